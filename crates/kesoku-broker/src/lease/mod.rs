//! Session leases: at most one worker runs a session's turns at a time, across processes.
//!
//! In one process the lane queue already hands out one turn per session at a time. When several
//! worker processes pop from a shared queue, a worker must also hold the session's lease while
//! the turn runs. The flow, for whoever wires this into the worker:
//!
//! ```no_run
//! # use std::time::Duration;
//! # use kesoku_broker::lease::{LeaseHolder, SessionLeases};
//! # async fn turn(leases: &dyn SessionLeases, session: kesoku_core::SessionId) -> Result<(), Box<dyn std::error::Error>> {
//! let holder = LeaseHolder::generate(); // once per worker
//! // After popping an activation of `session`:
//! let Some(lease) = leases.acquire(&session, &holder, Duration::from_secs(30)).await? else {
//!     // Another worker runs this session: put the activation back (or wait and retry).
//!     return Ok(());
//! };
//! let kept = lease.keep_alive(); // renews every ttl/3 in a task of its own
//! let lost = kept.lost_token();
//! // Run the turn; at each boundary (before a model call, a tool call, a write) stop if
//! // `lost.is_cancelled()`: then record nothing more and leave the activation unacknowledged,
//! // for whoever holds the session next. Otherwise write the outcome to the ledger with
//! // `kept.fencing_token()`, acknowledge the activation, and only then:
//! kept.release().await?;
//! # Ok(()) }
//! ```
//!
//! Invariants:
//! - **One session, one holder.** [`SessionLeases::acquire`] gives a session's lease to one
//!   holder until it is released or its ttl passes without a renewal; every other acquirer gets
//!   `None` at once (acquiring never waits).
//! - **Only the holder extends or ends its lease.** [`SessionLease::renew`] and
//!   [`SessionLease::release`] compare the lease's fencing token first, atomically, so a holder
//!   whose lease expired and was taken over can neither extend nor delete the new holder's.
//! - **Fencing tokens strictly increase per session**, across holders and processes, and across
//!   restarts of Redis or of the process: a token is at least the (Redis server's, or the
//!   process's) wall clock in microseconds. A holder can be paused (a stalled VM, SIGSTOP, a long
//!   GC in a tool's child process) past its ttl and resume believing it still holds the lease
//!   before its next renewal says otherwise; the token tells it apart. **Where the runtime should
//!   check it:** the ledger write that records a turn's outcome (and the acknowledgement of its
//!   activation) should carry the token and be refused when the session has already seen a larger
//!   one (`UPDATE … WHERE last_fencing_token <= $token`). Between turn steps the runtime checks
//!   [`KeptLease::lost_token`]; that check is cheap but is not a guarantee, the ledger's is.
//!   (Tokens come from one counter for all sessions, so they also increase across sessions; only
//!   compare tokens of one session.)
//!
//! Two backends: [`MemoryLeases`] for one process (the embedded default) and [`RedisLeases`] for
//! many. Why Redis rather than PostgreSQL advisory locks: an advisory lock lives as long as the
//! database session that took it, so every held lease would pin one pooled connection for the
//! whole turn (minutes, with tool calls), and it frees only when that connection drops, which a
//! half-open TCP connection to a killed machine can delay for as long as the kernel's keepalive.
//! A Redis lease is a key with a ttl: a process holding many sessions needs no connection per
//! session, a killed process's sessions become free after `ttl` and another process takes them
//! over, and Redis is already the broker and the queue once processes scale out. The trade-off,
//! honestly: Redis is not the ledger, so a lease and a ledger write are not one transaction
//! (hence the fencing token, checked by the ledger); a single Redis without replication is a
//! single point of failure for leases (as it is for the queue); a Redis that loses its data
//! (restart without persistence, failover to a lagging replica) forgets who holds what, so two
//! holders may briefly overlap, which the fencing check in the ledger then resolves; and the
//! ttl is a trade between how fast a dead process's sessions are taken over and how long a
//! live one may go without reaching Redis before it must stop its turns.
//!
//! Not here: which activation runs next (the queue), or stopping a turn (the runtime reads
//! [`KeptLease::lost_token`]).

mod memory;
mod redis_leases;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kesoku_core::SessionId;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use memory::MemoryLeases;
pub use redis_leases::{DEFAULT_KEY_PREFIX, DEFAULT_OPERATION_TIMEOUT, RedisLeases};

/// The longest ttl a lease may have (about 49 days). Leases are kept by renewal: a long ttl
/// only delays the takeover of a killed process's sessions.
pub const MAX_TTL: Duration = Duration::from_millis(u32::MAX as u64);

/// Who holds a lease: one worker of one process. Two workers must never share a holder name,
/// or one could renew the other's lease; [`LeaseHolder::generate`] makes a unique one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseHolder(String);

impl LeaseHolder {
    /// A holder name unique to this call: the process id and a ULID (`pid4242-01j…`).
    pub fn generate() -> Self {
        Self(format!("pid{}-{}", std::process::id(), ulid::Ulid::generate().to_string().to_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for LeaseHolder {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl From<String> for LeaseHolder {
    fn from(value: String) -> Self {
        Self(value)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The lease store could not be reached or did not answer in time. The lease's state is
    /// unknown: retry, and treat a held lease as lost once its ttl has passed since the last
    /// successful renewal ([`SessionLease::keep_alive`] does).
    #[error("session leases unavailable: {0}; check that Redis is running and reachable at [broker] url")]
    Unavailable(String),
    /// Redis answered a lease script with something this version does not expect.
    #[error("unexpected answer from redis to a session lease script: {0}")]
    Protocol(String),
    /// The Redis URL does not parse (the reason says why; the URL itself is left out, as it may
    /// hold a password).
    #[error("the redis url for session leases does not parse ({0}); write it as redis://[:password@]host:6379/db")]
    InvalidUrl(String),
    #[error("a session lease's ttl must be between 1 ms and {max} ms, not {got_ms} ms", max = MAX_TTL.as_millis())]
    InvalidTtl { got_ms: u128 },
}

impl LeaseError {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            LeaseError::Unavailable(_) => true,
            LeaseError::Protocol(_) | LeaseError::InvalidUrl(_) | LeaseError::InvalidTtl { .. } => false,
        }
    }
}

/// A lease's ttl in whole milliseconds (what the lease store keeps), checked.
fn ttl_millis(ttl: Duration) -> Result<u64, LeaseError> {
    let millis = ttl.as_millis();
    if millis == 0 || ttl > MAX_TTL {
        return Err(LeaseError::InvalidTtl { got_ms: millis });
    }
    u64::try_from(millis).map_err(|_| LeaseError::InvalidTtl { got_ms: millis })
}

/// Who may run a session's turns: one holder at a time, across processes.
#[async_trait]
pub trait SessionLeases: Send + Sync + 'static {
    /// Take `session_id`'s lease for `holder` for `ttl`, or `None` at once when someone holds
    /// it (the same holder too: a lease is not re-entrant). Never waits for the lease. The ttl
    /// is kept in whole milliseconds.
    async fn acquire(
        &self,
        session_id: &SessionId,
        holder: &LeaseHolder,
        ttl: Duration,
    ) -> Result<Option<SessionLease>, LeaseError>;

    /// Like [`SessionLeases::acquire`], but while another holder has the lease, try again
    /// (every ttl/4, between 10 ms and 250 ms) until `patience` has passed; `None` then.
    async fn acquire_within(
        &self,
        session_id: &SessionId,
        holder: &LeaseHolder,
        ttl: Duration,
        patience: Duration,
    ) -> Result<Option<SessionLease>, LeaseError> {
        let deadline = Instant::now() + patience;
        let pause = (ttl / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
        loop {
            if let Some(lease) = self.acquire(session_id, holder, ttl).await? {
                return Ok(Some(lease));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }

    /// How many leases are held now, by every holder of every process sharing this store (for
    /// `/metrics`). Expired leases do not count.
    async fn held_count(&self) -> Result<u64, LeaseError>;
}

/// What a backend does for a [`SessionLease`] it handed out.
#[async_trait]
trait LeaseKeeper: Send + Sync + 'static {
    /// Extend `lease` by its ttl if it is still the session's current lease.
    async fn renew(&self, lease: &SessionLease) -> Result<bool, LeaseError>;
    /// End `lease` if it is still the session's current lease.
    async fn release(&self, lease: &SessionLease) -> Result<bool, LeaseError>;
}

/// A session's lease, held by one holder until released or expired. Dropping it does not
/// release it (that needs the lease store, which is async): it then ends after its ttl. Release
/// explicitly once the turn's outcome is in the ledger.
pub struct SessionLease {
    session_id: SessionId,
    holder: LeaseHolder,
    fencing_token: u64,
    ttl: Duration,
    /// When the request that took the lease was sent: its ttl runs from no earlier than this.
    acquired_at: Instant,
    keeper: Arc<dyn LeaseKeeper>,
}

impl fmt::Debug for SessionLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionLease")
            .field("session_id", &self.session_id)
            .field("holder", &self.holder)
            .field("fencing_token", &self.fencing_token)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl SessionLease {
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    pub fn holder(&self) -> &LeaseHolder {
        &self.holder
    }

    /// Larger than the token of every earlier lease of this session. See the module docs for
    /// where the runtime should check it.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Extend the lease by its ttl from now. `Ok(false)`: the lease is lost (it expired, and
    /// perhaps another holder has the session now); stop the turn at its next boundary.
    pub async fn renew(&self) -> Result<bool, LeaseError> {
        self.keeper.renew(self).await
    }

    /// Give the lease up. `Ok(true)` when it was still ours; `Ok(false)` when it had already
    /// expired (and anyone who took it over keeps theirs).
    pub async fn release(self) -> Result<bool, LeaseError> {
        self.keeper.release(&self).await
    }

    /// Renew the lease every ttl/3 in a task of its own until it is released or lost.
    pub fn keep_alive(self) -> KeptLease {
        let every = (self.ttl / 3).max(Duration::from_millis(1));
        self.keep_alive_every(every)
    }

    /// Renew the lease every `every` (less than its ttl, or it expires between renewals) in a
    /// task of its own until it is released or lost. The lease counts as lost when a renewal
    /// says so, or when the lease store has not confirmed a renewal within the ttl (by this
    /// process's clock, from when the last confirmed request was sent).
    pub fn keep_alive_every(self, every: Duration) -> KeptLease {
        let lease = Arc::new(self);
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew_loop(lease.clone(), every, lost.clone(), stop.clone()));
        KeptLease { lease, lost, stop, task }
    }
}

async fn renew_loop(lease: Arc<SessionLease>, every: Duration, lost: CancellationToken, stop: CancellationToken) {
    let mut confirmed_at = lease.acquired_at;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let sent_at = Instant::now();
        let deadline = confirmed_at + lease.ttl;
        match tokio::time::timeout_at(deadline, lease.renew()).await {
            Ok(Ok(true)) => confirmed_at = sent_at,
            Ok(Ok(false)) => {
                tracing::warn!(session_id = %lease.session_id, holder = %lease.holder, "session lease lost: it expired before it was renewed");
                lost.cancel();
                return;
            }
            Ok(Err(error)) if Instant::now() < deadline => {
                tracing::warn!(session_id = %lease.session_id, %error, "could not renew a session lease; retrying");
            }
            Ok(Err(_)) | Err(_) => {
                tracing::warn!(session_id = %lease.session_id, holder = %lease.holder, "session lease lost: no renewal confirmed within its ttl");
                lost.cancel();
                return;
            }
        }
    }
}

/// A lease renewed in the background. Dropping it stops the renewals (the lease then ends after
/// its ttl); [`KeptLease::release`] stops them and releases it.
pub struct KeptLease {
    lease: Arc<SessionLease>,
    lost: CancellationToken,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl fmt::Debug for KeptLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeptLease").field("lease", &self.lease).field("lost", &self.is_lost()).finish_non_exhaustive()
    }
}

impl KeptLease {
    pub fn lease(&self) -> &SessionLease {
        &self.lease
    }

    pub fn fencing_token(&self) -> u64 {
        self.lease.fencing_token
    }

    /// Cancelled when the lease is lost (another holder may run the session now): stop the turn
    /// at its next boundary. Cancelling the returned token does not affect the lease.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.child_token()
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Stop renewing and give the lease up; `Ok(false)` when it was lost already.
    pub async fn release(mut self) -> Result<bool, LeaseError> {
        self.stop.cancel();
        // Wait for a renewal in flight, so that none lands after the release.
        if let Err(error) = (&mut self.task).await {
            tracing::warn!(session_id = %self.lease.session_id, %error, "the session lease's renewal task failed");
        }
        self.lease.keeper.release(&self.lease).await
    }
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
    }
}
