//! Intake: each message that waits for the agent becomes an activation, recorded in the ledger
//! and then queued on its lane, in the order the messages arrive. No activation is queued
//! before its ledger row is stored.

use chrono::Utc;
use futures::StreamExt;
use kesoku_broker::StopReason;
use kesoku_core::activation::Trigger;
use kesoku_core::{
    Activation, ActivationId, ActivationPayload, ExpectedResponse, Lane, LedgerEntry, Message, MessageFilter,
    MessageId, MessageType, Role, SessionKind, Status,
};
use kesoku_gateway::ListenFrom;
use tokio_util::sync::CancellationToken;

use super::{Agent, lock};
use crate::config::QueueMode;
use crate::error::AgentError;

/// Ledger rows of up to this many waiting messages are written at once (the store commits them
/// together); the messages are still queued in the order they arrived. One row at a time capped
/// intake at one store round trip per message.
const INTAKE_CONCURRENCY: usize = 64;

impl Agent {
    /// Queue every message that waits for the agent, in the order they arrive. A message whose
    /// activation cannot be recorded or queued stays `pending_agent` for the next start.
    pub(super) async fn intake(&self, shutdown: CancellationToken) {
        let agent = self.clone();
        let recorded = self
            .inner
            .deps
            .gateway
            .listen(MessageFilter::status(Status::PendingAgent), ListenFrom::Current)
            .map(move |event| {
                let agent = agent.clone();
                async move {
                    match event {
                        Ok(event) => agent.record(event.message).await,
                        Err(error) => {
                            tracing::warn!(%error, "reading pending work failed; will catch up on the next event");
                            Ok(None)
                        }
                    }
                }
            })
            .buffered(INTAKE_CONCURRENCY);
        let mut recorded = Box::pin(recorded);
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = recorded.next() => next,
            };
            let (message, activation) = match next {
                None => return,
                Some(Ok(Some(recorded))) => recorded,
                Some(Ok(None)) => continue,
                Some(Err((message_id, error))) => {
                    tracing::error!(%error, %message_id, "recording a message's activation failed; it stays pending");
                    lock(&self.inner.queued).remove(&message_id);
                    continue;
                }
            };
            if let Err(error) = self.dispatch(&message, activation).await {
                tracing::error!(%error, message_id = %message.id, "queueing a message failed; it stays pending");
                lock(&self.inner.queued).remove(&message.id);
            }
        }
    }

    /// The activation of `message`, its ledger row stored; `None` when the message is queued
    /// already (announced again while its activation waits).
    async fn record(&self, message: Message) -> Result<Option<(Message, Activation)>, (MessageId, AgentError)> {
        if !lock(&self.inner.queued).insert(message.id.clone()) {
            return Ok(None);
        }
        let activation = self.activation_for(&message);
        match self.inner.deps.ledger.record_enqueued(&LedgerEntry::enqueued(&activation)).await {
            Ok(()) => Ok(Some((message, activation))),
            Err(error) => Err((message.id, error.into())),
        }
    }

    /// Stop an older turn of the session when the channel's mode says so, and queue the
    /// activation (its ledger row is stored: every run has its row, whichever process runs it).
    async fn dispatch(&self, message: &Message, activation: Activation) -> Result<(), AgentError> {
        let deps = &self.inner.deps;
        let mode = deps.config.queue_mode_for(&message.chatbot_id, &message.channel_id);
        if is_human(message) && mode == QueueMode::Interrupt {
            deps.gateway.request_stop(&message.session_id, StopReason::NewerMessage, Some(&message.id)).await?;
        }
        deps.queue.push(activation).await?;
        Ok(())
    }

    pub(super) fn activation_for(&self, message: &Message) -> Activation {
        let trigger = if message.is_cron_trigger() {
            Trigger::Schedule
        } else if message.role == Role::System {
            Trigger::System
        } else {
            Trigger::Human
        };
        let kind = ActivationPayload::Message { message_id: message.id.clone() };
        let lane = Lane::derive(kind.kind(), trigger, SessionKind::Interactive);
        Activation {
            id: ActivationId::generate(),
            session_id: message.session_id.clone(),
            chatbot_id: message.chatbot_id.clone(),
            channel_id: message.channel_id.clone(),
            triggered_by: match trigger {
                Trigger::Human => message.sender.clone(),
                Trigger::Schedule => "cron".to_owned(),
                Trigger::System => "system".to_owned(),
            },
            delegation_user: None,
            depth: 0,
            lane,
            expected_response: ExpectedResponse::default(),
            locale: self.inner.deps.config.locale.clone(),
            timezone: self.inner.deps.config.timezone.clone(),
            model: None,
            output_schema: None,
            created_at: Utc::now(),
            payload: kind,
        }
    }
}

/// A message a person wrote (not a scheduled prompt, not a system message): only these
/// interrupt or supersede a running turn.
pub(super) fn is_human(message: &Message) -> bool {
    message.role == Role::User && message.message_type == MessageType::Text && !message.is_cron_trigger()
}
