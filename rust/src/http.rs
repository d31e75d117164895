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

use crate::http_scan::Scan;
use crate::shared::Shared;

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
