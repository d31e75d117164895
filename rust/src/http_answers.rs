//! What the compiled HTTP door writes itself, as the Python HTTP server writes it: the service's
//! JSON errors, uvicorn's answer to a request its parser refuses, hyper's own error answers (which
//! `http_stream.rs` replaces), and `Whole`, the body of every answer.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};

/// uvicorn's answer to a request its parser refuses (`httptools_impl.send_400_response`, with
/// `serve`'s server and date headers off), then the connection is closed.
pub const INVALID_REQUEST: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 30\r\nconnection: close\r\n\r\nInvalid HTTP request received.";

/// hyper's own answers to a head it cannot parse (no date header: `auto_date_header(false)`).
pub const HYPER_400: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
pub const HYPER_414: &[u8] =
    b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
pub const HYPER_431: &[u8] =
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// An answer's body, all of it at once. Unlike `Full`'s, an empty one is still a body to hyper, which
/// then writes a `content-length: 0` among the headers where it is (uvicorn's order), not after them
/// (after a `connection: close` it adds).
pub struct Whole(Option<Bytes>);

impl Whole {
    pub fn new(body: Vec<u8>) -> Self {
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
pub fn json_error(status: u16, message: &str) -> Vec<u8> {
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
pub fn error_response(status: u16, message: &str) -> Response<Whole> {
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

/// A whole response with the JSON error, closing the connection.
pub fn raw_error(status: u16, reason: &str, message: &str) -> Vec<u8> {
    let body = json_error(status, message);
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}
