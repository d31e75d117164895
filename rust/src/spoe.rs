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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Semaphore};

use crate::shared::{seconds, Shared};
use crate::spoe_conn::{write_loop, Closed, Conn, Pending, Reader};
use crate::spop::*;
use crate::spop_hello::negotiate;

/// Bytes of ACKs waiting to be written above which no further frame is read (asyncio's
/// default write high-water mark, where the Python agent's `drain()` waits).
const HIGH_WATER: usize = 64 * 1024;

/// A NOTIFY's message waiting for Python: its arguments (None: the frame has no such message).
pub struct SpoeRequest {
    pub args: Option<Args>,
    pub peer: SocketAddr,
}

/// The agent's bounds (the settings' `spoe`: `SpoeAgent`'s, and the compiled agent's own).
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

/// Where the agent listens, and its bounds (the settings' `spoe`).
pub struct SpoeSettings {
    /// A listening socket (duplicated, not taken).
    pub fd: i32,
    pub bounds: SpoeBounds,
    /// Bytes of NOTIFY frames queued or being decided over all connections.
    pub max_bytes: usize,
}

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

impl From<Closed> for End {
    fn from(_: Closed) -> Self {
        End::Closed
    }
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
    let budgets = Budgets {
        in_flight: Arc::new(Semaphore::new(bounds.max_in_flight)),
        connection: Arc::new(Semaphore::new(bounds.max_bytes_in_flight)),
        worker: worker_bytes.clone(),
    };
    loop {
        let (frame, body) = match next_frame(reader, bounds, limit).await {
            Ok(next) => next,
            Err(end) => return end,
        };
        match frame.kind {
            NOTIFY => {
                let conn = reader.conn.clone();
                let at = Notified {
                    frame,
                    body,
                    limit,
                    peer,
                };
                if let Err(end) = queue(shared, bounds, &budgets, conn, at).await {
                    return end;
                }
            }
            HAPROXY_DISCONNECT => {
                let _ = budgets
                    .in_flight
                    .acquire_many(bounds.max_in_flight as u32)
                    .await;
                return End::Normal;
            }
            kind => {
                return End::Refused(error(4, format!("unexpected frame type {kind}")));
            }
        }
    }
}

/// The next frame after the HELLO, and its body: begun within `timeout_idle` (once HAProxy reads
/// its answers), finished within `timeout_frame`, at most `limit` bytes.
async fn next_frame(
    reader: &mut Reader,
    bounds: &SpoeBounds,
    limit: u64,
) -> Result<(Frame, Vec<u8>), End> {
    let conn = reader.conn.clone();
    let next = async {
        conn.drained_to(HIGH_WATER).await; // no more frames read while HAProxy leaves its answers unread
        reader.length().await
    };
    let length = match tokio::time::timeout(bounds.timeout_idle, next).await {
        Err(_) => {
            let idle = format!("no frame begun within {}s", seconds(bounds.timeout_idle));
            return Err(End::Timeout(idle));
        }
        Ok(result) => result?,
    };
    if length > limit {
        return Err(too_big(length, limit));
    }
    let body = match tokio::time::timeout(bounds.timeout_frame, reader.body(length)).await {
        Err(_) => {
            let slow = format!(
                "a frame not finished within {}s",
                seconds(bounds.timeout_frame)
            );
            return Err(End::Timeout(slow));
        }
        Ok(result) => result?,
    };
    let frame = read_frame(&body)?;
    Ok((frame, body))
}

/// What a connection's messages may hold: places in flight, and bytes (the connection's, the worker's).
struct Budgets {
    in_flight: Arc<Semaphore>,
    connection: Arc<Semaphore>,
    worker: Arc<Semaphore>,
}

/// A NOTIFY frame read, with the frame size agreed and its peer.
struct Notified {
    frame: Frame,
    body: Vec<u8>,
    limit: u64,
    peer: SocketAddr,
}

/// Queue a NOTIFY's message for Python once the connection has a place in flight and the bytes for
/// it: waiting for them reads no further frame from this connection (HAProxy's own queue holds them).
async fn queue(
    shared: &Arc<Shared>,
    bounds: &SpoeBounds,
    budgets: &Budgets,
    conn: Arc<Conn>,
    notified: Notified,
) -> Result<(), End> {
    let Notified {
        frame,
        body,
        limit,
        peer,
    } = notified;
    let closed = |_| End::Closed;
    let permit = budgets
        .in_flight
        .clone()
        .acquire_owned()
        .await
        .map_err(closed)?;
    let weight = (body.len() + 256).min(bounds.max_bytes_in_flight) as u32;
    let own = budgets
        .connection
        .clone()
        .acquire_many_owned(weight)
        .await
        .map_err(closed)?;
    let shared_bytes = budgets
        .worker
        .clone()
        .acquire_many_owned(weight)
        .await
        .map_err(closed)?;
    let args = find_message(&body[frame.payload..], &bounds.message)?;
    let pending = Pending {
        conn,
        stream_id: frame.stream_id,
        frame_id: frame.frame_id,
        limit,
        _permit: permit,
        _bytes: (own, shared_bytes),
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + bounds.timeout_processing;
    let request = SpoeRequest { args, peer };
    let first =
        shared
            .state
            .lock()
            .unwrap()
            .spoe
            .push(id, request, pending, weight as usize, deadline);
    if first {
        shared.wake();
    }
    Ok(())
}

/// The messages Python is still deciding when `conn` ends go unanswered and are cancelled, as the
/// Python agent cancels them; a connection that ended badly is logged by Python, as the Python
/// agent does. Python is woken to hear it.
fn forget(shared: &Shared, conn: &Arc<Conn>, end: &Option<End>) {
    let note = match end {
        Some(End::Refused(error)) => Some(("error", error.message.clone())),
        Some(End::Timeout(why)) => Some(("timeout", why.clone())),
        _ => None,
    };
    let wake = {
        let mut state = shared.state.lock().unwrap();
        let gone = state
            .spoe
            .remove_where(|pending| Arc::ptr_eq(&pending.conn, conn));
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
}

/// One connection from HAProxy, from its HELLO to its end.
async fn connection(
    shared: Arc<Shared>,
    bounds: Arc<SpoeBounds>,
    worker_bytes: Arc<Semaphore>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    let conn = Arc::new(Conn::new(stream, bounds.max_buffered));
    let writer = tokio::spawn(write_loop(conn.clone()));
    let mut reader = Reader::new(conn.clone());
    let end = tokio::select! {
        end = serve(&shared, &bounds, &worker_bytes, &mut reader, peer) => Some(end),
        _ = conn.aborted() => None,
    };
    drop(reader);
    forget(&shared, &conn, &end);
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

/// Serve SPOE as `settings` say until `stop` turns true (open connections go on until the runtime
/// stops).
pub fn spawn(
    runtime: &tokio::runtime::Runtime,
    shared: Arc<Shared>,
    settings: SpoeSettings,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let listener = crate::settings::listener(runtime, settings.fd)?;
    let worker_bytes = Arc::new(Semaphore::new(settings.max_bytes));
    runtime.spawn(accept(
        listener,
        shared,
        Arc::new(settings.bounds),
        worker_bytes,
        stop,
    ));
    Ok(())
}

/// Accept connections until `stop` turns true: one over `max_connections` gets AGENT-DISCONNECT
/// status 13.
async fn accept(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    bounds: Arc<SpoeBounds>,
    worker_bytes: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    let open = Arc::new(AtomicUsize::new(0));
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
                    tokio::time::timeout(Duration::from_secs(5), stream.write_all(&refusal)).await;
                let _ = stream.shutdown().await;
                open.fetch_sub(1, Ordering::AcqRel);
            });
            continue;
        }
        let (shared, bounds, worker_bytes) = (shared.clone(), bounds.clone(), worker_bytes.clone());
        tokio::spawn(async move {
            connection(shared, bounds, worker_bytes, stream, peer).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}
