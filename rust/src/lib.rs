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

mod convert;
mod grpc;
mod grpc_limits;
mod http;
mod http_scan;
mod proto;
mod queue;
mod shared;
mod spoe;
mod spop;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use convert::{spoe_value, to_response};
use grpc::Answer;
use proto::*;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use queue::Queue;
use shared::{Shared, State};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::time::Instant;
use tonic::{Code, Status};

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
        spoe_max_in_flight=256, spoe_max_buffered=1<<20, spoe_max_bytes_in_flight=64<<10,
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
            let bounds = grpc::GrpcBounds {
                max_message_size,
                max_connections,
                handshake_timeout: StdDuration::from_secs_f64(handshake_timeout),
                receiving: grpc_limits::BodyBounds {
                    per_connection: max_receiving_per_connection,
                    per_worker: max_receiving,
                },
            };
            let (port, stop) = grpc::serve(
                &runtime,
                shared.clone(),
                address,
                reuse_port,
                bounds,
                serving.clone(),
            )?;
            bound = port;
            shutdown = Some(stop);
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
