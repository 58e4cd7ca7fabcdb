//! The result keeper: a child's turn ended → its result goes into the parent session; a
//! parent stopped → its children stop.
//!
//! It listens for roots of sub-agent sessions (chatbot [`AGENT_CHATBOT`]) that reached a final
//! status (from the store's current state at start, so results missed while nothing ran are
//! posted then), for interrupted roots anywhere (a stopped or interrupted turn stops the children
//! it delegated to), and for stop requests of a person (`/stop`, `kesoku stop`: every child of
//! the session stops).

use std::future::Future;
use std::pin::Pin;

use futures::StreamExt;
use kesoku_broker::{Control, StopReason};
use kesoku_core::{
    ActivationKind, ActivationRequest, Message, MessageFilter, MessageId, MessageType, Role, SessionId, Status,
};
use kesoku_gateway::{Gateway, GatewayError, ListenFrom};
use kesoku_store::{SessionFilter, StoreError};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{AGENT_CHATBOT, result_message_id};

/// Key in a child root's `metadata` (its free-form part) set when the child was stopped because
/// its parent was: such a child sends no result.
pub const STOPPED_WITH_PARENT: &str = "stopped_with_parent";
/// Longest task quoted back in a result message, in characters.
const TASK_QUOTED_CHARS: usize = 300;

/// Posts sub-agents' results and stops the children of stopped parents. Cheap to clone; run
/// one per process (two are safe: each result is posted once whoever posts it).
#[derive(Clone)]
pub struct ResultKeeper {
    gateway: Gateway,
}

impl std::fmt::Debug for ResultKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultKeeper").finish_non_exhaustive()
    }
}

type StopFuture<'a> = Pin<Box<dyn Future<Output = Result<usize, GatewayError>> + Send + 'a>>;

impl ResultKeeper {
    pub fn new(gateway: Gateway) -> Self {
        ResultKeeper { gateway }
    }

    /// Report ended children and stop children of stopped parents until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let ended_filter = MessageFilter {
            chatbot_id: Some(AGENT_CHATBOT.to_owned()),
            statuses: vec![Status::Processed, Status::Error, Status::Interrupted],
            ..MessageFilter::default()
        };
        let mut ended = Box::pin(self.gateway.listen(ended_filter, ListenFrom::Current));
        let mut interrupted =
            Box::pin(self.gateway.listen(MessageFilter::status(Status::Interrupted), ListenFrom::Now));
        let mut controls = Box::pin(self.gateway.controls());
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                event = ended.next() => match event {
                    Some(Ok(event)) => {
                        if let Err(error) = self.report(&event.message).await {
                            tracing::error!(%error, message_id = %event.message.id, "reporting a sub-agent's result failed; it is tried again at the next start");
                        }
                    }
                    Some(Err(error)) => tracing::warn!(%error, "reading ended sub-agents failed; catching up on the next event"),
                    None => return,
                },
                event = interrupted.next() => match event {
                    Some(Ok(event)) if event.message.parent_id.is_none() => {
                        let root = &event.message;
                        if let Err(error) = self.stop_children(&root.session_id, Some(&root.id)).await {
                            tracing::error!(%error, session_id = %root.session_id, "stopping the sub-agents of an interrupted turn failed");
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => tracing::warn!(%error, "reading interrupted turns failed"),
                    None => return,
                },
                control = controls.next() => match control {
                    Some(Control::Stop { session_id, reason: StopReason::UserRequest, .. }) => {
                        if let Err(error) = self.stop_children(&session_id, None).await {
                            tracing::error!(%error, %session_id, "stopping the sub-agents of a stopped session failed");
                        }
                    }
                    Some(Control::Stop { .. }) => {}
                    None => return,
                },
            }
        }
    }

    /// `root` of a sub-agent session ended: mark its turn's answers delivered, then post its
    /// result into the parent session (once, whoever else tries), unless it was stopped with
    /// its parent. True when this call posted the result.
    pub async fn report(&self, root: &Message) -> Result<bool, GatewayError> {
        if root.parent_id.is_some() || !matches!(root.status, Status::Processed | Status::Error | Status::Interrupted) {
            return Ok(false);
        }
        let store = self.gateway.store();
        let Some(session) = store.get_session(&root.session_id).await? else { return Ok(false) };
        if session.chatbot_id != AGENT_CHATBOT {
            return Ok(false);
        }
        // Reported already (its answers were marked before): nothing left to do. This keeps a
        // start, which sees every ended sub-agent again, to one read per turn.
        let result_id = result_message_id(&root.id);
        if store.get_message(&result_id).await?.is_some() {
            return Ok(false);
        }
        let messages = store.list_messages(&MessageFilter::session(&root.session_id)).await?;
        let turn = turn_of(&root.id, &messages);
        // Nobody delivers chatbot `agent`: the turn's answers are final once it ended.
        for message in turn.iter().filter(|m| m.awaits_delivery()) {
            match self.gateway.update_status(&message.id, Status::Delivered).await {
                Ok(_) | Err(GatewayError::Store(StoreError::IllegalTransition { .. })) => {}
                Err(error) => return Err(error),
            }
        }
        if stopped_with_parent(root) {
            return Ok(false);
        }
        // The child's task (its first root) says where the result goes.
        let Some(task) = messages.iter().chain(std::iter::once(root)).find_map(|m| {
            m.metadata.activation.as_ref().filter(|request| request.parent.is_some()).map(|request| (m, request))
        }) else {
            return Ok(false);
        };
        let (task_root, request) = task;
        let Some(parent) = request.parent.clone() else { return Ok(false) };
        let (chatbot_id, channel_id) = match store.get_message(&parent.message_id).await? {
            Some(parent_root) => (parent_root.chatbot_id, parent_root.channel_id),
            None => match store.get_session(&parent.session_id).await? {
                Some(parent_session) => (parent_session.chatbot_id, parent_session.channel_id),
                None => {
                    tracing::warn!(child_session = %root.session_id, parent_session = %parent.session_id, "the parent session of a sub-agent is gone; its result is dropped");
                    return Ok(false);
                }
            },
        };
        let (how, summary) = summary(root, &turn);
        let task_text = request.task.clone().unwrap_or_else(|| task_root.content.clone());
        let content = format!(
            "[Sub-agent result] The sub-agent you delegated a task to {how} (session {}).\nTask: {}\n\n{summary}",
            root.session_id,
            shorten(&task_text, TASK_QUOTED_CHARS)
        );
        let mut result = Message::wakeup_alert(&parent.session_id, &chatbot_id, &channel_id, content);
        result.id = result_id;
        result.metadata.activation = Some(Box::new(ActivationRequest {
            task: Some(summary),
            child_session_id: Some(root.session_id.clone()),
            depth: request.depth.saturating_sub(1),
            delegation_user: request.delegation_user.clone(),
            triggered_by: Some(format!("sub-agent:{}", root.session_id)),
            // Back to the agent that delegated (a configured one answers its own results).
            agent: parent.agent.clone(),
            ..ActivationRequest::new(ActivationKind::SubAgentResult)
        }));
        match self.gateway.post(&result).await {
            Ok(_) => {
                tracing::info!(child_session = %root.session_id, parent_session = %parent.session_id, "sub-agent result posted");
                Ok(true)
            }
            Err(GatewayError::Store(StoreError::Duplicate { .. })) => Ok(false),
            Err(GatewayError::Broker(error)) => {
                tracing::warn!(%error, "a sub-agent result is stored but was not announced");
                Ok(true)
            }
            Err(error) => Err(error),
        }
    }

    /// Stop the sub-agents of `session_id` (only those a turn of `root` delegated to, when
    /// given), and theirs in turn: running turns get a stop request, waiting roots go
    /// `interrupted`, each marked [`STOPPED_WITH_PARENT`] first so none reports back. Answers
    /// how many child sessions had work to stop.
    pub fn stop_children<'a>(&'a self, session_id: &'a SessionId, root: Option<&'a MessageId>) -> StopFuture<'a> {
        Box::pin(async move {
            let store = self.gateway.store();
            let filter = SessionFilter {
                chatbot_id: Some(AGENT_CHATBOT.to_owned()),
                channel_id: Some(session_id.to_string()),
                limit: None,
            };
            let mut stopped = 0;
            for child in store.list_sessions(&filter).await? {
                let messages = store.list_messages(&MessageFilter::session(&child.id)).await?;
                if let Some(root) = root {
                    let delegated_by = messages.iter().find_map(|m| {
                        m.metadata.activation.as_ref().and_then(|r| r.parent.as_ref()).map(|p| p.message_id.clone())
                    });
                    if delegated_by.as_ref() != Some(root) {
                        continue;
                    }
                }
                if self.stop_child(&child.id, &messages).await? {
                    stopped += 1;
                }
                // Its own children too, also when it has nothing running (it may wait for them).
                stopped += self.stop_children(&child.id, None).await?;
            }
            Ok(stopped)
        })
    }

    async fn stop_child(&self, child: &SessionId, messages: &[Message]) -> Result<bool, GatewayError> {
        let open: Vec<&Message> = messages
            .iter()
            .filter(|m| m.parent_id.is_none() && matches!(m.status, Status::PendingAgent | Status::Processing))
            .collect();
        if open.is_empty() {
            return Ok(false);
        }
        for root in &open {
            let mut metadata = root.metadata.clone();
            metadata.extra.insert(STOPPED_WITH_PARENT.to_owned(), Value::Bool(true));
            self.gateway.update_metadata(&root.id, &metadata).await?;
        }
        for root in open.iter().filter(|m| m.status == Status::PendingAgent) {
            self.gateway.claim(&root.id, Status::Interrupted, &[Status::PendingAgent], "stop").await?;
        }
        // Also when none was seen running: one may have been claimed since it was listed.
        self.gateway.request_stop(child, StopReason::UserRequest, None).await?;
        tracing::info!(child_session = %child, "sub-agent stopped with its parent");
        Ok(true)
    }
}

/// The messages of `root`'s turn: its steps (parent: the root) and their tool results (parent:
/// the call), in the order they were written.
fn turn_of<'a>(root: &MessageId, messages: &'a [Message]) -> Vec<&'a Message> {
    let steps: std::collections::HashSet<&MessageId> =
        messages.iter().filter(|m| m.parent_id.as_ref() == Some(root)).map(|m| &m.id).collect();
    messages
        .iter()
        .filter(|m| m.parent_id.as_ref().is_some_and(|parent| parent == root || steps.contains(parent)))
        .collect()
}

fn stopped_with_parent(root: &Message) -> bool {
    root.metadata.extra.get(STOPPED_WITH_PARENT).and_then(Value::as_bool).unwrap_or(false)
}

/// How the child's turn ended, in words, and its summary: its final answer, or why it has none.
fn summary(root: &Message, turn: &[&Message]) -> (&'static str, String) {
    let answer = turn
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant && m.message_type == MessageType::Text && !m.is_notification())
        .map(|m| m.content.trim().to_owned())
        .filter(|text| !text.is_empty());
    match root.status {
        Status::Processed => ("finished", answer.unwrap_or_else(|| "(It finished without an answer.)".to_owned())),
        Status::Error => {
            let why = turn
                .iter()
                .rev()
                .find(|m| m.is_notification())
                .map(|m| m.content.trim().to_owned())
                .unwrap_or_else(|| "an error stopped it".to_owned());
            ("failed", format!("It failed: {why}"))
        }
        // `report` passes only ended roots: interrupted is the one left.
        Status::Interrupted
        | Status::PendingAgent
        | Status::Processing
        | Status::Pending
        | Status::Delivered
        | Status::Responded => ("was stopped", "It was stopped before it finished.".to_owned()),
    }
}

fn shorten(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let short: String = text.chars().take(max_chars).collect();
    format!("{short}…")
}
