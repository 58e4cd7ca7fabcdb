//! Anthropic messages for the mock server: `POST /v1/messages`, streamed as named events
//! (`message_start`, `ping`, `content_block_start` / `_delta` / `_stop` with `text_delta`,
//! `thinking_delta`, `signature_delta`, `input_json_delta`, then `message_delta` and
//! `message_stop`). Errors as `{"type": "error", "error": {"type", "message"}}`.
//!
//! Rules enforced: `x-api-key` and `anthropic-version: 2023-06-01`; `max_tokens` set;
//! messages alternate user / assistant starting with user, and no `system` role in them; tool
//! results lead the user message right after the assistant's `tool_use`s and answer each of them
//! (no more, no less); thinking blocks carry a signature; a thinking budget is at least 1024 and
//! below `max_tokens`, and no temperature other than 1 goes with it; adaptive thinking takes no
//! budget, `display` is `summarized` or `omitted`, `output_config.effort` a known level.

use axum::response::Response;
use serde_json::{Value, json};

use super::{
    Accepted, Frame, MockAnswer, MockFinish, MockPart, RecordedRequest, json_response, split_fragments, split_text,
};

fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

pub(crate) fn error_body(status: u16, message: &str) -> Value {
    json!({ "type": "error", "error": { "type": error_type(status), "message": message }, "request_id": "req_mock" })
}

pub(crate) fn auth_error() -> Response {
    json_response(401, &error_body(401, "invalid x-api-key"), None)
}

pub(crate) fn check_request(request: &RecordedRequest) -> Result<Accepted, Vec<String>> {
    if request.path != "/v1/messages" {
        return Err(vec![format!("unknown path {}", request.path)]);
    }
    let mut problems = Vec::new();
    if request.header("anthropic-version") != Some("2023-06-01") {
        problems.push("anthropic-version header must be 2023-06-01".to_owned());
    }
    let body = &request.body;
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    if model.is_empty() {
        problems.push("model: Field required".to_owned());
    }
    let max_tokens = body["max_tokens"].as_u64();
    if max_tokens.is_none() {
        problems.push("max_tokens: Field required".to_owned());
    }
    if let Some(thinking) = body.get("thinking")
        && thinking["type"] == "enabled"
    {
        let budget = thinking["budget_tokens"].as_u64().unwrap_or(0);
        if budget < 1024 {
            problems.push("thinking.budget_tokens: must be at least 1024".to_owned());
        }
        if max_tokens.is_some_and(|max| budget >= max) {
            problems.push("max_tokens must be greater than thinking.budget_tokens".to_owned());
        }
        if body.get("temperature").is_some_and(|temperature| temperature.as_f64() != Some(1.0)) {
            problems.push("temperature may only be set to 1 when thinking is enabled".to_owned());
        }
    }
    if let Some(thinking) = body.get("thinking")
        && thinking["type"] == "adaptive"
    {
        if thinking.get("budget_tokens").is_some() {
            problems.push("thinking.adaptive.budget_tokens: Extra inputs are not permitted".to_owned());
        }
        if thinking.get("display").is_some_and(|display| display != "summarized" && display != "omitted") {
            problems.push("thinking.display: must be `summarized` or `omitted`".to_owned());
        }
        if body.get("temperature").is_some_and(|temperature| temperature.as_f64() != Some(1.0)) {
            problems.push("temperature may only be set to 1 when thinking is enabled".to_owned());
        }
    }
    if let Some(thinking) = body.get("thinking")
        && !["enabled", "adaptive", "disabled"].contains(&thinking["type"].as_str().unwrap_or_default())
    {
        problems.push(format!("thinking.type: unknown type {}", thinking["type"]));
    }
    if let Some(effort) = body.get("output_config").map(|config| &config["effort"])
        && !["low", "medium", "high", "xhigh", "max"].contains(&effort.as_str().unwrap_or_default())
    {
        problems.push(format!("output_config.effort: unknown effort {effort}"));
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    if messages.is_empty() {
        problems.push("messages: at least one message is required".to_owned());
    }
    let mut expected_role = "user";
    let mut pending_calls: Vec<String> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        if role != expected_role {
            problems.push(format!(
                "messages[{index}]: roles must alternate between \"user\" and \"assistant\" starting with \"user\", got `{role}`"
            ));
        }
        expected_role = if role == "user" { "assistant" } else { "user" };
        let blocks = match &message["content"] {
            Value::String(text) => vec![json!({ "type": "text", "text": text })],
            Value::Array(blocks) => blocks.clone(),
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::Object(_) => Vec::new(),
        };
        if blocks.is_empty() {
            problems.push(format!("messages[{index}]: content must not be empty"));
        }
        if role == "user" {
            let mut seen_other = false;
            let mut answered = Vec::new();
            for block in &blocks {
                if block["type"] == "tool_result" {
                    if seen_other {
                        problems
                            .push(format!("messages[{index}]: tool_result blocks must come first in the user message"));
                    }
                    let id = block["tool_use_id"].as_str().unwrap_or_default().to_owned();
                    if !pending_calls.contains(&id) {
                        problems.push(format!(
                            "messages[{index}]: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                        ));
                    }
                    answered.push(id);
                } else {
                    seen_other = true;
                }
            }
            for call in &pending_calls {
                if !answered.contains(call) {
                    problems.push(format!(
                        "messages[{index}]: `tool_use` ids were found without `tool_result` blocks immediately after: {call}"
                    ));
                }
            }
            pending_calls.clear();
        } else {
            if !pending_calls.is_empty() {
                problems.push(format!("messages[{index}]: tool_use blocks were not answered"));
            }
            pending_calls.clear();
            for block in &blocks {
                match block["type"].as_str().unwrap_or_default() {
                    "tool_use" => pending_calls.push(block["id"].as_str().unwrap_or_default().to_owned()),
                    "thinking" if block["signature"].as_str().is_none_or(str::is_empty) => {
                        problems.push(format!("messages[{index}]: thinking block without a signature"));
                    }
                    "text" if block["text"].as_str().is_none_or(str::is_empty) => {
                        problems.push(format!("messages[{index}]: text content blocks must be non-empty"));
                    }
                    _ => {}
                }
            }
        }
    }
    if !pending_calls.is_empty() {
        problems.push("the last assistant message has tool_use blocks without results".to_owned());
    }
    let streaming = body["stream"].as_bool().unwrap_or(false);
    if problems.is_empty() {
        Ok(Accepted { streaming, model, include_usage: true, include_thoughts: true })
    } else {
        Err(problems)
    }
}

fn stop_reason(answer: &MockAnswer) -> &'static str {
    match answer.finish {
        MockFinish::Stop if answer.has_tool_calls() => "tool_use",
        MockFinish::Stop => "end_turn",
        MockFinish::MaxTokens => "max_tokens",
        MockFinish::Blocked => "refusal",
    }
}

fn event(name: &str, data: Value) -> Frame {
    Frame(format!("event: {name}\ndata: {data}\n\n"))
}

pub(crate) fn stream_frames(answer: &MockAnswer, model: &str) -> Vec<Frame> {
    let mut frames = vec![
        event(
            "message_start",
            json!({ "type": "message_start", "message": {
                "id": "msg_mock", "type": "message", "role": "assistant", "content": [], "model": model,
                "stop_reason": null, "stop_sequence": null,
                "usage": {
                    "input_tokens": answer.usage.input - answer.usage.cached.min(answer.usage.input),
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": answer.usage.cached,
                    "output_tokens": 1
                }
            } }),
        ),
        event("ping", json!({ "type": "ping" })),
    ];
    for (index, part) in answer.parts.iter().enumerate() {
        match part {
            MockPart::Thought { text, signature } => {
                frames.push(event(
                    "content_block_start",
                    json!({ "type": "content_block_start", "index": index, "content_block": { "type": "thinking", "thinking": "", "signature": "" } }),
                ));
                for piece in split_text(text) {
                    frames.push(event(
                        "content_block_delta",
                        json!({ "type": "content_block_delta", "index": index, "delta": { "type": "thinking_delta", "thinking": piece } }),
                    ));
                }
                if let Some(signature) = signature {
                    frames.push(event(
                        "content_block_delta",
                        json!({ "type": "content_block_delta", "index": index, "delta": { "type": "signature_delta", "signature": signature } }),
                    ));
                }
            }
            MockPart::Text { text, .. } => {
                frames.push(event(
                    "content_block_start",
                    json!({ "type": "content_block_start", "index": index, "content_block": { "type": "text", "text": "" } }),
                ));
                for piece in split_text(text) {
                    frames.push(event(
                        "content_block_delta",
                        json!({ "type": "content_block_delta", "index": index, "delta": { "type": "text_delta", "text": piece } }),
                    ));
                }
            }
            MockPart::ToolCall { id, name, arguments, .. } => {
                frames.push(event(
                    "content_block_start",
                    json!({ "type": "content_block_start", "index": index, "content_block": { "type": "tool_use", "id": id, "name": name, "input": {} } }),
                ));
                let mut fragments = vec![String::new()];
                fragments.extend(split_fragments(&arguments.to_string()));
                for fragment in fragments {
                    frames.push(event(
                        "content_block_delta",
                        json!({ "type": "content_block_delta", "index": index, "delta": { "type": "input_json_delta", "partial_json": fragment } }),
                    ));
                }
            }
        }
        frames.push(event("content_block_stop", json!({ "type": "content_block_stop", "index": index })));
    }
    frames.push(event(
        "message_delta",
        json!({ "type": "message_delta", "delta": { "stop_reason": stop_reason(answer), "stop_sequence": null },
                "usage": { "output_tokens": answer.usage.output + answer.usage.thought } }),
    ));
    frames.push(event("message_stop", json!({ "type": "message_stop" })));
    frames
}

pub(crate) fn full_answer(answer: &MockAnswer, model: &str) -> Value {
    let content: Vec<Value> = answer
        .parts
        .iter()
        .map(|part| match part {
            MockPart::Thought { text, signature } => {
                json!({ "type": "thinking", "thinking": text, "signature": signature.clone().unwrap_or_default() })
            }
            MockPart::Text { text, .. } => json!({ "type": "text", "text": text }),
            MockPart::ToolCall { id, name, arguments, .. } => {
                json!({ "type": "tool_use", "id": id, "name": name, "input": arguments })
            }
        })
        .collect();
    json!({
        "id": "msg_mock", "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason(answer), "stop_sequence": null,
        "usage": {
            "input_tokens": answer.usage.input - answer.usage.cached.min(answer.usage.input),
            "cache_read_input_tokens": answer.usage.cached,
            "output_tokens": answer.usage.output + answer.usage.thought
        }
    })
}
