//! Where the store's timestamps come from: the system clock, or a hand-moved one for tests.
//!
//! The store stamps `created_at`, `updated_at` and claim times itself, and measures orphan age
//! against the same clock, so a test can claim a message "an hour ago" without sleeping. Times
//! are cut to whole microseconds, the precision both backends keep, so a message read back
//! equals the one written. This is not a scheduler and knows nothing of tokio's paused time.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};

/// The store's source of "now".
#[derive(Debug, Clone, Default)]
pub struct Clock {
    manual: Option<ManualClock>,
}

impl Clock {
    /// The system's wall clock.
    pub fn system() -> Self {
        Clock { manual: None }
    }

    /// Now, to the microsecond.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.manual {
            Some(manual) => manual.now(),
            None => truncate(Utc::now()),
        }
    }
}

impl From<ManualClock> for Clock {
    fn from(manual: ManualClock) -> Self {
        Clock { manual: Some(manual) }
    }
}

/// A clock that moves only when told to; clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    // A std mutex: held for a copy, never across an await.
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        ManualClock { now: Arc::new(Mutex::new(truncate(start))) }
    }

    pub fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set(&self, at: DateTime<Utc>) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = truncate(at);
    }

    /// Move forward by `by` (saturating at the end of representable time).
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        let step = chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        *now = truncate(now.checked_add_signed(step).unwrap_or(DateTime::<Utc>::MAX_UTC));
    }
}

/// Cut a time to whole microseconds, the precision both backends store.
pub fn truncate(at: DateTime<Utc>) -> DateTime<Utc> {
    at.trunc_subsecs(6)
}
