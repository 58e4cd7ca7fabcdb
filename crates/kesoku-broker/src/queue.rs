//! The lane queue: which activation runs next.
//!
//! Three lanes, served by priority with aging: interactive work goes first, but a responsive or
//! background activation that has waited long enough is promoted, so nothing starves. A session
//! is handed to one worker at a time: while an activation of a session is out (its
//! [`QueueLease`] alive), later activations of that session wait, in order, even if other
//! sessions' work runs meanwhile.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kesoku_core::{Activation, Lane, SessionId};
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::BrokerError;

/// Waiting activations per lane, and sessions with work out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueDepths {
    pub interactive: usize,
    pub responsive: usize,
    pub background: usize,
    /// Sessions whose activation is currently being worked on.
    pub running: usize,
}

impl QueueDepths {
    pub fn waiting(&self) -> usize {
        self.interactive + self.responsive + self.background
    }
}

/// Priority with aging: after how long a waiting activation counts as one lane higher.
#[derive(Debug, Clone, Copy)]
pub struct Aging {
    pub step: Duration,
}

impl Default for Aging {
    fn default() -> Self {
        Aging { step: Duration::from_secs(5) }
    }
}

/// A handed-out activation. Its session stays reserved until the lease is released or dropped.
pub struct QueueLease {
    pub activation: Activation,
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for QueueLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueLease").field("activation", &self.activation.id).finish()
    }
}

impl QueueLease {
    /// A lease whose release runs `release` (for queue backends).
    pub fn new(activation: Activation, release: impl FnOnce() + Send + 'static) -> Self {
        QueueLease { activation, release: Some(Box::new(release)) }
    }

    /// Give the session back so its next activation can run.
    pub fn release(mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

impl Drop for QueueLease {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// The queue of activations waiting for a worker.
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    async fn push(&self, activation: Activation) -> Result<(), BrokerError>;
    /// Wait for the next runnable activation (its session not already out).
    async fn pop(&self) -> Result<QueueLease, BrokerError>;
    fn depths(&self) -> QueueDepths;
    /// Drop waiting activations of a session (for example when the session is cleared).
    fn remove_session(&self, session_id: &SessionId) -> Vec<Activation>;
}

struct Waiting {
    activation: Activation,
    since: Instant,
}

#[derive(Default)]
struct State {
    lanes: [VecDeque<Waiting>; 3],
    running: HashSet<SessionId>,
}

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Interactive => 0,
        Lane::Responsive => 1,
        Lane::Background => 2,
    }
}

impl State {
    /// The runnable activation with the best effective priority: lane rank minus one per aging
    /// step waited; ties go to the one waiting longest.
    fn take_next(&mut self, aging: Aging, now: Instant) -> Option<Activation> {
        let mut best: Option<(i64, Instant, usize, usize)> = None;
        for (lane, queue) in self.lanes.iter().enumerate() {
            // Only the first runnable item of each lane competes: lanes are FIFO.
            let Some((position, item)) =
                queue.iter().enumerate().find(|(_, w)| !self.running.contains(&w.activation.session_id))
            else {
                continue;
            };
            let waited = now.saturating_duration_since(item.since);
            let steps = if aging.step.is_zero() { 0 } else { (waited.as_millis() / aging.step.as_millis()) as i64 };
            let rank = lane as i64 - steps;
            let candidate = (rank, item.since, lane, position);
            if best.is_none_or(|b| (candidate.0, candidate.1) < (b.0, b.1)) {
                best = Some(candidate);
            }
        }
        let (_, _, lane, position) = best?;
        let waiting = self.lanes[lane].remove(position)?;
        self.running.insert(waiting.activation.session_id.clone());
        Some(waiting.activation)
    }
}

/// The in-process queue.
#[derive(Clone)]
pub struct MemoryQueue {
    inner: Arc<Inner>,
}

struct Inner {
    // A std mutex: every critical section is a few pointer moves, never held across an await.
    state: Mutex<State>,
    ready: Notify,
    aging: Aging,
}

impl std::fmt::Debug for MemoryQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryQueue").field("depths", &self.depths()).finish()
    }
}

impl MemoryQueue {
    pub fn new(aging: Aging) -> Self {
        MemoryQueue { inner: Arc::new(Inner { state: Mutex::new(State::default()), ready: Notify::new(), aging }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked mid-update of plain collections;
        // the data is still structurally valid, so keep serving.
        self.inner.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Take the next runnable activation now, if any.
    pub fn try_pop(&self) -> Option<QueueLease> {
        let activation = self.lock().take_next(self.inner.aging, Instant::now())?;
        let inner = Arc::clone(&self.inner);
        let session_id = activation.session_id.clone();
        Some(QueueLease::new(activation, move || {
            inner.state.lock().unwrap_or_else(|p| p.into_inner()).running.remove(&session_id);
            // A session freed up: its next activation may now run.
            inner.ready.notify_waiters();
            inner.ready.notify_one();
        }))
    }
}

impl Default for MemoryQueue {
    fn default() -> Self {
        Self::new(Aging::default())
    }
}

#[async_trait]
impl Queue for MemoryQueue {
    async fn push(&self, activation: Activation) -> Result<(), BrokerError> {
        let lane = lane_index(activation.lane);
        self.lock().lanes[lane].push_back(Waiting { activation, since: Instant::now() });
        self.inner.ready.notify_one();
        Ok(())
    }

    async fn pop(&self) -> Result<QueueLease, BrokerError> {
        loop {
            let notified = self.inner.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(lease) = self.try_pop() {
                return Ok(lease);
            }
            // Wake up at least once per aging step: promotion may change nothing runnable, but
            // it keeps waits bounded even if a notification is missed.
            let _ = tokio::time::timeout(self.inner.aging.step.max(Duration::from_millis(50)), notified).await;
        }
    }

    fn depths(&self) -> QueueDepths {
        let state = self.lock();
        QueueDepths {
            interactive: state.lanes[0].len(),
            responsive: state.lanes[1].len(),
            background: state.lanes[2].len(),
            running: state.running.len(),
        }
    }

    fn remove_session(&self, session_id: &SessionId) -> Vec<Activation> {
        let mut state = self.lock();
        let mut removed = Vec::new();
        for lane in state.lanes.iter_mut() {
            let (gone, kept): (Vec<Waiting>, Vec<Waiting>) =
                lane.drain(..).partition(|w| &w.activation.session_id == session_id);
            lane.extend(kept);
            removed.extend(gone.into_iter().map(|w| w.activation));
        }
        removed
    }
}
