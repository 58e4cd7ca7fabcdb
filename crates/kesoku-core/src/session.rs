//! Sessions: one conversation's history, and which session a (chatbot, channel) pair talks to now.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::SessionId;

/// A conversation. Every message belongs to exactly one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub id: SessionId,
    /// The chatbot and channel the session was opened for.
    pub chatbot_id: String,
    pub channel_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Session {
    /// A new session for a channel, stamped `now`.
    pub fn new(chatbot_id: &str, channel_id: &str, now: DateTime<Utc>) -> Self {
        Session {
            id: SessionId::generate(),
            chatbot_id: chatbot_id.to_owned(),
            channel_id: channel_id.to_owned(),
            title: None,
            created_at: now,
            updated_at: now,
        }
    }
}
