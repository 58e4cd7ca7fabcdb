//! Crash recovery at start-up: work held by dead workers is handed back, their open tool calls
//! get a synthetic "restarted" result, and their ledger rows are closed.

use chrono::Utc;
use kesoku_core::{ActivationId, MessageFilter, MessageId, Outcome, Status, TurnOrigin};
use kesoku_tools::ToolOutput;

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
            if !still_running {
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
