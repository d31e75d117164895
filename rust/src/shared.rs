//! What the front door's three protocols share: one queue each (`queue.rs`) under one lock, the
//! socket pair that wakes Python's event loop, and the bounds every queued request counts against.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration as StdDuration;

use tokio::sync::oneshot;

use crate::grpc::Answer;
use crate::proto::RateLimitRequest;
use crate::queue::Queue;
use crate::{http, spoe};

/// The requests of each protocol, queued or being decided.
pub struct State {
    pub grpc: Queue<RateLimitRequest, oneshot::Sender<Answer>>,
    pub http: Queue<http::HttpRequest, oneshot::Sender<http::HttpAnswer>>,
    pub spoe: Queue<spoe::SpoeRequest, spoe::Pending>,
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

pub struct Shared {
    pub state: Mutex<State>,
    pub next_id: AtomicU64,
    pub wake: UnixStream,
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_pending: usize,
    pub max_pending_bytes: usize,
    pub request_timeout: StdDuration,
}

impl Shared {
    /// Write the wake-up byte (a full socket buffer means one is pending already).
    pub fn wake(&self) {
        let _ = (&self.wake).write(&[1]);
    }
}
