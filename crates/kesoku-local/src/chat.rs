//! The conversation this crate renders into a prompt: roles, messages, tool declarations and
//! tool calls, in a provider-neutral shape of its own (the `kesoku-llm` adapter maps to it).
//!
//! Plain data only; rendering is in `template`, parsing model output in `tool_calls`.

use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatRole {
    System,
    User,
    Assistant,
    /// The result of a tool call, sent back to the model.
    Tool,
}

impl ChatRole {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// A tool call made by the model (in history, or parsed from its output).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The caller's id for the call, when it has one (local models do not produce ids).
    pub id: Option<String>,
    pub name: String,
    /// The arguments, always a JSON object.
    pub arguments: serde_json::Value,
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: ChatRole,
    pub content: String,
    /// Calls made in an assistant message.
    pub tool_calls: Vec<ToolCall>,
    /// For [`ChatRole::Tool`]: the name of the tool that produced the result.
    pub tool_name: Option<String>,
    /// For [`ChatRole::Tool`]: the id of the call answered.
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    fn plain(role: ChatRole, content: impl Into<String>) -> Self {
        Self { role, content: content.into(), tool_calls: Vec::new(), tool_name: None, tool_call_id: None }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::plain(ChatRole::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::plain(ChatRole::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::plain(ChatRole::Assistant, content)
    }

    /// An assistant message that calls tools.
    pub fn assistant_calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self { tool_calls, ..Self::plain(ChatRole::Assistant, content) }
    }

    /// The result of a tool call.
    pub fn tool_result(name: impl Into<String>, call_id: Option<String>, content: impl Into<String>) -> Self {
        Self { tool_name: Some(name.into()), tool_call_id: call_id, ..Self::plain(ChatRole::Tool, content) }
    }
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// A whole conversation to render.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatPrompt {
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
}
