//! The one queue between the front door's tokio threads and Python, for gRPC, HTTP and SPOE alike.
//!
//! A request is pushed with what answers it (`W`: a oneshot sender, or an SPOE connection's ACK
//! writer), its size in bytes and its deadline. The push that turns the queue from empty to
//! non-empty asks the caller to write the wake-up byte; Python then calls `take` until it hands
//! out nothing. `take` skips entries whose caller left or whose deadline passed, so it returns an
//! empty batch only when the queue is empty: a batch of expired entries can never end a wake-up
//! while live ones wait behind it (the lost wake-up that stalled the door for good).
//!
//! An entry counts its bytes from `push` until it is answered, leaves or expires; the doors refuse
//! a request that would take the worker over its byte bound. `stalled` tells how long a wake-up has
//! gone without a `take` emptying the queue, for `/healthz`.

use std::collections::{HashMap, VecDeque};
use tokio::time::Instant;

struct Entry<T, W> {
    /// `None` once handed to Python.
    request: Option<T>,
    waiter: W,
    bytes: usize,
    deadline: Instant,
}

/// One protocol's requests: queued for Python, or being decided by it.
pub struct Queue<T, W> {
    order: VecDeque<u64>,
    entries: HashMap<u64, Entry<T, W>>,
    bytes: usize,
    /// When the queue last turned non-empty without a `take` emptying it since.
    waiting_since: Option<Instant>,
}

impl<T, W> Default for Queue<T, W> {
    fn default() -> Self {
        Queue {
            order: VecDeque::new(),
            entries: HashMap::new(),
            bytes: 0,
            waiting_since: None,
        }
    }
}

impl<T, W> Queue<T, W> {
    /// Requests queued or being decided.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Their bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Queue `request`; true when the queue was empty, so the caller writes the wake-up byte.
    pub fn push(
        &mut self,
        id: u64,
        request: T,
        waiter: W,
        bytes: usize,
        deadline: Instant,
    ) -> bool {
        let first = self.order.is_empty();
        if first {
            self.waiting_since = Some(Instant::now());
        }
        self.order.push_back(id);
        self.entries.insert(
            id,
            Entry {
                request: Some(request),
                waiter,
                bytes,
                deadline,
            },
        );
        self.bytes += bytes;
        // Ids of entries that left while Python was not taking: keep them from outgrowing the live.
        if self.order.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.order
                .retain(|id| entries.get(id).is_some_and(|e| e.request.is_some()));
        }
        first
    }

    /// Up to `limit` live requests, oldest first, with their deadlines; entries past their deadline
    /// are dropped on the way (their waiters with them). Empty only when the queue is empty.
    pub fn take(&mut self, limit: usize, now: Instant) -> Vec<(u64, T, Instant)> {
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(id) = self.order.pop_front() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&id) else {
                continue; // its caller left
            };
            if entry.deadline <= now {
                self.remove(id);
                continue;
            }
            if let Some(request) = entry.request.take() {
                out.push((id, request, entry.deadline));
            }
        }
        self.waiting_since = if self.order.is_empty() {
            None
        } else {
            Some(now)
        };
        out
    }

    /// Take request `id` out (answered, or its caller left): its waiter, if it was still here.
    pub fn remove(&mut self, id: u64) -> Option<W> {
        let entry = self.entries.remove(&id)?;
        self.bytes -= entry.bytes;
        Some(entry.waiter)
    }

    /// Take out every request whose waiter `matches` (an SPOE connection that ended); their ids.
    pub fn remove_where(&mut self, mut matches: impl FnMut(&W) -> bool) -> Vec<u64> {
        let mut gone = Vec::new();
        let mut freed = 0;
        self.entries.retain(|id, entry| {
            let ours = matches(&entry.waiter);
            if ours {
                freed += entry.bytes;
                if entry.request.is_none() {
                    gone.push(*id); // Python is deciding it
                }
            }
            !ours
        });
        self.bytes -= freed;
        gone
    }

    /// Seconds since a wake-up that no `take` has answered by emptying the queue (0: none pending).
    pub fn stalled(&self, now: Instant) -> f64 {
        self.waiting_since.map_or(0.0, |since| {
            now.saturating_duration_since(since).as_secs_f64()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn expired_entries_never_end_a_batch_early() {
        let mut queue: Queue<u32, ()> = Queue::default();
        let now = Instant::now();
        let past = now - Duration::from_millis(1);
        let later = now + Duration::from_secs(10);
        assert!(queue.push(0, 0, (), 10, past));
        for id in 1..3000 {
            assert!(!queue.push(id, id as u32, (), 10, past));
        }
        queue.push(3000, 3000, (), 10, later);
        let batch = queue.take(1024, now);
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].0, 3000);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.bytes(), 10);
        assert!(queue.take(1024, now).is_empty());
        assert_eq!(queue.stalled(now), 0.0);
        assert!(queue.remove(3000).is_some());
        assert_eq!(queue.bytes(), 0);
    }

    #[test]
    fn left_entries_are_skipped_and_compacted() {
        let mut queue: Queue<u32, ()> = Queue::default();
        let later = Instant::now() + Duration::from_secs(10);
        for id in 0..10_000 {
            queue.push(id, 0, (), 1, later);
            queue.remove(id);
        }
        assert!(queue.order.len() <= 64 + 1);
        assert!(queue.take(10, Instant::now()).is_empty());
        assert_eq!(queue.bytes(), 0);
    }

    #[test]
    fn stalled_counts_from_the_wake_up_until_a_take_empties() {
        let mut queue: Queue<u32, ()> = Queue::default();
        let now = Instant::now();
        queue.push(1, 1, (), 1, now + Duration::from_secs(10));
        queue.push(2, 2, (), 1, now + Duration::from_secs(10));
        assert!(queue.stalled(now + Duration::from_secs(3)) >= 2.9);
        assert_eq!(queue.take(1, now).len(), 1);
        assert!(queue.stalled(now) < 0.1);
        assert_eq!(queue.take(1, now).len(), 1);
        assert_eq!(queue.stalled(now + Duration::from_secs(30)), 0.0);
        let mut gone = queue.remove_where(|_| true);
        gone.sort();
        assert_eq!(gone, vec![1, 2]);
        assert_eq!((queue.len(), queue.bytes()), (0, 0));
    }
}
