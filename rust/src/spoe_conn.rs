//! One SPOE connection's socket, shared by its reader, its writer task and the messages Python is
//! deciding (`Conn`): ACKs written at once when the socket takes them, else queued for the writer
//! task (`write_loop`); frames read through a buffer (`Reader`); the messages Python is deciding
//! (`Pending`), each answered with its ACK.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit};

use crate::spop::ack;

/// A message Python is deciding: where and how its ACK goes. Dropped (answered, or its connection
/// ended), it frees its connection's in-flight slot.
pub struct Pending {
    pub conn: Arc<Conn>,
    pub stream_id: u64,
    pub frame_id: u64,
    /// The frame size agreed.
    pub limit: u64,
    /// Its place in flight, and its bytes (the connection's, the worker's).
    pub _permit: OwnedSemaphorePermit,
    pub _bytes: (OwnedSemaphorePermit, OwnedSemaphorePermit),
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
pub struct Conn {
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

/// The socket's end (EOF or an error) while reading.
pub struct Closed;

impl Conn {
    /// `stream`'s connection; a peer leaving more than `max_buffered` bytes unread is dropped.
    pub fn new(stream: tokio::net::TcpStream, max_buffered: usize) -> Self {
        Conn {
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
            max_buffered,
        }
    }

    /// Write `frame` now if nothing waits before it and the socket takes it, else queue it for the
    /// writer task; a peer leaving more than `max_buffered` bytes unread is dropped instead.
    pub fn send(&self, frame: Vec<u8>) {
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
    pub fn buffered(&self) -> usize {
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
    pub fn abort(&self) {
        self.killed.store(true, Ordering::Release);
        self.kill.notify_waiters();
        self.close();
    }

    /// No more writes; the socket is shut down both ways (closed when the last reference goes).
    pub fn close(&self) {
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
    pub async fn drained_to(&self, bytes: usize) {
        loop {
            let notified = self.drained.notified();
            if self.buffered() <= bytes {
                return;
            }
            notified.await;
        }
    }

    pub async fn aborted(&self) {
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
pub async fn write_loop(conn: Arc<Conn>) {
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
pub struct Reader {
    pub conn: Arc<Conn>,
    buffer: Vec<u8>,
    start: usize,
}

impl Reader {
    pub fn new(conn: Arc<Conn>) -> Self {
        Reader {
            conn,
            buffer: Vec::new(),
            start: 0,
        }
    }

    /// Until `count` bytes are buffered; `Closed` on EOF or an error.
    async fn fill(&mut self, count: usize) -> Result<(), Closed> {
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
                    return Err(Closed);
                }
            }
        }
        Ok(())
    }

    pub async fn length(&mut self) -> Result<u64, Closed> {
        self.fill(4).await?;
        let raw: [u8; 4] = self.buffer[self.start..self.start + 4].try_into().unwrap();
        self.start += 4;
        Ok(u32::from_be_bytes(raw) as u64)
    }

    /// The next `length` bytes, taken from the buffer.
    pub async fn body(&mut self, length: u64) -> Result<Vec<u8>, Closed> {
        self.fill(length as usize).await?;
        let body = self.buffer[self.start..self.start + length as usize].to_vec();
        self.start += length as usize;
        Ok(body)
    }
}

/// Bytes asked of the socket per read (HAProxy pipelines its frames on few connections).
const READ_CHUNK: usize = 16 * 1024;
