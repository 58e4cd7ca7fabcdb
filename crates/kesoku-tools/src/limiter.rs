//! The process-wide cap on tool processes running at once.
//!
//! One [`ProcessLimiter`] is made per agent process (by [`builtin_registry`](crate::builtin_registry))
//! and cloned into every tool that starts processes. It is a counter, not a scheduler: waiting
//! calls are served first come, first served.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A shared count of free process slots.
#[derive(Debug, Clone)]
pub struct ProcessLimiter {
    slots: Arc<Semaphore>,
}

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct ProcessSlot {
    _permit: Option<OwnedSemaphorePermit>,
}

impl ProcessLimiter {
    /// A limiter allowing `max_processes` at once (at least one).
    pub fn new(max_processes: usize) -> Self {
        Self { slots: Arc::new(Semaphore::new(max_processes.clamp(1, Semaphore::MAX_PERMITS))) }
    }

    /// Wait for a free slot. Cancel-safe: dropping the future gives up the place in line.
    pub async fn acquire(&self) -> ProcessSlot {
        match Arc::clone(&self.slots).acquire_owned().await {
            Ok(permit) => ProcessSlot { _permit: Some(permit) },
            // The semaphore is private and never closed, so this arm is unreachable; should that
            // ever change, running without a slot is better than refusing every command.
            Err(_closed) => ProcessSlot { _permit: None },
        }
    }

    /// Slots free right now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }
}
