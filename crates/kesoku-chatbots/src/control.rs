//! Stop, clear and compact a session: the one control every chatbot's commands and the HTTP
//! API use.
//!
//! Stopping a turn needs whoever runs it (the binary implements [`SessionControl::stop_session`]
//! over the agent runtime); clearing and compacting only touch the store and are provided, so
//! an implementation overrides them only to do more.
//!
//! Not here: replies to people ([`crate::commands`] words them) or HTTP shapes.

use async_trait::async_trait;
use chrono::Utc;
use kesoku_core::{Message, Session, SessionId};
use kesoku_gateway::Gateway;

use crate::ChatbotError;

/// What the user posts when they run `/compact` (the Manual Compaction Trigger's content).
pub const COMPACTION_REQUEST: &str =
    "[System Notification] The user manually requested compaction of the conversation history.";

/// What a stop request achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopAck {
    /// Whether the running turn (if any) was asked to stop.
    pub turn: TurnStop,
    /// Messages of the session that were waiting and are now `interrupted`.
    pub interrupted_waiting: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnStop {
    /// The runtime was asked to stop the session's turn (wherever it runs, if any runs).
    Requested,
    /// The turn cannot be stopped from here; the reason says why and what to do.
    Unreachable(String),
}

/// Stop, clear and compact sessions.
#[async_trait]
pub trait SessionControl: Send + Sync {
    /// Stop the session's running turn (its message becomes `interrupted`) and interrupt its
    /// messages still waiting for a worker.
    async fn stop_session(&self, session_id: &SessionId) -> Result<StopAck, ChatbotError>;

    /// Start a new session for (`chatbot_id`, `channel_id`); the old one is kept.
    async fn clear_session(
        &self,
        gateway: &Gateway,
        chatbot_id: &str,
        channel_id: &str,
    ) -> Result<Session, ChatbotError> {
        let session = Session::new(chatbot_id, channel_id, Utc::now());
        gateway.store().create_session(&session).await?;
        gateway.store().set_active_session(chatbot_id, channel_id, &session.id).await?;
        Ok(session)
    }

    /// Post a Manual Compaction Trigger to the session of (`chatbot_id`, `channel_id`); the
    /// agent runs it like a turn.
    async fn compact_session(
        &self,
        gateway: &Gateway,
        session_id: &SessionId,
        chatbot_id: &str,
        channel_id: &str,
    ) -> Result<Message, ChatbotError> {
        let trigger = Message::compaction_trigger(session_id, chatbot_id, channel_id, COMPACTION_REQUEST);
        gateway.post(&trigger).await?;
        Ok(trigger)
    }
}
