//! HAProxy's SPOE agent on the compiled front door (`--spoe-front compiled`): tokio accepts the
//! SPOP connections, answers HAPROXY-HELLO and HAPROXY-DISCONNECT, reads each NOTIFY frame and
//! queues its `message` (decoded arguments, or none when the frame has no such message) for
//! Python, which answers with the SET-VAR actions of the Python agent (`SpoeAgent.actions`);
//! this module frames them as the ACK.
//!
//! The codec (`spop.rs`) and the bounds mirror `serve/spop.py` and `serve/spoe.py`: the same DISCONNECT
//! status codes and messages, the same frame-size negotiation (the smaller of HAProxy's and
//! `max_frame_size`, at least 256), `pipelining` as the one capability, a connection over
//! `max_connections` disconnected with status 13, `timeout_hello` / `timeout_idle` /
//! `timeout_frame` ending a connection with status 2, `max_in_flight` checks per connection,
//! an ACK cut to its status when larger than the agreed frame size, and a connection dropped
//! when its peer leaves more than `max_buffered` bytes of ACKs unread.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use crate::shared::Shared;

use crate::spop::*;

/// Bytes of ACKs waiting to be written above which no further frame is read (asyncio's
/// default write high-water mark, where the Python agent's `drain()` waits).
const HIGH_WATER: usize = 64 * 1024;

/// A NOTIFY's message waiting for Python: its arguments (None: the frame has no such message).
pub struct SpoeRequest {
    pub args: Option<Args>,
    pub peer: SocketAddr,
}

/// The agent's bounds (`SpoeAgent`'s arguments).
pub struct SpoeBounds {
    pub max_connections: usize,
    pub max_frame_size: u64,
    pub timeout_hello: Duration,
    pub timeout_idle: Duration,
    pub timeout_frame: Duration,
    pub message: String,
    pub max_in_flight: usize,
    pub max_buffered: usize,
    /// Bytes of NOTIFY frames a connection may have queued or being decided; past them no frame
    /// is read from it until answers free some.
    pub max_bytes_in_flight: usize,
    /// Seconds a message may wait in the queue; then it is dropped undecided (HAProxy has given up
    /// on it: its `timeout processing` is shorter).
    pub timeout_processing: Duration,
}

/// A message Python is deciding: where and how its ACK goes. Dropped (answered, or its connection
/// ended), it frees its connection's in-flight slot.
pub struct Pending {
    conn: Arc<Conn>,
    stream_id: u64,
    frame_id: u64,
    limit: u64,
    _permit: OwnedSemaphorePermit,
    _bytes: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

impl Pending {
    /// Send the ACK carrying `actions` (cut to the first, the status, when larger than the frame
    /// size agreed). Called on Python's thread: written at once when the socket takes it.
    pub fn answer(self, actions: &[Vec<u8>]) {
        let mut answer = ack(self.stream_id, self.frame_id, actions);
        if answer.len() as u64 - 4 > self.limit {
            answer = ack(
                self.stream_id,
                self.frame_id,
                &actions[..actions.len().min(1)],
            );
        }
        self.conn.send(answer);
    }
}

/// Frames not yet written, oldest first (`offset`: bytes of the first already written).
struct Out {
    queue: VecDeque<Vec<u8>>,
    offset: usize,
    buffered: usize,
    closed: bool,
}

/// One connection, shared by its reader, its writer task and the messages Python is deciding.
struct Conn {
    stream: tokio::net::TcpStream,
    out: Mutex<Out>,
    wake_writer: Notify,
    drained: Notify,
    killed: AtomicBool,
    kill: Notify,
    max_buffered: usize,
}

enum Step {
    Idle,
    Wrote,
    Blocked,
    Dead,
}

impl Conn {
    /// Write `frame` now if nothing waits before it and the socket takes it, else queue it for the
    /// writer task; a peer leaving more than `max_buffered` bytes unread is dropped instead.
    fn send(&self, frame: Vec<u8>) {
        let mut out = self.out.lock().unwrap();
        if out.closed {
            return;
        }
        if out.buffered > self.max_buffered {
            drop(out);
            self.abort();
            return;
        }
        let mut written = 0;
        if out.queue.is_empty() {
            while written < frame.len() {
                match self.stream.try_write(&frame[written..]) {
                    Ok(n) => written += n,
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        drop(out);
                        self.abort();
                        return;
                    }
                }
            }
            if written == frame.len() {
                return;
            }
            out.offset = written;
        }
        out.buffered += frame.len() - written;
        out.queue.push_back(frame);
        drop(out);
        self.wake_writer.notify_one();
    }

    /// Bytes queued and not yet written.
    fn buffered(&self) -> usize {
        self.out.lock().unwrap().buffered
    }

    /// Write what the queue holds, as far as the socket takes it.
    fn write_some(&self) -> Step {
        let mut out = self.out.lock().unwrap();
        if out.closed {
            return Step::Dead;
        }
        let offset = out.offset;
        let Some(frame) = out.queue.front() else {
            return Step::Idle;
        };
        match self.stream.try_write(&frame[offset..]) {
            Ok(n) => {
                out.buffered -= n;
                out.offset += n;
                if out.offset == out.queue.front().map_or(0, Vec::len) {
                    out.queue.pop_front();
                    out.offset = 0;
                }
                Step::Wrote
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => Step::Blocked,
            Err(_) => Step::Dead,
        }
    }

    /// Drop the connection at once (a peer that does not read, or a failed write).
    fn abort(&self) {
        self.killed.store(true, Ordering::Release);
        self.kill.notify_waiters();
        self.close();
    }

    /// No more writes; the socket is shut down both ways (closed when the last reference goes).
    fn close(&self) {
        let mut out = self.out.lock().unwrap();
        if out.closed {
            return;
        }
        out.closed = true;
        out.queue.clear();
        out.buffered = 0;
        drop(out);
        // SAFETY: `stream` owns the descriptor and outlives this call; ManuallyDrop leaves closing it to `stream`.
        let socket =
            ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(self.stream.as_raw_fd()) });
        let _ = socket.shutdown(std::net::Shutdown::Both);
        self.wake_writer.notify_one();
        self.drained.notify_waiters();
    }

    /// Until at most `bytes` wait to be written (the Python agent's `writer.drain()`).
    async fn drained_to(&self, bytes: usize) {
        loop {
            let notified = self.drained.notified();
            if self.buffered() <= bytes {
                return;
            }
            notified.await;
        }
    }

    async fn aborted(&self) {
        loop {
            let notified = self.kill.notified();
            if self.killed.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// The writer task: writes what `Conn::send` could not, as the socket becomes writable.
async fn write_loop(conn: Arc<Conn>) {
    loop {
        match conn.write_some() {
            Step::Wrote => conn.drained.notify_waiters(),
            Step::Idle => {
                conn.drained.notify_waiters();
                conn.wake_writer.notified().await;
            }
            Step::Blocked => {
                if conn.stream.writable().await.is_err() {
                    conn.abort();
                    return;
                }
            }
            Step::Dead => {
                if !conn.out.lock().unwrap().closed {
                    conn.abort();
                }
                return;
            }
        }
    }
}

/// Frames read from a connection's socket through a buffer (frames that arrive together are read
/// with one system call).
struct Reader {
    conn: Arc<Conn>,
    buffer: Vec<u8>,
    start: usize,
}

impl Reader {
    /// Until `count` bytes are buffered; `End::Closed` on EOF or an error.
    async fn fill(&mut self, count: usize) -> Result<(), End> {
        if self.start > 0 && self.buffer.len() - self.start < count {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        while self.buffer.len() - self.start < count {
            let have = self.buffer.len();
            let want = (count - (have - self.start)).max(READ_CHUNK);
            self.buffer.resize(have + want, 0);
            let read = loop {
                match self.conn.stream.try_read(&mut self.buffer[have..]) {
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                        if self.conn.stream.readable().await.is_err() {
                            break Err(());
                        }
                    }
                    Ok(0) | Err(_) => break Err(()),
                    Ok(n) => break Ok(n),
                }
            };
            match read {
                Ok(n) => self.buffer.truncate(have + n),
                Err(()) => {
                    self.buffer.truncate(have);
                    return Err(End::Closed);
                }
            }
        }
        Ok(())
    }

    async fn length(&mut self) -> Result<u64, End> {
        self.fill(4).await?;
        let raw: [u8; 4] = self.buffer[self.start..self.start + 4].try_into().unwrap();
        self.start += 4;
        Ok(u32::from_be_bytes(raw) as u64)
    }

    /// The next `length` bytes, taken from the buffer.
    async fn body(&mut self, length: u64) -> Result<Vec<u8>, End> {
        self.fill(length as usize).await?;
        let body = self.buffer[self.start..self.start + length as usize].to_vec();
        self.start += length as usize;
        Ok(body)
    }
}

/// Bytes asked of the socket per read (HAProxy pipelines its frames on few connections).
const READ_CHUNK: usize = 16 * 1024;

/// How a connection's reading ends.
enum End {
    /// EOF or a socket error: closed.
    Closed,
    /// A frame the agent cannot use: AGENT-DISCONNECT with its status, then closed.
    Refused(SpopError),
    /// Out of time: AGENT-DISCONNECT status 2, unless ACKs are still unwritten (then dropped).
    Timeout(String),
    /// HAPROXY-DISCONNECT with every check answered: AGENT-DISCONNECT 0, then closed.
    Normal,
    /// A health check's HELLO answered: closed.
    Health,
}

impl From<SpopError> for End {
    fn from(error: SpopError) -> Self {
        End::Refused(error)
    }
}

fn too_big(length: u64, limit: u64) -> End {
    End::Refused(error(
        3,
        format!("a frame of {length} bytes is larger than the {limit} agreed"),
    ))
}

fn seconds(duration: Duration) -> String {
    format!("{}", duration.as_secs_f64())
}

/// The HELLO exchange: the agreed frame size.
async fn hello(reader: &mut Reader, bounds: &SpoeBounds) -> Result<u64, End> {
    let length = reader.length().await?;
    if length > bounds.max_frame_size {
        return Err(too_big(length, bounds.max_frame_size));
    }
    let body = reader.body(length).await?;
    let frame = read_frame(&body)?;
    if frame.kind != HAPROXY_HELLO {
        return Err(End::Refused(error(
            4,
            format!(
                "the first frame must be HAPROXY-HELLO, got type {}",
                frame.kind
            ),
        )));
    }
    let (limit, health) = negotiate(&body[frame.payload..], bounds.max_frame_size)?;
    reader.conn.send(agent_hello(limit));
    if health {
        return Err(End::Health);
    }
    Ok(limit)
}

/// Read frames until the connection ends: the HELLO, then NOTIFY frames, each message queued for
/// Python (at most `max_in_flight` at once), until HAPROXY-DISCONNECT, EOF or an error.
async fn serve(
    shared: &Arc<Shared>,
    bounds: &SpoeBounds,
    worker_bytes: &Arc<Semaphore>,
    reader: &mut Reader,
    peer: SocketAddr,
) -> End {
    let limit = match tokio::time::timeout(bounds.timeout_hello, hello(reader, bounds)).await {
        Err(_) => {
            return End::Timeout(format!(
                "no HAPROXY-HELLO within {}s",
                seconds(bounds.timeout_hello)
            ))
        }
        Ok(Err(end)) => return end,
        Ok(Ok(limit)) => limit,
    };
    let idle = format!("no frame begun within {}s", seconds(bounds.timeout_idle));
    let slow = format!(
        "a frame not finished within {}s",
        seconds(bounds.timeout_frame)
    );
    let in_flight = Arc::new(Semaphore::new(bounds.max_in_flight));
    let connection_bytes = Arc::new(Semaphore::new(bounds.max_bytes_in_flight));
    loop {
        let conn = reader.conn.clone();
        let next = async {
            conn.drained_to(HIGH_WATER).await; // no more frames read while HAProxy leaves its answers unread
            reader.length().await
        };
        let length = match tokio::time::timeout(bounds.timeout_idle, next).await {
            Err(_) => return End::Timeout(idle),
            Ok(Err(end)) => return end,
            Ok(Ok(length)) => length,
        };
        if length > limit {
            return too_big(length, limit);
        }
        let body = match tokio::time::timeout(bounds.timeout_frame, reader.body(length)).await {
            Err(_) => return End::Timeout(slow),
            Ok(Err(end)) => return end,
            Ok(Ok(body)) => body,
        };
        let frame = match read_frame(&body) {
            Ok(frame) => frame,
            Err(error) => return End::Refused(error),
        };
        match frame.kind {
            NOTIFY => {
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    return End::Closed;
                };
                // Its bytes, from the connection's budget and then the worker's: waiting for
                // them reads no further frame from this connection (HAProxy's own queue holds them).
                let weight = (body.len() + 256).min(bounds.max_bytes_in_flight) as u32;
                let Ok(own) = connection_bytes.clone().acquire_many_owned(weight).await else {
                    return End::Closed;
                };
                let Ok(shared_bytes) = worker_bytes.clone().acquire_many_owned(weight).await else {
                    return End::Closed;
                };
                let args = match find_message(&body[frame.payload..], &bounds.message) {
                    Ok(args) => args,
                    Err(error) => return End::Refused(error),
                };
                let pending = Pending {
                    conn: reader.conn.clone(),
                    stream_id: frame.stream_id,
                    frame_id: frame.frame_id,
                    limit,
                    _permit: permit,
                    _bytes: (own, shared_bytes),
                };
                let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                let deadline = tokio::time::Instant::now() + bounds.timeout_processing;
                let request = SpoeRequest { args, peer };
                let first = shared.state.lock().unwrap().spoe.push(
                    id,
                    request,
                    pending,
                    weight as usize,
                    deadline,
                );
                if first {
                    shared.wake();
                }
            }
            HAPROXY_DISCONNECT => {
                let _ = in_flight.acquire_many(bounds.max_in_flight as u32).await;
                return End::Normal;
            }
            kind => {
                return End::Refused(error(4, format!("unexpected frame type {kind}")));
            }
        }
    }
}

/// One connection from HAProxy, from its HELLO to its end.
async fn connection(
    shared: Arc<Shared>,
    bounds: Arc<SpoeBounds>,
    worker_bytes: Arc<Semaphore>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    let conn = Arc::new(Conn {
        stream,
        out: Mutex::new(Out {
            queue: VecDeque::new(),
            offset: 0,
            buffered: 0,
            closed: false,
        }),
        wake_writer: Notify::new(),
        drained: Notify::new(),
        killed: AtomicBool::new(false),
        kill: Notify::new(),
        max_buffered: bounds.max_buffered,
    });
    let writer = tokio::spawn(write_loop(conn.clone()));
    let mut reader = Reader {
        conn: conn.clone(),
        buffer: Vec::new(),
        start: 0,
    };
    let end = tokio::select! {
        end = serve(&shared, &bounds, &worker_bytes, &mut reader, peer) => Some(end),
        _ = conn.aborted() => None,
    };
    drop(reader);
    // The messages Python is still deciding go unanswered and are cancelled, as the Python agent
    // cancels them; a connection that ended badly is logged by Python, as the Python agent does.
    let note = match &end {
        Some(End::Refused(error)) => Some(("error", error.message.clone())),
        Some(End::Timeout(why)) => Some(("timeout", why.clone())),
        _ => None,
    };
    let wake = {
        let mut state = shared.state.lock().unwrap();
        let gone = state
            .spoe
            .remove_where(|pending| Arc::ptr_eq(&pending.conn, &conn));
        let mut wake = !gone.is_empty();
        state.spoe_dropped.extend(gone);
        if let Some(note) = note {
            if state.spoe_notes.len() < crate::shared::MAX_SPOE_NOTES {
                state.spoe_notes.push(note);
                wake = true;
            }
        }
        wake
    };
    if wake {
        shared.wake();
    }
    let last = match end {
        None | Some(End::Closed) | Some(End::Health) => None,
        Some(End::Normal) => Some(agent_disconnect(0, "normal")),
        Some(End::Refused(error)) => Some(agent_disconnect(error.status, &error.message)),
        // A peer that does not read gets no DISCONNECT: no waiting for it.
        Some(End::Timeout(_)) if conn.buffered() > 0 => None,
        Some(End::Timeout(why)) => Some(agent_disconnect(2, &why)),
    };
    if let Some(last) = last {
        conn.send(last);
    }
    let _ = tokio::time::timeout(bounds.timeout_frame, conn.drained_to(0)).await;
    conn.close();
    let _ = writer.await;
}

/// Serve SPOE on `listener` until `stop` turns true (open connections go on until the runtime stops).
pub fn spawn(
    runtime: &tokio::runtime::Runtime,
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    bounds: SpoeBounds,
    worker_bytes: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let bounds = Arc::new(bounds);
    let open = Arc::new(AtomicUsize::new(0));
    runtime.spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.changed() => break,
            };
            let (mut stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(_) => {
                    // out of file descriptors, for instance: let connections end first
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let count = open.fetch_add(1, Ordering::AcqRel) + 1;
            let open = open.clone();
            if count > bounds.max_connections {
                let refusal = agent_disconnect(
                    13,
                    &format!("this agent has {} connections open", bounds.max_connections),
                );
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), stream.write_all(&refusal))
                            .await;
                    let _ = stream.shutdown().await;
                    open.fetch_sub(1, Ordering::AcqRel);
                });
                continue;
            }
            let shared = shared.clone();
            let bounds = bounds.clone();
            let worker_bytes = worker_bytes.clone();
            tokio::spawn(async move {
                connection(shared, bounds, worker_bytes, stream, peer).await;
                open.fetch_sub(1, Ordering::AcqRel);
            });
        }
    });
    Ok(())
}
