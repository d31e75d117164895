//! Envoy's `RateLimitService.ShouldRateLimit` over gRPC: the listening socket, the connection cap
//! and handshake deadline (`grpc_limits.rs`), and tonic's server running the service
//! (`grpc_service.rs`) until the front door closes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use pyo3::exceptions::PyOSError;
use pyo3::PyResult;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::grpc_limits::{BodyBounds, Budget, Handshake, Limited, HEAD};
use crate::grpc_service::RlsServer;
use crate::shared::Shared;

/// The gRPC server's bounds (the settings' `grpc`).
#[derive(Clone, Copy)]
pub struct GrpcBounds {
    pub max_message_size: usize,
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_connections: usize,
    pub handshake_timeout: StdDuration,
    pub receiving: BodyBounds,
}

/// Where the gRPC server listens (the settings' `grpc`).
pub struct GrpcSettings {
    pub address: SocketAddr,
    /// SO_REUSEPORT: several workers on one port.
    pub reuse_port: bool,
    pub bounds: GrpcBounds,
    /// Answer every well-formed call at once, as an allowed one, without asking Python: the least
    /// this door can do for a call (the gateway bench's floor), never a limiter.
    pub fixed_ok: bool,
}

/// Serve `ShouldRateLimit` as `settings` say until the returned sender is sent to (or dropped): the
/// port bound, and that sender. `serving` is true from now until the server has stopped.
pub fn serve(
    runtime: &tokio::runtime::Runtime,
    shared: Arc<Shared>,
    settings: &GrpcSettings,
    serving: Arc<AtomicBool>,
) -> PyResult<(u16, oneshot::Sender<()>)> {
    let listener = listen(runtime, settings.address, settings.reuse_port)?;
    let bound = listener.local_addr()?.port();
    let (sender, stopped) = oneshot::channel::<()>();
    let server = RlsServer::new(shared, &settings.bounds, settings.fixed_ok);
    let (connections, incoming) = mpsc::channel::<std::io::Result<Limited>>(64);
    runtime.spawn(accept(listener, settings.bounds, connections));
    serving.store(true, Ordering::Release);
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
        serving.store(false, Ordering::Release);
    });
    Ok((bound, sender))
}

/// The listening socket on `address`.
fn listen(
    runtime: &tokio::runtime::Runtime,
    address: SocketAddr,
    reuse_port: bool,
) -> PyResult<tokio::net::TcpListener> {
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
    Ok(socket.listen(1024)?)
}

/// Accept connections for tonic: one over `max_connections` is closed at once; each other must send
/// HTTP/2's preface and SETTINGS within `handshake_timeout`.
async fn accept(
    listener: tokio::net::TcpListener,
    bounds: GrpcBounds,
    connections: mpsc::Sender<std::io::Result<Limited>>,
) {
    let permits = Arc::new(Semaphore::new(bounds.max_connections));
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
            deadline: Box::pin(tokio::time::sleep(bounds.handshake_timeout)),
            head: [0; HEAD],
            seen: 0,
        };
        let limited = Limited {
            stream,
            _permit: permit,
            handshake: Some(handshake),
            budget: Budget::default(),
        };
        if connections.send(Ok(limited)).await.is_err() {
            return;
        }
    }
}
