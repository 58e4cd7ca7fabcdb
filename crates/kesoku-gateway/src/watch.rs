//! Hearing other processes through the store: the broker backend for processes that share a
//! store but not a broker (the embedded default, `kesoku chat` beside `kesoku start`).
//!
//! With a shared broker (Redis) every process hears the others' changes through it, and this
//! is not needed.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::Gateway;

/// How often [`spawn_store_watch`] looks for changes made by other processes.
pub const STORE_WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

/// Announce on this process's broker the changes other processes make to the shared store.
///
/// The broker is in-process, so a message posted by another process (`kesoku chat` talking to
/// a running service, or the service answering it) would otherwise only be heard at the next
/// start. This reads `changes_since` every `period` and republishes what it finds; listeners
/// drop what they already heard (the gateway's duplicate filter works on revisions), so this
/// process's own changes passing through again are harmless.
pub fn spawn_store_watch(
    gateway: Gateway,
    period: std::time::Duration,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    const BATCH: u32 = 500;
    tokio::spawn(async move {
        let store = Arc::clone(gateway.store());
        let mut after = match store.current_rev().await {
            Ok(rev) => rev,
            Err(error) => {
                tracing::warn!(%error, "store watch: reading the current revision failed; starting from the beginning");
                0
            }
        };
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            loop {
                let batch = match store.changes_since(after, &kesoku_core::MessageFilter::default(), BATCH).await {
                    Ok(batch) => batch,
                    Err(error) => {
                        tracing::warn!(%error, "store watch: reading changes failed; retrying");
                        break;
                    }
                };
                let full = batch.len() == BATCH as usize;
                for event in batch {
                    after = event.rev;
                    let notice =
                        kesoku_broker::MessageNotice { rev: event.rev, created: event.created, message: event.message };
                    if let Err(error) =
                        gateway.broker().publish(kesoku_broker::BrokerEvent::Message(Box::new(notice))).await
                    {
                        tracing::warn!(%error, "store watch: announcing a change failed");
                    }
                }
                if !full {
                    break;
                }
            }
        }
    })
}
