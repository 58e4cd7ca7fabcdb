//! Google Gemini API: `models/{model}:generateContent` and `:streamGenerateContent?alt=sse`.
//!
//! Function results go back in `user` turns as `functionResponse` parts (Gemini rejects a
//! `tool` role). Thought summaries come as parts with `thought: true` when `includeThoughts` is
//! on, which thinking models are asked for unless the config says `thinking = "off"`; signatures (`thoughtSignature`) come on thought, text or function-call parts and must go
//! back on the same part. In the current turn (after the last user text) Gemini 3 requires the
//! first function call of each step to be signed: a call from another provider gets Gemini's
//! documented placeholder signature instead. The key goes in the `x-goog-api-key` header.

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::assemble::ResponseAssembler;
use crate::config::{ModelConfig, ModelInfo};
use crate::conversation::{FinishReason, Part, Request, Response, ThinkingLevel, ToolCall, Turn, TurnRole};
use crate::error::{LlmError, LlmErrorKind};
use crate::providers::{
    AttachmentKind, Defaults, GENERATED_CALL_ID_PREFIX, Settings, SignatureIssuer, attachment_as_text,
    attachment_bytes, attachment_kind, base64, generated_call_id, load_attachments, signature_for, wire_temperature,
};
use crate::secret::Secret;
use crate::transport::{HttpCall, SseEvent, StreamDecoder, Transport, VendorError};
use crate::{Model, ResponseStream, StreamEvent};

/// Gemini's documented stand-in for a missing signature on a function call of the current turn.
const PLACEHOLDER_SIGNATURE: &str = "skip_thought_signature_validator";

// ---- wire payloads -------------------------------------------------------------------------

/// Body of `generateContent` / `streamGenerateContent`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerateContentRequest {
    pub contents: Vec<Content>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_instruction: Option<Content>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<GeminiTool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_config: Option<GenerationConfig>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Content {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default)]
    pub parts: Vec<GeminiPart>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GeminiPart {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub thought: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thought_signature: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<FunctionCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_response: Option<FunctionResponse>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_data: Option<Blob>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FunctionCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    pub args: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FunctionResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    pub response: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blob {
    pub mime_type: String,
    pub data: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GeminiTool {
    pub function_declarations: Vec<FunctionDeclaration>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionDeclaration {
    pub name: String,
    pub description: String,
    pub parameters_json_schema: Value,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerationConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking_config: Option<ThinkingConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_mime_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_json_schema: Option<Value>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThinkingConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub include_thoughts: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking_budget: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking_level: Option<String>,
}

/// One answer, or one chunk of a streamed answer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerateContentResponse {
    #[serde(default)]
    pub candidates: Vec<Candidate>,
    #[serde(default)]
    pub prompt_feedback: Option<PromptFeedback>,
    #[serde(default)]
    pub usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    pub model_version: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptFeedback {
    #[serde(default)]
    pub block_reason: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageMetadata {
    #[serde(default)]
    pub prompt_token_count: u64,
    #[serde(default)]
    pub candidates_token_count: u64,
    #[serde(default)]
    pub thoughts_token_count: u64,
    #[serde(default)]
    pub cached_content_token_count: u64,
}

/// The error body: `{"error": {"code", "message", "status", "details": [...]}}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GeminiErrorResponse {
    pub error: GeminiErrorBody,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct GeminiErrorBody {
    #[serde(default)]
    pub code: u16,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub details: Vec<Value>,
}

// ---- the model -----------------------------------------------------------------------------

/// A Gemini model.
#[derive(Debug)]
pub struct GeminiModel {
    name: String,
    info: ModelInfo,
    base_url: String,
    defaults: Defaults,
    transport: Transport,
}

impl GeminiModel {
    pub fn new(name: &str, config: &ModelConfig, api_key: Option<Secret>) -> Result<Self, LlmError> {
        Ok(GeminiModel {
            name: name.to_owned(),
            info: config.info(),
            base_url: config.effective_base_url(),
            defaults: Defaults::from_config(config),
            transport: Transport::new(name, config, api_key)?,
        })
    }

    fn model_path(&self) -> &str {
        self.info.model.strip_prefix("models/").unwrap_or(&self.info.model)
    }

    async fn call(&self, request: &Request, method: &str) -> Result<HttpCall, LlmError> {
        let request = load_attachments(request, &self.name).await?;
        let body = build_request(&request, self.defaults.apply(&request), self.model_path());
        let body = serde_json::to_vec(&body).map_err(|error| {
            self.transport.context.error(LlmErrorKind::BadRequest, format!("could not encode the request: {error}"))
        })?;
        let key = self.transport.context.api_key.as_ref().map(|key| ("x-goog-api-key", key.expose().to_owned()));
        Ok(HttpCall {
            url: format!("{}/v1beta/models/{}:{method}", self.base_url, self.model_path()),
            headers: self.transport.headers(key, &[])?,
            body: Bytes::from(body),
        })
    }
}

#[async_trait]
impl Model for GeminiModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        let call = self.call(request, "streamGenerateContent?alt=sse").await?;
        let context = self.transport.context.clone();
        self.transport.stream(&call, parse_error_body, || GeminiDecoder::new(context.clone())).await
    }

    async fn generate(&self, request: &Request) -> Result<Response, LlmError> {
        let call = self.call(request, "generateContent").await?;
        let body = self.transport.request(&call, parse_error_body).await?;
        let mut decoder = GeminiDecoder::new(self.transport.context.clone());
        let mut ignored = Vec::new();
        decoder.on_event(&SseEvent { event: "message".to_owned(), data: body }, &mut ignored)?;
        decoder.finish(true)
    }
}

// ---- request building ----------------------------------------------------------------------

/// The wire body for `request` (attachments already loaded).
pub fn build_request_body(request: &Request, config: &ModelConfig) -> Value {
    let settings = Defaults::from_config(config).apply(request);
    let model = config.model.strip_prefix("models/").unwrap_or(&config.model);
    serde_json::to_value(build_request(request, settings, model)).unwrap_or(Value::Null)
}

fn build_request(request: &Request, settings: Settings, model: &str) -> GenerateContentRequest {
    let current_turn_start = request
        .turns
        .iter()
        .rposition(|turn| {
            turn.role == TurnRole::User && turn.parts.iter().any(|part| matches!(part, Part::Text { .. }))
        })
        .unwrap_or(0);
    let contents = request
        .turns
        .iter()
        .enumerate()
        .map(|(index, turn)| content(turn, index > current_turn_start))
        .filter(|content| !content.parts.is_empty())
        .collect();
    let tools = if request.tools.is_empty() {
        Vec::new()
    } else {
        vec![GeminiTool {
            function_declarations: request
                .tools
                .iter()
                .map(|tool| FunctionDeclaration {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters_json_schema: tool.parameters.clone(),
                })
                .collect(),
        }]
    };
    let mut generation = GenerationConfig {
        max_output_tokens: settings.max_output_tokens,
        temperature: settings.temperature.map(wire_temperature),
        thinking_config: match settings.thinking {
            Some(level) => thinking_config(level, model),
            None => default_thinking_config(model),
        },
        ..GenerationConfig::default()
    };
    if let Some(schema) = &request.output_schema {
        generation.response_mime_type = Some("application/json".to_owned());
        generation.response_json_schema = Some(schema.clone());
    }
    let has_generation = generation.max_output_tokens.is_some()
        || generation.temperature.is_some()
        || generation.thinking_config.is_some()
        || generation.response_mime_type.is_some();
    GenerateContentRequest {
        contents,
        system_instruction: request.system.as_ref().filter(|system| !system.is_empty()).map(|system| Content {
            role: None,
            parts: vec![GeminiPart { text: Some(system.clone()), ..GeminiPart::default() }],
        }),
        tools,
        generation_config: has_generation.then_some(generation),
    }
}

/// The `major.minor` version in a Gemini model id (`gemini-2.5-flash` → (2, 5), `gemini-3-pro`
/// → (3, 0)); `None` for ids without one (`gemini-flash-latest`, `gemma-3-27b-it`).
fn gemini_version(model: &str) -> Option<(u32, u32)> {
    let version = model.strip_prefix("gemini-")?.split('-').next()?;
    let (major, minor) = version.split_once('.').unwrap_or((version, "0"));
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Thinking settings when neither the request nor the config sets a level: ask a thinking model
/// (Gemini 2.5 and later, and the `-latest` aliases, which point at them) for its thought
/// summaries, and leave its budget or level, that is its own thinking effort, alone. Older
/// models and other families get no `thinkingConfig`: the API refuses it where it cannot think.
fn default_thinking_config(model: &str) -> Option<ThinkingConfig> {
    let thinks = match gemini_version(model) {
        Some(version) => version >= (2, 5),
        None => model.starts_with("gemini-") && model.ends_with("-latest"),
    };
    thinks.then(|| ThinkingConfig { include_thoughts: Some(true), ..ThinkingConfig::default() })
}

/// Gemini 2.x takes a token budget; later models take a level.
fn thinking_config(level: ThinkingLevel, model: &str) -> Option<ThinkingConfig> {
    let budget_style = model.starts_with("gemini-2") || model.starts_with("gemini-1");
    // Gemini 2.5 Pro refuses a budget of 0: it always thinks.
    let can_switch_off = budget_style && !model.starts_with("gemini-2.5-pro");
    match (level, budget_style) {
        (ThinkingLevel::Off, true) if can_switch_off => {
            Some(ThinkingConfig { thinking_budget: Some(0), ..ThinkingConfig::default() })
        }
        // Models that cannot switch thinking off: leave their default and ask for no summaries.
        (ThinkingLevel::Off, _) => None,
        (level, true) => Some(ThinkingConfig {
            include_thoughts: Some(true),
            thinking_budget: level.budget_tokens(),
            thinking_level: None,
        }),
        (level, false) => Some(ThinkingConfig {
            include_thoughts: Some(true),
            thinking_budget: None,
            thinking_level: Some(level.as_str().to_owned()),
        }),
    }
}

fn content(turn: &Turn, in_current_turn: bool) -> Content {
    let role = match turn.role {
        TurnRole::User => "user",
        TurnRole::Model => "model",
    };
    let mut parts: Vec<GeminiPart> = turn.parts.iter().filter_map(part).collect();
    // Gemini 3 checks that the first call of each step of the current turn is signed.
    if in_current_turn && turn.role == TurnRole::Model {
        let first_call = parts.iter().position(|part| part.function_call.is_some());
        let any_signed = parts.iter().any(|part| part.function_call.is_some() && part.thought_signature.is_some());
        if let Some(first_call) = first_call
            && !any_signed
        {
            parts[first_call].thought_signature = Some(PLACEHOLDER_SIGNATURE.to_owned());
        }
    }
    Content { role: Some(role.to_owned()), parts }
}

fn part(part: &Part) -> Option<GeminiPart> {
    match part {
        Part::Text { text, signature } => {
            let signature = signature_for(signature.as_ref(), SignatureIssuer::Gemini);
            (!text.is_empty() || signature.is_some()).then(|| GeminiPart {
                text: Some(text.clone()),
                thought_signature: signature,
                ..GeminiPart::default()
            })
        }
        // Gemini reads nothing from unsigned thought text: only signed thoughts go back.
        Part::Thought { text, signature } => {
            signature_for(signature.as_ref(), SignatureIssuer::Gemini).map(|signature| GeminiPart {
                text: Some(text.clone()),
                thought: true,
                thought_signature: Some(signature),
                ..GeminiPart::default()
            })
        }
        Part::ToolCall(call) => Some(GeminiPart {
            function_call: Some(FunctionCall {
                id: wire_call_id(&call.id),
                name: call.name.clone(),
                args: if call.arguments.is_null() { json!({}) } else { call.arguments.clone() },
            }),
            thought_signature: signature_for(call.signature.as_ref(), SignatureIssuer::Gemini),
            ..GeminiPart::default()
        }),
        Part::ToolResult(result) => {
            let response = match &result.error {
                None => json!({ "output": result.output }),
                Some(error) if result.output.is_empty() => json!({ "error": error }),
                Some(error) => json!({ "error": error, "output": result.output }),
            };
            Some(GeminiPart {
                function_response: Some(FunctionResponse {
                    id: wire_call_id(&result.call_id),
                    name: result.name.clone(),
                    response,
                }),
                ..GeminiPart::default()
            })
        }
        Part::Attachment(attachment) => match attachment_kind(&attachment.mime_type) {
            AttachmentKind::Image | AttachmentKind::Pdf | AttachmentKind::Audio | AttachmentKind::Video => {
                Some(GeminiPart {
                    inline_data: Some(Blob {
                        mime_type: attachment.mime_type.clone(),
                        data: base64(attachment_bytes(attachment)),
                    }),
                    ..GeminiPart::default()
                })
            }
            AttachmentKind::Text | AttachmentKind::Other => {
                Some(GeminiPart { text: Some(attachment_as_text(attachment)), ..GeminiPart::default() })
            }
        },
    }
}

/// Ids we made up are not Gemini's: leave them out so Gemini matches by name and order.
fn wire_call_id(id: &str) -> Option<String> {
    (!id.starts_with(GENERATED_CALL_ID_PREFIX) && !id.is_empty()).then(|| id.to_owned())
}

// ---- answers -------------------------------------------------------------------------------

fn parse_error_body(body: &str) -> VendorError {
    let Ok(parsed) = serde_json::from_str::<GeminiErrorResponse>(body) else {
        return VendorError { message: body.to_owned(), ..VendorError::default() };
    };
    vendor_error(&parsed.error)
}

fn vendor_error(error: &GeminiErrorBody) -> VendorError {
    let mut vendor = VendorError { message: error.message.clone(), ..VendorError::default() };
    for detail in &error.details {
        if detail.get("reason").and_then(Value::as_str) == Some("API_KEY_INVALID") {
            vendor.kind = Some(LlmErrorKind::Auth);
        }
        if let Some(delay) = detail.get("retryDelay").and_then(Value::as_str) {
            vendor.retry_after = delay
                .strip_suffix('s')
                .and_then(|seconds| seconds.parse::<f64>().ok())
                .and_then(|seconds| std::time::Duration::try_from_secs_f64(seconds).ok());
        }
    }
    let lowered = error.message.to_ascii_lowercase();
    if vendor.kind.is_none() && lowered.contains("token count") && lowered.contains("exceeds") {
        vendor.kind = Some(LlmErrorKind::ContextTooLong);
    }
    vendor
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "STOP" => FinishReason::Stop,
        "MAX_TOKENS" => FinishReason::MaxOutputTokens,
        "SAFETY" | "RECITATION" | "LANGUAGE" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            FinishReason::Blocked
        }
        _ => FinishReason::Other,
    }
}

/// Assembles Gemini chunks: each SSE `data:` is a whole `GenerateContentResponse`.
pub(crate) struct GeminiDecoder {
    assembler: ResponseAssembler,
    context: crate::transport::ErrorContext,
    calls: usize,
    finished: bool,
}

impl GeminiDecoder {
    pub(crate) fn new(context: crate::transport::ErrorContext) -> Self {
        GeminiDecoder { assembler: ResponseAssembler::default(), context, calls: 0, finished: false }
    }
}

impl StreamDecoder for GeminiDecoder {
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<bool, LlmError> {
        if event.data.trim().is_empty() {
            return Ok(false);
        }
        let value: Value = serde_json::from_str(&event.data)
            .map_err(|error| self.context.error(LlmErrorKind::Protocol, format!("unreadable Gemini chunk: {error}")))?;
        if let Some(error) = value.get("error") {
            let body: GeminiErrorBody = serde_json::from_value(error.clone()).unwrap_or_default();
            let status = if body.code == 0 { 500 } else { body.code };
            return Err(self.context.status_error(status, None, vendor_error(&body)));
        }
        let chunk: GenerateContentResponse = serde_json::from_value(value)
            .map_err(|error| self.context.error(LlmErrorKind::Protocol, format!("unexpected Gemini chunk: {error}")))?;
        if let Some(usage) = chunk.usage_metadata {
            self.assembler.usage = crate::conversation::TokenUsage {
                input_tokens: usage.prompt_token_count,
                output_tokens: usage.candidates_token_count + usage.thoughts_token_count,
                thought_tokens: usage.thoughts_token_count,
                cached_tokens: usage.cached_content_token_count,
            };
        }
        if let Some(version) = chunk.model_version {
            self.assembler.model_version = Some(version);
        }
        if let Some(reason) = chunk.prompt_feedback.and_then(|feedback| feedback.block_reason) {
            self.assembler.finish_reason = Some(FinishReason::Blocked);
            self.assembler.finish_detail = Some(format!("prompt blocked: {reason}"));
            self.finished = true;
        }
        if let Some(candidate) = chunk.candidates.into_iter().next() {
            for part in candidate.content.map(|content| content.parts).unwrap_or_default() {
                let signature = part.thought_signature.as_deref().map(|raw| SignatureIssuer::Gemini.tag(raw));
                if let Some(call) = part.function_call {
                    let id = call.id.filter(|id| !id.is_empty()).unwrap_or_else(|| generated_call_id(self.calls));
                    self.calls += 1;
                    let arguments = if call.args.is_null() { json!({}) } else { call.args };
                    self.assembler.tool_call(ToolCall { id, name: call.name, arguments, signature }, out);
                } else if part.thought {
                    self.assembler.thought(part.text.as_deref().unwrap_or_default(), signature, out);
                } else if part.text.is_some() || signature.is_some() {
                    self.assembler.text(part.text.as_deref().unwrap_or_default(), signature, out);
                }
            }
            if let Some(reason) = candidate.finish_reason {
                self.assembler.finish_reason = Some(finish_reason(&reason));
                self.assembler.finish_detail = Some(reason);
                self.finished = true;
            }
        }
        Ok(false)
    }

    fn finish(&mut self, _ended: bool) -> Result<Response, LlmError> {
        if !self.finished {
            return Err(self.context.error(
                LlmErrorKind::Network,
                "the answer ended before Gemini said it was complete (no finish reason)",
            ));
        }
        Ok(self.assembler.build())
    }
}
