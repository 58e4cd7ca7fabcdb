//! Crash recovery at start-up: work held by dead workers is handed back, their open tool calls
//! get a synthetic "restarted" result, and their ledger rows are closed.

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use kesoku_core::{ActivationId, MessageFilter, MessageId, Outcome, Status, TurnOrigin};
use kesoku_tools::ToolOutput;
use tokio_util::sync::CancellationToken;

use super::Agent;
use crate::error::AgentError;
use crate::turn::RESTARTED_RESULT;

/// What recovery found and fixed at start-up.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Messages handed back from dead workers (`processing` → `pending_agent`).
    pub recovered_messages: Vec<MessageId>,
    /// Tool calls that got a synthetic "service restarted" result.
    pub closed_tool_calls: Vec<MessageId>,
    /// Ledger rows of dead workers closed as cancelled.
    pub closed_activations: Vec<ActivationId>,
}

impl Agent {
    /// Hand work of dead workers back, close their tool calls and ledger rows. Run before `run`.
    pub async fn recover(&self) -> Result<RecoveryReport, AgentError> {
        let gateway = &self.inner.deps.gateway;
        let store = gateway.store();
        let mut report = RecoveryReport::default();

        // Claims of processes on this host that are gone can be recovered at once; others only
        // once their claim is older than the threshold (their worker may be alive elsewhere).
        for message in store.list_messages(&MessageFilter::status(Status::Processing)).await? {
            let Some(claim) = store.claim_of(&message.id).await? else { continue };
            if crate::liveness::claim_is_dead(&claim.claimed_by, &self.inner.worker_id)
                && gateway.claim(&message.id, Status::PendingAgent, &[Status::Processing], "recovery").await?.is_some()
            {
                report.recovered_messages.push(message.id);
            }
        }
        for event in gateway.recover_orphans(self.inner.deps.config.orphan_after()).await? {
            report.recovered_messages.push(event.message.id);
        }

        for call in store.orphaned_tool_calls(None).await? {
            let root_status = match &call.parent_id {
                Some(root) => store.get_message(root).await?.map(|m| m.status),
                None => None,
            };
            if root_status == Some(Status::Processing) {
                continue; // A live worker elsewhere may still be running it.
            }
            let origin = match &call.parent_id {
                Some(root_id) => match store.get_message(root_id).await? {
                    Some(root) => TurnOrigin::of(&root, &self.inner.deps.config.name),
                    None => continue,
                },
                None => continue,
            };
            let output = ToolOutput::failure(RESTARTED_RESULT);
            let result = origin.tool_result(&call, output.content, output.summary, output.error);
            gateway.post(&result).await?;
            if call.status.can_transition_to(Status::Interrupted) {
                gateway.update_status(&call.id, Status::Interrupted).await?;
            }
            report.closed_tool_calls.push(call.id);
        }

        let ledger = &self.inner.deps.ledger;
        for entry in ledger.unfinished_activations().await? {
            let still_running = match &entry.message_id {
                Some(id) => store.get_message(id).await?.is_some_and(|m| m.status == Status::Processing),
                None => false,
            };
            // With several processes, a row not started yet is another process's queued work
            // (the shared queue still holds it), not a dead one's.
            let queued_elsewhere = self.inner.deps.leasing.is_some() && entry.started_at.is_none();
            if !still_running && !queued_elsewhere {
                ledger
                    .record_finished(
                        &entry.id,
                        Utc::now(),
                        Outcome::Cancelled,
                        Some("the worker stopped before finishing (process exit); its message was handed back"),
                        &entry.usage,
                    )
                    .await?;
                report.closed_activations.push(entry.id);
            }
        }
        Ok(report)
    }
}

impl Agent {
    /// While several processes share the work (`[broker] url`), hand back the turns of workers
    /// that died without a restart of this process: every half `[agent] orphan_after_s`, a
    /// `processing` message whose claim went stale goes back to `pending_agent` (the intake
    /// queues it again; the rerun continues from its stored steps) and the dead turn's ledger
    /// row is closed as cancelled. Live workers renew their claims four times per period.
    pub(super) async fn sweep_orphans_until(&self, shutdown: CancellationToken) {
        let period = (self.inner.deps.config.orphan_after() / 2).max(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            match self.sweep_orphans().await {
                Ok(0) => {}
                Ok(recovered) => {
                    tracing::warn!(recovered, "handed back the turns of workers that stopped renewing their claims")
                }
                Err(error) => tracing::warn!(%error, "looking for turns of dead workers failed; will look again"),
            }
        }
    }

    /// One sweep (see [`Agent::sweep_orphans_until`]); how many messages it handed back.
    pub async fn sweep_orphans(&self) -> Result<usize, AgentError> {
        let gateway = &self.inner.deps.gateway;
        // Rows started after this instant belong to reruns, never to the dead turns.
        let swept_at = Utc::now();
        let recovered = gateway.recover_orphans(self.inner.deps.config.orphan_after()).await?;
        if recovered.is_empty() {
            return Ok(0);
        }
        let ids: HashSet<MessageId> = recovered.iter().map(|event| event.message.id.clone()).collect();
        let ledger = &self.inner.deps.ledger;
        for entry in ledger.unfinished_activations().await? {
            let dead_turn = entry.started_at.is_some_and(|at| at <= swept_at)
                && entry.message_id.as_ref().is_some_and(|id| ids.contains(id));
            if dead_turn {
                ledger
                    .record_finished(
                        &entry.id,
                        Utc::now(),
                        Outcome::Cancelled,
                        Some("the worker stopped renewing its claim (process killed?); its message was handed back"),
                        &entry.usage,
                    )
                    .await?;
            }
        }
        Ok(ids.len())
    }
}
