//! The lane queue: which activation runs next.
//!
//! Three lanes, served by priority with aging: interactive work goes first, but a responsive or
//! background activation that has waited long enough is promoted, so nothing starves.
//!
//! Invariants:
//! - **Interactive work is never queued behind automation.** [`LaneCaps`] bound how many
//!   responsive and background activations may be out at once (by default, for N workers:
//!   responsive and background together ≤ max(1, 3N/4), background ≤ max(1, N/4)); interactive
//!   work may use every worker. So with N ≥ 2 some workers are always free of automation, and an
//!   interactive activation waits only for other interactive work (or for its own session).
//! - **Background work always progresses.** Its cap is at least 1, and aging promotes a
//!   background activation that has waited among what may run, so a stream of interactive work
//!   does not hold it back forever.
//! - **One turn per session at a time.** While a turn-running activation of a session is out
//!   (its [`QueueLease`] alive), the session's later ones wait, in order, even if other sessions'
//!   work runs meanwhile. Maintenance (compaction, titles) is held apart: it runs beside the
//!   session's turn, never beside another maintenance activation of the same session.
//!
//! Not here: what an activation does, its limits, or whether the work beside a turn is safe
//! (the runtime makes maintenance safe to run beside a turn).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kesoku_core::{Activation, ActivationPayload, Lane, SessionId};
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::BrokerError;

/// Waiting activations per lane, and activations out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueDepths {
    pub interactive: usize,
    pub responsive: usize,
    pub background: usize,
    /// Activations handed to a worker and not yet released.
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

/// How many activations of the automated lanes may be out at once; interactive work may use
/// every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneCaps {
    /// Responsive and background activations out together: the workers this leaves are kept
    /// for interactive work.
    pub responsive_and_background: usize,
    /// Background activations out (counted in `responsive_and_background` too).
    pub background: usize,
}

impl LaneCaps {
    /// The caps for a pool of `workers`: responsive and background together ≤ max(1, 3N/4),
    /// background ≤ max(1, N/4). A quarter of the pool is always free of automation (none when
    /// N = 1: a single worker must still serve every lane).
    pub fn for_workers(workers: usize) -> LaneCaps {
        let workers = workers.max(1);
        LaneCaps { responsive_and_background: (workers * 3 / 4).max(1), background: (workers / 4).max(1) }
    }

    /// No caps: every lane may use every worker (priority and aging still order the work).
    pub fn unlimited() -> LaneCaps {
        LaneCaps { responsive_and_background: usize::MAX, background: usize::MAX }
    }
}

/// A handed-out activation. What it holds (its session's turns, or its session's maintenance)
/// stays reserved until the lease is acknowledged or dropped.
///
/// [`QueueLease::ack`] says the activation is finished for good: call it only after its
/// outcome is in the ledger. A lease dropped without `ack` (a panic, a shutdown) frees what it
/// held in this process; a backend that can redeliver (Redis) hands the activation out again
/// later, one that cannot (memory) forgets it.
pub struct QueueLease {
    pub activation: Activation,
    acknowledge: Option<Box<dyn Acknowledge>>,
}

/// How a backend finishes a lease: [`Acknowledge::ack`] when the activation's outcome is
/// recorded, [`Acknowledge::abandon`] (synchronous, from `Drop`) when the lease went away
/// without it. Both free what the activation held in this process. This is also where a
/// backend that leases sessions across processes gives its session lease back.
#[async_trait]
pub trait Acknowledge: Send + 'static {
    async fn ack(self: Box<Self>) -> Result<(), BrokerError>;
    fn abandon(self: Box<Self>);
}

impl std::fmt::Debug for QueueLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueLease").field("activation", &self.activation.id).finish()
    }
}

impl QueueLease {
    /// A lease finished by `acknowledge` (for queue backends).
    pub fn new(activation: Activation, acknowledge: impl Acknowledge) -> Self {
        QueueLease { activation, acknowledge: Some(Box::new(acknowledge)) }
    }

    /// The activation is done and its outcome recorded: forget it for good and give the
    /// session back so its next activation can run. What it held here is freed even when the
    /// backend could not be told (the error says why; the backend may then redeliver it).
    pub async fn ack(mut self) -> Result<(), BrokerError> {
        match self.acknowledge.take() {
            Some(acknowledge) => acknowledge.ack().await,
            None => Ok(()),
        }
    }
}

impl Drop for QueueLease {
    fn drop(&mut self) {
        if let Some(acknowledge) = self.acknowledge.take() {
            acknowledge.abandon();
        }
    }
}

/// The queue of activations waiting for a worker.
///
/// Every backend passes the conformance suite (`queue_tests!`, feature `conformance`).
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    async fn push(&self, activation: Activation) -> Result<(), BrokerError>;
    /// Wait for the next runnable activation: what it holds is free (its session's turns, or its
    /// session's maintenance) and its lane is under its cap. A backend that loses its server
    /// keeps retrying here (logging) rather than failing.
    async fn pop(&self) -> Result<QueueLease, BrokerError>;
    /// The next runnable activation now, if any.
    async fn try_pop(&self) -> Result<Option<QueueLease>, BrokerError>;
    /// Waiting activations per lane, and those out in this process.
    async fn depths(&self) -> Result<QueueDepths, BrokerError>;
    /// Drop waiting activations of a session (for example when the session is cleared).
    async fn remove_session(&self, session_id: &SessionId) -> Result<Vec<Activation>, BrokerError>;
}

/// What of a session an activation holds while it is out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Hold {
    /// The session's turns: one at a time, in order.
    Turns,
    /// The session's maintenance (compaction, titles): one at a time, beside the turns.
    Maintenance,
}

impl Hold {
    pub(crate) fn of(activation: &Activation) -> Hold {
        match activation.payload {
            ActivationPayload::Maintenance { .. } => Hold::Maintenance,
            ActivationPayload::Message { .. }
            | ActivationPayload::Workflow { .. }
            | ActivationPayload::DirectTrigger { .. }
            | ActivationPayload::FollowUp { .. }
            | ActivationPayload::SubAgentResult { .. }
            | ActivationPayload::BackgroundJobResult { .. }
            | ActivationPayload::VoiceTranscript { .. } => Hold::Turns,
        }
    }
}

/// An activation waiting in a process's lanes.
pub(crate) struct Waiting {
    pub(crate) activation: Activation,
    pub(crate) since: Instant,
    /// The backend's name for it (a Redis stream entry id), if it has one.
    pub(crate) entry: Option<String>,
}

/// The lanes of one process and what is out of them: the scheduling every backend shares.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) lanes: [VecDeque<Waiting>; 3],
    /// Sessions whose turn is out.
    turns_out: HashSet<SessionId>,
    /// Sessions whose maintenance is out.
    maintenance_out: HashSet<SessionId>,
    /// Activations out, per lane (indexed like `lanes`).
    pub(crate) out: [usize; 3],
}

pub(crate) fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Interactive => 0,
        Lane::Responsive => 1,
        Lane::Background => 2,
    }
}

impl State {
    fn held(&self, hold: Hold) -> &HashSet<SessionId> {
        match hold {
            Hold::Turns => &self.turns_out,
            Hold::Maintenance => &self.maintenance_out,
        }
    }

    fn held_mut(&mut self, hold: Hold) -> &mut HashSet<SessionId> {
        match hold {
            Hold::Turns => &mut self.turns_out,
            Hold::Maintenance => &mut self.maintenance_out,
        }
    }

    /// Give back what an activation of `lane` holding `hold` of `session_id` held.
    pub(crate) fn release(&mut self, lane: usize, session_id: &SessionId, hold: Hold) {
        self.held_mut(hold).remove(session_id);
        self.out[lane] = self.out[lane].saturating_sub(1);
    }

    pub(crate) fn depths(&self) -> QueueDepths {
        QueueDepths {
            interactive: self.lanes[0].len(),
            responsive: self.lanes[1].len(),
            background: self.lanes[2].len(),
            running: self.out.iter().sum(),
        }
    }

    /// Take a session's waiting activations out of the lanes.
    pub(crate) fn remove_session(&mut self, session_id: &SessionId) -> Vec<Waiting> {
        let mut removed = Vec::new();
        for lane in self.lanes.iter_mut() {
            let (gone, kept): (Vec<Waiting>, Vec<Waiting>) =
                lane.drain(..).partition(|w| &w.activation.session_id == session_id);
            lane.extend(kept);
            removed.extend(gone);
        }
        removed
    }

    /// Whether lane `lane` (an index) holds a waiting activation that could run now (ignoring
    /// caps).
    pub(crate) fn lane_has_runnable(&self, lane: usize) -> bool {
        self.lanes[lane].iter().any(|w| !self.held(Hold::of(&w.activation)).contains(&w.activation.session_id))
    }

    /// Whether one more activation of lane `lane` (an index) may go out under `caps`.
    pub(crate) fn lane_has_room(&self, lane: usize, caps: LaneCaps) -> bool {
        let automated = self.out[1] + self.out[2];
        match lane {
            0 => true,
            1 => automated < caps.responsive_and_background,
            _ => automated < caps.responsive_and_background && self.out[2] < caps.background,
        }
    }

    /// The runnable activation with the best effective priority: lane rank minus one per aging
    /// step waited; ties go to the one waiting longest. Lanes at their cap do not compete.
    pub(crate) fn take_next(&mut self, aging: Aging, caps: LaneCaps, now: Instant) -> Option<Waiting> {
        let mut best: Option<(i64, Instant, usize, usize)> = None;
        for (lane, queue) in self.lanes.iter().enumerate() {
            if !self.lane_has_room(lane, caps) {
                continue;
            }
            // Only the first runnable item of each lane competes: lanes are FIFO.
            let Some((position, item)) = queue
                .iter()
                .enumerate()
                .find(|(_, w)| !self.held(Hold::of(&w.activation)).contains(&w.activation.session_id))
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
        let hold = Hold::of(&waiting.activation);
        self.held_mut(hold).insert(waiting.activation.session_id.clone());
        self.out[lane] += 1;
        Some(waiting)
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
    caps: LaneCaps,
}

impl std::fmt::Debug for MemoryQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryQueue").field("depths", &self.depths_now()).field("caps", &self.inner.caps).finish()
    }
}

impl MemoryQueue {
    pub fn new(aging: Aging, caps: LaneCaps) -> Self {
        MemoryQueue {
            inner: Arc::new(Inner { state: Mutex::new(State::default()), ready: Notify::new(), aging, caps }),
        }
    }

    /// The queue of a pool of `workers` (the agent's `max_concurrent_turns`): default aging,
    /// [`LaneCaps::for_workers`].
    pub fn for_workers(workers: usize) -> Self {
        Self::new(Aging::default(), LaneCaps::for_workers(workers))
    }

    pub fn caps(&self) -> LaneCaps {
        self.inner.caps
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock_state(&self.inner.state)
    }

    /// Waiting activations per lane, and activations out.
    pub fn depths_now(&self) -> QueueDepths {
        self.lock().depths()
    }

    /// Take the next runnable activation now, if any.
    pub fn try_pop(&self) -> Option<QueueLease> {
        let activation = self.lock().take_next(self.inner.aging, self.inner.caps, Instant::now())?.activation;
        let release = MemoryRelease {
            inner: Arc::clone(&self.inner),
            lane: lane_index(activation.lane),
            session_id: activation.session_id.clone(),
            hold: Hold::of(&activation),
        };
        Some(QueueLease::new(activation, release))
    }
}

/// What a memory lease gives back: the same on `ack` and on drop (nothing can redeliver).
struct MemoryRelease {
    inner: Arc<Inner>,
    lane: usize,
    session_id: SessionId,
    hold: Hold,
}

impl MemoryRelease {
    fn release(&self) {
        lock_state(&self.inner.state).release(self.lane, &self.session_id, self.hold);
        // A session and a lane slot freed up: waiting work may now run.
        self.inner.ready.notify_waiters();
        self.inner.ready.notify_one();
    }
}

#[async_trait]
impl Acknowledge for MemoryRelease {
    async fn ack(self: Box<Self>) -> Result<(), BrokerError> {
        self.release();
        Ok(())
    }

    fn abandon(self: Box<Self>) {
        self.release();
    }
}

fn lock_state(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A poisoned lock only means another thread panicked mid-update of plain collections;
    // the data is still structurally valid, so keep serving.
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Default for MemoryQueue {
    /// Default aging and no lane caps: every lane may use every worker. The agent's wiring uses
    /// [`MemoryQueue::for_workers`] instead.
    fn default() -> Self {
        Self::new(Aging::default(), LaneCaps::unlimited())
    }
}

#[async_trait]
impl Queue for MemoryQueue {
    async fn push(&self, activation: Activation) -> Result<(), BrokerError> {
        let lane = lane_index(activation.lane);
        self.lock().lanes[lane].push_back(Waiting { activation, since: Instant::now(), entry: None });
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

    async fn try_pop(&self) -> Result<Option<QueueLease>, BrokerError> {
        Ok(MemoryQueue::try_pop(self))
    }

    async fn depths(&self) -> Result<QueueDepths, BrokerError> {
        Ok(self.depths_now())
    }

    async fn remove_session(&self, session_id: &SessionId) -> Result<Vec<Activation>, BrokerError> {
        Ok(self.lock().remove_session(session_id).into_iter().map(|w| w.activation).collect())
    }
}
