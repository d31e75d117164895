//! What a gRPC connection and its calls may hold on the compiled front door: a permit of the
//! connection cap, a deadline for HTTP/2's preface and SETTINGS, and the bytes of calls still being
//! received, counted against the connection's budget and the worker's.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Buf;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;
use tonic::codegen::{Body, StdError};
use tonic::Status;

/// Bounds on what calls still being received may hold, counted from their headers to their
/// message's last byte: each counts `STREAM_BYTES` plus the bytes it sent.
#[derive(Clone, Copy)]
pub struct BodyBounds {
    pub per_connection: usize,
    pub per_worker: usize,
}

/// What a call counts while it is received (an HTTP/2 stream's state and its tonic task).
pub const STREAM_BYTES: usize = 8 * 1024;

/// Bytes of unfinished request bodies: of one connection (its `ConnectInfo`) or of the worker.
#[derive(Clone, Default)]
pub struct Budget(Arc<AtomicUsize>);

impl Budget {
    /// Add `bytes` unless that passes `bound`.
    pub fn charge(&self, bytes: usize, bound: usize) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= bound).then_some(held + bytes)
            })
            .is_ok()
    }
    pub fn release(&self, bytes: usize) {
        self.0.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A call's request body, counted against its connection's and the worker's budgets until it is
/// dropped (tonic drops it once the message is decoded, before the decision).
pub struct Counted<B> {
    body: Pin<Box<B>>,
    connection: Budget,
    worker: Budget,
    bounds: BodyBounds,
    held: usize,
}

impl<B> Counted<B> {
    /// Count a new call, or say why it is refused: a budget is spent.
    pub fn new(
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

/// A connection holding one of `max_connections` permits for as long as it is open, and the
/// budget of its calls being received.
pub struct Limited {
    pub stream: tokio::net::TcpStream,
    pub _permit: OwnedSemaphorePermit,
    pub handshake: Option<Handshake>,
    pub budget: Budget,
}

/// The HTTP/2 client preface (24 bytes) and the header of the SETTINGS frame that must follow it.
pub const HEAD: usize = 24 + 9;

/// Until the client's preface and its first frame (SETTINGS) have arrived whole: a read that would
/// wait past `deadline` fails instead, so hyper closes the connection and frees its permit.
pub struct Handshake {
    pub deadline: Pin<Box<Sleep>>,
    pub head: [u8; HEAD],
    pub seen: usize,
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
