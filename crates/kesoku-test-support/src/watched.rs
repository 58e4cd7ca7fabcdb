//! A fake server's state shared between its handlers and the test: a mutex for short critical
//! sections (never held across an await) and a version bumped on every change, so a test that
//! waits for something re-checks when the state moves instead of polling.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;

/// State `T` with change notification.
#[derive(Debug)]
pub struct Watched<T> {
    state: Mutex<T>,
    /// Bumped after every change, so waiters re-check without polling.
    changed: watch::Sender<u64>,
}

impl<T> Watched<T> {
    pub fn new(state: T) -> Self {
        Watched { state: Mutex::new(state), changed: watch::channel(0).0 }
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Change the state and wake whoever waits on it.
    pub fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R {
        let result = change(&mut self.lock());
        self.changed.send_modify(|version| *version = version.wrapping_add(1));
        result
    }

    pub fn read<R>(&self, read: impl FnOnce(&T) -> R) -> R {
        read(&self.lock())
    }

    /// Wakes after each later [`Watched::update`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}
