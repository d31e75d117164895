//! The `envoy.service.ratelimit.v3.RateLimitService` service (tonic): each call's deadline from its
//! headers, its body counted while received (`grpc_limits.rs`), its request checked for size and
//! shape, then queued for Python and answered with Python's decision.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration as StdDuration;

use prost::Message;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::codegen::{empty_body, http as tonic_http, Body, BoxFuture, Service, StdError};
use tonic::{Code, Status};

use crate::grpc::GrpcBounds;
use crate::grpc_limits::{BodyBounds, Budget, Counted};
use crate::proto::*;
use crate::shared::Shared;

pub const UNITS_LISTED: &str = "SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR";
const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

pub type Answer = Result<RateLimitResponse, Status>;

/// Bytes a decoded gRPC request holds: its encoding, and the allocations of its strings.
fn weight(request: &RateLimitRequest) -> usize {
    let entries: usize = request.descriptors.iter().map(|d| d.entries.len()).sum();
    256 + request.encoded_len() + 64 * request.descriptors.len() + 64 * entries
}

/// The bounds on one request's shape.
#[derive(Clone, Copy)]
struct Shape {
    max_descriptors: usize,
    max_entries: usize,
}

impl Shape {
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
}

impl Shared {
    /// Queue `request` for a decision and wait for it until `deadline`: the sooner of the call's
    /// arrival plus `request_timeout` and the caller's own (`grpc-timeout`, `callers`). A request
    /// whose caller gave up (this future dropped: the call was reset) or whose deadline passed
    /// leaves the queue, so `take` never hands it to Python.
    async fn decide(
        self: Arc<Self>,
        shape: Shape,
        request: RateLimitRequest,
        deadline: Deadline,
    ) -> Answer {
        shape.check(&request)?;
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
                self.bounds.request_timeout.as_secs_f64()
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
pub struct RlsServer {
    shared: Arc<Shared>,
    max_message_size: usize,
    shape: Shape,
    /// Bytes of unfinished request bodies of the whole worker, and the bounds of both budgets.
    receiving: Budget,
    bounds: BodyBounds,
    fixed_ok: bool,
}

impl RlsServer {
    pub fn new(shared: Arc<Shared>, bounds: &GrpcBounds, fixed_ok: bool) -> Self {
        RlsServer {
            shared,
            max_message_size: bounds.max_message_size,
            shape: Shape {
                max_descriptors: bounds.max_descriptors,
                max_entries: bounds.max_entries,
            },
            receiving: Budget::default(),
            bounds: bounds.receiving,
            fixed_ok,
        }
    }
}

struct ShouldRateLimit(Arc<Shared>, Shape, bool);

/// An allowed answer for every descriptor of `request`, shaped as a counted one (a limit, what is
/// left, the time to its reset), decided by nothing: the bench's floor (`fixed_ok`).
fn fixed_ok(request: &RateLimitRequest) -> RateLimitResponse {
    let status = DescriptorStatus {
        code: CODE_OK,
        current_limit: Some(RateLimit {
            name: String::new(),
            requests_per_unit: 1_000_000_000,
            unit: 3, // HOUR
        }),
        limit_remaining: 999_999_999,
        duration_until_reset: Some(Duration {
            seconds: 3600,
            nanos: 0,
        }),
    };
    RateLimitResponse {
        overall_code: CODE_OK,
        statuses: vec![status; request.descriptors.len()],
        response_headers_to_add: Vec::new(),
    }
}

impl tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<tonic::Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let (shared, shape, fixed) = (self.0.clone(), self.1, self.2);
        let deadline = request.extensions().get::<Deadline>().copied();
        Box::pin(async move {
            if fixed {
                let request = request.into_inner();
                shape.check(&request)?;
                return Ok(tonic::Response::new(fixed_ok(&request)));
            }
            let deadline = deadline.ok_or_else(|| Status::internal("a call without a deadline"))?;
            shared
                .decide(shape, request.into_inner(), deadline)
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
        let server = self.shared.bounds.request_timeout;
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
        let (size, shape, fixed) = (self.max_message_size, self.shape, self.fixed_ok);
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic::codec::ProstCodec::default())
                .apply_max_message_size_config(Some(size), None);
            let unary = grpc.unary(ShouldRateLimit(shared.clone(), shape, fixed), request);
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
