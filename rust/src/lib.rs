//! ratewarden serve's compiled front door: Envoy's `ShouldRateLimit` over gRPC.
//!
//! Rust (tonic on its own tokio runtime) owns the connections, HTTP/2 and protobuf; the
//! decision stays the one Python decision core. Requests wait in a queue; the first request
//! into an empty queue writes a byte to a socket pair whose reading end Python's event loop
//! watches. Python then takes every queued request at once (`Front.take`, one GIL crossing per
//! batch), decides them, and hands the answers back in one call (`Front.answer`). The tokio side
//! never takes the GIL.
//!
//! With `http_fd`, it serves the HTTP check API too (`http.rs`): hyper (HTTP/1.1) reads each
//! request on that listening socket and queues it; Python takes them with `take_http` and answers
//! them with `answer_http`, through the same socket-pair wake-up.
//!
//! With `spoe_fd`, it serves HAProxy's SPOE agent protocol (`spoe.rs`): tokio reads the SPOP
//! frames on that listening socket and queues each NOTIFY's message; Python takes them with
//! `take_spoe` and answers each with its SET-VAR actions (`answer_spoe`).

#![allow(clippy::result_large_err)] // tonic::Status is the error type of every gRPC call

mod http;
mod proto;
mod queue;
mod spoe;

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration as StdDuration;

use bytes::Buf;
use prost::Message;
use proto::*;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple};
use queue::Queue;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::codegen::{empty_body, http as tonic_http, Body, BoxFuture, Service, StdError};
use tonic::{Code, Status};

const UINT32_MAX: u64 = u32::MAX as u64;
const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const UNITS_LISTED: &str = "SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR";

type Answer = Result<RateLimitResponse, Status>;

struct State {
    grpc: Queue<RateLimitRequest, oneshot::Sender<Answer>>,
    http: Queue<http::HttpRequest, oneshot::Sender<http::HttpAnswer>>,
    spoe: Queue<spoe::SpoeRequest, spoe::Pending>,
    /// Messages Python was deciding when their connection ended (their decisions are cancelled).
    spoe_dropped: Vec<u64>,
    /// How connections ended badly, for Python's log: (`error` or `timeout`, why); at most
    /// `MAX_SPOE_NOTES` wait.
    spoe_notes: Vec<(&'static str, String)>,
}

/// Notes of ended SPOE connections kept for Python's log between two of its wake-ups.
const MAX_SPOE_NOTES: usize = 1024;

impl State {
    /// Why a gRPC or HTTP request of `bytes` may not be queued now: the worker holds `max_pending`
    /// requests, or their bytes and these would pass `max_pending_bytes`.
    fn full(&self, shared: &Shared, bytes: usize) -> Option<String> {
        if self.grpc.len() + self.http.len() >= shared.max_pending {
            return Some(format!(
                "more than {} requests waiting for a decision",
                shared.max_pending
            ));
        }
        if self.grpc.bytes() + self.http.bytes() + bytes > shared.max_pending_bytes {
            return Some(format!(
                "more than {} bytes of requests waiting for a decision",
                shared.max_pending_bytes
            ));
        }
        None
    }
}

struct Shared {
    state: Mutex<State>,
    next_id: AtomicU64,
    wake: UnixStream,
    max_descriptors: usize,
    max_entries: usize,
    max_pending: usize,
    max_pending_bytes: usize,
    request_timeout: StdDuration,
}

/// Bytes a decoded gRPC request holds: its encoding, and the allocations of its strings.
fn weight(request: &RateLimitRequest) -> usize {
    let entries: usize = request.descriptors.iter().map(|d| d.entries.len()).sum();
    256 + request.encoded_len() + 64 * request.descriptors.len() + 64 * entries
}

impl Shared {
    /// Write the wake-up byte (a full socket buffer means one is pending already).
    fn wake(&self) {
        let _ = (&self.wake).write(&[1]);
    }

    /// Refuse what the decision core would refuse for its size or shape before queueing it,
    /// with the same messages (`RateLimitService.check_size`, `request_from_proto`).
    fn check(&self, request: &RateLimitRequest) -> Result<(), Status> {
        let descriptors = request.descriptors.len();
        if descriptors > self.max_descriptors {
            return Err(Status::invalid_argument(format!(
                "a request may carry at most {} descriptors, got {}",
                self.max_descriptors, descriptors
            )));
        }
        let entries: usize = request.descriptors.iter().map(|d| d.entries.len()).sum();
        if entries > self.max_entries {
            return Err(Status::invalid_argument(format!(
                "a request may carry at most {} entries in all, got {}",
                self.max_entries, entries
            )));
        }
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            if let Some(limit) = &descriptor.limit {
                if unit_name(limit.unit).is_none() {
                    return Err(Status::invalid_argument(format!(
                        "descriptor {index}: limit override unit must be one of {UNITS_LISTED}, got {}",
                        limit.unit
                    )));
                }
            }
        }
        Ok(())
    }

    /// Queue `request` for a decision and wait for it until `deadline`: the sooner of the call's
    /// arrival plus `request_timeout` and the caller's own (`grpc-timeout`, `callers`). A request
    /// whose caller gave up (this future dropped: the call was reset) or whose deadline passed
    /// leaves the queue, so `take` never hands it to Python.
    async fn decide(self: Arc<Self>, request: RateLimitRequest, deadline: Deadline) -> Answer {
        self.check(&request)?;
        let bytes = weight(&request);
        let (sender, receiver) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let first = {
            let mut state = self.state.lock().unwrap();
            if let Some(why) = state.full(&self, bytes) {
                return Err(Status::resource_exhausted(why));
            }
            state.grpc.push(id, request, sender, bytes, deadline.at)
        };
        let mut leave = Leave(&self, Some(id));
        if first {
            self.wake();
        }
        match tokio::time::timeout_at(deadline.at, receiver).await {
            Ok(Ok(answer)) => {
                leave.1 = None; // `answer` took it out
                answer
            }
            Ok(Err(_)) if Instant::now() < deadline.at => {
                Err(Status::internal("the decision was dropped"))
            }
            _ => Err(self.deadline_status(deadline)),
        }
    }

    fn deadline_status(&self, deadline: Deadline) -> Status {
        if deadline.callers {
            caller_deadline()
        } else {
            Status::deadline_exceeded(format!(
                "no decision within {:.3} s",
                self.request_timeout.as_secs_f64()
            ))
        }
    }
}

/// A gRPC call's deadline, from its headers' arrival: `callers` when the caller's `grpc-timeout`
/// set it (shorter than the server's request timeout).
#[derive(Clone, Copy)]
struct Deadline {
    at: Instant,
    callers: bool,
}

fn caller_deadline() -> Status {
    Status::deadline_exceeded("the caller's deadline (grpc-timeout) passed before a decision")
}

/// Takes a request out of `waiting` when its `decide` ends unanswered or is dropped.
struct Leave<'a>(&'a Shared, Option<u64>);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if let (Some(id), Ok(mut state)) = (self.1, self.0.state.lock()) {
            state.grpc.remove(id);
        }
    }
}

/// The caller's `grpc-timeout` header (gRPC over HTTP/2: at most 8 digits and a unit, H M S m u n);
/// `None` when absent or malformed (then only `request_timeout` applies, as tonic does).
fn grpc_timeout(headers: &tonic_http::HeaderMap) -> Option<StdDuration> {
    let text = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => StdDuration::from_secs(value * 3600),
        "M" => StdDuration::from_secs(value * 60),
        "S" => StdDuration::from_secs(value),
        "m" => StdDuration::from_millis(value),
        "u" => StdDuration::from_micros(value),
        "n" => StdDuration::from_nanos(value),
        _ => return None,
    })
}

/// `envoy.service.ratelimit.v3.RateLimitService`, as tonic-build would generate it.
#[derive(Clone)]
struct RlsServer {
    shared: Arc<Shared>,
    max_message_size: usize,
    /// Bytes of unfinished request bodies of the whole worker, and the bounds of both budgets.
    receiving: Budget,
    bounds: BodyBounds,
}

/// Bounds on what calls still being received may hold, counted from their headers to their
/// message's last byte: each counts `STREAM_BYTES` plus the bytes it sent.
#[derive(Clone, Copy)]
struct BodyBounds {
    per_connection: usize,
    per_worker: usize,
}

/// What a call counts while it is received (an HTTP/2 stream's state and its tonic task).
const STREAM_BYTES: usize = 8 * 1024;

/// Bytes of unfinished request bodies: of one connection (its `ConnectInfo`) or of the worker.
#[derive(Clone, Default)]
struct Budget(Arc<AtomicUsize>);

impl Budget {
    /// Add `bytes` unless that passes `bound`.
    fn charge(&self, bytes: usize, bound: usize) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= bound).then_some(held + bytes)
            })
            .is_ok()
    }
    fn release(&self, bytes: usize) {
        self.0.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A call's request body, counted against its connection's and the worker's budgets until it is
/// dropped (tonic drops it once the message is decoded, before the decision).
struct Counted<B> {
    body: Pin<Box<B>>,
    connection: Budget,
    worker: Budget,
    bounds: BodyBounds,
    held: usize,
}

impl<B> Counted<B> {
    /// Count a new call, or say why it is refused: a budget is spent.
    fn new(
        body: B,
        connection: Budget,
        worker: Budget,
        bounds: BodyBounds,
    ) -> Result<Self, Status> {
        let mut counted = Counted {
            body: Box::pin(body),
            connection,
            worker,
            bounds,
            held: 0,
        };
        counted.charge(STREAM_BYTES)?;
        Ok(counted)
    }

    fn charge(&mut self, bytes: usize) -> Result<(), Status> {
        if !self.connection.charge(bytes, self.bounds.per_connection) {
            return Err(Status::resource_exhausted(format!(
                "this connection's calls being received hold more than {} bytes",
                self.bounds.per_connection
            )));
        }
        if !self.worker.charge(bytes, self.bounds.per_worker) {
            self.connection.release(bytes);
            return Err(Status::resource_exhausted(format!(
                "calls being received hold more than {} bytes in this worker",
                self.bounds.per_worker
            )));
        }
        self.held += bytes;
        Ok(())
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        self.connection.release(self.held);
        self.worker.release(self.held);
    }
}

impl<B> Body for Counted<B>
where
    B: Body,
    B::Error: Into<StdError>,
{
    type Data = B::Data;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, StdError>>> {
        let this = &mut *self;
        match this.body.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(status) = this.charge(data.remaining()) {
                        return Poll::Ready(Some(Err(Box::new(status))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
}

struct ShouldRateLimit(Arc<Shared>);

impl tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<tonic::Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let shared = self.0.clone();
        let deadline = request.extensions().get::<Deadline>().copied();
        Box::pin(async move {
            let deadline = deadline.ok_or_else(|| Status::internal("a call without a deadline"))?;
            shared
                .decide(request.into_inner(), deadline)
                .await
                .map(tonic::Response::new)
        })
    }
}

impl<B> Service<tonic_http::Request<B>> for RlsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = tonic_http::Response<tonic::body::BoxBody>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic_http::Request<B>) -> Self::Future {
        if request.uri().path() != METHOD {
            return Box::pin(async move {
                let mut response = tonic_http::Response::new(empty_body());
                let headers = response.headers_mut();
                headers.insert("grpc-status", (Code::Unimplemented as i32).into());
                headers.insert(
                    tonic_http::header::CONTENT_TYPE,
                    tonic_http::HeaderValue::from_static("application/grpc"),
                );
                Ok(response)
            });
        }
        // The call's deadline counts from here: receiving its message, waiting and its decision.
        let server = self.shared.request_timeout;
        let caller = grpc_timeout(request.headers());
        let deadline = Deadline {
            at: Instant::now() + caller.map_or(server, |t| t.min(server)),
            callers: caller.is_some_and(|t| t < server),
        };
        let (mut parts, body) = request.into_parts();
        parts.extensions.insert(deadline);
        let connection = parts
            .extensions
            .get::<Budget>()
            .cloned()
            .unwrap_or_default();
        let body = match Counted::new(body, connection, self.receiving.clone(), self.bounds) {
            Ok(body) => body,
            Err(status) => return Box::pin(async move { Ok(status.into_http()) }),
        };
        let request = tonic_http::Request::from_parts(parts, body);
        let shared = self.shared.clone();
        let size = self.max_message_size;
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic::codec::ProstCodec::default())
                .apply_max_message_size_config(Some(size), None);
            let unary = grpc.unary(ShouldRateLimit(shared.clone()), request);
            // Past the deadline the call's future is dropped, and with it its body: the stream is
            // reset and what it had sent is freed, whether or not its message was complete.
            let Ok(mut response) = tokio::time::timeout_at(deadline.at, unary).await else {
                return Ok(shared.deadline_status(deadline).into_http());
            };
            // tonic answers a message over the limit OUT_OF_RANGE (gRPC's servers: RESOURCE_EXHAUSTED),
            // and bytes that are no RateLimitRequest INTERNAL (the Python door: INVALID_ARGUMENT); the
            // message is percent-encoded.
            let headers = response.headers_mut();
            let code = match headers.get("grpc-status").map(|value| value.as_bytes()) {
                Some(b"11") => Some(Code::ResourceExhausted),
                Some(b"13")
                    if headers.get("grpc-message").is_some_and(|m| {
                        m.as_bytes().starts_with(b"failed%20to%20decode%20Protobuf")
                    }) =>
                {
                    Some(Code::InvalidArgument)
                }
                _ => None,
            };
            if let Some(code) = code {
                headers.insert("grpc-status", (code as i32).into());
            }
            Ok(response)
        })
    }
}

impl tonic::server::NamedService for RlsServer {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

/// A connection holding one of `max_connections` permits for as long as it is open, and the
/// budget of its calls being received.
struct Limited {
    stream: tokio::net::TcpStream,
    _permit: OwnedSemaphorePermit,
    handshake: Option<Handshake>,
    budget: Budget,
}

/// The HTTP/2 client preface (24 bytes) and the header of the SETTINGS frame that must follow it.
const HEAD: usize = 24 + 9;

/// Until the client's preface and its first frame (SETTINGS) have arrived whole: a read that would
/// wait past `deadline` fails instead, so hyper closes the connection and frees its permit.
struct Handshake {
    deadline: Pin<Box<Sleep>>,
    head: [u8; HEAD],
    seen: usize,
}

impl Handshake {
    /// Count `bytes` read; true once the preface and the whole first frame are in.
    fn saw(&mut self, bytes: &[u8]) -> bool {
        if self.seen < HEAD {
            let n = (HEAD - self.seen).min(bytes.len());
            self.head[self.seen..self.seen + n].copy_from_slice(&bytes[..n]);
        }
        self.seen += bytes.len();
        let length = u32::from_be_bytes([0, self.head[24], self.head[25], self.head[26]]) as usize;
        self.seen >= HEAD && self.seen >= HEAD + length
    }
}

impl tonic::transport::server::Connected for Limited {
    type ConnectInfo = Budget;
    fn connect_info(&self) -> Budget {
        self.budget.clone()
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some(handshake) = &mut this.handshake else {
            return poll;
        };
        match &poll {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if read.is_empty() || handshake.saw(read) {
                    this.handshake = None;
                }
            }
            Poll::Pending if handshake.deadline.as_mut().poll(cx).is_ready() => {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no HTTP/2 preface and SETTINGS within the handshake timeout",
                )));
            }
            _ => {}
        }
        poll
    }
}

impl AsyncWrite for Limited {
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

/// The gRPC front door: serves on its own threads from construction until `stop()`.
///
/// Args:
///     descriptor_class: Called as `descriptor_class(entries, limit, hits_addend)` for each
///         request descriptor (ratewarden's `RequestDescriptor`).
///     host, port: Where to listen for gRPC (port 0: any free port; `port` tells which; None: no gRPC).
///     reuse_port: Set SO_REUSEPORT (several workers on one port).
///     max_message_size: Largest request, bytes (more: RESOURCE_EXHAUSTED, unread).
///     max_descriptors, max_entries: Per request (more: INVALID_ARGUMENT, never queued).
///     max_connections: Open connections (more are closed at once).
///     handshake_timeout: Seconds for a new connection to send HTTP/2's preface and SETTINGS (then
///         it is closed, freeing its place under `max_connections`).
///     max_pending: Requests queued or being decided (more: RESOURCE_EXHAUSTED).
///     request_timeout: Seconds from a request's start to its answer (then DEADLINE_EXCEEDED); a
///         caller's shorter `grpc-timeout` applies instead.
///     threads: tokio worker threads.
///     http_fd: A listening socket to serve the HTTP check API on (duplicated; None: no HTTP).
///     http_max_connections, http_max_header_size, http_timeout, http_keep_alive: The HTTP bounds
///         (`http.rs`).
///     spoe_fd: A listening socket to serve HAProxy's SPOE agent protocol on (duplicated; None: no SPOE).
///     spoe_max_connections, spoe_max_frame_size, spoe_timeout_hello, spoe_timeout_idle,
///     spoe_timeout_frame, spoe_message, spoe_max_in_flight, spoe_max_buffered: The SPOE bounds
///         (`spoe.rs`, as `SpoeAgent`'s).
#[pyclass(module = "ratewarden._front")]
struct Front {
    shared: Arc<Shared>,
    reader: UnixStream,
    descriptor_class: PyObject,
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: Option<oneshot::Sender<()>>,
    serving: Arc<AtomicBool>,
    http_stop: Option<watch::Sender<bool>>,
    http_live: Arc<AtomicUsize>,
    spoe_stop: Option<watch::Sender<bool>>,
    #[pyo3(get)]
    port: u16,
}

#[pymethods]
impl Front {
    #[new]
    #[pyo3(signature = (descriptor_class, host="127.0.0.1", port=0, *, reuse_port=false,
        max_message_size=1<<20, max_descriptors=256, max_entries=1024, max_connections=1000,
        handshake_timeout=5.0, max_pending=10000, max_pending_bytes=32<<20, max_receiving=32<<20,
        max_receiving_per_connection=4<<20, request_timeout=10.0, threads=1, http_fd=None, http_max_connections=1000,
        http_max_header_size=65536, http_timeout=10.0, http_keep_alive=5.0, spoe_fd=None,
        spoe_max_connections=256, spoe_max_frame_size=16380, spoe_timeout_hello=5.0,
        spoe_timeout_idle=120.0, spoe_timeout_frame=5.0, spoe_message="check",
        spoe_max_in_flight=256, spoe_max_buffered=1<<20, spoe_max_bytes_in_flight=256<<10,
        spoe_max_bytes=32<<20, spoe_timeout_processing=1.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        descriptor_class: PyObject,
        host: &str,
        port: Option<u16>,
        reuse_port: bool,
        max_message_size: usize,
        max_descriptors: usize,
        max_entries: usize,
        max_connections: usize,
        handshake_timeout: f64,
        max_pending: usize,
        max_pending_bytes: usize,
        max_receiving: usize,
        max_receiving_per_connection: usize,
        request_timeout: f64,
        threads: usize,
        http_fd: Option<i32>,
        http_max_connections: usize,
        http_max_header_size: usize,
        http_timeout: f64,
        http_keep_alive: f64,
        spoe_fd: Option<i32>,
        spoe_max_connections: usize,
        spoe_max_frame_size: u64,
        spoe_timeout_hello: f64,
        spoe_timeout_idle: f64,
        spoe_timeout_frame: f64,
        spoe_message: &str,
        spoe_max_in_flight: usize,
        spoe_max_buffered: usize,
        spoe_max_bytes_in_flight: usize,
        spoe_max_bytes: usize,
        spoe_timeout_processing: f64,
    ) -> PyResult<Self> {
        for (name, value) in [
            ("handshake_timeout", handshake_timeout),
            ("http_timeout", http_timeout),
            ("http_keep_alive", http_keep_alive),
            ("spoe_timeout_hello", spoe_timeout_hello),
            ("spoe_timeout_idle", spoe_timeout_idle),
            ("spoe_timeout_frame", spoe_timeout_frame),
            ("spoe_timeout_processing", spoe_timeout_processing),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return Err(PyValueError::new_err(format!(
                    "{name} must be a positive number of seconds, got {value}"
                )));
            }
        }
        if http_max_connections == 0 || http_max_header_size == 0 {
            return Err(PyValueError::new_err(
                "http_max_connections and http_max_header_size must be at least 1",
            ));
        }
        if spoe_max_connections == 0 || spoe_max_in_flight == 0 {
            return Err(PyValueError::new_err(
                "spoe_max_connections and spoe_max_in_flight must be at least 1",
            ));
        }
        let grpc = port.is_some();
        let port = port.unwrap_or(0);
        if !(request_timeout > 0.0 && request_timeout.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "request_timeout must be a positive number of seconds, got {request_timeout}"
            )));
        }
        if threads == 0 || max_connections == 0 || max_pending == 0 {
            return Err(PyValueError::new_err(
                "threads, max_connections and max_pending must be at least 1",
            ));
        }
        for (name, value, least) in [
            ("max_pending_bytes", max_pending_bytes, 2 * max_message_size),
            ("max_receiving", max_receiving, max_receiving_per_connection),
            (
                "max_receiving_per_connection",
                max_receiving_per_connection,
                max_message_size + 64 * 1024,
            ),
            (
                "spoe_max_bytes_in_flight",
                spoe_max_bytes_in_flight,
                2 * spoe_max_frame_size as usize,
            ),
            ("spoe_max_bytes", spoe_max_bytes, spoe_max_bytes_in_flight),
        ] {
            if value < least {
                return Err(PyValueError::new_err(format!(
                    "{name} must be at least {least} bytes, got {value}"
                )));
            }
        }
        let address: SocketAddr = format!(
            "{}:{}",
            if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]")
            } else {
                host.to_string()
            },
            port
        )
        .parse()
        .map_err(|e| PyValueError::new_err(format!("bad address {host}:{port}: {e}")))?;
        let (reader, wake) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        reader.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                grpc: Queue::default(),
                http: Queue::default(),
                spoe: Queue::default(),
                spoe_dropped: Vec::new(),
                spoe_notes: Vec::new(),
            }),
            next_id: AtomicU64::new(0),
            wake,
            max_descriptors,
            max_entries,
            max_pending,
            max_pending_bytes,
            request_timeout: StdDuration::from_secs_f64(request_timeout),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("ratewarden-front")
            .enable_all()
            .build()?;
        let serving = Arc::new(AtomicBool::new(false));
        let mut bound = 0;
        let mut shutdown = None;
        if grpc {
            let listener = {
                let _entered = runtime.enter();
                let socket = if address.is_ipv4() {
                    tokio::net::TcpSocket::new_v4()?
                } else {
                    tokio::net::TcpSocket::new_v6()?
                };
                socket.set_reuseaddr(true)?;
                if reuse_port {
                    socket.set_reuseport(true)?;
                }
                socket.bind(address).map_err(|e| {
                    PyOSError::new_err(format!("cannot listen for gRPC on {address}: {e}"))
                })?;
                socket.listen(1024)?
            };
            bound = listener.local_addr()?.port();
            let (sender, stopped) = oneshot::channel::<()>();
            shutdown = Some(sender);
            let server = RlsServer {
                shared: shared.clone(),
                max_message_size,
                receiving: Budget::default(),
                bounds: BodyBounds {
                    per_connection: max_receiving_per_connection,
                    per_worker: max_receiving,
                },
            };
            let permits = Arc::new(Semaphore::new(max_connections));
            let handshake_timeout = StdDuration::from_secs_f64(handshake_timeout);
            let (connections, incoming) =
                tokio::sync::mpsc::channel::<std::io::Result<Limited>>(64);
            runtime.spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        drop(stream); // over max_connections: closed at once
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let handshake = Handshake {
                        deadline: Box::pin(tokio::time::sleep(handshake_timeout)),
                        head: [0; HEAD],
                        seen: 0,
                    };
                    if connections
                        .send(Ok(Limited {
                            stream,
                            _permit: permit,
                            handshake: Some(handshake),
                            budget: Budget::default(),
                        }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
            serving.store(true, Ordering::Release);
            let server_running = serving.clone();
            runtime.spawn(async move {
                let result = tonic::transport::Server::builder()
                    .max_concurrent_streams(Some(1024))
                    .http2_max_header_list_size(Some(64 * 1024))
                    .http2_keepalive_interval(Some(StdDuration::from_secs(60)))
                    .http2_keepalive_timeout(Some(StdDuration::from_secs(20)))
                    .add_service(server)
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::ReceiverStream::new(incoming),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await;
                if let Err(error) = result {
                    eprintln!("ratewarden._front: gRPC server stopped: {error}");
                }
                server_running.store(false, Ordering::Release);
            });
        }
        let http_live = Arc::new(AtomicUsize::new(0));
        let mut http_stop = None;
        if let Some(fd) = http_fd {
            // SAFETY: the caller's socket stays open for this call; it is duplicated, not taken.
            let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
            let listener = std::net::TcpListener::from(owned);
            let (stop_sender, stop_receiver) = watch::channel(false);
            http::spawn(
                &runtime,
                shared.clone(),
                listener,
                http::HttpBounds {
                    max_connections: http_max_connections,
                    max_header_size: http_max_header_size,
                    timeout: StdDuration::from_secs_f64(http_timeout),
                    keep_alive: StdDuration::from_secs_f64(http_keep_alive),
                },
                http_live.clone(),
                stop_receiver,
            )?;
            http_stop = Some(stop_sender);
        }
        let mut spoe_stop = None;
        if let Some(fd) = spoe_fd {
            // SAFETY: the caller's socket stays open for this call; it is duplicated, not taken.
            let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
            let (stop_sender, stop_receiver) = watch::channel(false);
            spoe::spawn(
                &runtime,
                shared.clone(),
                std::net::TcpListener::from(owned),
                spoe::SpoeBounds {
                    max_connections: spoe_max_connections,
                    max_frame_size: spoe_max_frame_size,
                    timeout_hello: StdDuration::from_secs_f64(spoe_timeout_hello),
                    timeout_idle: StdDuration::from_secs_f64(spoe_timeout_idle),
                    timeout_frame: StdDuration::from_secs_f64(spoe_timeout_frame),
                    message: spoe_message.to_string(),
                    max_in_flight: spoe_max_in_flight,
                    max_buffered: spoe_max_buffered,
                    max_bytes_in_flight: spoe_max_bytes_in_flight,
                    timeout_processing: StdDuration::from_secs_f64(spoe_timeout_processing),
                },
                Arc::new(Semaphore::new(spoe_max_bytes)),
                stop_receiver,
            )?;
            spoe_stop = Some(stop_sender);
        }
        let _ = py;
        Ok(Front {
            shared,
            reader,
            descriptor_class,
            runtime: Some(runtime),
            shutdown,
            serving,
            http_stop,
            http_live,
            spoe_stop,
            port: bound,
        })
    }

    /// The file descriptor that becomes readable when requests wait (watch it with
    /// `loop.add_reader`; read it empty with `drain()` before `take()`).
    fn fileno(&self) -> i32 {
        self.reader.as_raw_fd()
    }

    /// Read the wake-up socket empty.
    fn drain(&self) {
        let mut buffer = [0u8; 256];
        while let Ok(n) = std::io::Read::read(&mut (&self.reader), &mut buffer) {
            if n < buffer.len() {
                break;
            }
        }
    }

    /// Up to `limit` waiting requests, oldest first, as `(id, domain, descriptors, hits_addend,
    /// seconds left)`: the seconds until the request's deadline, when Rust answers it
    /// DEADLINE_EXCEEDED (stop deciding it then: nothing may be charged for it). A request past its
    /// deadline, or whose caller left, is never handed out.
    #[pyo3(signature = (limit=usize::MAX))]
    fn take<'py>(&self, py: Python<'py>, limit: usize) -> PyResult<Bound<'py, PyList>> {
        let now = Instant::now();
        let batch = self.shared.state.lock().unwrap().grpc.take(limit, now);
        let out = PyList::empty(py);
        let class = self.descriptor_class.bind(py);
        for (id, request, deadline) in batch {
            let descriptors = PyList::empty(py);
            for descriptor in &request.descriptors {
                let entries = PyTuple::new(
                    py,
                    descriptor
                        .entries
                        .iter()
                        .map(|e| PyTuple::new(py, [e.key.as_str(), e.value.as_str()]).unwrap()),
                )?;
                let limit = match &descriptor.limit {
                    Some(l) => (l.requests_per_unit, unit_name(l.unit).unwrap_or(""))
                        .into_pyobject(py)?
                        .into_any(),
                    None => py.None().into_bound(py),
                };
                let hits = match &descriptor.hits_addend {
                    Some(h) => h.value.into_pyobject(py)?.into_any(),
                    None => py.None().into_bound(py),
                };
                descriptors.append(class.call1((entries, limit, hits))?)?;
            }
            let left = deadline.saturating_duration_since(now).as_secs_f64();
            out.append((id, request.domain, descriptors, request.hits_addend, left))?;
        }
        Ok(out)
    }

    /// Answer requests: each item `(id, answer)` where `answer` is an `RlsAnswer`, or
    /// `(code, message)` for a gRPC error (3 INVALID_ARGUMENT, 14 UNAVAILABLE, 13 INTERNAL...).
    fn answer(&self, py: Python<'_>, items: &Bound<'_, PyList>) -> PyResult<()> {
        let mut answers: Vec<(u64, Answer)> = Vec::with_capacity(items.len());
        for item in items.iter() {
            let (id, answer): (u64, Bound<'_, PyAny>) = item.extract()?;
            let converted = if answer.is_instance_of::<PyTuple>() {
                match answer.extract::<(i32, String)>() {
                    Ok((code, message)) => Err(Status::new(Code::from_i32(code), message)),
                    Err(error) => Err(Status::internal(format!("bad error answer: {error}"))),
                }
            } else {
                to_response(py, &answer)
                    .map_err(|error| Status::internal(format!("bad answer: {error}")))
            };
            answers.push((id, converted));
        }
        let mut state = self.shared.state.lock().unwrap();
        for (id, answer) in answers {
            if let Some(sender) = state.grpc.remove(id) {
                let _ = sender.send(answer);
            }
        }
        Ok(())
    }

    /// Up to `limit` waiting HTTP requests, oldest first, as
    /// `(id, method, target, headers, (peer host, peer port), (local host, local port), body)`;
    /// `headers` is a list of `(name, value)` bytes, names in lowercase.
    #[pyo3(signature = (limit=usize::MAX))]
    fn take_http<'py>(&self, py: Python<'py>, limit: usize) -> PyResult<Bound<'py, PyList>> {
        let batch = self
            .shared
            .state
            .lock()
            .unwrap()
            .http
            .take(limit, Instant::now());
        let out = PyList::empty(py);
        for (id, request, _) in batch {
            let headers = PyList::empty(py);
            for (name, value) in request.headers.iter() {
                headers.append((
                    PyBytes::new(py, name.as_str().as_bytes()),
                    PyBytes::new(py, value.as_bytes()),
                ))?;
            }
            let peer = (
                request.peer.ip().to_canonical().to_string(),
                request.peer.port(),
            );
            let local = (
                request.local.ip().to_canonical().to_string(),
                request.local.port(),
            );
            out.append((
                id,
                request.method,
                request.target,
                headers,
                peer,
                local,
                PyBytes::new(py, &request.body),
            ))?;
        }
        Ok(out)
    }

    /// Answer HTTP requests: each item `(id, status, headers, body)`, `headers` the complete list
    /// of `(name, value)` bytes.
    fn answer_http(&self, items: &Bound<'_, PyList>) -> PyResult<()> {
        let mut answers: Vec<(u64, http::HttpAnswer)> = Vec::with_capacity(items.len());
        for item in items.iter() {
            type Pair<'a> = (Bound<'a, PyBytes>, Bound<'a, PyBytes>);
            let (id, status, headers, body): (u64, u16, Vec<Pair<'_>>, Bound<'_, PyBytes>) =
                item.extract()?;
            let headers = headers
                .iter()
                .map(|(name, value)| (name.as_bytes().to_vec(), value.as_bytes().to_vec()))
                .collect();
            let body = body.as_bytes().to_vec();
            answers.push((
                id,
                http::HttpAnswer {
                    status,
                    headers,
                    body,
                },
            ));
        }
        let mut state = self.shared.state.lock().unwrap();
        for (id, answer) in answers {
            if let Some(sender) = state.http.remove(id) {
                let _ = sender.send(answer);
            }
        }
        Ok(())
    }

    /// Up to `limit` waiting SPOE messages, oldest first, as `(id, args, peer host, peer port)`;
    /// `args` is a dict of the message's arguments (`spop.Value`s), or None when the NOTIFY frame
    /// has no message of the agent's name.
    #[pyo3(signature = (limit=usize::MAX))]
    fn take_spoe<'py>(&self, py: Python<'py>, limit: usize) -> PyResult<Bound<'py, PyList>> {
        let batch = self
            .shared
            .state
            .lock()
            .unwrap()
            .spoe
            .take(limit, Instant::now());
        let out = PyList::empty(py);
        let mut addresses: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = None;
        for (id, request, _) in batch {
            let args = match request.args {
                None => py.None().into_bound(py),
                Some(args) => {
                    let dict = PyDict::new(py);
                    for (name, value) in args {
                        let value = spoe_value(py, value, &mut addresses)?;
                        dict.set_item(name, value)?;
                    }
                    dict.into_any()
                }
            };
            out.append((id, args, request.peer.ip().to_string(), request.peer.port()))?;
        }
        Ok(out)
    }

    /// Answer SPOE messages: each item `(id, actions)`, `actions` a list of encoded SET-VAR
    /// actions (`spop.set_var`), framed here as the NOTIFY's ACK and written on this thread when
    /// the socket takes it at once (else by the connection's writer task).
    fn answer_spoe(&self, py: Python<'_>, items: &Bound<'_, PyList>) -> PyResult<()> {
        let mut answers: Vec<(u64, Vec<Vec<u8>>)> = Vec::with_capacity(items.len());
        for item in items.iter() {
            let (id, actions): (u64, Vec<Bound<'_, PyBytes>>) = item.extract()?;
            answers.push((id, actions.iter().map(|a| a.as_bytes().to_vec()).collect()));
        }
        let found: Vec<(spoe::Pending, Vec<Vec<u8>>)> = {
            let mut state = self.shared.state.lock().unwrap();
            answers
                .into_iter()
                .filter_map(|(id, actions)| state.spoe.remove(id).map(|p| (p, actions)))
                .collect()
        };
        py.allow_threads(|| {
            for (pending, actions) in found {
                pending.answer(&actions);
            }
        });
        Ok(())
    }

    /// What happened to SPOE connections since the last call: the ids of the messages Python was
    /// deciding when their connection ended (cancel them: nothing answers them now), and how
    /// connections ended badly, as `(kind, why)`: `error` for a frame refused, `timeout`.
    fn take_spoe_ended(&self) -> (Vec<u64>, Vec<(&'static str, String)>) {
        let mut state = self.shared.state.lock().unwrap();
        (
            std::mem::take(&mut state.spoe_dropped),
            std::mem::take(&mut state.spoe_notes),
        )
    }

    /// Requests queued and being decided.
    fn pending(&self) -> usize {
        let state = self.shared.state.lock().unwrap();
        state.grpc.len() + state.http.len() + state.spoe.len()
    }

    /// Bytes of the requests queued and being decided, as `(grpc, http, spoe)`.
    fn pending_bytes(&self) -> (usize, usize, usize) {
        let state = self.shared.state.lock().unwrap();
        (state.grpc.bytes(), state.http.bytes(), state.spoe.bytes())
    }

    /// Seconds each protocol's wake-up has waited for a `take` that empties its queue, as
    /// `(grpc, http, spoe)` (0: nothing waits). Past its request deadline, the door is stalled.
    fn stalled(&self) -> (f64, f64, f64) {
        let now = Instant::now();
        let state = self.shared.state.lock().unwrap();
        (
            state.grpc.stalled(now),
            state.http.stalled(now),
            state.spoe.stalled(now),
        )
    }

    /// False once the server has stopped after `close()`: every connection has ended, so every
    /// answer handed to `answer()` has been written.
    fn serving(&self) -> bool {
        self.serving.load(Ordering::Acquire) || self.http_live.load(Ordering::Acquire) > 0
    }

    /// Stop accepting connections and streams (HTTP/2 GOAWAY); open requests are still served,
    /// so keep deciding until `pending()` is 0, then `stop()`.
    fn close(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(stop) = &self.http_stop {
            let _ = stop.send(true);
        }
        if let Some(stop) = &self.spoe_stop {
            let _ = stop.send(true);
        }
    }

    /// Stop accepting, give open requests up to `grace` seconds, then stop the threads.
    #[pyo3(signature = (grace=5.0))]
    fn stop(&mut self, py: Python<'_>, grace: f64) -> PyResult<()> {
        self.close();
        if let Some(runtime) = self.runtime.take() {
            py.allow_threads(|| {
                runtime.shutdown_timeout(StdDuration::from_secs_f64(grace.max(0.0)))
            });
        }
        Ok(())
    }
}

/// A SPOP value as `spop.read_frame`'s decoding gives it (`addresses`: ipaddress's two classes,
/// imported on first use).
fn spoe_value<'py>(
    py: Python<'py>,
    value: spoe::Value,
    addresses: &mut Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut address = |raw: &[u8], v6: bool| -> PyResult<Bound<'py, PyAny>> {
        if addresses.is_none() {
            let module = py.import("ipaddress")?;
            *addresses = Some((
                module.getattr("IPv4Address")?,
                module.getattr("IPv6Address")?,
            ));
        }
        let (v4_class, v6_class) = addresses.as_ref().unwrap();
        (if v6 { v6_class } else { v4_class }).call1((PyBytes::new(py, raw),))
    };
    Ok(match value {
        spoe::Value::Null => py.None().into_bound(py),
        spoe::Value::Bool(flag) => PyBool::new(py, flag).to_owned().into_any(),
        spoe::Value::Int(number) => number.into_pyobject(py)?.into_any(),
        spoe::Value::UInt(number) => number.into_pyobject(py)?.into_any(),
        spoe::Value::Ipv4(raw) => address(&raw, false)?,
        spoe::Value::Ipv6(raw) => address(&raw, true)?,
        spoe::Value::Bin(raw) => PyBytes::new(py, &raw).into_any(),
        spoe::Value::Str(raw) => match std::str::from_utf8(&raw) {
            Ok(text) => PyString::new(py, text).into_any(),
            Err(_) => PyBytes::new(py, &raw)
                .call_method1(intern!(py, "decode"), ("utf-8", "surrogateescape"))?,
        },
    })
}

fn to_response(py: Python<'_>, answer: &Bound<'_, PyAny>) -> PyResult<RateLimitResponse> {
    let overall_ok: bool = answer.getattr(intern!(py, "overall_ok"))?.extract()?;
    let statuses_obj = answer.getattr(intern!(py, "statuses"))?;
    let mut statuses = Vec::new();
    for status in statuses_obj.try_iter()? {
        let status = status?;
        let code_obj = status.getattr(intern!(py, "code"))?;
        let code = if code_obj.extract::<&str>()? == "OK" {
            CODE_OK
        } else {
            CODE_OVER_LIMIT
        };
        let remaining: i128 = status.getattr(intern!(py, "limit_remaining"))?.extract()?;
        let limit_remaining = remaining.clamp(0, UINT32_MAX as i128) as u32;
        let current = status.getattr(intern!(py, "current_limit"))?;
        if current.is_none() {
            statuses.push(DescriptorStatus {
                code,
                current_limit: None,
                limit_remaining,
                duration_until_reset: None,
            });
            continue;
        }
        let unit_text = current.getattr(intern!(py, "unit"))?;
        let unit = unit_number(unit_text.extract::<&str>()?)
            .ok_or_else(|| PyValueError::new_err(format!("unknown unit {unit_text}")))?;
        let reset: f64 = status
            .getattr(intern!(py, "duration_until_reset"))?
            .extract()?;
        statuses.push(DescriptorStatus {
            code,
            current_limit: Some(RateLimit {
                name: current.getattr(intern!(py, "name"))?.extract()?,
                requests_per_unit: current
                    .getattr(intern!(py, "requests_per_unit"))?
                    .extract()?,
                unit,
            }),
            limit_remaining,
            duration_until_reset: Some(Duration {
                seconds: reset.ceil().max(0.0) as i64,
                nanos: 0,
            }),
        });
    }
    let mut headers = Vec::new();
    for pair in answer.getattr(intern!(py, "headers"))?.try_iter()? {
        let (key, value): (String, String) = pair?.extract()?;
        headers.push(HeaderValue { key, value });
    }
    Ok(RateLimitResponse {
        overall_code: if overall_ok { CODE_OK } else { CODE_OVER_LIMIT },
        statuses,
        response_headers_to_add: headers,
    })
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// `ratewarden._front`: built into the ratewarden wheel by setup.py (setuptools-rust).
#[pymodule]
fn _front(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Front>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
