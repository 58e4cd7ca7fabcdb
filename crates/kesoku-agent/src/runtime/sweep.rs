//! The intake's sweep: every few seconds, any intake process looks for work that fell between
//! two processes. An activation whose ledger row was stored but which was never queued (its
//! intake died between the two) is queued again; a waiting message no intake recorded is
//! recorded and queued. (A `processing` message whose worker died is handed back by
//! `recovery`'s orphan sweep, then dispatched again at its new revision.)
//!
//! A row is taken for lost only when it never started, its message still waits at the same
//! revision, it is older than `[agent] requeue_after_s`, and its lane looks empty from here: an
//! activation waiting in a long queue is left alone. Should one still run twice, the second run
//! finds its message claimed (the claim is a compare-and-set) and changes nothing else.

use std::time::Duration;

use chrono::Utc;
use kesoku_broker::QueueDepths;
use kesoku_core::{Lane, LedgerEntry, MessageFilter, Status};
use tokio_util::sync::CancellationToken;

use super::Agent;
use super::intake::dispatch_id;
use crate::error::AgentError;

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    /// Recorded activations queued again (lost between the ledger and the queue).
    pub requeued: usize,
    /// Waiting messages no intake had recorded, recorded and queued now.
    pub recorded: usize,
}

fn depth_of(depths: &QueueDepths, lane: Lane) -> usize {
    match lane {
        Lane::Interactive => depths.interactive,
        Lane::Responsive => depths.responsive,
        Lane::Background => depths.background,
    }
}

impl Agent {
    /// Sweep every quarter of `[agent] requeue_after_s` (1 to 15 s) until `shutdown`.
    pub(super) async fn sweep(&self, shutdown: CancellationToken) {
        let period =
            (self.inner.deps.config.requeue_after() / 4).clamp(Duration::from_secs(1), Duration::from_secs(15));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            match self.sweep_once().await {
                Ok(report) if report != SweepReport::default() => tracing::info!(?report, "intake sweep"),
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "the intake sweep failed; it tries again"),
            }
        }
    }

    /// One sweep (see the module docs).
    pub async fn sweep_once(&self) -> Result<SweepReport, AgentError> {
        let deps = &self.inner.deps;
        let gateway = &deps.gateway;
        let mut report = SweepReport::default();
        let requeue_after = chrono::Duration::from_std(deps.config.requeue_after()).unwrap_or(chrono::Duration::MAX);
        let depths = deps.queue.depths().await?;
        let waiting = gateway.store().changes_since(0, &MessageFilter::status(Status::PendingAgent), u32::MAX).await?;
        let now = Utc::now();
        for event in waiting {
            let id = dispatch_id(&event.message.id, event.rev);
            match deps.ledger.get_activation(&id).await? {
                None => {
                    let old = event.message.updated_at.is_some_and(|at| now - at >= requeue_after);
                    if !old {
                        continue; // The intake has not heard it yet: its turn.
                    }
                    if let Some((message, activation)) =
                        self.record(event.message, event.rev).await.map_err(|(_, e)| e)?
                    {
                        self.dispatch(&message, activation).await?;
                        report.recorded += 1;
                    }
                }
                Some(entry) if is_lost(&entry, now, requeue_after) && depth_of(&depths, entry.lane) == 0 => {
                    let mut activation = self.activation_for(&event.message);
                    activation.id = id;
                    activation.created_at = entry.enqueued_at;
                    tracing::warn!(activation_id = %activation.id, message_id = %event.message.id, "an activation was recorded but never queued; queueing it again");
                    deps.queue.push(activation).await?;
                    report.requeued += 1;
                }
                Some(_) => {}
            }
        }
        Ok(report)
    }
}

/// A row that never started, enqueued longer ago than `requeue_after`.
fn is_lost(entry: &LedgerEntry, now: chrono::DateTime<Utc>, requeue_after: chrono::Duration) -> bool {
    entry.started_at.is_none() && entry.finished_at.is_none() && now - entry.enqueued_at >= requeue_after
}
