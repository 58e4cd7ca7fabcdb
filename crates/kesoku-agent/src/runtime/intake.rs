//! Intake: each message that waits for the agent becomes an activation, recorded in the ledger
//! and then queued on its lane, in the order the messages arrive. No activation is queued
//! before its ledger row is stored.
//!
//! Exactly once across processes: every intake (each `ingest` or `all` process) hears every
//! waiting message, so the activation's id is derived from what they all see alike, the
//! message's id and the store revision at which it waits ([`dispatch_id`]); the ledger insert
//! reports whether it stored the row, and only the intake that stored it queues it. A message
//! handed back to `pending_agent` later waits at a newer revision: a new dispatch, a new id.
//! The crash between the ledger insert and the push is covered by [`Agent::sweep`].
use chrono::Utc;
use futures::StreamExt;
use kesoku_broker::StopReason;
use kesoku_core::activation::{MaintenanceTask, ReplyMode, Trigger, TriggerContext};
use kesoku_core::{
    Activation, ActivationId, ActivationKind, ActivationPayload, ActivationRequest, ExpectedResponse, Lane,
    LedgerEntry, Message, MessageFilter, MessageId, MessageType, Orchestration, Role, SessionKind, Status,
};
use kesoku_gateway::ListenFrom;
use tokio_util::sync::CancellationToken;

use super::Agent;
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
                        Ok(event) => agent.record(event.message, event.rev).await,
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
                    continue;
                }
            };
            // False only at shutdown: the row is stored, the sweep (or the next start) queues it.
            if !self.dispatch_until_done(&message, activation, &shutdown).await {
                tracing::info!(message_id = %message.id, "shutting down before queueing a message; the sweep queues it");
            }
        }
    }

    /// [`Agent::dispatch`], retried with backoff while the broker or the queue is unreachable (a
    /// Redis outage): the message is stored and its ledger row written, so it must not wait for
    /// the next start. Later messages wait behind it, keeping the arrival order. False when
    /// shutdown came first (the message stays `pending_agent` for the next start).
    async fn dispatch_until_done(
        &self,
        message: &Message,
        activation: Activation,
        shutdown: &CancellationToken,
    ) -> bool {
        let mut delay = std::time::Duration::from_millis(100);
        loop {
            match self.dispatch(message, activation.clone()).await {
                Ok(()) => return true,
                Err(error) => {
                    tracing::warn!(%error, message_id = %message.id, "queueing a message failed; retrying");
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(std::time::Duration::from_secs(5));
        }
    }

    /// The activation of `message` waiting at revision `rev`, its ledger row stored by this
    /// call; `None` when the row existed (this process or another one recorded this dispatch
    /// already, and queued it or will).
    pub(super) async fn record(
        &self,
        message: Message,
        rev: i64,
    ) -> Result<Option<(Message, Activation)>, (MessageId, AgentError)> {
        let mut activation = self.activation_for(&message);
        activation.id = dispatch_id(&message.id, rev);
        match self.inner.deps.ledger.record_enqueued(&LedgerEntry::enqueued(&activation)).await {
            Ok(true) => Ok(Some((message, activation))),
            Ok(false) => Ok(None),
            Err(error) => Err((message.id, error.into())),
        }
    }

    /// Stop an older turn of the session when the channel's mode says so, and queue the
    /// activation (its ledger row is stored: every run has its row, whichever process runs it).
    pub(super) async fn dispatch(&self, message: &Message, activation: Activation) -> Result<(), AgentError> {
        let deps = &self.inner.deps;
        let mode = deps.config.queue_mode_for(&message.chatbot_id, &message.channel_id);
        if is_human(message) && mode == QueueMode::Interrupt {
            deps.gateway.request_stop(&message.session_id, StopReason::NewerMessage, Some(&message.id)).await?;
        }
        deps.queue.push(activation).await?;
        Ok(())
    }

    /// The activation of a root message: its kind and payload from `metadata.activation` (what
    /// the producer asked for; a Cronjob Trigger Message without it is a workflow), its lane
    /// from the kind and who triggered it, its model and output schema from the message.
    pub(super) fn activation_for(&self, message: &Message) -> Activation {
        let request = requested(message);
        let kind = request.as_ref().map_or(ActivationKind::Message, |r| r.kind);
        let message_id = message.id.clone();
        let task = || request.as_ref().and_then(|r| r.task.clone()).unwrap_or_else(|| message.content.clone());
        let trigger_of = |source: &str| {
            request.as_ref().and_then(|r| r.trigger.clone()).unwrap_or_else(|| TriggerContext {
                name: message.metadata.cron_job.clone().unwrap_or_else(|| source.to_owned()),
                source: source.to_owned(),
                schedule: None,
                fired_at: message.created_at.unwrap_or_else(Utc::now),
            })
        };
        let (payload, trigger, default_by) = match kind {
            ActivationKind::Workflow => {
                let trigger = trigger_of("cron");
                let by = format!("{}:{}", trigger.source, trigger.name);
                (ActivationPayload::Workflow { message_id, task: task(), trigger }, Trigger::Schedule, by)
            }
            ActivationKind::DirectTrigger => {
                let trigger = trigger_of("api");
                let by = trigger.source.clone();
                (ActivationPayload::DirectTrigger { message_id, task: task(), trigger }, Trigger::System, by)
            }
            ActivationKind::FollowUp => match request.as_ref().and_then(|r| r.followup_id.clone()) {
                Some(followup_id) => (
                    ActivationPayload::FollowUp { message_id, followup_id, task: task() },
                    Trigger::System,
                    "follow-up".to_owned(),
                ),
                None => unasked(message),
            },
            ActivationKind::BackgroundJobResult => match request.as_ref().and_then(|r| r.job_id.clone()) {
                Some(job_id) => {
                    let by = format!("job:{job_id}");
                    (ActivationPayload::BackgroundJobResult { job_id, message_id }, Trigger::System, by)
                }
                None => unasked(message),
            },
            ActivationKind::SubAgentResult => match request.as_ref().and_then(|r| r.child_session_id.clone()) {
                Some(child_session_id) => {
                    let by = format!("sub-agent:{child_session_id}");
                    (
                        ActivationPayload::SubAgentResult { message_id, child_session_id, summary: task() },
                        Trigger::System,
                        by,
                    )
                }
                None => unasked(message),
            },
            // Not made from a stored message (the runtime makes them itself), or not produced
            // by this version: the message is answered as what it is.
            ActivationKind::Message | ActivationKind::VoiceTranscript | ActivationKind::Maintenance => unasked(message),
        };
        let lane = Lane::derive(payload.kind(), trigger, SessionKind::Interactive);
        let config = &self.inner.deps.config;
        let (agent, orchestration) = match request.as_ref().and_then(|r| r.agent.clone()) {
            Some(agent) => (Some(agent), request.as_ref().and_then(|r| r.orchestration.clone())),
            None => self.route(message),
        };
        Activation {
            id: ActivationId::generate(),
            session_id: message.session_id.clone(),
            chatbot_id: message.chatbot_id.clone(),
            channel_id: message.channel_id.clone(),
            triggered_by: request.as_ref().and_then(|r| r.triggered_by.clone()).unwrap_or(default_by),
            delegation_user: request.as_ref().and_then(|r| r.delegation_user.clone()),
            depth: request.as_ref().map_or(0, |r| r.depth),
            agent,
            orchestration,
            lane,
            expected_response: ExpectedResponse::default(),
            locale: config.locale.clone(),
            timezone: request
                .as_ref()
                .and_then(|r| r.timezone.clone())
                .or_else(|| config.timezone_for(&message.chatbot_id).map(str::to_owned)),
            model: message.metadata.model.clone(),
            output_schema: request.and_then(|r| r.output_schema),
            created_at: Utc::now(),
            payload,
        }
    }

    /// Who answers a root that names no agent: the first configured agent its text mentions
    /// (the worker's access check refuses one that does not sit in the channel); else the
    /// channel's agents, a round when several sit there; else the default agent.
    fn route(&self, message: &Message) -> (Option<String>, Option<Orchestration>) {
        let personas = &self.inner.deps.personas;
        if personas.is_empty() {
            return (None, None);
        }
        if let Some(mentioned) = personas.mentioned_in(&message.content).first() {
            return (Some(mentioned.name.clone()), None);
        }
        let parent = message.metadata.thread.as_ref().map(|t| t.parent_channel_id.as_str());
        let members: Vec<String> = personas
            .members_of(&message.chatbot_id, &message.channel_id, parent)
            .iter()
            .map(|p| p.name.clone())
            .collect();
        match members.len() {
            0 => (None, None),
            1 => (members.into_iter().next(), None),
            _ => {
                let round = Orchestration::start(members);
                (round.as_ref().and_then(|r| r.current().map(str::to_owned)), round)
            }
        }
    }

    /// A maintenance activation of `session` on the background lane (no root message: it
    /// answers nobody).
    pub(super) fn maintenance_for(
        &self,
        session_id: &kesoku_core::SessionId,
        chatbot_id: &str,
        channel_id: &str,
        task: MaintenanceTask,
    ) -> Activation {
        let payload = ActivationPayload::Maintenance { task };
        Activation {
            id: ActivationId::generate(),
            session_id: session_id.clone(),
            chatbot_id: chatbot_id.to_owned(),
            channel_id: channel_id.to_owned(),
            triggered_by: "system".to_owned(),
            delegation_user: None,
            depth: 0,
            agent: None,
            orchestration: None,
            lane: Lane::derive(payload.kind(), Trigger::System, SessionKind::Interactive),
            expected_response: ExpectedResponse { mode: ReplyMode::InternalOnly, ..ExpectedResponse::default() },
            locale: None,
            timezone: None,
            model: None,
            output_schema: None,
            created_at: Utc::now(),
            payload,
        }
    }
}

/// The id of the activation of `message_id` waiting for the agent at store revision `rev`:
/// the same in every process that hears it (`act_<message id>@<rev>`).
pub fn dispatch_id(message_id: &MessageId, rev: i64) -> ActivationId {
    ActivationId::from(format!("{}_{message_id}@{rev}", ActivationId::PREFIX))
}

/// What the message asks for: its `metadata.activation`, or a workflow for a Cronjob Trigger
/// Message written before triggers carried one.
fn requested(message: &Message) -> Option<ActivationRequest> {
    match &message.metadata.activation {
        Some(request) => Some(ActivationRequest::clone(request)),
        None if message.is_cron_trigger() => Some(ActivationRequest::new(ActivationKind::Workflow)),
        None => None,
    }
}

/// A `message` activation: a person's text (interactive), or a system message (responsive).
fn unasked(message: &Message) -> (ActivationPayload, Trigger, String) {
    let payload = ActivationPayload::Message { message_id: message.id.clone() };
    if message.role == Role::System {
        (payload, Trigger::System, "system".to_owned())
    } else {
        (payload, Trigger::Human, message.sender.clone())
    }
}

/// A message a person wrote (not a scheduled prompt, not a trigger, not a system message): only
/// these interrupt or supersede a running turn.
pub(super) fn is_human(message: &Message) -> bool {
    message.role == Role::User
        && message.message_type == MessageType::Text
        && !message.is_cron_trigger()
        && message.metadata.activation.is_none()
}
