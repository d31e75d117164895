//! The front door's settings, as `Front(descriptor_class, settings)` is given them: a dict with a
//! dict for each protocol it serves (`grpc`, `http`, `spoe`), the bounds of the gRPC and HTTP
//! requests queued (`queue`), and `threads`. Every bound comes from Python (`serve/bounds.py`,
//! through `serve/front.py`, `front_http.py` and `front_spoe.py`): none has a default here, so
//! none can disagree with Python's. A setting missing or unknown is a ValueError.
//!
//! `queue`: `max_pending`, `max_pending_bytes`, `request_timeout` (needed with `grpc` or `http`).
//! `grpc`: `host`, `port` (0: any free port), `reuse_port`, `max_message_size`, `max_descriptors`,
//! `max_entries`, `max_connections`, `handshake_timeout`, `max_receiving`,
//! `max_receiving_per_connection`; `fixed_ok` (optional) answers every call allowed without asking
//! Python: the gateway bench's floor.
//! `http`: `fd` (a listening socket, duplicated), `max_connections`, `max_header_size`, `timeout`,
//! `keep_alive`.
//! `spoe`: `fd`, `max_connections`, `max_frame_size`, `timeout_hello`, `timeout_idle`,
//! `timeout_frame`, `message`, `max_in_flight`, `max_buffered`, `max_bytes_in_flight`,
//! `max_bytes`, `timeout_processing`.
//! `threads`: tokio's worker threads (1 when not given: not a bound).

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::grpc::{GrpcBounds, GrpcSettings};
use crate::grpc_limits::BodyBounds;
use crate::http::{HttpBounds, HttpSettings};
use crate::shared::QueueBounds;
use crate::spoe::{SpoeBounds, SpoeSettings};

/// What the front door serves, and within which bounds.
pub struct Settings {
    pub threads: usize,
    pub queue: QueueBounds,
    pub grpc: Option<GrpcSettings>,
    pub http: Option<HttpSettings>,
    pub spoe: Option<SpoeSettings>,
}

impl Settings {
    /// The settings `dict` gives, checked.
    pub fn from_dict(dict: &Bound<'_, PyDict>) -> PyResult<Self> {
        let mut top = Section::new("", dict.clone());
        let threads = match top.optional::<usize>("threads")? {
            Some(threads) => at_least("threads", threads, 1)?,
            None => 1,
        };
        let grpc = top.section("grpc")?.map(grpc).transpose()?;
        let http = top.section("http")?.map(http).transpose()?;
        let spoe = top.section("spoe")?.map(spoe).transpose()?;
        let queue = match top.section("queue")? {
            Some(section) => queue(section, grpc.as_ref())?,
            None if grpc.is_some() || http.is_some() => return Err(missing("queue")),
            None => QueueBounds::NONE,
        };
        top.finish()?;
        Ok(Settings {
            threads,
            queue,
            grpc,
            http,
            spoe,
        })
    }
}

/// A listening socket Python gave, for `runtime` (duplicated: the caller's stays open, and its own).
pub fn listener(
    runtime: &tokio::runtime::Runtime,
    fd: i32,
) -> std::io::Result<tokio::net::TcpListener> {
    // SAFETY: the caller's socket stays open for this call (`Front`'s construction); it is
    // duplicated, not taken.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    let listener = std::net::TcpListener::from(owned);
    listener.set_nonblocking(true)?;
    let _entered = runtime.enter();
    tokio::net::TcpListener::from_std(listener)
}

fn queue(mut section: Section<'_>, grpc: Option<&GrpcSettings>) -> PyResult<QueueBounds> {
    let bounds = QueueBounds {
        max_pending: section.count("max_pending")?,
        max_pending_bytes: section.get("max_pending_bytes")?,
        request_timeout: section.seconds("request_timeout")?,
    };
    if let Some(grpc) = grpc {
        let least = 2 * grpc.bounds.max_message_size; // two of the largest requests fit
        at_least("queue.max_pending_bytes", bounds.max_pending_bytes, least)?;
    }
    section.finish()?;
    Ok(bounds)
}

fn grpc(mut section: Section<'_>) -> PyResult<GrpcSettings> {
    let host: String = section.get("host")?;
    let port: u16 = section.get("port")?;
    let bracketed = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    let address: SocketAddr = format!("{bracketed}:{port}")
        .parse()
        .map_err(|e| PyValueError::new_err(format!("bad address {host}:{port}: {e}")))?;
    let max_message_size: usize = section.get("max_message_size")?;
    let per_connection: usize = section.get("max_receiving_per_connection")?;
    let per_worker: usize = section.get("max_receiving")?;
    let settings = GrpcSettings {
        address,
        reuse_port: section.get("reuse_port")?,
        fixed_ok: section.optional("fixed_ok")?.unwrap_or(false),
        bounds: GrpcBounds {
            max_message_size,
            max_descriptors: section.get("max_descriptors")?,
            max_entries: section.get("max_entries")?,
            max_connections: section.count("max_connections")?,
            handshake_timeout: section.seconds("handshake_timeout")?,
            receiving: BodyBounds {
                per_connection,
                per_worker,
            },
        },
    };
    let least = max_message_size + 64 * 1024; // a whole message, and its frames' overhead
    at_least("grpc.max_receiving_per_connection", per_connection, least)?;
    at_least("grpc.max_receiving", per_worker, per_connection)?;
    section.finish()?;
    Ok(settings)
}

fn http(mut section: Section<'_>) -> PyResult<HttpSettings> {
    let settings = HttpSettings {
        fd: section.get("fd")?,
        bounds: HttpBounds {
            max_connections: section.count("max_connections")?,
            max_header_size: section.count("max_header_size")?,
            timeout: section.seconds("timeout")?,
            keep_alive: section.seconds("keep_alive")?,
        },
    };
    section.finish()?;
    Ok(settings)
}

fn spoe(mut section: Section<'_>) -> PyResult<SpoeSettings> {
    let max_frame_size: u64 = section.get("max_frame_size")?;
    let bounds = SpoeBounds {
        max_connections: section.count("max_connections")?,
        max_frame_size,
        timeout_hello: section.seconds("timeout_hello")?,
        timeout_idle: section.seconds("timeout_idle")?,
        timeout_frame: section.seconds("timeout_frame")?,
        message: section.get("message")?,
        max_in_flight: section.count("max_in_flight")?,
        max_buffered: section.get("max_buffered")?,
        max_bytes_in_flight: section.get("max_bytes_in_flight")?,
        timeout_processing: section.seconds("timeout_processing")?,
    };
    let least = 2 * max_frame_size as usize; // two of the largest frames fit
    at_least(
        "spoe.max_bytes_in_flight",
        bounds.max_bytes_in_flight,
        least,
    )?;
    let max_bytes: usize = section.get("max_bytes")?;
    at_least("spoe.max_bytes", max_bytes, bounds.max_bytes_in_flight)?;
    let fd = section.get("fd")?;
    section.finish()?;
    Ok(SpoeSettings {
        fd,
        bounds,
        max_bytes,
    })
}

/// `value`, when it is at least `least`.
fn at_least(name: &str, value: usize, least: usize) -> PyResult<usize> {
    if value < least {
        return Err(PyValueError::new_err(format!(
            "{name} must be at least {least}, got {value}"
        )));
    }
    Ok(value)
}

fn missing(name: &str) -> PyErr {
    PyValueError::new_err(format!("the front door's settings lack {name}"))
}

/// One dict of the settings, and the keys read from it (any other is unknown).
struct Section<'py> {
    name: &'static str,
    dict: Bound<'py, PyDict>,
    read: Vec<&'static str>,
}

impl<'py> Section<'py> {
    fn new(name: &'static str, dict: Bound<'py, PyDict>) -> Self {
        Section {
            name,
            dict,
            read: Vec::new(),
        }
    }

    /// `key`'s full name: `grpc.port`.
    fn full(&self, key: &str) -> String {
        if self.name.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.name)
        }
    }

    fn optional<T: FromPyObject<'py>>(&mut self, key: &'static str) -> PyResult<Option<T>> {
        self.read.push(key);
        let Some(value) = self.dict.get_item(key)? else {
            return Ok(None);
        };
        value.extract().map(Some).map_err(|error| {
            let py = self.dict.py();
            let message = format!("{}: {}", self.full(key), error.value(py));
            PyErr::from_type(error.get_type(py), message)
        })
    }

    fn get<T: FromPyObject<'py>>(&mut self, key: &'static str) -> PyResult<T> {
        self.optional(key)?.ok_or_else(|| missing(&self.full(key)))
    }

    /// A positive, finite number of seconds.
    fn seconds(&mut self, key: &'static str) -> PyResult<Duration> {
        let value: f64 = self.get(key)?;
        if !(value > 0.0 && value.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "{} must be a positive number of seconds, got {value}",
                self.full(key)
            )));
        }
        Ok(Duration::from_secs_f64(value))
    }

    /// A count of at least 1.
    fn count(&mut self, key: &'static str) -> PyResult<usize> {
        let value: usize = self.get(key)?;
        at_least(&self.full(key), value, 1)
    }

    fn section(&mut self, key: &'static str) -> PyResult<Option<Section<'py>>> {
        Ok(self
            .optional::<Bound<'py, PyDict>>(key)?
            .map(|dict| Section::new(key, dict)))
    }

    /// A ValueError when the dict has a key never read.
    fn finish(self) -> PyResult<()> {
        for key in self.dict.keys() {
            let key: String = key.extract()?;
            if !self.read.contains(&key.as_str()) {
                return Err(PyValueError::new_err(format!(
                    "unknown setting {} of the front door",
                    self.full(&key)
                )));
            }
        }
        Ok(())
    }
}
