//! Anthropic messages (`POST {base_url}/v1/messages`, `x-api-key`, `anthropic-version: 2023-06-01`).
//!
//! Tool results are `tool_result` blocks at the start of the next user message; thinking blocks
//! go back with their signatures (unsigned or foreign thoughts are dropped, Anthropic would
//! reject them). With thinking on, Anthropic wants the last assistant message of a tool loop to
//! start with a thinking block: when it does not (the turn began on another model), the request
//! is sent without thinking rather than rejected. Thinking models are asked for their thoughts
//! unless the config says `thinking = "off"`: Claude 3.7 Sonnet to 4.5 with extended thinking at
//! the smallest budget (1,024 tokens), Claude 4.6 and later with adaptive thinking at the model's
//! own effort and `display: "summarized"`. Structured output has no native field here: the
//! schema is added to the system instruction.

use std::collections::HashMap;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::assemble::ResponseAssembler;
use crate::config::{ModelConfig, ModelInfo};
use crate::conversation::{FinishReason, Part, Request, Response, ThinkingLevel, ToolCall, TurnRole};
use crate::error::{LlmError, LlmErrorKind};
use crate::providers::wire_temperature;
use crate::providers::{
    AttachmentKind, Defaults, Settings, SignatureIssuer, attachment_as_text, attachment_bytes, attachment_kind, base64,
    load_attachments, untag,
};
use crate::secret::Secret;
use crate::transport::{ErrorContext, HttpCall, SseEvent, StreamDecoder, Transport, VendorError};
use crate::{Model, ResponseStream, StreamEvent};

/// The API version header value.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Smallest thinking budget Anthropic accepts. Also the budget asked for when the config sets
/// no thinking level: enough for the model to show how it goes about the task, at the least cost.
const MIN_THINKING_BUDGET: u32 = 1024;

/// How a Claude model thinks, read from its id (Anthropic's documentation lists the models).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClaudeThinking {
    /// Extended thinking with a token budget: Claude 3.7 Sonnet to the 4.5 models.
    Budget,
    /// Adaptive thinking, its depth set by `output_config.effort`: Claude 4.6 and later (4.7
    /// and later refuse `type: enabled`).
    Adaptive,
    /// A model that does not think (Claude 3.5 and older) or an id we cannot read.
    Unknown,
}

/// The `major.minor` version in a Claude model id: `claude-sonnet-4-5-20250929` → (4, 5),
/// `claude-3-7-sonnet-latest` → (3, 7), `claude-opus-4-20250514` → (4, 0) (the date is not
/// a version), `claude-opus-5` → (5, 0).
fn claude_version(model: &str) -> Option<(u32, u32)> {
    let mut numbers = model
        .strip_prefix("claude-")?
        .split('-')
        .filter(|token| token.len() <= 2)
        .filter_map(|token| token.parse::<u32>().ok());
    let major = numbers.next()?;
    Some((major, numbers.next().unwrap_or(0)))
}

fn claude_thinking(model: &str) -> ClaudeThinking {
    match claude_version(model) {
        Some(version) if version >= (4, 6) => ClaudeThinking::Adaptive,
        Some(version) if version >= (3, 7) => ClaudeThinking::Budget,
        Some(_) | None => ClaudeThinking::Unknown,
    }
}

// ---- wire payloads -------------------------------------------------------------------------

/// Body of `POST /v1/messages`.
#[derive(Debug, Clone, Serialize)]
pub struct MessagesRequest {
    pub model: String,
    pub max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub messages: Vec<AnthropicMessage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<AnthropicTool>,
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<ThinkingParams>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_config: Option<OutputConfig>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AnthropicMessage {
    pub role: String,
    pub content: Vec<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AnthropicTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` (extended thinking, Claude 3.7 Sonnet
/// to 4.5) or `{"type": "adaptive", "display": "summarized"}` (Claude 4.6 and later).
#[derive(Debug, Clone, Serialize)]
pub struct ThinkingParams {
    #[serde(rename = "type")]
    pub thinking_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u32>,
    /// `summarized`: Claude Opus 4.7 and later return empty thinking blocks unless asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display: Option<String>,
}

/// `output_config`: how much effort an adaptive-thinking model spends (`low`, `medium`, `high`).
#[derive(Debug, Clone, Serialize)]
pub struct OutputConfig {
    pub effort: String,
}

/// One streamed event (`message_start`, `content_block_start`, …), tagged by `type`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesStreamEvent {
    MessageStart {
        message: MessageStart,
    },
    ContentBlockStart {
        index: usize,
        content_block: Value,
    },
    ContentBlockDelta {
        index: usize,
        delta: Value,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        #[serde(default)]
        delta: MessageDeltaBody,
        #[serde(default)]
        usage: Option<AnthropicUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: AnthropicErrorBody,
    },
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct MessageStart {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub usage: Option<AnthropicUsage>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct MessageDeltaBody {
    #[serde(default)]
    pub stop_reason: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct AnthropicUsage {
    #[serde(default)]
    pub input_tokens: Option<u64>,
    #[serde(default)]
    pub output_tokens: Option<u64>,
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u64>,
}

/// The error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AnthropicErrorResponse {
    #[serde(default)]
    pub error: AnthropicErrorBody,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct AnthropicErrorBody {
    #[serde(default, rename = "type")]
    pub error_type: String,
    #[serde(default)]
    pub message: String,
}

// ---- the model -----------------------------------------------------------------------------

/// An Anthropic model.
#[derive(Debug)]
pub struct AnthropicModel {
    name: String,
    info: ModelInfo,
    base_url: String,
    defaults: Defaults,
    transport: Transport,
}

impl AnthropicModel {
    pub fn new(name: &str, config: &ModelConfig, api_key: Option<Secret>) -> Result<Self, LlmError> {
        Ok(AnthropicModel {
            name: name.to_owned(),
            info: config.info(),
            base_url: config.effective_base_url(),
            defaults: Defaults::from_config(config),
            transport: Transport::new(name, config, api_key)?,
        })
    }
}

#[async_trait]
impl Model for AnthropicModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        let request = load_attachments(request, &self.name).await?;
        let body = build_request(&request, self.defaults.apply(&request), &self.info);
        let body = serde_json::to_vec(&body).map_err(|error| {
            self.transport.context.error(LlmErrorKind::BadRequest, format!("could not encode the request: {error}"))
        })?;
        let key = self.transport.context.api_key.as_ref().map(|key| ("x-api-key", key.expose().to_owned()));
        let call = HttpCall {
            url: format!("{}/v1/messages", self.base_url),
            headers: self.transport.headers(key, &[("anthropic-version", ANTHROPIC_VERSION)])?,
            body: Bytes::from(body),
        };
        let context = self.transport.context.clone();
        self.transport.stream(&call, parse_error_body, || AnthropicDecoder::new(context.clone())).await
    }
}

// ---- request building ----------------------------------------------------------------------

/// The wire body for `request` (attachments already loaded).
pub fn build_request_body(request: &Request, config: &ModelConfig) -> Value {
    let settings = Defaults::from_config(config).apply(request);
    serde_json::to_value(build_request(request, settings, &config.info())).unwrap_or(Value::Null)
}

fn build_request(request: &Request, settings: Settings, info: &ModelInfo) -> MessagesRequest {
    let mut messages: Vec<AnthropicMessage> = Vec::new();
    for turn in &request.turns {
        let role = match turn.role {
            TurnRole::User => "user",
            TurnRole::Model => "assistant",
        };
        let content = match turn.role {
            TurnRole::User => user_blocks(&turn.parts),
            TurnRole::Model => assistant_blocks(&turn.parts),
        };
        if content.is_empty() {
            continue;
        }
        // Dropped turns can leave two messages of one role side by side: Anthropic wants alternation.
        match messages.last_mut() {
            Some(last) if last.role == role => {
                if role == "user" {
                    // Tool results must lead a user message.
                    let (mut results, rest): (Vec<Value>, Vec<Value>) =
                        last.content.drain(..).chain(content).partition(|block| block["type"] == "tool_result");
                    results.extend(rest);
                    last.content = results;
                } else {
                    last.content.extend(content);
                }
            }
            Some(_) | None => messages.push(AnthropicMessage { role: role.to_owned(), content }),
        }
    }
    let max_tokens = settings.max_output_tokens.unwrap_or(info.max_output_tokens);
    let (mut thinking, effort) = thinking_params(settings.thinking, &info.model, max_tokens);
    if thinking.is_some() && last_tool_loop_lacks_thinking(&messages) {
        thinking = None;
    }
    let mut system = request.system.clone().filter(|system| !system.is_empty());
    if let Some(schema) = &request.output_schema {
        let instruction = format!("Answer with only a JSON value that follows this JSON Schema:\n{schema}");
        system = Some(match system {
            Some(system) => format!("{system}\n\n{instruction}"),
            None => instruction,
        });
    }
    MessagesRequest {
        model: info.model.clone(),
        max_tokens,
        system,
        messages,
        tools: request
            .tools
            .iter()
            .map(|tool| AnthropicTool {
                name: tool.name.clone(),
                description: tool.description.clone(),
                input_schema: tool.parameters.clone(),
            })
            .collect(),
        stream: true,
        // Anthropic allows no temperature but 1 with thinking on: leave it to the default then.
        temperature: if thinking.is_some() { None } else { settings.temperature.map(wire_temperature) },
        output_config: thinking.as_ref().and(effort).map(|effort| OutputConfig { effort: effort.to_owned() }),
        thinking,
    }
}

/// `thinking` (and the adaptive effort) for a request. With no level set, thinking models are
/// asked for their thoughts: adaptive ones at their own default effort, budget ones with the
/// smallest budget Anthropic accepts ([`MIN_THINKING_BUDGET`]), which leaves the answer most of
/// `max_tokens`. `Off` sends nothing: the model's default, which shows no thoughts.
fn thinking_params(
    level: Option<ThinkingLevel>,
    model: &str,
    max_tokens: u32,
) -> (Option<ThinkingParams>, Option<&'static str>) {
    let budget = |tokens: u32| {
        let tokens = tokens.max(MIN_THINKING_BUDGET).min(max_tokens.saturating_sub(1));
        (tokens >= MIN_THINKING_BUDGET).then(|| ThinkingParams {
            thinking_type: "enabled".to_owned(),
            budget_tokens: Some(tokens),
            display: None,
        })
    };
    let adaptive = || ThinkingParams {
        thinking_type: "adaptive".to_owned(),
        budget_tokens: None,
        display: Some("summarized".to_owned()),
    };
    let effort = match level {
        Some(ThinkingLevel::Off) => return (None, None),
        Some(ThinkingLevel::Minimal | ThinkingLevel::Low) => Some("low"),
        Some(ThinkingLevel::Medium) => Some("medium"),
        Some(ThinkingLevel::High) => Some("high"),
        None => None,
    };
    match (level, claude_thinking(model)) {
        (_, ClaudeThinking::Adaptive) => (Some(adaptive()), effort),
        (None, ClaudeThinking::Budget) => (budget(MIN_THINKING_BUDGET), None),
        (None, ClaudeThinking::Unknown) => (None, None),
        (Some(level), ClaudeThinking::Budget | ClaudeThinking::Unknown) => {
            (level.budget_tokens().and_then(budget), None)
        }
    }
}

/// The last assistant message calls tools but does not start with a thinking block.
fn last_tool_loop_lacks_thinking(messages: &[AnthropicMessage]) -> bool {
    let Some(last_assistant) = messages.iter().rev().find(|message| message.role == "assistant") else {
        return false;
    };
    let calls_tools = last_assistant.content.iter().any(|block| block["type"] == "tool_use");
    let starts_with_thinking = last_assistant
        .content
        .first()
        .is_some_and(|block| block["type"] == "thinking" || block["type"] == "redacted_thinking");
    calls_tools && !starts_with_thinking
}

/// Anthropic ids match `^[a-zA-Z0-9_-]+$`: other characters become `_` (the same on call and result).
fn wire_id(id: &str) -> String {
    let cleaned: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    if cleaned.is_empty() { "call".to_owned() } else { cleaned }
}

fn user_blocks(parts: &[Part]) -> Vec<Value> {
    let mut blocks = Vec::new();
    for part in parts {
        if let Part::ToolResult(result) = part {
            let mut block = json!({ "type": "tool_result", "tool_use_id": wire_id(&result.call_id) });
            match &result.error {
                None => block["content"] = json!(result.output),
                Some(error) => {
                    let text =
                        if result.output.is_empty() { error.clone() } else { format!("{error}\n{}", result.output) };
                    block["content"] = json!(text);
                    block["is_error"] = json!(true);
                }
            }
            blocks.push(block);
        }
    }
    for part in parts {
        match part {
            Part::Text { text, .. } if !text.is_empty() => blocks.push(json!({ "type": "text", "text": text })),
            Part::Attachment(attachment) => {
                let media_type = attachment.mime_type.to_ascii_lowercase();
                let data = base64(attachment_bytes(attachment));
                match attachment_kind(&attachment.mime_type) {
                    AttachmentKind::Image
                        if matches!(media_type.as_str(), "image/jpeg" | "image/png" | "image/gif" | "image/webp") =>
                    {
                        blocks.push(json!({
                            "type": "image",
                            "source": { "type": "base64", "media_type": media_type, "data": data }
                        }));
                    }
                    AttachmentKind::Pdf => blocks.push(json!({
                        "type": "document",
                        "source": { "type": "base64", "media_type": "application/pdf", "data": data }
                    })),
                    AttachmentKind::Image
                    | AttachmentKind::Audio
                    | AttachmentKind::Video
                    | AttachmentKind::Text
                    | AttachmentKind::Other => {
                        blocks.push(json!({ "type": "text", "text": attachment_as_text(attachment) }));
                    }
                }
            }
            Part::Text { .. } | Part::Thought { .. } | Part::ToolCall(_) | Part::ToolResult(_) => {}
        }
    }
    blocks
}

fn assistant_blocks(parts: &[Part]) -> Vec<Value> {
    let mut blocks = Vec::new();
    for part in parts {
        match part {
            Part::Thought { text, signature: Some(signature) } => match untag(signature) {
                (SignatureIssuer::Anthropic, raw) => {
                    blocks.push(json!({ "type": "thinking", "thinking": text, "signature": raw }));
                }
                (SignatureIssuer::AnthropicRedacted, raw) => {
                    blocks.push(json!({ "type": "redacted_thinking", "data": raw }));
                }
                (SignatureIssuer::Gemini, _) => {}
            },
            Part::Text { text, .. } if !text.is_empty() => blocks.push(json!({ "type": "text", "text": text })),
            Part::ToolCall(call) => {
                let input = if call.arguments.is_object() { call.arguments.clone() } else { json!({}) };
                blocks.push(json!({ "type": "tool_use", "id": wire_id(&call.id), "name": call.name, "input": input }));
            }
            Part::Thought { signature: None, .. } | Part::Text { .. } | Part::ToolResult(_) | Part::Attachment(_) => {}
        }
    }
    blocks
}

// ---- answers -------------------------------------------------------------------------------

fn parse_error_body(body: &str) -> VendorError {
    let Ok(parsed) = serde_json::from_str::<AnthropicErrorResponse>(body) else {
        return VendorError { message: body.to_owned(), ..VendorError::default() };
    };
    vendor_error(&parsed.error)
}

fn vendor_error(error: &AnthropicErrorBody) -> VendorError {
    let kind = match error.error_type.as_str() {
        "authentication_error" | "permission_error" => Some(LlmErrorKind::Auth),
        "rate_limit_error" => Some(LlmErrorKind::RateLimited),
        "overloaded_error" => Some(LlmErrorKind::Overloaded),
        "invalid_request_error" if error.message.contains("prompt is too long") => Some(LlmErrorKind::ContextTooLong),
        _ => None,
    };
    VendorError { message: error.message.clone(), kind, retry_after: None }
}

/// The HTTP status an in-stream error type stands for.
fn status_of(error_type: &str) -> u16 {
    match error_type {
        "overloaded_error" => 529,
        "rate_limit_error" => 429,
        "authentication_error" => 401,
        "permission_error" => 403,
        "invalid_request_error" => 400,
        _ => 500,
    }
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "tool_use" => FinishReason::ToolCalls,
        "max_tokens" => FinishReason::MaxOutputTokens,
        "refusal" => FinishReason::Blocked,
        _ => FinishReason::Other,
    }
}

#[derive(Debug)]
enum OpenBlock {
    Text,
    Thinking { signature: String },
    ToolUse { id: String, name: String, input_json: String },
    Other,
}

/// Assembles the `message_start` … `message_stop` event sequence.
pub(crate) struct AnthropicDecoder {
    assembler: ResponseAssembler,
    context: ErrorContext,
    blocks: HashMap<usize, OpenBlock>,
    input_tokens: u64,
    cached_tokens: u64,
    stopped: bool,
}

impl AnthropicDecoder {
    pub(crate) fn new(context: ErrorContext) -> Self {
        AnthropicDecoder {
            assembler: ResponseAssembler::default(),
            context,
            blocks: HashMap::new(),
            input_tokens: 0,
            cached_tokens: 0,
            stopped: false,
        }
    }

    fn usage(&mut self, usage: AnthropicUsage) {
        if let Some(input) = usage.input_tokens {
            let cache_read = usage.cache_read_input_tokens.unwrap_or(0);
            let cache_creation = usage.cache_creation_input_tokens.unwrap_or(0);
            self.input_tokens = input + cache_read + cache_creation;
            self.cached_tokens = cache_read;
        }
        self.assembler.usage.input_tokens = self.input_tokens;
        self.assembler.usage.cached_tokens = self.cached_tokens;
        if let Some(output) = usage.output_tokens {
            self.assembler.usage.output_tokens = output;
        }
    }
}

impl StreamDecoder for AnthropicDecoder {
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<bool, LlmError> {
        if event.data.trim().is_empty() {
            return Ok(false);
        }
        let parsed: MessagesStreamEvent = match serde_json::from_str(&event.data) {
            Ok(parsed) => parsed,
            // Event types added after this was written are skipped, as Anthropic asks clients to.
            Err(_) if event.data.contains("\"type\"") && !event.data.contains("\"error\"") => return Ok(false),
            Err(error) => {
                return Err(self.context.error(LlmErrorKind::Protocol, format!("unreadable event: {error}")));
            }
        };
        match parsed {
            MessagesStreamEvent::MessageStart { message } => {
                self.assembler.model_version = message.model;
                if let Some(usage) = message.usage {
                    self.usage(usage);
                }
            }
            MessagesStreamEvent::ContentBlockStart { index, content_block } => {
                let block = match content_block["type"].as_str().unwrap_or_default() {
                    "text" => {
                        self.assembler.new_text();
                        let text = content_block["text"].as_str().unwrap_or_default();
                        self.assembler.text(text, None, out);
                        OpenBlock::Text
                    }
                    "thinking" => {
                        self.assembler.new_thought();
                        let text = content_block["thinking"].as_str().unwrap_or_default();
                        self.assembler.thought(text, None, out);
                        OpenBlock::Thinking { signature: String::new() }
                    }
                    "redacted_thinking" => {
                        let data = content_block["data"].as_str().unwrap_or_default();
                        self.assembler.new_thought();
                        self.assembler.set_thought_signature(SignatureIssuer::AnthropicRedacted.tag(data));
                        OpenBlock::Other
                    }
                    "tool_use" => OpenBlock::ToolUse {
                        id: content_block["id"].as_str().unwrap_or_default().to_owned(),
                        name: content_block["name"].as_str().unwrap_or_default().to_owned(),
                        input_json: String::new(),
                    },
                    _ => OpenBlock::Other,
                };
                self.blocks.insert(index, block);
            }
            MessagesStreamEvent::ContentBlockDelta { index, delta } => {
                let piece = |field: &str| delta[field].as_str().unwrap_or_default().to_owned();
                match (self.blocks.get_mut(&index), delta["type"].as_str().unwrap_or_default()) {
                    (Some(OpenBlock::Text), "text_delta") => self.assembler.text(&piece("text"), None, out),
                    (Some(OpenBlock::Thinking { .. }), "thinking_delta") => {
                        self.assembler.thought(&piece("thinking"), None, out);
                    }
                    (Some(OpenBlock::Thinking { signature }), "signature_delta") => {
                        signature.push_str(&piece("signature"));
                    }
                    (Some(OpenBlock::ToolUse { input_json, .. }), "input_json_delta") => {
                        input_json.push_str(&piece("partial_json"));
                    }
                    _ => {}
                }
            }
            MessagesStreamEvent::ContentBlockStop { index } => match self.blocks.remove(&index) {
                Some(OpenBlock::Thinking { signature }) if !signature.is_empty() => {
                    self.assembler.set_thought_signature(SignatureIssuer::Anthropic.tag(&signature));
                }
                Some(OpenBlock::ToolUse { id, name, input_json }) => {
                    let arguments = if input_json.trim().is_empty() {
                        json!({})
                    } else {
                        serde_json::from_str(&input_json).map_err(|error| {
                            self.context.error(
                                LlmErrorKind::Protocol,
                                format!("tool call `{name}` has unreadable input: {error}"),
                            )
                        })?
                    };
                    self.assembler.tool_call(ToolCall { id, name, arguments, signature: None }, out);
                }
                Some(OpenBlock::Thinking { .. } | OpenBlock::Text | OpenBlock::Other) | None => {}
            },
            MessagesStreamEvent::MessageDelta { delta, usage } => {
                if let Some(usage) = usage {
                    self.usage(usage);
                }
                if let Some(reason) = delta.stop_reason {
                    self.assembler.finish_reason = Some(finish_reason(&reason));
                    self.assembler.finish_detail = Some(reason);
                }
            }
            MessagesStreamEvent::MessageStop => {
                self.stopped = true;
                return Ok(true);
            }
            MessagesStreamEvent::Ping => {}
            MessagesStreamEvent::Error { error } => {
                return Err(self.context.status_error(status_of(&error.error_type), None, vendor_error(&error)));
            }
        }
        Ok(false)
    }

    fn finish(&mut self, _ended: bool) -> Result<Response, LlmError> {
        if !self.stopped {
            return Err(self
                .context
                .error(LlmErrorKind::Network, "the answer ended before Anthropic finished it (no message_stop)"));
        }
        Ok(self.assembler.build())
    }
}
