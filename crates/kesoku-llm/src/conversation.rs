//! The provider-neutral conversation: what the agent sends a model and what it gets back.
//!
//! A [`Request`] is a system instruction plus strictly alternating [`Turn`]s of [`Part`]s and the
//! tools the model may call; a [`Response`] is the parts the model produced, why it stopped and
//! what it cost. Nothing here knows a vendor's JSON: providers translate these types to and from
//! their wire formats. Signatures on thoughts, text and tool calls are opaque strings that a
//! provider hands out and expects back unchanged.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One request to a model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The system instruction.
    pub system: Option<String>,
    /// The conversation, starting with a user turn and alternating user / model.
    pub turns: Vec<Turn>,
    /// Tools the model may call.
    pub tools: Vec<ToolDeclaration>,
    /// Overrides the model's configured maximum output tokens.
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    /// Overrides the model's configured thinking level.
    pub thinking: Option<ThinkingLevel>,
    /// JSON Schema the answer must follow (structured output).
    pub output_schema: Option<Value>,
}

impl Request {
    /// A request with one user turn holding `text`.
    pub fn user_text(text: impl Into<String>) -> Self {
        Request { turns: vec![Turn::user(vec![Part::text(text)])], ..Request::default() }
    }
}

/// Who speaks a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnRole {
    /// The person, the system's notifications, and tool results.
    User,
    /// The model's own output: thoughts, text, tool calls.
    Model,
}

/// One turn: consecutive parts spoken by one side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub role: TurnRole,
    pub parts: Vec<Part>,
}

impl Turn {
    pub fn user(parts: Vec<Part>) -> Self {
        Turn { role: TurnRole::User, parts }
    }

    pub fn model(parts: Vec<Part>) -> Self {
        Turn { role: TurnRole::Model, parts }
    }
}

/// One piece of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Visible text. Model text may carry the provider's signature.
    Text {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// The model's reasoning (or its summary), with the provider's signature when it gave one.
    Thought {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    ToolCall(ToolCall),
    ToolResult(ToolResult),
    Attachment(Attachment),
}

impl Part {
    pub fn text(text: impl Into<String>) -> Self {
        Part::Text { text: text.into(), signature: None }
    }

    pub fn thought(text: impl Into<String>, signature: Option<String>) -> Self {
        Part::Thought { text: text.into(), signature }
    }
}

/// A call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call (generated when the provider gives none).
    pub id: String,
    pub name: String,
    /// The arguments object.
    pub arguments: Value,
    /// The provider's signature attached to this call (Gemini), echoed back on later requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// What a tool returned for a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the call this answers.
    pub call_id: String,
    /// The tool's name (Gemini matches results to calls by name).
    pub name: String,
    /// The tool's output (may be empty when it failed).
    pub output: String,
    /// Set when the tool failed: what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A file given to the model: an image, a PDF or another file with its MIME type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    /// The name the user gave the file.
    pub filename: String,
    pub mime_type: String,
    pub source: AttachmentSource,
}

/// Where an attachment's bytes are. Files are read when the request is sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachmentSource {
    /// A staged file on disk.
    File(PathBuf),
    /// Bytes in memory (serialized as base64).
    Inline(#[serde(with = "base64_bytes")] Vec<u8>),
}

mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// A tool the model may call, with its arguments' JSON Schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDeclaration {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// How hard the model should think before answering. Each provider maps it to its own knob
/// (Gemini `thinkingLevel` / `thinkingBudget`, OpenAI `reasoning_effort`, Anthropic `budget_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingLevel {
    /// No thinking where the model allows it; no thought summaries.
    Off,
    Minimal,
    Low,
    Medium,
    High,
}

impl ThinkingLevel {
    /// Token budget for providers that take one (Gemini 2.x, Anthropic). `None` for `Off`.
    pub fn budget_tokens(self) -> Option<u32> {
        match self {
            ThinkingLevel::Off => None,
            ThinkingLevel::Minimal => Some(1024),
            ThinkingLevel::Low => Some(2048),
            ThinkingLevel::Medium => Some(8192),
            ThinkingLevel::High => Some(24576),
        }
    }

    /// The lowercase name (`off`, `minimal`, `low`, `medium`, `high`).
    pub fn as_str(self) -> &'static str {
        match self {
            ThinkingLevel::Off => "off",
            ThinkingLevel::Minimal => "minimal",
            ThinkingLevel::Low => "low",
            ThinkingLevel::Medium => "medium",
            ThinkingLevel::High => "high",
        }
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// It finished its answer.
    Stop,
    /// It wants tool results before going on.
    ToolCalls,
    /// It hit the output token limit.
    MaxOutputTokens,
    /// The provider blocked the prompt or the answer (safety, recitation, refusal, …).
    Blocked,
    /// Anything else; the provider's own reason is in [`Response::finish_detail`].
    Other,
}

/// Tokens a response cost.
///
/// `input_tokens` counts the whole prompt (cached tokens included); `output_tokens` counts
/// everything generated (thought tokens included). `thought_tokens` and `cached_tokens` say how
/// much of each was thinking and cache reads, when the provider reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub thought_tokens: u64,
    pub cached_tokens: u64,
}

impl TokenUsage {
    /// Input plus output.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// A complete answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// Thoughts, text and tool calls, in the order the model produced them.
    pub parts: Vec<Part>,
    pub finish_reason: FinishReason,
    /// The provider's own finish reason (`STOP`, `end_turn`, `content_filter`, …) or block reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_detail: Option<String>,
    pub usage: TokenUsage,
    /// The model version the provider reported, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
}

impl Response {
    /// A plain text answer (for tests and scripted models).
    pub fn text(text: impl Into<String>) -> Self {
        Response {
            parts: vec![Part::text(text)],
            finish_reason: FinishReason::Stop,
            finish_detail: None,
            usage: TokenUsage::default(),
            model_version: None,
        }
    }

    /// An answer made of `parts`; the finish reason is `ToolCalls` when a part is a tool call.
    pub fn from_parts(parts: Vec<Part>) -> Self {
        let finish_reason = if parts.iter().any(|part| matches!(part, Part::ToolCall(_))) {
            FinishReason::ToolCalls
        } else {
            FinishReason::Stop
        };
        Response { parts, finish_reason, finish_detail: None, usage: TokenUsage::default(), model_version: None }
    }

    /// All visible text, concatenated.
    pub fn text_content(&self) -> String {
        let mut text = String::new();
        for part in &self.parts {
            if let Part::Text { text: piece, .. } = part {
                text.push_str(piece);
            }
        }
        text
    }

    /// The first signature carried by a text part (Gemini signs the last part of an answer).
    pub fn text_signature(&self) -> Option<&str> {
        self.parts.iter().find_map(|part| match part {
            Part::Text { signature: Some(signature), .. } => Some(signature.as_str()),
            Part::Text { signature: None, .. }
            | Part::Thought { .. }
            | Part::ToolCall(_)
            | Part::ToolResult(_)
            | Part::Attachment(_) => None,
        })
    }

    /// The thought parts as (text, signature) pairs.
    pub fn thoughts(&self) -> Vec<(&str, Option<&str>)> {
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::Thought { text, signature } => Some((text.as_str(), signature.as_deref())),
                Part::Text { .. } | Part::ToolCall(_) | Part::ToolResult(_) | Part::Attachment(_) => None,
            })
            .collect()
    }

    /// The tool calls, in order.
    pub fn tool_calls(&self) -> Vec<&ToolCall> {
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::ToolCall(call) => Some(call),
                Part::Text { .. } | Part::Thought { .. } | Part::ToolResult(_) | Part::Attachment(_) => None,
            })
            .collect()
    }
}
