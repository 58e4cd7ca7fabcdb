//! Typed message metadata for the keys the spec names, keeping every other key as it came.
//!
//! Platforms attach their own ids (`discord_message_id`, `wechat_cronjob`, …); those we do not
//! model land in [`Metadata::extra`] and are written back unchanged.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// A file attached to a message, staged in the session's folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// Path of the staged file (relative to the workspace, or absolute).
    pub path: String,
    pub mime_type: String,
    /// The name the user gave the file.
    pub filename: String,
}

/// Figures shown with a final answer (spec example 6.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TurnMetrics {
    /// Completed turns in the session, this one included.
    pub session_turns: u64,
    /// Tokens of the context the model saw on its last call.
    pub context_tokens: u64,
    /// Tool calls made during this turn.
    pub turn_tool_calls: u64,
    /// Tokens used by all model calls of this turn (input + output).
    pub turn_tokens: u64,
    /// Wall-clock seconds of the turn.
    pub turn_time: f64,
}

/// What a compaction summary replaces: whole turns, from `first_turn` to `last_turn` (their
/// root message ids, inclusive, in phased order). Nothing is deleted; the summary stands in for
/// those turns in what the model sees until it is undone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionSummary {
    pub first_turn: crate::MessageId,
    pub last_turn: crate::MessageId,
    /// Turns and messages the summary stands in for.
    pub turns: u32,
    pub messages: u32,
    /// Set by `kesoku history uncompact`: the turns are shown in full again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub undone: bool,
}

/// Message metadata: the spec's keys, typed, plus whatever else arrived.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Metadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// The arguments object the model passed to the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_arguments: Option<Value>,
    /// A short summary of the tool's output (the full output is the message content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_result: Option<String>,
    /// Set when the tool failed: what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_error: Option<String>,
    /// The provider's id for the call, echoed on its result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The provider's opaque signature of a thought or call, echoed back on later requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thought_signature: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments: Option<Vec<Attachment>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_metrics: Option<TurnMetrics>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_cronjob: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_compaction: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_message_id: Option<String>,
    /// Set on a compaction summary message: the range of turns it replaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_summary: Option<CompactionSummary>,
    /// Keys this version does not model, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Metadata {
    /// No key is set: serialized as an absent field.
    pub fn is_empty(&self) -> bool {
        *self == Metadata::default()
    }

    /// Convert to a JSON object (for storage).
    pub fn to_value(&self) -> Value {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Map::new()))
    }

    /// Parse from a JSON value; `null` means empty.
    pub fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        if value.is_null() {
            return Ok(Self::default());
        }
        serde_json::from_value(value)
    }
}

/// Deserialize `null` (Python's `None`) as empty metadata.
pub(crate) fn null_as_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Metadata, D::Error> {
    Ok(Option::<Metadata>::deserialize(deserializer)?.unwrap_or_default())
}
