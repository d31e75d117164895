//! The HTTP check API on the compiled front door: hyper (HTTP/1.1) reads each request (line,
//! headers, body) within the service's bounds and queues it; Python answers it with the same ASGI
//! app the Python HTTP server runs (`ServeApp`), and the answer is written as given.
//!
//! Bounds, as the Python HTTP server's (docs/serve.md#bounds): one connection over
//! `max_connections` is answered 503 and closed; a request line and headers over `max_header_size`
//! bytes are answered 431 (over twice that, hyper answers 431 itself, with no body); a request
//! whose head is not received within `timeout` of its first byte (or of the connection's start),
//! or its body within `timeout` of its head, is answered 408 and closed; a connection idle for
//! `keep_alive` between requests is closed; a body over `MAX_BODY` bytes is answered 413.

use std::convert::Infallible;
use std::io::Write;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{oneshot, watch, Semaphore};

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

/// Where one connection is: receiving a request's head since `since`, or idle since `since`;
/// `in_flight` requests are past their head (reading the body, or waiting for the answer).
struct Phase {
    receiving: bool,
    since: Instant,
    in_flight: u32,
}

type PhaseCell = Arc<Mutex<Phase>>;

/// A connection's stream, marking the start of each request's head (its first byte read while idle).
struct Tracked {
    stream: tokio::net::TcpStream,
    phase: PhaseCell,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            let mut phase = self.phase.lock().unwrap();
            if !phase.receiving {
                phase.receiving = true;
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
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Marks a request past its head for as long as it is handled (dropped: answered or abandoned).
struct InFlight(PhaseCell);

impl InFlight {
    fn new(phase: PhaseCell) -> Self {
        {
            let mut state = phase.lock().unwrap();
            state.in_flight += 1;
            state.receiving = false;
        }
        InFlight(phase)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.0.lock().unwrap();
        state.in_flight -= 1;
        if !state.receiving {
            state.since = Instant::now();
        }
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
fn error_response(status: u16, message: &str) -> Response<Full<Bytes>> {
    let body = json_error(status, message);
    let length = body.len();
    let mut response = Response::new(Full::new(Bytes::from(body)));
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
async fn decide(shared: Arc<Shared>, request: HttpRequest) -> Response<Full<Bytes>> {
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
            let mut response = Response::new(Full::new(Bytes::from(answer.body)));
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

/// One request: its body read (bounded in size and time), then decided by Python.
async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    peer: SocketAddr,
    local: SocketAddr,
    bounds: Arc<HttpBounds>,
    phase: PhaseCell,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let _in_flight = InFlight::new(phase);
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
        return Ok(error_response(431, &message));
    }
    let body = if parts.uri.path() == "/check" {
        Bytes::new() // a gateway's sub-request: its body is never read
    } else {
        match tokio::time::timeout(timeout, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
                let message = format!("the body is larger than {MAX_BODY} bytes");
                return Ok(error_response(413, &message));
            }
            Ok(Err(_)) => return Ok(error_response(400, "the request body could not be read")),
            Err(_) => {
                let message = format!(
                    "the request was not received whole within {} seconds",
                    seconds(timeout)
                );
                return Ok(error_response(408, &message));
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
    Ok(decide(shared, request).await)
}

/// Answer `status` with the JSON error and close, before HTTP is spoken (over the connection cap).
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

async fn refuse(mut stream: tokio::net::TcpStream, message: String) {
    let out = raw_error(503, "Service Unavailable", &message);
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(&out)).await;
    let _ = stream.shutdown().await;
}

/// Serve one connection until it ends, its head or idle time runs out, or the server stops.
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
    let phase: PhaseCell = Arc::new(Mutex::new(Phase {
        receiving: true,
        since: Instant::now(),
        in_flight: 0,
    }));
    let io = TokioIo::new(Tracked {
        stream,
        phase: phase.clone(),
    });
    let service_phase = phase.clone();
    let service_bounds = bounds.clone();
    let service = hyper::service::service_fn(move |request| {
        handle(
            shared.clone(),
            request,
            peer,
            local,
            service_bounds.clone(),
            service_phase.clone(),
        )
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut stopping = *stop.borrow();
    if stopping {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        let wake = {
            let state = phase.lock().unwrap();
            if state.in_flight > 0 {
                Instant::now() + bounds.timeout
            } else if state.receiving {
                state.since + bounds.timeout
            } else {
                state.since + bounds.keep_alive
            }
        };
        tokio::select! {
            _ = connection.as_mut() => break,
            _ = stop.changed(), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                let (in_flight, receiving, since) = {
                    let state = phase.lock().unwrap();
                    (state.in_flight, state.receiving, state.since)
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
                    // SAFETY: `connection` owns the socket and is alive until this function returns;
                    // ManuallyDrop leaves closing it to `connection`.
                    let writer = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
                    let _ = (&*writer).write(&raw_error(408, "Request Timeout", &message));
                    let _ = writer.shutdown(std::net::Shutdown::Write);
                    break;
                }
                if !receiving && since + bounds.keep_alive <= now {
                    break;
                }
            }
        }
    }
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
    let head_limit = 2 * bounds.max_header_size.max(4096);
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
