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

use std::io::Write;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::header::HeaderMap;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Semaphore};

use crate::http_answers::{raw_error, INVALID_REQUEST};
use crate::http_service::handle;
use crate::http_stream::{PhaseCell, Tracked};
use crate::shared::{seconds, Shared};

/// The largest request body read (`/v1/check`, `/json`), as `serve.http_io.MAX_BODY`.
pub const MAX_BODY: usize = 64 * 1024;
/// Headers per request (hyper's default is 100); the byte bound is `max_header_size`.
pub const MAX_HEADERS: usize = 1000;

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

/// The HTTP server's bounds (the settings' `http`).
#[derive(Clone, Copy)]
pub struct HttpBounds {
    pub max_connections: usize,
    pub max_header_size: usize,
    pub timeout: Duration,
    pub keep_alive: Duration,
}

/// Where the HTTP server listens (the settings' `http`).
pub struct HttpSettings {
    /// A listening socket (duplicated, not taken).
    pub fd: i32,
    pub bounds: HttpBounds,
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

/// What a connection's loop does when its phase says so.
enum Due {
    /// Sleep until then (or a change of phase).
    Wait(Instant),
    /// A request was refused (`Scan`): answer `INVALID_REQUEST` and close.
    Refuse,
}

/// The connection's next deadline: a request being answered is bounded by `handle` (its answer
/// wakes the loop); a head being received ends `timeout` after it began; an idle connection ends
/// `keep_alive` after its last answer.
fn due(cell: &PhaseCell, bounds: &HttpBounds) -> Due {
    let phase = cell.phase.lock().unwrap();
    if phase.refused {
        Due::Refuse
    } else if phase.in_flight > 0 {
        Due::Wait(Instant::now() + bounds.timeout)
    } else if phase.receiving() {
        Due::Wait(phase.since + bounds.timeout)
    } else {
        Due::Wait(phase.since + bounds.keep_alive)
    }
}

/// Whether the connection ends at its deadline: answered 408 when a head has not arrived in time
/// (`fd`: its socket), closed when idle too long.
fn expired(cell: &PhaseCell, bounds: &HttpBounds, fd: std::os::fd::RawFd) -> bool {
    let (in_flight, receiving, since) = {
        let phase = cell.phase.lock().unwrap();
        (phase.in_flight, phase.receiving(), phase.since)
    };
    let now = Instant::now();
    if in_flight > 0 {
        return false;
    }
    if receiving && since + bounds.timeout <= now {
        let message = format!(
            "the request was not received whole within {} seconds",
            seconds(bounds.timeout)
        );
        answer_raw(fd, &raw_error(408, "Request Timeout", &message));
        return true;
    }
    !receiving && since + bounds.keep_alive <= now
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
    let cell = Arc::new(PhaseCell::new());
    let limit = head_limit(bounds.max_header_size);
    let io = TokioIo::new(Tracked::new(
        stream,
        cell.clone(),
        bounds.max_header_size,
        limit,
    ));
    let (service_cell, service_bounds) = (cell.clone(), bounds.clone());
    let service = hyper::service::service_fn(move |request| {
        let (shared, bounds, cell) = (shared.clone(), service_bounds.clone(), service_cell.clone());
        handle(shared, request, peer, local, bounds, cell)
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut stopping = *stop.borrow();
    if stopping {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        // Re-read after each change (`cell.changed`): the last answer given re-arms the idle deadline.
        let wake = match due(&cell, &bounds) {
            Due::Refuse => {
                answer_raw(fd, INVALID_REQUEST);
                break;
            }
            Due::Wait(wake) => wake,
        };
        tokio::select! {
            _ = connection.as_mut() => break,
            _ = stop.changed(), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
            _ = cell.changed.notified() => {}
            _ = tokio::time::sleep_until(wake.into()) => {
                if expired(&cell, &bounds, fd) {
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

/// hyper's HTTP/1.1 server, its head bounded by `max_header_size` (the head's time is bounded per
/// connection, by `connection`, with a 408 as the Python server's).
fn builder(max_header_size: usize) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    let head_limit = head_limit(max_header_size);
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_header_size(head_limit)
        .max_buf_size(head_limit + 16384)
        .max_headers(MAX_HEADERS)
        .auto_date_header(false);
    builder
}

/// Serve HTTP as `settings` say until `stop` turns true; `live` counts the accept loop and the open
/// connections (0: everything answered has been written).
pub fn spawn(
    runtime: &tokio::runtime::Runtime,
    shared: Arc<Shared>,
    settings: &HttpSettings,
    live: Arc<AtomicUsize>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let listener = crate::settings::listener(runtime, settings.fd)?;
    let bounds = Arc::new(settings.bounds);
    let builder = Arc::new(builder(bounds.max_header_size));
    live.fetch_add(1, Ordering::AcqRel);
    runtime.spawn(accept(listener, shared, builder, bounds, live, stop));
    Ok(())
}

/// Accept connections until `stop` turns true: one over `max_connections` is answered 503 and closed.
async fn accept(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    builder: Arc<hyper::server::conn::http1::Builder>,
    bounds: Arc<HttpBounds>,
    live: Arc<AtomicUsize>,
    stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(bounds.max_connections));
    let mut stopping = stop.clone();
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
            let message = format!(
                "this worker has {} connections open: try again",
                bounds.max_connections
            );
            tokio::spawn(refuse(stream, message));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (shared, builder, bounds) = (shared.clone(), builder.clone(), bounds.clone());
        let (stop, live) = (stop.clone(), live.clone());
        live.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            connection(shared, builder, bounds, stream, peer, stop).await;
            drop(permit);
            live.fetch_sub(1, Ordering::AcqRel);
        });
    }
    live.fetch_sub(1, Ordering::AcqRel);
}
