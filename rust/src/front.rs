//! `ratewarden._front.Front`, the Python class: it starts the protocols its settings name
//! (`settings.rs`) on its own tokio runtime, hands Python the queued requests in batches and takes
//! their answers (`batch.rs`), and stops.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::settings::Settings;
use crate::shared::Shared;
use crate::spoe_python::Addresses;
use crate::{batch, grpc, grpc_python, http, http_python, spoe, spoe_python};

/// The compiled front door: serves on its own threads from construction until `stop()`.
///
/// Args:
///     descriptor_class: Called as `descriptor_class(entries, limit, hits_addend)` for each gRPC
///         request descriptor (ratewarden's `RequestDescriptor`).
///     settings: What to serve, and within which bounds: a dict with a dict for each protocol
///         served (`grpc`, `http`, `spoe`), the `queue`'s bounds, and `threads` (tokio's worker
///         threads, 1 when not given). Each key is required, and each bound comes from
///         `ratewarden.serve.bounds` (the list: rust/src/settings.rs).
#[pyclass(module = "ratewarden._front")]
pub struct Front {
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

impl Front {
    /// Start serving as `settings` say.
    fn start(descriptor_class: PyObject, settings: Settings) -> PyResult<Self> {
        let (reader, wake) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        reader.set_nonblocking(true)?;
        let shared = Arc::new(Shared::new(wake, settings.queue));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(settings.threads)
            .thread_name("ratewarden-front")
            .enable_all()
            .build()?;
        let serving = Arc::new(AtomicBool::new(false));
        let (mut port, mut shutdown) = (0, None);
        if let Some(grpc) = &settings.grpc {
            let (bound, stop) = grpc::serve(&runtime, shared.clone(), grpc, serving.clone())?;
            (port, shutdown) = (bound, Some(stop));
        }
        let http_live = Arc::new(AtomicUsize::new(0));
        let mut http_stop = None;
        if let Some(http) = &settings.http {
            let (stop, stopped) = watch::channel(false);
            http::spawn(&runtime, shared.clone(), http, http_live.clone(), stopped)?;
            http_stop = Some(stop);
        }
        let mut spoe_stop = None;
        if let Some(spoe) = settings.spoe {
            let (stop, stopped) = watch::channel(false);
            spoe::spawn(&runtime, shared.clone(), spoe, stopped)?;
            spoe_stop = Some(stop);
        }
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
            port,
        })
    }
}

#[pymethods]
impl Front {
    #[new]
    fn new(descriptor_class: PyObject, settings: &Bound<'_, PyDict>) -> PyResult<Self> {
        Front::start(descriptor_class, Settings::from_dict(settings)?)
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
        let class = self.descriptor_class.bind(py);
        batch::take(
            py,
            &self.shared,
            |s| &mut s.grpc,
            limit,
            |id, request, left| grpc_python::request(class, id, request, left),
        )
    }

    /// Answer requests: each item `(id, answer)` where `answer` is an `RlsAnswer`, or
    /// `(code, message)` for a gRPC error (3 INVALID_ARGUMENT, 14 UNAVAILABLE, 13 INTERNAL...).
    fn answer(&self, items: &Bound<'_, PyList>) -> PyResult<()> {
        batch::send(&self.shared, |s| &mut s.grpc, items, grpc_python::answer)
    }

    /// Up to `limit` waiting HTTP requests, oldest first, as
    /// `(id, method, target, headers, (peer host, peer port), (local host, local port), body)`;
    /// `headers` is a list of `(name, value)` bytes, names in lowercase.
    #[pyo3(signature = (limit=usize::MAX))]
    fn take_http<'py>(&self, py: Python<'py>, limit: usize) -> PyResult<Bound<'py, PyList>> {
        batch::take(
            py,
            &self.shared,
            |s| &mut s.http,
            limit,
            |id, request, _| http_python::request(py, id, request),
        )
    }

    /// Answer HTTP requests: each item `(id, status, headers, body)`, `headers` the complete list
    /// of `(name, value)` bytes.
    fn answer_http(&self, items: &Bound<'_, PyList>) -> PyResult<()> {
        batch::send(&self.shared, |s| &mut s.http, items, http_python::answer)
    }

    /// Up to `limit` waiting SPOE messages, oldest first, as `(id, args, peer host, peer port)`;
    /// `args` is a dict of the message's arguments (`spop.Value`s), or None when the NOTIFY frame
    /// has no message of the agent's name.
    #[pyo3(signature = (limit=usize::MAX))]
    fn take_spoe<'py>(&self, py: Python<'py>, limit: usize) -> PyResult<Bound<'py, PyList>> {
        let mut addresses: Addresses<'py> = None;
        batch::take(
            py,
            &self.shared,
            |s| &mut s.spoe,
            limit,
            |id, request, _| spoe_python::request(py, &mut addresses, id, request),
        )
    }

    /// Answer SPOE messages: each item `(id, actions)`, `actions` a list of encoded SET-VAR
    /// actions (`spop.set_var`), framed here as the NOTIFY's ACK and written on this thread when
    /// the socket takes it at once (else by the connection's writer task).
    fn answer_spoe(&self, py: Python<'_>, items: &Bound<'_, PyList>) -> PyResult<()> {
        let found = batch::answer(&self.shared, |s| &mut s.spoe, items, spoe_python::answer)?;
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
