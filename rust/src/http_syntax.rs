//! The HTTP/1.1 syntax llhttp (uvicorn's parser, through httptools) accepts, for `Scan`
//! (`http_scan.rs`): its request methods, the header names it reads, token and control bytes, and
//! chunked framing, a byte at a time (`At::chunk`).

/// The request methods llhttp knows (httptools 0.9, llhttp 9): any other, in any case, is refused.
/// CONNECT is left out: hyper would take the connection for a tunnel (llhttp too: uvicorn answers
/// its own 400 to most CONNECT targets).
pub const METHODS: [&[u8]; 34] = [
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
pub const METHOD_CAP: usize = 12;
pub const CONTENT_LENGTH: &[u8] = b"content-length:";
pub const TRANSFER_ENCODING: &[u8] = b"transfer-encoding:";
pub const CHUNKED: &[u8] = b"chunked";

/// Where the bytes read are in the stream of requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
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

impl At {
    /// The state after one byte of chunked framing; None: refused. As llhttp's strict chunks: no
    /// white space in a size line, extensions `;name[=token|"quoted"]`, trailers `name:value` with
    /// no control bytes, CRLF only.
    pub fn chunk(self, byte: u8) -> Option<At> {
        let token = is_token(byte);
        Some(match (self, byte) {
            (At::Size(size, _), b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => {
                if size > u64::MAX >> 4 {
                    return None;
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
            _ => return None,
        })
    }
}

/// A `tchar` (RFC 9110): the bytes of a token.
pub fn is_token(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// A control byte other than HTAB (refused in field values and quoted strings).
pub fn is_control(byte: u8) -> bool {
    (byte < 0x20 && byte != b'\t') || byte == 0x7f
}
