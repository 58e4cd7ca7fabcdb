//! Where the store's timestamps come from: the system clock, or a hand-moved one for tests.
//!
//! The store stamps `created_at`, `updated_at` and claim times itself, and measures orphan age
//! against the same clock, so a test can claim a message "an hour ago" without sleeping. Times
//! are cut to whole microseconds, the precision both backends keep, so a message read back
//! equals the one written. Schedulers (cron, follow-ups) read the same clock; in tests that pause
//! tokio's time, [`Clock::following_tokio`] makes wall time move with `tokio::time::advance`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};

/// The store's source of "now".
#[derive(Debug, Clone, Default)]
pub struct Clock {
    source: Source,
}

#[derive(Debug, Clone, Default)]
enum Source {
    #[default]
    System,
    Manual(ManualClock),
    /// `start` plus the time tokio's clock moved since `anchor`.
    Tokio {
        start: DateTime<Utc>,
        anchor: tokio::time::Instant,
    },
}

impl Clock {
    /// The system's wall clock.
    pub fn system() -> Self {
        Clock { source: Source::System }
    }

    /// A clock that reads `start` now and then moves as tokio's clock does: with
    /// `tokio::time::pause`, a test sleeps through a day (and a DST change) in no time, and every
    /// schedule that reads this clock sees the day pass.
    pub fn following_tokio(start: DateTime<Utc>) -> Self {
        Clock { source: Source::Tokio { start: truncate(start), anchor: tokio::time::Instant::now() } }
    }

    /// Now, to the microsecond.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.source {
            Source::System => truncate(Utc::now()),
            Source::Manual(manual) => manual.now(),
            Source::Tokio { start, anchor } => {
                let moved = chrono::Duration::from_std(anchor.elapsed()).unwrap_or(chrono::Duration::MAX);
                truncate(start.checked_add_signed(moved).unwrap_or(DateTime::<Utc>::MAX_UTC))
            }
        }
    }

    /// Sleep until this clock reads `at` or later (at once when it already does). Wakes at least
    /// once a minute to read the clock again, so a wall clock that jumps (a suspended laptop, an
    /// NTP step) delays a schedule by at most a minute.
    pub async fn sleep_until(&self, at: DateTime<Utc>) {
        const RECHECK: std::time::Duration = std::time::Duration::from_secs(60);
        loop {
            let Ok(left) = (at - self.now()).to_std() else { return };
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(RECHECK)).await;
        }
    }
}

impl From<ManualClock> for Clock {
    fn from(manual: ManualClock) -> Self {
        Clock { source: Source::Manual(manual) }
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
