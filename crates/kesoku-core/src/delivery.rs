//! Delivery records: which platform message carries which part of a Kesoku message.
//!
//! A final answer may go out as several platform messages (a long text in chunks, a file, a
//! question with buttons); each sent part is recorded once it is on the platform, so a delivery
//! that is retried after a crash skips the parts already sent and a later edit or deletion can
//! find them. This module is plain data: how a text is split and sent is the chatbots' business,
//! how records are kept is the store's.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::MessageId;

/// One part of a message as the platform received it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    /// The Kesoku message the part belongs to.
    pub message_id: MessageId,
    /// The part's index in the message's outbound parts, from 0.
    pub part: u32,
    /// The id the platform gave the sent message (a Discord message id, a Google Chat message
    /// name, …).
    pub platform_message_id: String,
    pub recorded_at: DateTime<Utc>,
}
