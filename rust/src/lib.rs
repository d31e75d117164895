//! ratewarden serve's compiled front door: Envoy's `ShouldRateLimit` over gRPC, the HTTP check API
//! and HAProxy's SPOE agent protocol, each decided by the one Python decision core in batches.
//!
//! Rust (on its own tokio runtime) owns the connections and the protocols; the decision stays in
//! Python. Requests wait in one queue per protocol (`queue.rs`, under one lock: `shared.rs`); the
//! first request into an empty queue writes a byte to a socket pair whose reading end Python's
//! event loop watches. Python then takes every queued request at once (one GIL crossing per
//! batch), decides them, and hands the answers back in one call, in one batch shape for the three
//! protocols (`batch.rs`). The tokio side never takes the GIL.
//!
//! The modules, by role:
//! - the Python class and its settings: `front.rs`, `settings.rs`, `batch.rs`;
//! - the one queue and its wake-up: `queue.rs`, `shared.rs`;
//! - the gRPC service: `grpc.rs` (server), `grpc_service.rs`, `grpc_limits.rs`, `proto.rs`,
//!   `grpc_python.rs`;
//! - HTTP: `http.rs` (server and connections), `http_service.rs`, `http_stream.rs`,
//!   `http_answers.rs`, `http_scan.rs`, `http_syntax.rs`, `http_python.rs`;
//! - the SPOP codec: `spop.rs`, `spop_hello.rs`;
//! - the SPOE agent: `spoe.rs`, `spoe_conn.rs`, `spoe_python.rs`.

#![allow(clippy::result_large_err)] // tonic::Status is the error type of every gRPC call

mod batch;
mod front;
mod grpc;
mod grpc_limits;
mod grpc_python;
mod grpc_service;
mod http;
mod http_answers;
mod http_python;
mod http_scan;
mod http_service;
mod http_stream;
mod http_syntax;
mod proto;
mod queue;
mod settings;
mod shared;
mod spoe;
mod spoe_conn;
mod spoe_python;
mod spop;
mod spop_hello;

use pyo3::prelude::*;

/// `ratewarden._front`: built into the ratewarden wheel by setup.py (setuptools-rust).
#[pymodule]
fn _front(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<front::Front>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
