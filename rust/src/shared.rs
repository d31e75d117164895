//! What the front door's three protocols share: one queue each (`queue.rs`) under one lock, the
//! socket pair that wakes Python's event loop, and the bounds every queued gRPC or HTTP request
//! counts against (`QueueBounds`).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration as StdDuration;

use tokio::sync::oneshot;

use crate::grpc_service::Answer;
use crate::proto::RateLimitRequest;
use crate::queue::Queue;
use crate::{http, spoe, spoe_conn};

/// The requests of each protocol, queued or being decided.
pub struct State {
    pub grpc: Queue<RateLimitRequest, oneshot::Sender<Answer>>,
    pub http: Queue<http::HttpRequest, oneshot::Sender<http::HttpAnswer>>,
    pub spoe: Queue<spoe::SpoeRequest, spoe_conn::Pending>,
    /// Messages Python was deciding when their connection ended (their decisions are cancelled).
    pub spoe_dropped: Vec<u64>,
    /// How connections ended badly, for Python's log: (`error` or `timeout`, why); at most
    /// `MAX_SPOE_NOTES` wait.
    pub spoe_notes: Vec<(&'static str, String)>,
}

/// Notes of ended SPOE connections kept for Python's log between two of its wake-ups.
pub const MAX_SPOE_NOTES: usize = 1024;

impl State {
    /// Why a gRPC or HTTP request of `bytes` may not be queued now: the worker holds `max_pending`
    /// requests, or their bytes and these would pass `max_pending_bytes`.
    pub fn full(&self, shared: &Shared, bytes: usize) -> Option<String> {
        let bounds = &shared.bounds;
        if self.grpc.len() + self.http.len() >= bounds.max_pending {
            return Some(format!(
                "more than {} requests waiting for a decision",
                bounds.max_pending
            ));
        }
        if self.grpc.bytes() + self.http.bytes() + bytes > bounds.max_pending_bytes {
            return Some(format!(
                "more than {} bytes of requests waiting for a decision",
                bounds.max_pending_bytes
            ));
        }
        None
    }
}

/// The bounds of the gRPC and HTTP requests queued or being decided (the settings' `queue`).
#[derive(Clone, Copy)]
pub struct QueueBounds {
    /// Requests, over both protocols; more are refused at once.
    pub max_pending: usize,
    /// Their bytes (`weight`s); more are refused at once.
    pub max_pending_bytes: usize,
    /// From a request's start to its answer.
    pub request_timeout: StdDuration,
}

impl QueueBounds {
    /// A front door with no gRPC or HTTP door (SPOE only): nothing may be queued.
    pub const NONE: QueueBounds = QueueBounds {
        max_pending: 0,
        max_pending_bytes: 0,
        request_timeout: StdDuration::ZERO,
    };
}

pub struct Shared {
    pub state: Mutex<State>,
    pub next_id: AtomicU64,
    pub wake: UnixStream,
    pub bounds: QueueBounds,
}

impl Shared {
    /// Shared state for `bounds`, waking Python through `wake`.
    pub fn new(wake: UnixStream, bounds: QueueBounds) -> Self {
        Shared {
            state: Mutex::new(State {
                grpc: Queue::default(),
                http: Queue::default(),
                spoe: Queue::default(),
                spoe_dropped: Vec::new(),
                spoe_notes: Vec::new(),
            }),
            next_id: AtomicU64::new(0),
            wake,
            bounds,
        }
    }

    /// Write the wake-up byte (a full socket buffer means one is pending already).
    pub fn wake(&self) {
        let _ = (&self.wake).write(&[1]);
    }
}

/// A duration as the messages give it, in seconds (`10`, `0.5`).
pub fn seconds(duration: StdDuration) -> String {
    format!("{}", duration.as_secs_f64())
}
