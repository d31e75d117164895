//! The HTTP check API on the compiled front door: hyper (HTTP/1.1) reads each request (line,
//! headers, body) within the service's bounds and queues it; Python answers it with the same ASGI
//! app the Python HTTP server runs (`ServeApp`), and the answer is written as given.
//!
//! Bounds, as the Python HTTP server's (docs/serve.md#bounds): one connection over
//! `max_connections` is answered 503 and closed; a request line and headers over `max_header_size`
//! bytes are answered 431 (hyper); headers not received within `timeout` close the connection, a
//! body not received within `timeout` is answered 408; a body over `MAX_BODY` bytes is answered 413.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
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
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("content-length", HeaderValue::from(length));
    headers.insert("connection", HeaderValue::from_static("close"));
    response
}

fn seconds(duration: Duration) -> String {
    format!("{}", duration.as_secs_f64())
}

/// Queue `request` for Python and wait for its answer (at most the request timeout).
async fn decide(shared: Arc<Shared>, request: HttpRequest) -> Response<Full<Bytes>> {
    let (sender, receiver) = oneshot::channel();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let first = {
        let mut state = shared.state.lock().unwrap();
        if state.waiting.len() + state.http_waiting.len() >= shared.max_pending {
            return error_response(
                503,
                &format!("more than {} requests waiting for a decision", shared.max_pending),
            );
        }
        state.http_waiting.insert(id, sender);
        state.http_queue.push((id, request));
        state.http_queue.len() == 1
    };
    if first {
        // A full socket buffer means a wake-up is pending already.
        let _ = (&shared.wake).write(&[1]);
    }
    match tokio::time::timeout(shared.request_timeout, receiver).await {
        Ok(Ok(answer)) => {
            let mut response = Response::new(Full::new(Bytes::from(answer.body)));
            *response.status_mut() =
                StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let headers = response.headers_mut();
            for (name, value) in answer.headers {
                if let (Ok(name), Ok(value)) =
                    (HeaderName::from_bytes(&name), HeaderValue::from_bytes(&value))
                {
                    headers.append(name, value);
                }
            }
            response
        }
        Ok(Err(_)) => error_response(500, "the decision was dropped"),
        Err(_) => {
            shared.state.lock().unwrap().http_waiting.remove(&id);
            error_response(
                503,
                &format!("no decision within {} seconds", seconds(shared.request_timeout)),
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
    timeout: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
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
async fn refuse(mut stream: tokio::net::TcpStream, message: String) {
    let body = json_error(503, &message);
    let mut out = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(&out)).await;
    let _ = stream.shutdown().await;
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
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.timeout)
        .max_header_size(bounds.max_header_size)
        .max_headers(MAX_HEADERS)
        .auto_date_header(false);
    let builder = Arc::new(builder);
    let permits = Arc::new(Semaphore::new(bounds.max_connections));
    let max_connections = bounds.max_connections;
    let timeout = bounds.timeout;
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
            let local = stream.local_addr().unwrap_or(peer);
            let shared = shared.clone();
            let builder = builder.clone();
            let mut stop = stop.clone();
            let live = live.clone();
            live.fetch_add(1, Ordering::AcqRel);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    handle(shared.clone(), request, peer, local, timeout)
                });
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                tokio::pin!(connection);
                let stopped = *stop.borrow();
                if stopped {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                } else {
                    tokio::select! {
                        _ = connection.as_mut() => {}
                        _ = stop.changed() => {
                            connection.as_mut().graceful_shutdown();
                            let _ = connection.await;
                        }
                    }
                }
                drop(permit);
                live.fetch_sub(1, Ordering::AcqRel);
            });
        }
        live.fetch_sub(1, Ordering::AcqRel);
    });
    Ok(())
}
