//! The HTTP check API on the compiled front door: hyper (HTTP/1.1) reads each request (line,
//! headers, body) within the service's bounds and queues it; Python answers it with the same ASGI
//! app the Python HTTP server runs (`ServeApp`), and the answer is written as given.
//!
//! Bounds, as the Python HTTP server's (docs/serve.md#bounds): one connection over
//! `max_connections` is answered 503 and closed; a request line and headers over `max_header_size`
//! bytes are answered 431 (over twice that, hyper stops reading and refuses it: `Tracked` sends the
//! same 431); a request whose head is not received within `timeout` of its first byte (or of the
//! connection's start), or its body within `timeout` of its head, is answered 408 and closed; a
//! connection is closed `keep_alive` after its last answer when no next request has begun; a body
//! over `MAX_BODY` bytes is answered 413.
//!
//! What the Python server's parser (llhttp, through uvicorn's httptools protocol) refuses, the
//! compiled door refuses with uvicorn's bytes (`INVALID_REQUEST`) before hyper sees it: `Scan`
//! follows the bytes as read (each head, then its body by `Content-Length` or chunks) and finds a
//! method not in llhttp's list (lower case included), a line ended by a bare LF, `Transfer-Encoding`
//! with `Content-Length`, a repeated or malformed `Content-Length`, a `Transfer-Encoding` not ending
//! in one `chunked`, and chunk framing llhttp refuses. hyper's own answers to a head it cannot
//! parse (400, 414, 431, sent without a body) are written as the Python server's instead, and an
//! answer to an HTTP/1.0 request is sent as uvicorn sends it (`HTTP/1.1` status line, `connection:
//! close`). The differences left are listed in docs/security.md.

use std::borrow::Cow;
use std::convert::Infallible;
use std::io::Write;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::Body as _;
use http_body::Frame;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{oneshot, watch, Notify, Semaphore};

use crate::Shared;

/// The largest request body read (`/v1/check`, `/json`), as `serve.http_io.MAX_BODY`.
pub const MAX_BODY: usize = 64 * 1024;
/// Headers per request (hyper's default is 100); the byte bound is `max_header_size`.
const MAX_HEADERS: usize = 1000;

/// A request waiting for Python.
pub struct HttpRequest {
    pub method: String,
    pub target: String,
    pub headers: HeaderMap,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub body: Bytes,
}

/// Python's answer: status, the complete header list, body.
pub struct HttpAnswer {
    pub status: u16,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// The HTTP server's bounds.
pub struct HttpBounds {
    pub max_connections: usize,
    pub max_header_size: usize,
    pub timeout: Duration,
    pub keep_alive: Duration,
}

/// uvicorn's answer to a request its parser refuses (`httptools_impl.send_400_response`, with
/// `serve`'s server and date headers off), then the connection is closed.
const INVALID_REQUEST: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 30\r\nconnection: close\r\n\r\nInvalid HTTP request received.";

/// hyper's own answers to a head it cannot parse (no date header: `auto_date_header(false)`).
const HYPER_400: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
const HYPER_414: &[u8] =
    b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
const HYPER_431: &[u8] =
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// The request methods llhttp knows (httptools 0.9, llhttp 9): any other, in any case, is refused.
/// CONNECT is left out: hyper would take the connection for a tunnel (llhttp too: uvicorn answers
/// its own 400 to most CONNECT targets).
const METHODS: [&[u8]; 34] = [
    b"DELETE",
    b"GET",
    b"HEAD",
    b"POST",
    b"PUT",
    b"OPTIONS",
    b"TRACE",
    b"COPY",
    b"LOCK",
    b"MKCOL",
    b"MOVE",
    b"PROPFIND",
    b"PROPPATCH",
    b"SEARCH",
    b"UNLOCK",
    b"BIND",
    b"REBIND",
    b"UNBIND",
    b"ACL",
    b"REPORT",
    b"MKACTIVITY",
    b"CHECKOUT",
    b"MERGE",
    b"M-SEARCH",
    b"NOTIFY",
    b"SUBSCRIBE",
    b"UNSUBSCRIBE",
    b"PATCH",
    b"PURGE",
    b"MKCALENDAR",
    b"LINK",
    b"UNLINK",
    b"SOURCE",
    b"QUERY",
];
/// Bytes of a method kept: more than any of `METHODS` has.
const METHOD_CAP: usize = 12;
const CONTENT_LENGTH: &[u8] = b"content-length:";
const TRANSFER_ENCODING: &[u8] = b"transfer-encoding:";
const CHUNKED: &[u8] = b"chunked";

/// Where the bytes read are in the stream of requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// Between requests or in a head.
    Head,
    /// In a body with so many bytes left.
    Body(u64),
    /// In a chunk's size line: its hex digits (the size so far, whether there is a digit), an
    /// extension's name (its bytes so far), the start of its value, a token value, a quoted value
    /// (after a backslash in it, after its closing quote), then the LF after the line's CR.
    Size(u64, bool),
    ExtensionName(u64, usize),
    ExtensionValue(u64),
    ExtensionToken(u64),
    ExtensionQuoted(u64),
    ExtensionEscaped(u64),
    ExtensionQuotedEnd(u64),
    SizeEnd(u64),
    /// In a chunk's data, with so many bytes left; then the CR and the LF after it.
    Data(u64),
    DataCr,
    DataLf,
    /// In the trailer section: at a line's start, in its name, in its value, at the
    /// LF after its CR (ending an empty line: the trailers' end).
    TrailerStart,
    TrailerName,
    TrailerValue,
    TrailerLf(bool),
}

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
struct Scan {
    at: At,
    /// A head has begun (its first byte that is not a leading CR or LF).
    begun: bool,
    /// The head's bytes, its complete lines (0: in the request line) and the current line's bytes
    /// (CR not counted), whether the last byte was a CR.
    bytes: usize,
    lines: usize,
    line: usize,
    cr: bool,
    /// Its header lines complete.
    fields: usize,
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
struct Fed {
    /// Heads begun.
    begun: u64,
    /// A request the Python server refuses: answer `INVALID_REQUEST` and close.
    refused: bool,
}

impl Scan {
    fn new() -> Self {
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

    fn feed(&mut self, bytes: &[u8]) -> Fed {
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

    /// One byte of chunked framing; false: refused. As llhttp's strict chunks: no white space in a
    /// size line, extensions `;name[=token|"quoted"]`, trailers `name:value` with no control bytes,
    /// CRLF only.
    fn chunk(&mut self, byte: u8) -> bool {
        let token = is_token(byte);
        self.at = match (self.at, byte) {
            (At::Size(size, _), b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => {
                if size > u64::MAX >> 4 {
                    return false;
                }
                let digit = (byte as char).to_digit(16).unwrap_or(0);
                At::Size(size << 4 | u64::from(digit), true)
            }
            (At::Size(size, true), b';') => At::ExtensionName(size, 0),
            (At::Size(size, true), b'\r') => At::SizeEnd(size),
            (At::ExtensionName(size, len), _) if token => At::ExtensionName(size, len + 1),
            (At::ExtensionName(size, len), b'=') if len > 0 => At::ExtensionValue(size),
            (At::ExtensionValue(size), b'"') => At::ExtensionQuoted(size),
            (At::ExtensionValue(size) | At::ExtensionToken(size), _) if token => {
                At::ExtensionToken(size)
            }
            (At::ExtensionQuoted(size), b'"') => At::ExtensionQuotedEnd(size),
            (At::ExtensionQuoted(size), b'\\') => At::ExtensionEscaped(size),
            (At::ExtensionQuoted(size) | At::ExtensionEscaped(size), _) if !is_control(byte) => {
                At::ExtensionQuoted(size)
            }
            (
                At::ExtensionName(size, 1..)
                | At::ExtensionValue(size)
                | At::ExtensionToken(size)
                | At::ExtensionQuotedEnd(size),
                b';',
            ) => At::ExtensionName(size, 0),
            (
                At::ExtensionName(size, 1..)
                | At::ExtensionValue(size)
                | At::ExtensionToken(size)
                | At::ExtensionQuotedEnd(size),
                b'\r',
            ) => At::SizeEnd(size),
            (At::SizeEnd(0), b'\n') => At::TrailerStart,
            (At::SizeEnd(size), b'\n') => At::Data(size),
            (At::DataCr, b'\r') => At::DataLf,
            (At::DataLf, b'\n') => At::Size(0, false),
            (At::TrailerStart, b'\r') => At::TrailerLf(true),
            (At::TrailerStart | At::TrailerName, _) if token => At::TrailerName,
            (At::TrailerName, b':') => At::TrailerValue,
            (At::TrailerValue, b'\r') => At::TrailerLf(false),
            (At::TrailerValue, _) if !is_control(byte) => At::TrailerValue,
            (At::TrailerLf(true), b'\n') => At::Head,
            (At::TrailerLf(false), b'\n') => At::TrailerStart,
            _ => return false,
        };
        true
    }
}

/// A `tchar` (RFC 9110): the bytes of a token.
fn is_token(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// A control byte other than HTAB (refused in field values and quoted strings).
fn is_control(byte: u8) -> bool {
    (byte < 0x20 && byte != b'\t') || byte == 0x7f
}

/// Where one connection is: `begun` heads were begun and `dispatched` handed to `handle`; a head is
/// being received (since `since`) while more were begun than handed, or before the first one (since
/// the connection's start); else the connection is idle since `since` (its last answer) once no
/// request is `in_flight` (past its head: reading its body, or waiting for its answer).
struct Phase {
    begun: u64,
    dispatched: u64,
    since: Instant,
    in_flight: u32,
    /// A request the Python server refuses was read (`Scan`): answer `INVALID_REQUEST` and close.
    refused: bool,
    /// An answer to an HTTP/1.0 request is about to be written: its status line's version to patch.
    http10: bool,
}

impl Phase {
    fn receiving(&self) -> bool {
        self.begun == 0 || self.begun > self.dispatched
    }
}

/// A connection's phase, and a signal to its loop (`connection`) when the phase changes its
/// deadline: its last answer given, or a request refused.
struct PhaseCell {
    phase: Mutex<Phase>,
    changed: Notify,
}

/// The sizes of `Tracked`'s answers to an oversized head.
#[derive(Clone, Copy)]
struct HeadBounds {
    max_header_size: usize,
    head_limit: usize,
}

/// A connection's stream: its bytes read go through `Scan` (marking the start of each request's
/// head, and refusing what the Python server refuses), and hyper's own error answers written are
/// replaced by the Python server's.
struct Tracked {
    stream: tokio::net::TcpStream,
    cell: Arc<PhaseCell>,
    scan: Scan,
    bounds: HeadBounds,
    /// An answer being written in place of hyper's: its bytes, those written so far.
    replacing: Option<(Cow<'static, [u8]>, usize)>,
    /// Bytes of an HTTP/1.0 answer's status line written so far (its version patched).
    status_written: usize,
    /// A request was refused: nothing more is read.
    refused: bool,
}

impl Tracked {
    /// The Python server's answer in place of hyper's own in `buf` (the answer to a head not
    /// handed to `handle`), with any bytes before it.
    fn replacement(&self, buf: &[u8]) -> Option<Cow<'static, [u8]>> {
        let hyper = [HYPER_400, HYPER_414, HYPER_431]
            .into_iter()
            .find(|hyper| buf.ends_with(hyper))?;
        let ours: Cow<'static, [u8]> = if hyper == HYPER_431 {
            let message =
                if self.scan.fields >= MAX_HEADERS && self.scan.bytes <= self.bounds.head_limit {
                    format!("the request has more than {MAX_HEADERS} header lines")
                } else {
                    format!(
                        "the request line and headers are larger than {} bytes",
                        self.bounds.max_header_size
                    )
                };
            Cow::Owned(raw_error(431, "Request Header Fields Too Large", &message))
        } else {
            Cow::Borrowed(INVALID_REQUEST) // 400; 414: a target over 65,535 bytes is uvicorn's 400
        };
        let before = &buf[..buf.len() - hyper.len()];
        if before.is_empty() {
            return Some(ours);
        }
        let mut out = before.to_vec();
        out.extend_from_slice(&ours);
        Some(Cow::Owned(out))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.cell.phase.lock().unwrap()
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.refused {
            return Poll::Pending; // `connection` is answering and closing
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            let fed = self.scan.feed(&buf.filled()[before..]);
            if fed.refused {
                // hyper never sees it: `connection` answers as the Python server and closes
                buf.set_filled(before);
                self.refused = true;
                self.lock().refused = true;
                self.cell.changed.notify_one();
                return Poll::Pending;
            }
            if fed.begun > 0 {
                let mut phase = self.lock();
                phase.begun += fed.begun;
                phase.since = Instant::now();
            }
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.replacing.is_none() {
            let (undispatched, http10) = {
                let phase = this.lock();
                (phase.begun > phase.dispatched, phase.http10)
            };
            if undispatched {
                if let Some(replacement) = this.replacement(buf) {
                    this.replacing = Some((replacement, 0));
                }
            } else if http10 {
                // hyper answers HTTP/1.0 with an HTTP/1.0 status line, uvicorn with HTTP/1.1
                const STATUS: &[u8] = b"HTTP/1.0 ";
                let done = this.status_written;
                if done < STATUS.len() && buf.starts_with(&STATUS[done..]) {
                    let mut patched = [0u8; 1024];
                    let len = buf.len().min(patched.len());
                    patched[..len].copy_from_slice(&buf[..len]);
                    if done <= 7 {
                        patched[7 - done] = b'1';
                    }
                    let written =
                        ready!(Pin::new(&mut this.stream).poll_write(cx, &patched[..len]))?;
                    this.status_written += written;
                    if this.status_written >= STATUS.len() {
                        this.status_written = 0;
                        this.lock().http10 = false;
                    }
                    return Poll::Ready(Ok(written));
                }
            }
        }
        if let Some((bytes, written)) = &mut this.replacing {
            while *written < bytes.len() {
                match ready!(Pin::new(&mut this.stream).poll_write(cx, &bytes[*written..])) {
                    Ok(0) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
                    Ok(n) => *written += n,
                    Err(error) => return Poll::Ready(Err(error)),
                }
            }
            this.replacing = None;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    // Not vectored: hyper then writes each answer from one buffer, which `poll_write` can read.
}

/// Marks a request past its head for as long as it is handled (dropped: answered or abandoned).
struct InFlight(Arc<PhaseCell>);

impl InFlight {
    fn new(cell: Arc<PhaseCell>) -> Self {
        {
            let mut phase = cell.phase.lock().unwrap();
            phase.in_flight += 1;
            phase.dispatched += 1;
        }
        InFlight(cell)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut phase = self.0.phase.lock().unwrap();
        phase.in_flight -= 1;
        if phase.in_flight == 0 {
            if !phase.receiving() {
                phase.since = Instant::now(); // idle from the answer on
            }
            drop(phase);
            self.0.changed.notify_one(); // the connection's deadline is now `since`'s
        }
    }
}

/// An answer's body, all of it at once. Unlike `Full`'s, an empty one is still a body to hyper, which
/// then writes a `content-length: 0` among the headers where it is (uvicorn's order), not after them
/// (after a `connection: close` it adds).
struct Whole(Option<Bytes>);

impl Whole {
    fn new(body: Vec<u8>) -> Self {
        Whole(Some(Bytes::from(body)))
    }
}

impl http_body::Body for Whole {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.take().map(|body| Ok(Frame::data(body))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.as_ref().map_or(0, |body| body.len() as u64))
    }
}

/// The service's JSON error, as `serve.http_io.send_error` writes it.
fn json_error(status: u16, message: &str) -> Vec<u8> {
    let mut escaped = String::with_capacity(message.len());
    for c in message.chars() {
        match c {
            '"' => escaped.push_str("\\\""),
            '\\' => escaped.push_str("\\\\"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    escaped.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => escaped.push(c),
        }
    }
    format!("{{\"status\": {status}, \"error\": \"{escaped}\"}}").into_bytes()
}

/// An error answered by Rust, closing the connection.
fn error_response(status: u16, message: &str) -> Response<Whole> {
    let body = json_error(status, message);
    let length = body.len();
    let mut response = Response::new(Whole::new(body));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("content-length", HeaderValue::from(length));
    headers.insert("connection", HeaderValue::from_static("close"));
    response
}

fn seconds(duration: Duration) -> String {
    format!("{}", duration.as_secs_f64())
}

/// Bytes a queued request holds: its target, headers and body, and their allocations.
fn weight(request: &HttpRequest) -> usize {
    let headers: usize = request
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 64)
        .sum();
    256 + request.method.len() + request.target.len() + headers + request.body.len()
}

/// Queue `request` for Python and wait for its answer (at most the request timeout).
async fn decide(shared: Arc<Shared>, request: HttpRequest) -> Response<Whole> {
    let (sender, receiver) = oneshot::channel();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let bytes = weight(&request);
    let deadline = tokio::time::Instant::now() + shared.request_timeout;
    let first = {
        let mut state = shared.state.lock().unwrap();
        if let Some(why) = state.full(&shared, bytes) {
            return error_response(503, &why);
        }
        state.http.push(id, request, sender, bytes, deadline)
    };
    if first {
        shared.wake();
    }
    match tokio::time::timeout_at(deadline, receiver).await {
        Ok(Ok(answer)) => {
            let mut response = Response::new(Whole::new(answer.body));
            *response.status_mut() =
                StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let headers = response.headers_mut();
            for (name, value) in answer.headers {
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(&name),
                    HeaderValue::from_bytes(&value),
                ) {
                    headers.append(name, value);
                }
            }
            response
        }
        Ok(Err(_)) if tokio::time::Instant::now() < deadline => {
            error_response(500, "the decision was dropped")
        }
        _ => {
            shared.state.lock().unwrap().http.remove(id);
            error_response(
                503,
                &format!(
                    "no decision within {} seconds",
                    seconds(shared.request_timeout)
                ),
            )
        }
    }
}

/// One request, answered (`answer`); to HTTP/1.0 as uvicorn answers it: `connection: close`, and an
/// HTTP/1.1 status line (`Tracked::poll_write`; hyper would add `connection: keep-alive` to a 1.1
/// answer when asked for it).
async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    peer: SocketAddr,
    local: SocketAddr,
    bounds: Arc<HttpBounds>,
    cell: Arc<PhaseCell>,
) -> Result<Response<Whole>, Infallible> {
    let _in_flight = InFlight::new(cell.clone());
    let http10 = request.version() == Version::HTTP_10;
    let head = request.method() == hyper::Method::HEAD;
    let mut response = answer(shared, request, peer, local, bounds).await;
    let status = response.status().as_u16();
    if !head && status >= 200 && status != 204 && status != 304 {
        // where uvicorn writes it: before a `connection: close` hyper adds
        let length = response.body().size_hint().exact().unwrap_or(0);
        if let hyper::header::Entry::Vacant(entry) =
            response.headers_mut().entry(hyper::header::CONTENT_LENGTH)
        {
            entry.insert(if length == 0 {
                HeaderValue::from_static("0")
            } else {
                HeaderValue::from(length)
            });
        }
    }
    if http10 {
        *response.version_mut() = Version::HTTP_10;
        let close = response
            .headers()
            .get_all(hyper::header::CONNECTION)
            .iter()
            .any(|value| {
                value
                    .as_bytes()
                    .split(|&byte| byte == b',')
                    .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
            });
        if !close {
            response
                .headers_mut()
                .append(hyper::header::CONNECTION, HeaderValue::from_static("close"));
        }
        cell.phase.lock().unwrap().http10 = true;
    }
    Ok(response)
}

/// One request: its body read (bounded in size and time), then decided by Python.
async fn answer(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    peer: SocketAddr,
    local: SocketAddr,
    bounds: Arc<HttpBounds>,
) -> Response<Whole> {
    let timeout = bounds.timeout;
    let (parts, body) = request.into_parts();
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
    // As the Python server counts a head received whole: the URL, then each header line.
    let head = target.len()
        + parts
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>();
    if head > bounds.max_header_size {
        let message = format!(
            "the request line and headers are larger than {} bytes",
            bounds.max_header_size
        );
        return error_response(431, &message);
    }
    let body = if parts.uri.path() == "/check" {
        Bytes::new() // a gateway's sub-request: its body is never read
    } else {
        match tokio::time::timeout(timeout, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
                let message = format!("the body is larger than {MAX_BODY} bytes");
                return error_response(413, &message);
            }
            Ok(Err(_)) => return error_response(400, "the request body could not be read"),
            Err(_) => {
                let message = format!(
                    "the request was not received whole within {} seconds",
                    seconds(timeout)
                );
                return error_response(408, &message);
            }
        }
    };
    let request = HttpRequest {
        method: parts.method.as_str().to_string(),
        target,
        headers: parts.headers,
        peer,
        local,
        body,
    };
    decide(shared, request).await
}

/// A whole response with the JSON error, closing the connection.
fn raw_error(status: u16, reason: &str, message: &str) -> Vec<u8> {
    let body = json_error(status, message);
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Answer 503 with the JSON error and close, before HTTP is spoken (over the connection cap).
async fn refuse(mut stream: tokio::net::TcpStream, message: String) {
    let out = raw_error(503, "Service Unavailable", &message);
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(&out)).await;
    let _ = stream.shutdown().await;
}

/// Write `answer` on the connection's socket while hyper holds it (it owns and closes the socket), as
/// much as the socket takes at once, and end the writing side.
fn answer_raw(fd: std::os::fd::RawFd, answer: &[u8]) {
    // SAFETY: the caller's `connection` owns the socket and is alive until it returns;
    // ManuallyDrop leaves closing it to `connection`.
    let writer = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
    let _ = (&*writer).write(answer);
    let _ = writer.shutdown(std::net::Shutdown::Write);
}

/// Serve one connection until it ends, its head or idle time runs out, a request is refused, or the
/// server stops.
async fn connection(
    shared: Arc<Shared>,
    builder: Arc<hyper::server::conn::http1::Builder>,
    bounds: Arc<HttpBounds>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    mut stop: watch::Receiver<bool>,
) {
    let local = stream.local_addr().unwrap_or(peer);
    // To answer 408 while hyper holds the stream mid-head (no second descriptor: the caps count files).
    let fd = stream.as_raw_fd();
    let cell = Arc::new(PhaseCell {
        phase: Mutex::new(Phase {
            begun: 0,
            dispatched: 0,
            since: Instant::now(),
            in_flight: 0,
            refused: false,
            http10: false,
        }),
        changed: Notify::new(),
    });
    let io = TokioIo::new(Tracked {
        stream,
        cell: cell.clone(),
        scan: Scan::new(),
        bounds: HeadBounds {
            max_header_size: bounds.max_header_size,
            head_limit: head_limit(bounds.max_header_size),
        },
        replacing: None,
        status_written: 0,
        refused: false,
    });
    let service_cell = cell.clone();
    let service_bounds = bounds.clone();
    let service = hyper::service::service_fn(move |request| {
        handle(
            shared.clone(),
            request,
            peer,
            local,
            service_bounds.clone(),
            service_cell.clone(),
        )
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut stopping = *stop.borrow();
    if stopping {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        // Re-read after each change (`cell.changed`): the last answer given re-arms the idle deadline.
        let (refused, wake) = {
            let phase = cell.phase.lock().unwrap();
            let wake = if phase.in_flight > 0 {
                Instant::now() + bounds.timeout // bounded by `handle`; woken when answered
            } else if phase.receiving() {
                phase.since + bounds.timeout
            } else {
                phase.since + bounds.keep_alive
            };
            (phase.refused, wake)
        };
        if refused {
            answer_raw(fd, INVALID_REQUEST);
            break;
        }
        tokio::select! {
            _ = connection.as_mut() => break,
            _ = stop.changed(), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
            _ = cell.changed.notified() => {}
            _ = tokio::time::sleep_until(wake.into()) => {
                let (in_flight, receiving, since) = {
                    let phase = cell.phase.lock().unwrap();
                    (phase.in_flight, phase.receiving(), phase.since)
                };
                let now = Instant::now();
                if in_flight > 0 {
                    continue;
                }
                if receiving && since + bounds.timeout <= now {
                    let message = format!(
                        "the request was not received whole within {} seconds",
                        seconds(bounds.timeout)
                    );
                    answer_raw(fd, &raw_error(408, "Request Timeout", &message));
                    break;
                }
                if !receiving && since + bounds.keep_alive <= now {
                    break;
                }
            }
        }
    }
}

/// The bytes of a head hyper reads (more: its own 431, answered as the Python server's by `Tracked`).
fn head_limit(max_header_size: usize) -> usize {
    2 * max_header_size.max(4096)
}

/// Serve HTTP on `listener` until `stop` turns true; `live` counts the accept loop and the open
/// connections (0: everything answered has been written).
pub fn spawn(
    runtime: &tokio::runtime::Runtime,
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    bounds: HttpBounds,
    live: Arc<AtomicUsize>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The head's time is bounded per connection (`connection`), with a 408 as the Python server's.
    let head_limit = head_limit(bounds.max_header_size);
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_header_size(head_limit)
        .max_buf_size(head_limit + 16384)
        .max_headers(MAX_HEADERS)
        .auto_date_header(false);
    let builder = Arc::new(builder);
    let permits = Arc::new(Semaphore::new(bounds.max_connections));
    let max_connections = bounds.max_connections;
    let bounds = Arc::new(bounds);
    live.fetch_add(1, Ordering::AcqRel);
    let mut stopping = stop.clone();
    runtime.spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stopping.changed() => break,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(_) => {
                    // out of file descriptors, for instance: let connections end first
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                let message =
                    format!("this worker has {max_connections} connections open: try again");
                tokio::spawn(refuse(stream, message));
                continue;
            };
            let _ = stream.set_nodelay(true);
            let shared = shared.clone();
            let builder = builder.clone();
            let bounds = bounds.clone();
            let stop = stop.clone();
            let live = live.clone();
            live.fetch_add(1, Ordering::AcqRel);
            tokio::spawn(async move {
                connection(shared, builder, bounds, stream, peer, stop).await;
                drop(permit);
                live.fetch_sub(1, Ordering::AcqRel);
            });
        }
        live.fetch_sub(1, Ordering::AcqRel);
    });
    Ok(())
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
