//! Which messages a query or a subscription wants. One struct serves the store's list queries,
//! the gateway's `listen`, and the HTTP event stream, so "matches" means the same everywhere.

use crate::ids::SessionId;
use crate::message::Message;
use crate::status::{MessageType, Role, Status};

/// A conjunction of optional conditions; an empty list means "any".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageFilter {
    pub session_id: Option<SessionId>,
    pub chatbot_id: Option<String>,
    pub channel_id: Option<String>,
    pub statuses: Vec<Status>,
    pub roles: Vec<Role>,
    pub types: Vec<MessageType>,
    /// Most rows a query returns (the oldest first); `None` for all.
    pub limit: Option<u32>,
}

impl MessageFilter {
    pub fn session(session_id: &SessionId) -> Self {
        MessageFilter { session_id: Some(session_id.clone()), ..Self::default() }
    }

    pub fn status(status: Status) -> Self {
        MessageFilter { statuses: vec![status], ..Self::default() }
    }

    pub fn with_chatbot(mut self, chatbot_id: &str) -> Self {
        self.chatbot_id = Some(chatbot_id.to_owned());
        self
    }

    pub fn with_channel(mut self, channel_id: &str) -> Self {
        self.channel_id = Some(channel_id.to_owned());
        self
    }

    pub fn with_statuses(mut self, statuses: &[Status]) -> Self {
        self.statuses = statuses.to_vec();
        self
    }

    pub fn with_roles(mut self, roles: &[Role]) -> Self {
        self.roles = roles.to_vec();
        self
    }

    pub fn with_types(mut self, types: &[MessageType]) -> Self {
        self.types = types.to_vec();
        self
    }

    pub fn with_limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Whether `message` satisfies every condition (the limit is not a condition).
    pub fn matches(&self, message: &Message) -> bool {
        self.session_id.as_ref().is_none_or(|s| *s == message.session_id)
            && self.chatbot_id.as_ref().is_none_or(|c| *c == message.chatbot_id)
            && self.channel_id.as_ref().is_none_or(|c| *c == message.channel_id)
            && (self.statuses.is_empty() || self.statuses.contains(&message.status))
            && (self.roles.is_empty() || self.roles.contains(&message.role))
            && (self.types.is_empty() || self.types.contains(&message.message_type))
    }
}
