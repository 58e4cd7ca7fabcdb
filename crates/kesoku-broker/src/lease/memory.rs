//! Session leases in one process: a map behind a mutex, times on tokio's clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use kesoku_core::SessionId;
use tokio::time::Instant;

use super::{LeaseError, LeaseHolder, LeaseKeeper, SessionLease, SessionLeases, ttl_millis};

/// Session leases for one process: the embedded default. Cheap to clone; clones share the
/// leases.
#[derive(Clone, Default)]
pub struct MemoryLeases {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLeases").finish_non_exhaustive()
    }
}

impl MemoryLeases {
    pub fn new() -> Self {
        Self::default()
    }
}

#[derive(Default)]
struct Inner {
    /// Short sections only (a map lookup), never across an await.
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Current leases; an entry whose `expires_at` has passed is free to take.
    held: HashMap<SessionId, Held>,
    /// The last fencing token handed out, for any session.
    last_token: u64,
}

struct Held {
    fencing_token: u64,
    expires_at: Instant,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves the map consistent (every section is a single
        // insert, update or remove), so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The wall clock in microseconds, so that tokens keep increasing across restarts.
fn now_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
}

#[async_trait]
impl SessionLeases for MemoryLeases {
    async fn acquire(
        &self,
        session_id: &SessionId,
        holder: &LeaseHolder,
        ttl: Duration,
    ) -> Result<Option<SessionLease>, LeaseError> {
        let ttl = Duration::from_millis(ttl_millis(ttl)?);
        let now = Instant::now();
        let fencing_token = {
            let mut state = self.inner.state();
            if state.held.get(session_id).is_some_and(|held| held.expires_at > now) {
                return Ok(None);
            }
            let token = (state.last_token + 1).max(now_micros());
            state.last_token = token;
            state.held.insert(session_id.clone(), Held { fencing_token: token, expires_at: now + ttl });
            token
        };
        Ok(Some(SessionLease {
            session_id: session_id.clone(),
            holder: holder.clone(),
            fencing_token,
            ttl,
            acquired_at: now,
            keeper: self.inner.clone(),
        }))
    }

    async fn held_count(&self) -> Result<u64, LeaseError> {
        let now = Instant::now();
        let mut state = self.inner.state();
        state.held.retain(|_, held| held.expires_at > now);
        Ok(state.held.len() as u64)
    }
}

#[async_trait]
impl LeaseKeeper for Inner {
    async fn renew(&self, lease: &SessionLease) -> Result<bool, LeaseError> {
        let now = Instant::now();
        let mut state = self.state();
        match state.held.get_mut(&lease.session_id) {
            Some(held) if held.fencing_token == lease.fencing_token && held.expires_at > now => {
                held.expires_at = now + lease.ttl;
                Ok(true)
            }
            Some(_) | None => Ok(false),
        }
    }

    async fn release(&self, lease: &SessionLease) -> Result<bool, LeaseError> {
        let now = Instant::now();
        let mut state = self.state();
        match state.held.get(&lease.session_id) {
            Some(held) if held.fencing_token == lease.fencing_token => {
                let was_live = held.expires_at > now;
                state.held.remove(&lease.session_id);
                Ok(was_live)
            }
            Some(_) | None => Ok(false),
        }
    }
}
