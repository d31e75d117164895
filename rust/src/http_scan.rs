//! What uvicorn's parser (llhttp, through httptools) refuses and hyper's (httparse) accepts, found
//! in the bytes of an HTTP/1.1 connection as they are read (`Scan`): a state per byte, no
//! allocation; the compiled HTTP door refuses those requests with uvicorn's bytes (`http.rs`).

use crate::http_syntax::{At, CHUNKED, CONTENT_LENGTH, METHODS, METHOD_CAP, TRANSFER_ENCODING};

/// What a header line's value is being read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    /// Its name is still being matched against `CONTENT_LENGTH` and `TRANSFER_ENCODING`: the bits
    /// of the ones still matching (1 and 2).
    Name(u8),
    /// Neither.
    Other,
    /// `Content-Length`: optional white space, digits (the value so far), optional white space.
    Length {
        value: u64,
        digits: bool,
        after: bool,
        bad: bool,
    },
    /// `Transfer-Encoding`: its current token (bytes so far, whether they spell `chunked`, white
    /// space after them).
    Coding {
        len: usize,
        chunked: bool,
        space: bool,
    },
}

/// Follows the bytes of one connection as they are read, for what llhttp refuses and httparse
/// (hyper) accepts: a state per byte, no allocation.
#[derive(Debug)]
pub struct Scan {
    at: At,
    /// A head has begun (its first byte that is not a leading CR or LF).
    begun: bool,
    /// The head's bytes, its complete lines (0: in the request line) and the current line's bytes
    /// (CR not counted), whether the last byte was a CR.
    pub bytes: usize,
    lines: usize,
    line: usize,
    cr: bool,
    /// Its header lines complete.
    pub fields: usize,
    /// The method, while the request line is in it.
    method: [u8; METHOD_CAP],
    method_len: usize,
    in_method: bool,
    field: Field,
    lengths: u32,
    length: u64,
    length_bad: bool,
    /// `Transfer-Encoding` was sent; its last coding so far is `chunked`; a coding followed `chunked`.
    coded: bool,
    chunked: bool,
    after_chunked: bool,
}

/// What `Scan::feed` found in some bytes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fed {
    /// Heads begun.
    pub begun: u64,
    /// A request the Python server refuses: answer `INVALID_REQUEST` and close.
    pub refused: bool,
}

impl Scan {
    pub fn new() -> Self {
        Scan {
            at: At::Head,
            begun: false,
            bytes: 0,
            lines: 0,
            line: 0,
            cr: false,
            fields: 0,
            method: [0; METHOD_CAP],
            method_len: 0,
            in_method: true,
            field: Field::Other,
            lengths: 0,
            length: 0,
            length_bad: false,
            coded: false,
            chunked: false,
            after_chunked: false,
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) -> Fed {
        let mut fed = Fed::default();
        let mut i = 0;
        while i < bytes.len() {
            // bodies and chunk data are skipped whole
            if let At::Body(left) | At::Data(left) = self.at {
                let skip = left.min((bytes.len() - i) as u64);
                i += skip as usize;
                self.at = match (self.at, left - skip) {
                    (At::Body(_), 0) => At::Head,
                    (At::Body(_), left) => At::Body(left),
                    (_, 0) => At::DataCr,
                    (_, left) => At::Data(left),
                };
                continue;
            }
            let byte = bytes[i];
            i += 1;
            let ok = match self.at {
                At::Head => self.head(byte, &mut fed),
                _ => self.chunk(byte),
            };
            if !ok {
                fed.refused = true;
                return fed;
            }
        }
        fed
    }

    /// One byte of a head, or before one; false: refused.
    fn head(&mut self, byte: u8, fed: &mut Fed) -> bool {
        if !self.begun {
            if byte == b'\r' || byte == b'\n' {
                return true; // empty lines before a request line are skipped (llhttp, hyper)
            }
            *self = Scan::new();
            self.begun = true;
            fed.begun += 1;
        }
        self.bytes += 1;
        match byte {
            b'\r' => {
                self.cr = true;
                true
            }
            b'\n' => {
                if !self.cr {
                    return false; // a bare LF
                }
                self.cr = false;
                self.end_line()
            }
            _ => {
                self.cr = false;
                self.line += 1;
                if self.lines == 0 {
                    self.request_line(byte)
                } else {
                    self.header(byte);
                    true
                }
            }
        }
    }

    fn request_line(&mut self, byte: u8) -> bool {
        if !self.in_method {
            return true;
        }
        if byte == b' ' {
            self.in_method = false;
            let method = &self.method[..self.method_len];
            return METHODS.contains(&method);
        }
        if self.method_len == METHOD_CAP {
            return false;
        }
        self.method[self.method_len] = byte;
        self.method_len += 1;
        let method = &self.method[..self.method_len];
        METHODS.iter().any(|known| known.starts_with(method)) // llhttp refuses at the first byte off
    }

    fn header(&mut self, byte: u8) {
        let at = self.line - 1;
        match &mut self.field {
            Field::Name(matching) => {
                let lower = byte.to_ascii_lowercase();
                if CONTENT_LENGTH.get(at) != Some(&lower) {
                    *matching &= !1;
                }
                if TRANSFER_ENCODING.get(at) != Some(&lower) {
                    *matching &= !2;
                }
                self.field = match *matching {
                    0 => Field::Other,
                    1 if at + 1 == CONTENT_LENGTH.len() => Field::Length {
                        value: 0,
                        digits: false,
                        after: false,
                        bad: false,
                    },
                    2 if at + 1 == TRANSFER_ENCODING.len() => Field::Coding {
                        len: 0,
                        chunked: true,
                        space: false,
                    },
                    _ => self.field,
                };
            }
            Field::Other => {}
            Field::Length {
                value,
                digits,
                after,
                bad,
            } => match byte {
                b' ' | b'\t' => *after |= *digits,
                b'0'..=b'9' if !*after => {
                    match value
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(u64::from(byte - b'0')))
                    {
                        Some(next) => *value = next,
                        None => *bad = true,
                    }
                    *digits = true;
                }
                _ => *bad = true,
            },
            Field::Coding {
                len,
                chunked,
                space,
            } => match byte {
                b',' => self.end_coding(),
                b' ' | b'\t' => *space |= *len > 0,
                _ => {
                    *chunked &=
                        !*space && CHUNKED.get(*len).copied() == Some(byte.to_ascii_lowercase());
                    *len += 1;
                }
            },
        }
    }

    /// The end of one coding of a `Transfer-Encoding` value.
    fn end_coding(&mut self) {
        if let Field::Coding { len, chunked, .. } = self.field {
            self.coding(len, chunked);
            self.field = Field::Coding {
                len: 0,
                chunked: true,
                space: false,
            };
        }
    }

    fn coding(&mut self, len: usize, chunked: bool) {
        if len > 0 {
            self.after_chunked |= self.chunked;
            self.chunked = chunked && len == CHUNKED.len();
        }
    }

    /// A CRLF in a head: the end of its request line, of a header line, or (an empty line) of it.
    fn end_line(&mut self) -> bool {
        let (lines, empty) = (self.lines, self.line == 0);
        self.lines += 1;
        self.line = 0;
        let field = std::mem::replace(&mut self.field, Field::Name(3));
        if lines == 0 {
            return !self.in_method; // a request line of one word
        }
        if empty {
            return self.end_head();
        }
        self.fields += 1;
        match field {
            Field::Length {
                value, digits, bad, ..
            } => {
                self.lengths += 1;
                self.length = value;
                self.length_bad |= bad || !digits;
            }
            Field::Coding { len, chunked, .. } => {
                self.coding(len, chunked);
                self.coded = true;
            }
            _ => {}
        }
        true
    }

    /// The empty line ending a head: refused, or on to its body.
    fn end_head(&mut self) -> bool {
        let refused = self.length_bad
            || self.lengths > 1
            || (self.coded && (self.lengths > 0 || !self.chunked || self.after_chunked));
        self.begun = false;
        self.at = if self.coded {
            At::Size(0, false)
        } else if self.lengths == 1 && self.length > 0 {
            At::Body(self.length)
        } else {
            At::Head
        };
        !refused
    }

    /// One byte of chunked framing; false: refused.
    fn chunk(&mut self, byte: u8) -> bool {
        match self.at.chunk(byte) {
            Some(at) => {
                self.at = at;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `Scan` makes of `bytes`, fed whole and then one byte at a time (the same both ways).
    fn scan(bytes: &[u8]) -> Fed {
        let whole = Scan::new().feed(bytes);
        let mut scan = Scan::new();
        let mut split = Fed::default();
        for byte in bytes {
            let fed = scan.feed(std::slice::from_ref(byte));
            split.begun += fed.begun;
            if fed.refused {
                split.refused = true;
                break;
            }
        }
        assert_eq!(whole, split, "{:?}", String::from_utf8_lossy(bytes));
        whole
    }

    fn passed(heads: u64) -> Fed {
        Fed {
            begun: heads,
            refused: false,
        }
    }

    const GET: &[u8] = b"GET /check HTTP/1.1\r\nHost: x\r\n\r\n";

    #[test]
    fn requests_llhttp_takes_pass() {
        assert_eq!(scan(GET), passed(1));
        assert_eq!(
            scan(b"\r\n\nGET /check HTTP/1.1\r\nHost: x\r\n\r\n\r\n"),
            passed(1)
        );
        assert_eq!(
            scan(b"M-SEARCH * HTTP/1.1\r\n\r\nQUERY / HTTP/1.1\r\n\r\n"),
            passed(2)
        );
        let post =
            b"POST /v1/check HTTP/1.1\r\ncontent-LENGTH:  2 \r\n\r\n{}GET / HTTP/1.1\r\n\r\n";
        assert_eq!(scan(post), passed(2));
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip ,Chunked\r\n\r\n2;a=b\r\n{}\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        assert_eq!(scan(chunked), passed(2));
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        for body in [
            &b"0000000000000000002;a;b=;c=d;e=\"f \\\" \t\xe9\"\r\n{}\r\n0\r\n\r\n"[..],
            b"FFFFFFFFFFFFFFF\r\n",
            b"0\r\nX-T: 1\r\nY:\r\n\r\n",
        ] {
            assert_eq!(scan(&[chunked, body].concat()), passed(1));
        }
        // a body whose bytes look like a head is skipped
        let body = b"POST / HTTP/1.1\r\nContent-Length: 23\r\n\r\nget /\nTransfer-Encoding";
        assert_eq!(scan(body), passed(1));
        // names that only begin like the two watched
        let names = b"GET / HTTP/1.1\r\nContent-Lengths: x\r\nTransfer-Encodingx: y\r\nX-Content-Length: 1\r\n\r\n";
        assert_eq!(scan(names), passed(1));
    }

    #[test]
    fn what_llhttp_refuses_is_refused() {
        let refused = [
            &b"get /check HTTP/1.1\r\n\r\n"[..],
            b"FOO /check HTTP/1.1\r\n\r\n",
            b"CONNECT x:443 HTTP/1.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"GET\t/ HTTP/1.1\r\n\r\n",
            b" GET / HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            b"GET / HTTP/1.1\n\n",
            b"GET / HTTP/1.1\r\nHost: x\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: 0\r\ntransfer-encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
            b"POST / HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\n{}",
            b"POST / HTTP/1.1\r\nContent-Length: +2\r\n\r\n{}",
            b"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n{}",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chun ked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2 \r\n{}\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\n{}\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}x\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n11111111111111111\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2; a=b\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;a=b=c\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;a=\"b\"c\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;a=\"\x01\"\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nbad trailer\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: a\x7f\r\n\r\n",
            // the second of two requests, after a body
            b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}GET / HTTP/1.1\nHost: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nget / HTTP/1.1\r\n\r\n",
        ];
        for bytes in refused {
            assert!(scan(bytes).refused, "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn heads_are_counted_for_the_timers_and_the_431_answer() {
        let mut scan = Scan::new();
        assert_eq!(scan.feed(b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\n"), passed(1));
        assert_eq!((scan.fields, scan.bytes), (2, 28));
        assert_eq!(scan.feed(b"\r\n"), passed(0));
        assert_eq!(scan.feed(b"GET / HTTP/1.1\r\n\r\nGET"), passed(2));
        assert_eq!(scan.fields, 0);
    }
}
