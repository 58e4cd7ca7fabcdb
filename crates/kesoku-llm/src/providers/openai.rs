//! OpenAI-style chat completions (`POST {base_url}/chat/completions`), as served by OpenAI,
//! Ollama, vLLM, llama.cpp's server, LM Studio and OpenRouter.
//!
//! Streaming sends `stream_options.include_usage` so the last chunk carries the usage; tool
//! calls arrive as fragments keyed by `index` and are assembled when the answer finishes.
//! Reasoning text is read from `reasoning_content` (DeepSeek, vLLM) or `reasoning` (Ollama,
//! OpenRouter) as thoughts, unless the config says `thinking = "off"`, but never sent back:
//! these servers keep no signature and several reject it.
//! The output limit is sent as `max_completion_tokens` to OpenAI itself (its reasoning models
//! refuse `max_tokens`) and as `max_tokens` to every other server, which all understand it.

use std::collections::BTreeMap;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::assemble::ResponseAssembler;
use crate::config::{ModelConfig, ModelInfo};
use crate::conversation::{FinishReason, Part, Request, ThinkingLevel, TokenUsage, ToolCall, TurnRole};
use crate::error::{LlmError, LlmErrorKind};
use crate::providers::wire_temperature;
use crate::providers::{
    AttachmentKind, Defaults, Settings, attachment_as_text, attachment_bytes, attachment_kind, base64,
    generated_call_id, load_attachments,
};
use crate::secret::Secret;
use crate::transport::{ErrorContext, HttpCall, SseEvent, StreamDecoder, Transport, VendorError};
use crate::{Model, ResponseStream, StreamEvent};

// ---- wire payloads -------------------------------------------------------------------------

/// Body of `POST /chat/completions`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ChatTool>,
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct StreamOptions {
    pub include_usage: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, an array of content parts, or null (an assistant message with only tool calls).
    pub content: Value,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ChatToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub call_type: String,
    pub function: ChatFunctionCall,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatFunctionCall {
    pub name: String,
    /// The arguments as a JSON string.
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatTool {
    #[serde(rename = "type")]
    pub tool_type: String,
    pub function: ChatFunction,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatFunction {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// One streamed chunk (`chat.completion.chunk`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatCompletionChunkEvent {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    #[serde(default)]
    pub usage: Option<ChatUsage>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChunkChoice {
    #[serde(default)]
    pub delta: ChunkDelta,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChunkDelta {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ToolCallDelta {
    #[serde(default)]
    pub index: usize,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct FunctionDelta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct ChatUsage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default)]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: u64,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct CompletionTokensDetails {
    #[serde(default)]
    pub reasoning_tokens: u64,
}

/// The error body: `{"error": {"message", "type", "code"}}` (Ollama sends `{"error": "text"}`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatErrorResponse {
    #[serde(default)]
    pub error: Value,
}

// ---- the model -----------------------------------------------------------------------------

/// A model behind an OpenAI-style chat completions endpoint.
#[derive(Debug)]
pub struct OpenAiModel {
    name: String,
    info: ModelInfo,
    base_url: String,
    defaults: Defaults,
    transport: Transport,
}

impl OpenAiModel {
    pub fn new(name: &str, config: &ModelConfig, api_key: Option<Secret>) -> Result<Self, LlmError> {
        Ok(OpenAiModel {
            name: name.to_owned(),
            info: config.info(),
            base_url: config.effective_base_url(),
            defaults: Defaults::from_config(config),
            transport: Transport::new(name, config, api_key)?,
        })
    }
}

#[async_trait]
impl Model for OpenAiModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        let request = load_attachments(request, &self.name).await?;
        let settings = self.defaults.apply(&request);
        let reasoning = ReasoningText::for_level(settings.thinking);
        let body = build_request(&request, settings, &self.info.model, &self.base_url);
        let body = serde_json::to_vec(&body).map_err(|error| {
            self.transport.context.error(LlmErrorKind::BadRequest, format!("could not encode the request: {error}"))
        })?;
        let key =
            self.transport.context.api_key.as_ref().map(|key| ("authorization", format!("Bearer {}", key.expose())));
        let call = HttpCall {
            url: format!("{}/chat/completions", self.base_url),
            headers: self.transport.headers(key, &[])?,
            body: Bytes::from(body),
        };
        let context = self.transport.context.clone();
        self.transport.stream(&call, parse_error_body, || OpenAiDecoder::new(context.clone(), reasoning)).await
    }
}

// ---- request building ----------------------------------------------------------------------

/// The wire body for `request` (attachments already loaded).
pub fn build_request_body(request: &Request, config: &ModelConfig) -> Value {
    let settings = Defaults::from_config(config).apply(request);
    let body = build_request(request, settings, &config.model, &config.effective_base_url());
    serde_json::to_value(body).unwrap_or(Value::Null)
}

fn is_openai_itself(base_url: &str) -> bool {
    base_url.starts_with("https://api.openai.com")
}

fn build_request(request: &Request, settings: Settings, model: &str, base_url: &str) -> ChatCompletionRequest {
    let mut messages = Vec::new();
    if let Some(system) = request.system.as_ref().filter(|system| !system.is_empty()) {
        messages.push(ChatMessage {
            role: "system".to_owned(),
            content: json!(system),
            tool_calls: Vec::new(),
            tool_call_id: None,
        });
    }
    for turn in &request.turns {
        match turn.role {
            TurnRole::User => user_messages(&turn.parts, &mut messages),
            TurnRole::Model => {
                if let Some(message) = assistant_message(&turn.parts) {
                    messages.push(message);
                }
            }
        }
    }
    let (max_tokens, max_completion_tokens) = if is_openai_itself(base_url) {
        (None, settings.max_output_tokens)
    } else {
        (settings.max_output_tokens, None)
    };
    let reasoning_effort = match settings.thinking {
        None | Some(ThinkingLevel::Off) => None,
        Some(level) => Some(level.as_str().to_owned()),
    };
    ChatCompletionRequest {
        model: model.to_owned(),
        messages,
        tools: request
            .tools
            .iter()
            .map(|tool| ChatTool {
                tool_type: "function".to_owned(),
                function: ChatFunction {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters: tool.parameters.clone(),
                },
            })
            .collect(),
        stream: true,
        stream_options: Some(StreamOptions { include_usage: true }),
        max_tokens,
        max_completion_tokens,
        temperature: settings.temperature.map(wire_temperature),
        reasoning_effort,
        response_format: request
            .output_schema
            .as_ref()
            .map(|schema| json!({ "type": "json_schema", "json_schema": { "name": "response", "schema": schema } })),
    }
}

/// Tool results become `tool` messages (first, right after the assistant's calls); the rest one `user` message.
fn user_messages(parts: &[Part], messages: &mut Vec<ChatMessage>) {
    for part in parts {
        if let Part::ToolResult(result) = part {
            let content = match &result.error {
                None => result.output.clone(),
                Some(error) if result.output.is_empty() => format!("Error: {error}"),
                Some(error) => format!("Error: {error}\n{}", result.output),
            };
            messages.push(ChatMessage {
                role: "tool".to_owned(),
                content: json!(content),
                tool_calls: Vec::new(),
                tool_call_id: Some(result.call_id.clone()),
            });
        }
    }
    let mut content = Vec::new();
    for part in parts {
        match part {
            Part::Text { text, .. } if !text.is_empty() => content.push(json!({ "type": "text", "text": text })),
            Part::Attachment(attachment) => match attachment_kind(&attachment.mime_type) {
                AttachmentKind::Image => content.push(json!({
                    "type": "image_url",
                    "image_url": { "url": format!("data:{};base64,{}", attachment.mime_type, base64(attachment_bytes(attachment))) }
                })),
                AttachmentKind::Pdf => content.push(json!({
                    "type": "file",
                    "file": {
                        "filename": attachment.filename,
                        "file_data": format!("data:{};base64,{}", attachment.mime_type, base64(attachment_bytes(attachment)))
                    }
                })),
                AttachmentKind::Audio | AttachmentKind::Video | AttachmentKind::Text | AttachmentKind::Other => {
                    content.push(json!({ "type": "text", "text": attachment_as_text(attachment) }));
                }
            },
            Part::Text { .. } | Part::Thought { .. } | Part::ToolCall(_) | Part::ToolResult(_) => {}
        }
    }
    if content.is_empty() {
        return;
    }
    // Plain text goes as a string: older local servers do not take content arrays.
    let all_text = content.iter().all(|item| item["type"] == "text");
    let content = if all_text {
        let texts: Vec<&str> = content.iter().filter_map(|item| item["text"].as_str()).collect();
        json!(texts.join("\n\n"))
    } else {
        Value::Array(content)
    };
    messages.push(ChatMessage { role: "user".to_owned(), content, tool_calls: Vec::new(), tool_call_id: None });
}

fn assistant_message(parts: &[Part]) -> Option<ChatMessage> {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for part in parts {
        match part {
            Part::Text { text: piece, .. } => {
                if !text.is_empty() && !piece.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(piece);
            }
            Part::ToolCall(call) => tool_calls.push(ChatToolCall {
                id: call.id.clone(),
                call_type: "function".to_owned(),
                function: ChatFunctionCall {
                    name: call.name.clone(),
                    arguments: match &call.arguments {
                        Value::String(raw) => raw.clone(),
                        Value::Null => "{}".to_owned(),
                        arguments @ (Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_)) => {
                            arguments.to_string()
                        }
                    },
                },
            }),
            Part::Thought { .. } | Part::ToolResult(_) | Part::Attachment(_) => {}
        }
    }
    if text.is_empty() && tool_calls.is_empty() {
        return None;
    }
    let content = if text.is_empty() { Value::Null } else { json!(text) };
    Some(ChatMessage { role: "assistant".to_owned(), content, tool_calls, tool_call_id: None })
}

// ---- answers -------------------------------------------------------------------------------

fn parse_error_body(body: &str) -> VendorError {
    let Ok(parsed) = serde_json::from_str::<ChatErrorResponse>(body) else {
        return VendorError { message: body.to_owned(), ..VendorError::default() };
    };
    vendor_error(&parsed.error)
}

fn vendor_error(error: &Value) -> VendorError {
    let message = match error {
        Value::String(text) => text.clone(),
        other @ (Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_)) => {
            other.get("message").and_then(Value::as_str).unwrap_or_default().to_owned()
        }
    };
    let code = error.get("code").and_then(Value::as_str).unwrap_or_default();
    let kind = match code {
        "context_length_exceeded" => Some(LlmErrorKind::ContextTooLong),
        "invalid_api_key" => Some(LlmErrorKind::Auth),
        "rate_limit_exceeded" | "insufficient_quota" => Some(LlmErrorKind::RateLimited),
        _ if message.contains("maximum context length") => Some(LlmErrorKind::ContextTooLong),
        _ => None,
    };
    VendorError { message, kind, retry_after: None }
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::MaxOutputTokens,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::Blocked,
        _ => FinishReason::Other,
    }
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// What the decoder does with a server's reasoning text (`reasoning_content`, `reasoning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReasoningText {
    /// Thought parts, shown and stored as the spec's thought messages (the default).
    AsThoughts,
    /// Dropped: the config says `thinking = "off"`, and these servers cannot be told to stop.
    Ignored,
}

impl ReasoningText {
    fn for_level(level: Option<ThinkingLevel>) -> Self {
        match level {
            Some(ThinkingLevel::Off) => ReasoningText::Ignored,
            Some(ThinkingLevel::Minimal | ThinkingLevel::Low | ThinkingLevel::Medium | ThinkingLevel::High) | None => {
                ReasoningText::AsThoughts
            }
        }
    }
}

/// Assembles chat completion chunks; ends at `data: [DONE]`.
pub(crate) struct OpenAiDecoder {
    assembler: ResponseAssembler,
    context: ErrorContext,
    reasoning: ReasoningText,
    calls: BTreeMap<usize, PartialCall>,
    flushed_calls: usize,
    saw_finish: bool,
}

impl OpenAiDecoder {
    pub(crate) fn new(context: ErrorContext, reasoning: ReasoningText) -> Self {
        OpenAiDecoder {
            assembler: ResponseAssembler::default(),
            context,
            reasoning,
            calls: BTreeMap::new(),
            flushed_calls: 0,
            saw_finish: false,
        }
    }

    fn flush_calls(&mut self, out: &mut Vec<StreamEvent>) {
        for (_, call) in std::mem::take(&mut self.calls) {
            let arguments = if call.arguments.trim().is_empty() {
                json!({})
            } else {
                // Small local models sometimes write broken JSON: keep it raw, the tool will say so.
                serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments))
            };
            let id = call.id.filter(|id| !id.is_empty()).unwrap_or_else(|| generated_call_id(self.flushed_calls));
            self.flushed_calls += 1;
            self.assembler.tool_call(ToolCall { id, name: call.name, arguments, signature: None }, out);
        }
    }
}

impl StreamDecoder for OpenAiDecoder {
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<bool, LlmError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.flush_calls(out);
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let value: Value = serde_json::from_str(data)
            .map_err(|error| self.context.error(LlmErrorKind::Protocol, format!("unreadable chunk: {error}")))?;
        if let Some(error) = value.get("error") {
            let vendor = vendor_error(error);
            let status =
                error.get("code").and_then(Value::as_u64).and_then(|code| u16::try_from(code).ok()).unwrap_or(500);
            return Err(self.context.status_error(status, None, vendor));
        }
        let chunk: ChatCompletionChunkEvent = serde_json::from_value(value)
            .map_err(|error| self.context.error(LlmErrorKind::Protocol, format!("unexpected chunk: {error}")))?;
        if let Some(model) = chunk.model {
            self.assembler.model_version = Some(model);
        }
        if let Some(usage) = chunk.usage {
            self.assembler.usage = TokenUsage {
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
                thought_tokens: usage.completion_tokens_details.map(|details| details.reasoning_tokens).unwrap_or(0),
                cached_tokens: usage.prompt_tokens_details.map(|details| details.cached_tokens).unwrap_or(0),
            };
        }
        if let Some(choice) = chunk.choices.into_iter().next() {
            let delta = choice.delta;
            if let Some(reasoning) = delta.reasoning_content.or(delta.reasoning).filter(|text| !text.is_empty())
                && self.reasoning == ReasoningText::AsThoughts
            {
                self.assembler.thought(&reasoning, None, out);
            }
            if let Some(content) = delta.content.filter(|text| !text.is_empty()) {
                self.assembler.text(&content, None, out);
            }
            for fragment in delta.tool_calls {
                let call = self.calls.entry(fragment.index).or_default();
                if let Some(id) = fragment.id {
                    call.id = Some(id);
                }
                if let Some(function) = fragment.function {
                    if let Some(name) = function.name {
                        call.name.push_str(&name);
                    }
                    if let Some(arguments) = function.arguments {
                        call.arguments.push_str(&arguments);
                    }
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.flush_calls(out);
                self.assembler.finish_reason = Some(finish_reason(&reason));
                self.assembler.finish_detail = Some(reason);
                self.saw_finish = true;
            }
        }
        Ok(false)
    }

    fn finish(&mut self, ended: bool) -> Result<crate::conversation::Response, LlmError> {
        if !ended && !self.saw_finish {
            return Err(self.context.error(
                LlmErrorKind::Network,
                "the answer ended before the server finished it (no finish_reason, no [DONE])",
            ));
        }
        let mut ignored = Vec::new();
        self.flush_calls(&mut ignored);
        Ok(self.assembler.build())
    }
}
