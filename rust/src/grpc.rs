//! Envoy's `RateLimitService.ShouldRateLimit` over gRPC (tonic): the calls' deadlines from their
//! headers, the bytes of calls still being received bounded per connection and per worker, the
//! connection cap and handshake deadline, and each decoded request queued for Python.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration as StdDuration;

use prost::Message;
use pyo3::exceptions::PyOSError;
use pyo3::PyResult;
use tokio::sync::{oneshot, Semaphore};
use tokio::time::Instant;
use tonic::codegen::{empty_body, http as tonic_http, Body, BoxFuture, Service, StdError};
use tonic::{Code, Status};

use crate::grpc_limits::{BodyBounds, Budget, Counted, Handshake, Limited, HEAD};
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

impl Shared {
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

/// The gRPC server's bounds (`Front`'s arguments).
pub struct GrpcBounds {
    pub max_message_size: usize,
    pub max_connections: usize,
    pub handshake_timeout: StdDuration,
    pub receiving: BodyBounds,
}

/// Serve `ShouldRateLimit` on `address` until the returned sender is sent to (or dropped): the port
/// bound, and that sender. `serving` is true from now until the server has stopped.
pub fn serve(
    runtime: &tokio::runtime::Runtime,
    shared: Arc<Shared>,
    address: SocketAddr,
    reuse_port: bool,
    bounds: GrpcBounds,
    serving: Arc<AtomicBool>,
) -> PyResult<(u16, oneshot::Sender<()>)> {
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
        socket
            .bind(address)
            .map_err(|e| PyOSError::new_err(format!("cannot listen for gRPC on {address}: {e}")))?;
        socket.listen(1024)?
    };
    let bound = listener.local_addr()?.port();
    let (sender, stopped) = oneshot::channel::<()>();
    let server = RlsServer {
        shared,
        max_message_size: bounds.max_message_size,
        receiving: Budget::default(),
        bounds: bounds.receiving,
    };
    let permits = Arc::new(Semaphore::new(bounds.max_connections));
    let handshake_timeout = bounds.handshake_timeout;
    let (connections, incoming) = tokio::sync::mpsc::channel::<std::io::Result<Limited>>(64);
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
    let server_running = serving;
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

    Ok((bound, sender))
}
