//! OpenAI-style chat completions for the mock server: `POST /v1/chat/completions`, streamed as
//! `chat.completion.chunk` objects (`data: {...}` then `data: [DONE]`), tool calls as fragments
//! keyed by `index`, reasoning as `reasoning_content`, the usage in a last chunk with no choices
//! when `stream_options.include_usage` is set. Errors as `{"error": {"message", "type", "code"}}`.
//!
//! Rules enforced: `Authorization: Bearer` key; `model` and `messages` present; roles among
//! system, developer, user, assistant, tool; an assistant message with `tool_calls` is followed
//! by one `tool` message per call (and nothing else in between); every `tool` message answers a
//! call of that assistant message; tool call arguments are JSON strings.
//!
//! [`serve`] runs this server standalone on an address (for benchmarks and end-to-end tests).

use std::net::SocketAddr;

use axum::response::Response;
use serde_json::{Value, json};

use super::{
    Accepted, Behaviour, Frame, MockAnswer, MockFinish, MockPart, RecordedRequest, Vendor, json_response, serve_vendor,
    split_fragments, split_text,
};

/// Serve the OpenAI-style API on `addr` with `behaviour` (any key accepted) until dropped.
///
/// `Behaviour::FixedText` answers every request at once; `Behaviour::Latency` waits before the
/// first byte and between chunks.
pub async fn serve(addr: SocketAddr, behaviour: Behaviour) -> std::io::Result<()> {
    serve_vendor(addr, Vendor::OpenAi, behaviour).await
}

fn error_type(status: u16) -> (&'static str, Option<&'static str>) {
    match status {
        400 => ("invalid_request_error", None),
        401 => ("invalid_request_error", Some("invalid_api_key")),
        404 => ("invalid_request_error", Some("model_not_found")),
        429 => ("requests", Some("rate_limit_exceeded")),
        503 => ("server_error", None),
        _ => ("server_error", None),
    }
}

pub(crate) fn error_body(status: u16, message: &str) -> Value {
    let (kind, code) = error_type(status);
    json!({ "error": { "message": message, "type": kind, "param": null, "code": code } })
}

/// OpenAI quotes part of a wrong key in its message; the client must not repeat it.
pub(crate) fn auth_error(given: &str) -> Response {
    let masked = if given.len() > 6 {
        format!("{}{}{}", &given[..3], "*".repeat(given.len().saturating_sub(6)), &given[given.len() - 3..])
    } else {
        "***".to_owned()
    };
    let message = format!(
        "Incorrect API key provided: {masked}. You can find your API key at https://platform.openai.com/account/api-keys."
    );
    json_response(401, &error_body(401, &message), None)
}

pub(crate) fn check_request(request: &RecordedRequest) -> Result<Accepted, Vec<String>> {
    if request.path != "/v1/chat/completions" {
        return Err(vec![format!("unknown path {}", request.path)]);
    }
    let mut problems = Vec::new();
    let body = &request.body;
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    if model.is_empty() {
        problems.push("model is missing".to_owned());
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    if messages.is_empty() {
        problems.push("messages is empty".to_owned());
    }
    let mut awaiting: Vec<String> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
            problems.push(format!("messages[{index}] has unknown role `{role}`"));
        }
        if role == "tool" {
            let id = message["tool_call_id"].as_str().unwrap_or_default();
            match awaiting.iter().position(|call| call == id) {
                Some(position) => {
                    awaiting.remove(position);
                }
                None => problems.push(format!(
                    "messages[{index}] is a tool message for `{id}`, which is not a tool call of the assistant message before it"
                )),
            }
            continue;
        }
        if !awaiting.is_empty() {
            problems.push(format!(
                "an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'; missing: {}",
                awaiting.join(", ")
            ));
            awaiting.clear();
        }
        if role == "assistant" {
            for call in message["tool_calls"].as_array().cloned().unwrap_or_default() {
                if !call["function"]["arguments"].is_string() {
                    problems.push(format!("messages[{index}] has tool call arguments that are not a JSON string"));
                }
                awaiting.push(call["id"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    if !awaiting.is_empty() {
        problems.push(format!("tool calls without a tool message: {}", awaiting.join(", ")));
    }
    let streaming = body["stream"].as_bool().unwrap_or(false);
    let include_usage = body["stream_options"]["include_usage"].as_bool().unwrap_or(false);
    if problems.is_empty() {
        Ok(Accepted { streaming, model, include_usage, include_thoughts: true })
    } else {
        Err(problems)
    }
}

fn finish_reason(answer: &MockAnswer) -> &'static str {
    match answer.finish {
        MockFinish::Stop if answer.has_tool_calls() => "tool_calls",
        MockFinish::Stop => "stop",
        MockFinish::MaxTokens => "length",
        MockFinish::Blocked => "content_filter",
    }
}

fn usage(answer: &MockAnswer) -> Value {
    let completion = answer.usage.output + answer.usage.thought;
    json!({
        "prompt_tokens": answer.usage.input,
        "completion_tokens": completion,
        "total_tokens": answer.usage.input + completion,
        "prompt_tokens_details": { "cached_tokens": answer.usage.cached },
        "completion_tokens_details": { "reasoning_tokens": answer.usage.thought }
    })
}

fn chunk(model: &str, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "choices": [ { "index": 0, "delta": delta, "finish_reason": finish_reason } ]
    })
}

pub(crate) fn stream_frames(answer: &MockAnswer, model: &str, include_usage: bool) -> Vec<Frame> {
    let mut chunks = vec![chunk(model, json!({ "role": "assistant", "content": "" }), None)];
    let mut call_index = 0;
    for part in &answer.parts {
        match part {
            MockPart::Thought { text, .. } => {
                for piece in split_text(text) {
                    chunks.push(chunk(model, json!({ "reasoning_content": piece }), None));
                }
            }
            MockPart::Text { text, .. } => {
                for piece in split_text(text) {
                    chunks.push(chunk(model, json!({ "content": piece }), None));
                }
            }
            MockPart::ToolCall { id, name, arguments, .. } => {
                chunks.push(chunk(
                    model,
                    json!({ "tool_calls": [ {
                        "index": call_index, "id": id, "type": "function",
                        "function": { "name": name, "arguments": "" }
                    } ] }),
                    None,
                ));
                for fragment in split_fragments(&arguments.to_string()) {
                    chunks.push(chunk(
                        model,
                        json!({ "tool_calls": [ { "index": call_index, "function": { "arguments": fragment } } ] }),
                        None,
                    ));
                }
                call_index += 1;
            }
        }
    }
    chunks.push(chunk(model, json!({}), Some(finish_reason(answer))));
    if include_usage {
        chunks.push(json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [],
            "usage": usage(answer)
        }));
    }
    let mut frames: Vec<Frame> = chunks.into_iter().map(|chunk| Frame(format!("data: {chunk}\n\n"))).collect();
    frames.push(Frame("data: [DONE]\n\n".to_owned()));
    frames
}

pub(crate) fn full_answer(answer: &MockAnswer, model: &str) -> Value {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for part in &answer.parts {
        match part {
            MockPart::Thought { text: piece, .. } => reasoning.push_str(piece),
            MockPart::Text { text: piece, .. } => text.push_str(piece),
            MockPart::ToolCall { id, name, arguments, .. } => calls.push(json!({
                "id": id, "type": "function", "function": { "name": name, "arguments": arguments.to_string() }
            })),
        }
    }
    let mut message =
        json!({ "role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) } });
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [ { "index": 0, "message": message, "finish_reason": finish_reason(answer) } ],
        "usage": usage(answer)
    })
}
