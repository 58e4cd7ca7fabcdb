//! Typed message metadata for the keys the spec names, keeping every other key as it came.
//!
//! Platforms attach their own ids (`discord_message_id`, `wechat_cronjob`, …); those we do not
//! model land in [`Metadata::extra`] and are written back unchanged.

use serde::de::{MapAccess, Visitor};
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

/// Where a thread hangs: the channel it was opened in and the message it was started from.
/// The thread itself is the message's `channel_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRef {
    /// The channel the thread was opened in (same chatbot).
    pub parent_channel_id: String,
    /// The stored message the thread was started from, when Kesoku stored it (ids derive from
    /// platform ids, so it can be named before it is read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_message_id: Option<crate::MessageId>,
}

/// Message metadata: the spec's keys, typed, plus whatever else arrived.
///
/// Deserialized by hand (below) rather than derived: a derived `#[serde(flatten)]` buffers every
/// key before sorting it out, which made reading a long history twice as slow.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
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
    /// Set on a Cronjob Trigger Message: the name of the `[[cron]]` job that posted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron_job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_compaction: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_message_id: Option<String>,
    /// Set on a user message by a chatbot whose channel asks for a model other than the
    /// default (`[[chatbots.discord.channels]] model`): the `[models.NAME]` that answers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Set on a compaction summary message: the range of turns it replaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_summary: Option<CompactionSummary>,
    /// Set on the root message of work no person typed (a workflow, a direct trigger, a
    /// follow-up, a background job's wakeup alert): the activation it asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<Box<crate::activation::ActivationRequest>>,
    /// Set on every message a configured agent's turn stores (its thoughts, tool calls and
    /// results, its answer): the `[[agents]]` name. Absent for the default agent. Each agent of a
    /// shared channel sees its own steps; another agent's answers reach it as channel context.
    /// (Boxed: every message carries these fields, and the history cache counts their size.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Box<str>>,
    /// Set on a message written inside a thread (a Discord thread, a Google Chat thread): the
    /// channel the thread hangs off and the message it was started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<Box<ThreadRef>>,
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

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(MetadataVisitor)
    }
}

struct MetadataVisitor;

impl<'de> Visitor<'de> for MetadataVisitor {
    type Value = Metadata;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a metadata object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Metadata, A::Error> {
        let mut metadata = Metadata::default();
        // A key given twice keeps its last value, as a JSON object read into a map does.
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::ToolName => metadata.tool_name = map.next_value()?,
                Key::ToolArguments => metadata.tool_arguments = map.next_value()?,
                Key::ToolResult => metadata.tool_result = map.next_value()?,
                Key::ToolError => metadata.tool_error = map.next_value()?,
                Key::ToolCallId => metadata.tool_call_id = map.next_value()?,
                Key::ThoughtSignature => metadata.thought_signature = map.next_value()?,
                Key::Attachments => metadata.attachments = map.next_value()?,
                Key::TurnMetrics => metadata.turn_metrics = map.next_value()?,
                Key::IsCronjob => metadata.is_cronjob = map.next_value()?,
                Key::CronJob => metadata.cron_job = map.next_value()?,
                Key::IsCompaction => metadata.is_compaction = map.next_value()?,
                Key::DiscordMessageId => metadata.discord_message_id = map.next_value()?,
                Key::Model => metadata.model = map.next_value()?,
                Key::CompactionSummary => metadata.compaction_summary = map.next_value()?,
                Key::Activation => metadata.activation = map.next_value()?,
                Key::Agent => metadata.agent = map.next_value()?,
                Key::Thread => metadata.thread = map.next_value()?,
                Key::Other(name) => {
                    let value: Value = map.next_value()?;
                    metadata.extra.insert(name, value);
                }
            }
        }
        Ok(metadata)
    }
}

/// A metadata key: one of the typed fields, or any other name (kept in `extra`).
enum Key {
    ToolName,
    ToolArguments,
    ToolResult,
    ToolError,
    ToolCallId,
    ThoughtSignature,
    Attachments,
    TurnMetrics,
    IsCronjob,
    CronJob,
    IsCompaction,
    DiscordMessageId,
    Model,
    CompactionSummary,
    Activation,
    Agent,
    Thread,
    Other(String),
}

impl Key {
    fn known(name: &str) -> Option<Key> {
        Some(match name {
            "tool_name" => Key::ToolName,
            "tool_arguments" => Key::ToolArguments,
            "tool_result" => Key::ToolResult,
            "tool_error" => Key::ToolError,
            "tool_call_id" => Key::ToolCallId,
            "thought_signature" => Key::ThoughtSignature,
            "attachments" => Key::Attachments,
            "turn_metrics" => Key::TurnMetrics,
            "is_cronjob" => Key::IsCronjob,
            "cron_job" => Key::CronJob,
            "is_compaction" => Key::IsCompaction,
            "discord_message_id" => Key::DiscordMessageId,
            "model" => Key::Model,
            "compaction_summary" => Key::CompactionSummary,
            "activation" => Key::Activation,
            "agent" => Key::Agent,
            "thread" => Key::Thread,
            _ => return None,
        })
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a metadata key")
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Key, E> {
                Ok(Key::known(name).unwrap_or_else(|| Key::Other(name.to_owned())))
            }

            fn visit_string<E: serde::de::Error>(self, name: String) -> Result<Key, E> {
                Ok(Key::known(&name).unwrap_or(Key::Other(name)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Deserialize `null` (Python's `None`) as empty metadata.
pub(crate) fn null_as_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Metadata, D::Error> {
    Ok(Option::<Metadata>::deserialize(deserializer)?.unwrap_or_default())
}
