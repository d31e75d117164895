//! A compiled HTTP connection's stream as hyper reads and writes it (`Tracked`): each byte read goes
//! through `Scan` (marking where each request's head begins, and refusing what the Python server
//! refuses), and hyper's own error answers are replaced by the Python server's; `Phase` tells the
//! connection's loop (`http.rs`) which deadline applies.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use crate::http::MAX_HEADERS;
use crate::http_answers::{raw_error, HYPER_400, HYPER_414, HYPER_431, INVALID_REQUEST};
use crate::http_scan::Scan;

/// Where one connection is: `begun` heads were begun and `dispatched` handed to `handle`; a head is
/// being received (since `since`) while more were begun than handed, or before the first one (since
/// the connection's start); else the connection is idle since `since` (its last answer) once no
/// request is `in_flight` (past its head: reading its body, or waiting for its answer).
pub struct Phase {
    pub begun: u64,
    pub dispatched: u64,
    pub since: Instant,
    pub in_flight: u32,
    /// A request the Python server refuses was read (`Scan`): answer `INVALID_REQUEST` and close.
    pub refused: bool,
    /// An answer to an HTTP/1.0 request is about to be written: its status line's version to patch.
    pub http10: bool,
}

impl Phase {
    pub fn receiving(&self) -> bool {
        self.begun == 0 || self.begun > self.dispatched
    }
}

/// A connection's phase, and a signal to its loop (`connection`) when the phase changes its
/// deadline: its last answer given, or a request refused.
pub struct PhaseCell {
    pub phase: Mutex<Phase>,
    pub changed: Notify,
}

/// The sizes of `Tracked`'s answers to an oversized head.
#[derive(Clone, Copy)]
struct HeadBounds {
    max_header_size: usize,
    head_limit: usize,
}

/// A connection's stream: its bytes read go through `Scan` (marking the start of each request's
/// head, and refusing what the Python server refuses), and hyper's own error answers written are
/// replaced by the Python server's.
pub struct Tracked {
    stream: tokio::net::TcpStream,
    cell: Arc<PhaseCell>,
    scan: Scan,
    bounds: HeadBounds,
    /// An answer being written in place of hyper's: its bytes, those written so far.
    replacing: Option<(Cow<'static, [u8]>, usize)>,
    /// Bytes of an HTTP/1.0 answer's status line written so far (its version patched).
    status_written: usize,
    /// A request was refused: nothing more is read.
    refused: bool,
}

impl PhaseCell {
    /// A new connection's: no head begun, since now.
    pub fn new() -> Self {
        PhaseCell {
            phase: Mutex::new(Phase {
                begun: 0,
                dispatched: 0,
                since: Instant::now(),
                in_flight: 0,
                refused: false,
                http10: false,
            }),
            changed: Notify::new(),
        }
    }
}

impl Tracked {
    /// `stream`, its phase kept in `cell`; heads of more than `max_header_size` bytes are answered 431
    /// (hyper reads at most `head_limit`).
    pub fn new(
        stream: tokio::net::TcpStream,
        cell: Arc<PhaseCell>,
        max_header_size: usize,
        head_limit: usize,
    ) -> Self {
        Tracked {
            stream,
            cell,
            scan: Scan::new(),
            bounds: HeadBounds {
                max_header_size,
                head_limit,
            },
            replacing: None,
            status_written: 0,
            refused: false,
        }
    }

    /// The Python server's answer in place of hyper's own in `buf` (the answer to a head not
    /// handed to `handle`), with any bytes before it.
    fn replacement(&self, buf: &[u8]) -> Option<Cow<'static, [u8]>> {
        let hyper = [HYPER_400, HYPER_414, HYPER_431]
            .into_iter()
            .find(|hyper| buf.ends_with(hyper))?;
        let ours: Cow<'static, [u8]> = if hyper == HYPER_431 {
            let message =
                if self.scan.fields >= MAX_HEADERS && self.scan.bytes <= self.bounds.head_limit {
                    format!("the request has more than {MAX_HEADERS} header lines")
                } else {
                    format!(
                        "the request line and headers are larger than {} bytes",
                        self.bounds.max_header_size
                    )
                };
            Cow::Owned(raw_error(431, "Request Header Fields Too Large", &message))
        } else {
            Cow::Borrowed(INVALID_REQUEST) // 400; 414: a target over 65,535 bytes is uvicorn's 400
        };
        let before = &buf[..buf.len() - hyper.len()];
        if before.is_empty() {
            return Some(ours);
        }
        let mut out = before.to_vec();
        out.extend_from_slice(&ours);
        Some(Cow::Owned(out))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.cell.phase.lock().unwrap()
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.refused {
            return Poll::Pending; // `connection` is answering and closing
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            let fed = self.scan.feed(&buf.filled()[before..]);
            if fed.refused {
                // hyper never sees it: `connection` answers as the Python server and closes
                buf.set_filled(before);
                self.refused = true;
                self.lock().refused = true;
                self.cell.changed.notify_one();
                return Poll::Pending;
            }
            if fed.begun > 0 {
                let mut phase = self.lock();
                phase.begun += fed.begun;
                phase.since = Instant::now();
            }
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.replacing.is_none() {
            let (undispatched, http10) = {
                let phase = this.lock();
                (phase.begun > phase.dispatched, phase.http10)
            };
            if undispatched {
                if let Some(replacement) = this.replacement(buf) {
                    this.replacing = Some((replacement, 0));
                }
            } else if http10 {
                // hyper answers HTTP/1.0 with an HTTP/1.0 status line, uvicorn with HTTP/1.1
                const STATUS: &[u8] = b"HTTP/1.0 ";
                let done = this.status_written;
                if done < STATUS.len() && buf.starts_with(&STATUS[done..]) {
                    let mut patched = [0u8; 1024];
                    let len = buf.len().min(patched.len());
                    patched[..len].copy_from_slice(&buf[..len]);
                    if done <= 7 {
                        patched[7 - done] = b'1';
                    }
                    let written =
                        ready!(Pin::new(&mut this.stream).poll_write(cx, &patched[..len]))?;
                    this.status_written += written;
                    if this.status_written >= STATUS.len() {
                        this.status_written = 0;
                        this.lock().http10 = false;
                    }
                    return Poll::Ready(Ok(written));
                }
            }
        }
        if let Some((bytes, written)) = &mut this.replacing {
            while *written < bytes.len() {
                match ready!(Pin::new(&mut this.stream).poll_write(cx, &bytes[*written..])) {
                    Ok(0) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
                    Ok(n) => *written += n,
                    Err(error) => return Poll::Ready(Err(error)),
                }
            }
            this.replacing = None;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    // Not vectored: hyper then writes each answer from one buffer, which `poll_write` can read.
}

/// Marks a request past its head for as long as it is handled (dropped: answered or abandoned).
pub struct InFlight(Arc<PhaseCell>);

impl InFlight {
    pub fn new(cell: Arc<PhaseCell>) -> Self {
        {
            let mut phase = cell.phase.lock().unwrap();
            phase.in_flight += 1;
            phase.dispatched += 1;
        }
        InFlight(cell)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut phase = self.0.phase.lock().unwrap();
        phase.in_flight -= 1;
        if phase.in_flight == 0 {
            if !phase.receiving() {
                phase.since = Instant::now(); // idle from the answer on
            }
            drop(phase);
            self.0.changed.notify_one(); // the connection's deadline is now `since`'s
        }
    }
}
