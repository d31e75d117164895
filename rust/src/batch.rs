//! One batch shape across the boundary, for the three protocols: Python takes the requests waiting
//! in a protocol's queue as a list of tuples, each led by its request's id (`take`), and answers
//! with a list of tuples, each led by the id it answers (`answer`; `send` hands each answer to its
//! caller where callers wait on a channel). Taking and answering are
//! written once, here; each protocol gives the rest of its tuples (`grpc_python.rs`,
//! `http_python.rs`, `spoe_python.rs`).

use pyo3::prelude::*;
use pyo3::types::PyList;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::queue::Queue;
use crate::shared::{Shared, State};

/// One protocol's queue in the shared state.
pub type Pick<T, W> = fn(&mut State) -> &mut Queue<T, W>;

/// Up to `limit` requests waiting in `pick`'s queue, oldest first, each as `item` makes it of its
/// id, the request and the seconds left until its deadline. A request past its deadline, or whose
/// caller left, is never handed out (`Queue::take`).
pub fn take<'py, T, W, I: IntoPyObject<'py>>(
    py: Python<'py>,
    shared: &Shared,
    pick: Pick<T, W>,
    limit: usize,
    mut item: impl FnMut(u64, T, f64) -> PyResult<I>,
) -> PyResult<Bound<'py, PyList>> {
    let now = Instant::now();
    let batch = pick(&mut shared.state.lock().unwrap()).take(limit, now);
    let out = PyList::empty(py);
    for (id, request, deadline) in batch {
        let left = deadline.saturating_duration_since(now).as_secs_f64();
        out.append(item(id, request, left)?)?;
    }
    Ok(out)
}

/// Python's answers, each item read by `read` as the id it answers and the answer (all of them
/// before the lock is taken); the waiters of the requests still in `pick`'s queue, taken out of it,
/// each with its answer, for the caller to hand over.
pub fn answer<T, W, A>(
    shared: &Shared,
    pick: Pick<T, W>,
    items: &Bound<'_, PyList>,
    read: fn(&Bound<'_, PyAny>) -> PyResult<(u64, A)>,
) -> PyResult<Vec<(W, A)>> {
    let mut answers = Vec::with_capacity(items.len());
    for item in items.iter() {
        answers.push(read(&item)?);
    }
    let mut state = shared.state.lock().unwrap();
    let queue = pick(&mut state);
    Ok(answers
        .into_iter()
        .filter_map(|(id, answer)| queue.remove(id).map(|waiter| (waiter, answer)))
        .collect())
}

/// `answer` for a protocol whose callers each wait on a channel (gRPC, HTTP): each answer is sent
/// to its caller (dropped when the caller left).
pub fn send<T, A>(
    shared: &Shared,
    pick: Pick<T, oneshot::Sender<A>>,
    items: &Bound<'_, PyList>,
    read: fn(&Bound<'_, PyAny>) -> PyResult<(u64, A)>,
) -> PyResult<()> {
    for (sender, answer) in answer(shared, pick, items, read)? {
        let _ = sender.send(answer);
    }
    Ok(())
}
