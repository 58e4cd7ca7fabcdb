//! [`LocalChatModel`]: a [`LocalModel`] behind kesoku-llm's provider-neutral [`Model`] trait, so
//! the agent talks to it like to any remote provider.
//!
//! Request → prompt: the system instruction (plus, when an output schema is set, an instruction
//! to answer with JSON following it — there is no constrained decoding), then each user turn's
//! text and tool results and each model turn's text and tool calls, rendered by the model's chat
//! template (see `template` for the tool fallback). Thoughts are not sent back; attachments are
//! inlined when they are text and replaced by a note otherwise (local models read text only).
//!
//! Response: text streams as it is generated, except that when tools are offered any text that
//! may be a tool call is held until the end; then the output is parsed ([`parse_tool_calls`]),
//! each call becomes a [`StreamEvent::ToolCall`] with a generated id, and `Completed` carries the
//! whole answer with token usage (cached prompt tokens included).

use crate::chat::{ChatMessage, ChatPrompt, ToolCall as LocalToolCall, ToolSpec};
use crate::engine::{FinishReason as LocalFinish, GenerationEvent, LocalModel};
use crate::error::LocalError;
use crate::tool_calls::{StreamHold, parse_tool_calls, stream_hold};
use async_trait::async_trait;
use futures::StreamExt;
use kesoku_llm::{
    AttachmentSource, FinishReason, LlmError, LlmErrorKind, Model, ModelInfo, Part, Provider, Request, Response,
    ResponseStream, StreamEvent, TokenUsage, ToolCall, Turn, TurnRole,
};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_util::sync::CancellationToken;

/// Text attachments larger than this are cut (the context window is small).
const MAX_INLINE_ATTACHMENT_BYTES: usize = 32 * 1024;

/// A loaded local model as a kesoku-llm [`Model`].
#[derive(Debug, Clone)]
pub struct LocalChatModel {
    name: String,
    model: LocalModel,
    info: ModelInfo,
}

impl LocalChatModel {
    /// Wraps `model` under the configured `name`. `provider` is what [`Model::info`] reports: pass
    /// kesoku-llm's local provider variant (the adapter does not choose a remote one for it).
    pub fn new(name: impl Into<String>, model: LocalModel, provider: Provider) -> Self {
        let info = ModelInfo {
            provider,
            model: model.info().name.clone(),
            context_window: u32::try_from(model.info().context_window).unwrap_or(u32::MAX),
            max_output_tokens: u32::try_from(model.config().max_output_tokens).unwrap_or(u32::MAX),
        };
        Self { name: name.into(), model, info }
    }

    pub fn local_model(&self) -> &LocalModel {
        &self.model
    }

    fn error(&self, error: LocalError) -> LlmError {
        to_llm_error(&self.name, error)
    }
}

fn to_llm_error(name: &str, error: LocalError) -> LlmError {
    let kind = match &error {
        LocalError::PromptTooLong { .. } => LlmErrorKind::ContextTooLong,
        LocalError::Template(_) | LocalError::Tokenizer(_) => LlmErrorKind::BadRequest,
        LocalError::WorkerGone => LlmErrorKind::Server,
        LocalError::ReadModel { .. }
        | LocalError::NotGguf { .. }
        | LocalError::CorruptModel { .. }
        | LocalError::UnsupportedModel { .. }
        | LocalError::Config(_)
        | LocalError::InvalidSource { .. }
        | LocalError::Download { .. }
        | LocalError::ChecksumMismatch { .. }
        | LocalError::Archive { .. }
        | LocalError::WriteModel { .. } => LlmErrorKind::Config,
    };
    LlmError::new(kind, error.to_string()).with_model(name.to_owned())
}

fn attachment_text(attachment: &kesoku_llm::Attachment) -> String {
    let textual = attachment.mime_type.starts_with("text/")
        || matches!(attachment.mime_type.as_str(), "application/json" | "application/xml" | "application/x-yaml");
    let note = |why: &str| format!("[attachment {} ({}): {why}]", attachment.filename, attachment.mime_type);
    if !textual {
        return note("not shown, this local model reads text only");
    }
    let bytes = match &attachment.source {
        AttachmentSource::Inline(bytes) => bytes.clone(),
        AttachmentSource::File(path) => match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) => return note(&format!("cannot be read: {error}")),
        },
    };
    let shown = &bytes[..bytes.len().min(MAX_INLINE_ATTACHMENT_BYTES)];
    let mut text = format!("[attachment {}]\n{}", attachment.filename, String::from_utf8_lossy(shown));
    if shown.len() < bytes.len() {
        text.push_str("\n[… cut]");
    }
    text
}

/// The conversation of `request` as chat messages and tools.
pub fn request_to_prompt(request: &Request) -> ChatPrompt {
    let mut messages = Vec::new();
    let mut system = request.system.clone().unwrap_or_default();
    if let Some(schema) = &request.output_schema {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str("Answer only with a JSON value that follows this JSON Schema:\n");
        system.push_str(&schema.to_string());
    }
    if !system.is_empty() {
        messages.push(ChatMessage::system(system));
    }
    for turn in &request.turns {
        match turn.role {
            TurnRole::User => user_turn(turn, &mut messages),
            TurnRole::Model => model_turn(turn, &mut messages),
        }
    }
    let tools = request
        .tools
        .iter()
        .map(|tool| ToolSpec {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: tool.parameters.clone(),
        })
        .collect();
    ChatPrompt { messages, tools }
}

fn user_turn(turn: &Turn, messages: &mut Vec<ChatMessage>) {
    let mut text = String::new();
    let flush = |text: &mut String, messages: &mut Vec<ChatMessage>| {
        if !text.is_empty() {
            messages.push(ChatMessage::user(std::mem::take(text)));
        }
    };
    for part in &turn.parts {
        match part {
            Part::Text { text: piece, .. } | Part::Thought { text: piece, .. } => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(piece);
            }
            Part::Attachment(attachment) => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&attachment_text(attachment));
            }
            Part::ToolResult(result) => {
                flush(&mut text, messages);
                let content = match &result.error {
                    Some(error) if result.output.is_empty() => format!("error: {error}"),
                    Some(error) => format!("{}\nerror: {error}", result.output),
                    None => result.output.clone(),
                };
                messages.push(ChatMessage::tool_result(result.name.clone(), Some(result.call_id.clone()), content));
            }
            Part::ToolCall(call) => {
                // A call in a user turn is malformed history; keep it visible as text.
                text.push_str(&format!("[tool call {} {}]", call.name, call.arguments));
            }
        }
    }
    flush(&mut text, messages);
}

fn model_turn(turn: &Turn, messages: &mut Vec<ChatMessage>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for part in &turn.parts {
        match part {
            Part::Text { text: piece, .. } => text.push_str(piece),
            // The model's earlier thinking is not shown to it again.
            Part::Thought { .. } => {}
            Part::ToolCall(call) => calls.push(LocalToolCall {
                id: Some(call.id.clone()),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            }),
            Part::ToolResult(result) => text.push_str(&format!("[tool result {}: {}]", result.name, result.output)),
            Part::Attachment(attachment) => text.push_str(&attachment_text(attachment)),
        }
    }
    messages.push(ChatMessage::assistant_calls(text, calls));
}

/// Ids for tool calls, unique in the process.
fn next_call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("local_call_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn finish_reason(reason: LocalFinish) -> (FinishReason, &'static str) {
    match reason {
        LocalFinish::EndOfTurn => (FinishReason::Stop, "end_of_turn"),
        LocalFinish::StopSequence => (FinishReason::Stop, "stop_sequence"),
        LocalFinish::MaxTokens => (FinishReason::MaxOutputTokens, "max_tokens"),
        LocalFinish::ContextFull => (FinishReason::MaxOutputTokens, "context_full"),
        LocalFinish::Cancelled => (FinishReason::Other, "cancelled"),
    }
}

#[async_trait]
impl Model for LocalChatModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        let prompt = request_to_prompt(request);
        let mut params = self.model.default_params();
        if let Some(max) = request.max_output_tokens {
            params.max_tokens = usize::try_from(max).unwrap_or(usize::MAX).max(1);
        }
        if let Some(temperature) = request.temperature {
            params.temperature = temperature.max(0.0);
        }
        let offered: Vec<String> = prompt.tools.iter().map(|t| t.name.clone()).collect();
        let mut generation = self.model.chat(&prompt, params, &CancellationToken::new()).map_err(|e| self.error(e))?;
        // Wait for the first event so that refusals (prompt too long…) are an `Err` here.
        let first = match generation.next().await {
            Some(Ok(event)) => event,
            Some(Err(error)) => return Err(self.error(error)),
            None => return Err(self.error(LocalError::WorkerGone)),
        };
        Ok(respond(first, generation, offered, self.name.clone(), self.info.model.clone()))
    }
}

/// Turns generation events into kesoku-llm stream events: text streamed (held back where it may
/// be a tool call), then tool calls, then the completed response.
fn respond(
    first: GenerationEvent,
    mut rest: impl futures::Stream<Item = Result<GenerationEvent, LocalError>> + Send + Unpin + 'static,
    offered: Vec<String>,
    name: String,
    model_version: String,
) -> ResponseStream {
    let stream = async_stream::stream! {
        let mut raw = String::new();
        let mut released = 0usize;
        let mut next = Some(Ok(first));
        loop {
            let event = match next.take() {
                Some(event) => event,
                None => match rest.next().await {
                    Some(event) => event,
                    None => {
                        yield Err(to_llm_error(&name, LocalError::WorkerGone));
                        break;
                    }
                },
            };
            match event {
                Err(error) => {
                    yield Err(to_llm_error(&name, error));
                    break;
                }
                Ok(GenerationEvent::Text(piece)) => {
                    raw.push_str(&piece);
                    // The reply's leading whitespace is never shown.
                    let start = raw.len() - raw.trim_start().len();
                    let visible = &raw[start..];
                    let until = if offered.is_empty() {
                        visible.len()
                    } else {
                        match stream_hold(visible) {
                            StreamHold::Release => visible.len(),
                            StreamHold::HoldFrom(at) => at,
                        }
                    };
                    if until > released {
                        yield Ok(StreamEvent::TextDelta(visible[released..until].to_owned()));
                        released = until;
                    }
                }
                Ok(GenerationEvent::Finished(stats)) => {
                    let names: Vec<&str> = offered.iter().map(String::as_str).collect();
                    let parsed = if names.is_empty() {
                        crate::tool_calls::ParsedOutput { text: raw.trim().to_owned(), tool_calls: Vec::new() }
                    } else {
                        parse_tool_calls(&raw, &names)
                    };
                    let shown = raw.trim_start();
                    let shown = &shown[..released.min(shown.len())];
                    if let Some(rest) = parsed.text.strip_prefix(shown)
                        && !rest.is_empty()
                    {
                        yield Ok(StreamEvent::TextDelta(rest.to_owned()));
                    }
                    let mut parts = Vec::new();
                    if !parsed.text.is_empty() {
                        parts.push(Part::text(parsed.text.clone()));
                    }
                    for call in parsed.tool_calls {
                        let call = ToolCall { id: next_call_id(), name: call.name, arguments: call.arguments, signature: None };
                        yield Ok(StreamEvent::ToolCall(call.clone()));
                        parts.push(Part::ToolCall(call));
                    }
                    let (mut reason, detail) = finish_reason(stats.finish_reason);
                    if parts.iter().any(|p| matches!(p, Part::ToolCall(_))) {
                        reason = FinishReason::ToolCalls;
                    }
                    let response = Response {
                        parts,
                        finish_reason: reason,
                        finish_detail: Some(detail.to_owned()),
                        usage: TokenUsage {
                            input_tokens: stats.prompt_tokens as u64,
                            output_tokens: stats.output_tokens as u64,
                            thought_tokens: 0,
                            cached_tokens: stats.cached_prompt_tokens as u64,
                        },
                        model_version: Some(model_version.clone()),
                    };
                    yield Ok(StreamEvent::Completed(response));
                    break;
                }
            }
        }
    };
    Box::pin(stream)
}

#[cfg(test)]
mod tests {
    //! The event translation on scripted generation events, table by table.

    use super::*;
    use crate::engine::GenerationStats;
    use std::time::Duration;

    fn stats(reason: LocalFinish) -> GenerationStats {
        GenerationStats {
            finish_reason: reason,
            prompt_tokens: 10,
            cached_prompt_tokens: 4,
            output_tokens: 7,
            prompt_time: Duration::ZERO,
            generation_time: Duration::ZERO,
        }
    }

    /// Feeds `pieces` then a `Finished(reason)`; returns the deltas, the call names and the
    /// completed response.
    async fn run(pieces: &[&str], offered: &[&str], reason: LocalFinish) -> (Vec<String>, Vec<String>, Response) {
        let mut events: Vec<Result<GenerationEvent, LocalError>> =
            pieces.iter().map(|p| Ok(GenerationEvent::Text((*p).to_owned()))).collect();
        events.push(Ok(GenerationEvent::Finished(stats(reason))));
        let mut events = events.into_iter();
        let Some(Ok(first)) = events.next() else { panic!("no first event") };
        let offered = offered.iter().map(|s| (*s).to_owned()).collect();
        let mut stream = respond(first, futures::stream::iter(events), offered, "local".into(), "tiny".into());
        let (mut deltas, mut calls) = (Vec::new(), Vec::new());
        while let Some(event) = stream.next().await {
            match event {
                Ok(StreamEvent::TextDelta(text)) => deltas.push(text),
                Ok(StreamEvent::ToolCall(call)) => calls.push(call.name),
                Ok(StreamEvent::Completed(response)) => return (deltas, calls, response),
                Ok(StreamEvent::ThoughtDelta(_)) => panic!("local models do not think"),
                Err(error) => panic!("unexpected error {error}"),
            }
        }
        panic!("no Completed event")
    }

    #[tokio::test]
    async fn text_streams_and_tool_calls_are_held_then_parsed() {
        let add = ["add"];
        // (pieces, offered tools, expected deltas, expected calls, expected final text, finish)
        type Case<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], &'a [&'a str], &'a str, FinishReason);
        let cases: Vec<Case> = vec![
            (&["  Hello", " world"], &[], &["Hello", " world"], &[], "Hello world", FinishReason::Stop),
            (&["Hi", " there"], &add, &["Hi", " there"], &[], "Hi there", FinishReason::Stop),
            (
                &["Let me", " check.\n<tool", "_call>{\"name\": \"add\", \"arguments\": {\"a\": 1}}</tool_call>"],
                &add,
                &["Let me", " check.\n"],
                &["add"],
                "Let me check.",
                FinishReason::ToolCalls,
            ),
            (&["{\"name\": \"add\",", " \"arguments\": {}}"], &add, &[], &["add"], "", FinishReason::ToolCalls),
            (&["{\"answer\":", " 40}"], &add, &["{\"answer\": 40}"], &[], "{\"answer\": 40}", FinishReason::Stop),
            (&["<tool_call>{broken"], &add, &["<tool_call>{broken"], &[], "<tool_call>{broken", FinishReason::Stop),
        ];
        for (pieces, offered, deltas, calls, text, finish) in cases {
            let (got_deltas, got_calls, response) = run(pieces, offered, LocalFinish::EndOfTurn).await;
            assert_eq!(got_deltas, deltas, "{pieces:?}");
            assert_eq!(got_calls, calls, "{pieces:?}");
            assert_eq!(response.text_content(), text, "{pieces:?}");
            assert_eq!(response.finish_reason, finish, "{pieces:?}");
            assert_eq!(
                response.usage,
                TokenUsage { input_tokens: 10, output_tokens: 7, thought_tokens: 0, cached_tokens: 4 }
            );
        }
    }

    #[tokio::test]
    async fn finish_reasons_map() {
        let cases = [
            (LocalFinish::EndOfTurn, FinishReason::Stop),
            (LocalFinish::StopSequence, FinishReason::Stop),
            (LocalFinish::MaxTokens, FinishReason::MaxOutputTokens),
            (LocalFinish::ContextFull, FinishReason::MaxOutputTokens),
            (LocalFinish::Cancelled, FinishReason::Other),
        ];
        for (local, expected) in cases {
            let (_, _, response) = run(&["x"], &[], local).await;
            assert_eq!(response.finish_reason, expected, "{local:?}");
        }
    }
}
