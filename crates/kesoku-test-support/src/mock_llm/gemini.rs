//! Gemini's wire format for the mock server: `POST /v1beta/models/{model}:generateContent` and
//! `:streamGenerateContent?alt=sse` (each SSE `data:` a whole `GenerateContentResponse`,
//! events separated by `\r\n\r\n`), errors as `{"error": {"code", "message", "status"}}`.
//!
//! Rules enforced: the key in `x-goog-api-key`; `contents` not empty, roles only `user` and
//! `model` (a `tool` role is rejected, as current Gemini models do); every part holds exactly
//! one kind of data; each `functionResponse` answers a `functionCall` of the model turn right
//! before it (by name, and by id when ids are given) and every call there is answered. Like
//! Gemini, it sends thought parts only when the request asks for them (`includeThoughts`).

use axum::response::Response;
use serde_json::{Value, json};

use super::{Accepted, Frame, MockAnswer, MockFinish, MockPart, RecordedRequest, json_response, split_text};

fn status_name(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

pub(crate) fn error_body(status: u16, message: &str) -> Value {
    json!({ "error": { "code": status, "message": message, "status": status_name(status) } })
}

/// Gemini answers a bad key with a 400 carrying `API_KEY_INVALID`.
pub(crate) fn auth_error() -> Response {
    let body = json!({
        "error": {
            "code": 400,
            "message": "API key not valid. Please pass a valid API key.",
            "status": "INVALID_ARGUMENT",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                    "metadata": { "service": "generativelanguage.googleapis.com" }
                }
            ]
        }
    });
    json_response(400, &body, None)
}

pub(crate) fn check_request(request: &RecordedRequest) -> Result<Accepted, Vec<String>> {
    let mut problems = Vec::new();
    let Some(rest) = request.path.strip_prefix("/v1beta/models/") else {
        return Err(vec![format!("unknown path {}", request.path)]);
    };
    let (model, method) = rest.split_once(':').unwrap_or((rest, ""));
    let streaming = match method {
        "generateContent" => false,
        "streamGenerateContent" => {
            if request.query.as_deref() != Some("alt=sse") {
                problems.push("streamGenerateContent without alt=sse".to_owned());
            }
            true
        }
        other => {
            problems.push(format!("unknown method `{other}`"));
            false
        }
    };
    let body = &request.body;
    let contents = body["contents"].as_array().cloned().unwrap_or_default();
    if contents.is_empty() {
        problems.push("contents is empty".to_owned());
    }
    if let Some(system) = body.get("systemInstruction")
        && system["parts"].as_array().is_none_or(Vec::is_empty)
    {
        problems.push("systemInstruction has no parts".to_owned());
    }
    let mut previous_calls: Vec<(Option<String>, String)> = Vec::new();
    for (index, content) in contents.iter().enumerate() {
        let role = content["role"].as_str().unwrap_or_default();
        if role != "user" && role != "model" {
            problems.push(format!("contents[{index}] has role `{role}`: only `user` and `model` are accepted"));
        }
        let parts = content["parts"].as_array().cloned().unwrap_or_default();
        if parts.is_empty() {
            problems.push(format!("contents[{index}] has no parts"));
        }
        let mut calls = Vec::new();
        let mut responses = Vec::new();
        for (part_index, part) in parts.iter().enumerate() {
            let kinds = ["text", "functionCall", "functionResponse", "inlineData", "fileData"]
                .iter()
                .filter(|key| part.get(**key).is_some())
                .count();
            if kinds != 1 {
                problems.push(format!("contents[{index}].parts[{part_index}] must hold exactly one kind of data"));
            }
            if let Some(call) = part.get("functionCall") {
                if role != "model" {
                    problems.push(format!("contents[{index}] has a functionCall outside a model turn"));
                }
                calls.push((
                    call["id"].as_str().map(str::to_owned),
                    call["name"].as_str().unwrap_or_default().to_owned(),
                ));
            }
            if let Some(response) = part.get("functionResponse") {
                if role != "user" {
                    problems.push(format!("contents[{index}] has a functionResponse outside a user turn"));
                }
                if !response["response"].is_object() {
                    problems.push(format!(
                        "contents[{index}].parts[{part_index}].functionResponse.response must be an object"
                    ));
                }
                responses.push((
                    response["id"].as_str().map(str::to_owned),
                    response["name"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
        if role == "user" {
            for (id, name) in &responses {
                let matched = previous_calls.iter().any(|(call_id, call_name)| {
                    call_name == name && (id.is_none() || call_id.is_none() || call_id == id)
                });
                if !matched {
                    problems.push(format!("contents[{index}] has a functionResponse for `{name}` with no matching functionCall in the turn before"));
                }
            }
            if !previous_calls.is_empty() && responses.len() != previous_calls.len() {
                problems.push(format!(
                    "contents[{index}] answers {} of the {} function calls of the turn before",
                    responses.len(),
                    previous_calls.len()
                ));
            }
        }
        previous_calls = if role == "model" { calls } else { Vec::new() };
    }
    if problems.is_empty() {
        let include_thoughts = body["generationConfig"]["thinkingConfig"]["includeThoughts"] == json!(true);
        Ok(Accepted { streaming, model: model.to_owned(), include_usage: true, include_thoughts })
    } else {
        Err(problems)
    }
}

fn usage(answer: &MockAnswer) -> Value {
    let mut usage = json!({
        "promptTokenCount": answer.usage.input,
        "candidatesTokenCount": answer.usage.output,
        "totalTokenCount": answer.usage.input + answer.usage.output + answer.usage.thought,
    });
    if answer.usage.thought > 0 {
        usage["thoughtsTokenCount"] = json!(answer.usage.thought);
    }
    if answer.usage.cached > 0 {
        usage["cachedContentTokenCount"] = json!(answer.usage.cached);
    }
    usage
}

fn finish_reason(answer: &MockAnswer) -> &'static str {
    match answer.finish {
        MockFinish::Stop => "STOP",
        MockFinish::MaxTokens => "MAX_TOKENS",
        MockFinish::Blocked => "SAFETY",
    }
}

fn call_part(id: &str, name: &str, arguments: &Value, signature: &Option<String>) -> Value {
    let mut call = json!({ "name": name, "args": arguments });
    if !id.is_empty() {
        call["id"] = json!(id);
    }
    let mut part = json!({ "functionCall": call });
    if let Some(signature) = signature {
        part["thoughtSignature"] = json!(signature);
    }
    part
}

fn chunk(parts: Vec<Value>, model: &str) -> Value {
    json!({
        "candidates": [ { "content": { "parts": parts, "role": "model" }, "index": 0 } ],
        "modelVersion": model,
        "responseId": "mock-response-1"
    })
}

/// The chunks Gemini streams: thought and text pieces (a text's signature in a last chunk with
/// empty text, as Gemini does), one chunk per function call, finish reason and full usage on the
/// last chunk.
pub(crate) fn stream_frames(answer: &MockAnswer, model: &str) -> Vec<Frame> {
    let mut chunks: Vec<Value> = Vec::new();
    for part in &answer.parts {
        match part {
            MockPart::Thought { text, signature } => {
                let pieces = split_text(text);
                let count = pieces.len();
                for (index, piece) in pieces.into_iter().enumerate() {
                    let mut part = json!({ "text": piece, "thought": true });
                    if index + 1 == count
                        && let Some(signature) = signature
                    {
                        part["thoughtSignature"] = json!(signature);
                    }
                    chunks.push(chunk(vec![part], model));
                }
            }
            MockPart::Text { text, signature } => {
                for piece in split_text(text) {
                    chunks.push(chunk(vec![json!({ "text": piece })], model));
                }
                if let Some(signature) = signature {
                    chunks.push(chunk(vec![json!({ "text": "", "thoughtSignature": signature })], model));
                }
            }
            MockPart::ToolCall { id, name, arguments, signature } => {
                chunks.push(chunk(vec![call_part(id, name, arguments, signature)], model));
            }
        }
    }
    if chunks.is_empty() {
        chunks.push(chunk(vec![json!({ "text": "" })], model));
    }
    let partial_usage = json!({ "promptTokenCount": answer.usage.input, "totalTokenCount": answer.usage.input });
    let last = chunks.len() - 1;
    for (index, chunk) in chunks.iter_mut().enumerate() {
        if index == last {
            chunk["candidates"][0]["finishReason"] = json!(finish_reason(answer));
            chunk["usageMetadata"] = usage(answer);
        } else {
            chunk["usageMetadata"] = partial_usage.clone();
        }
    }
    chunks.into_iter().map(|chunk| Frame(format!("data: {chunk}\r\n\r\n"))).collect()
}

/// The whole answer of `generateContent`.
pub(crate) fn full_answer(answer: &MockAnswer, model: &str) -> Value {
    let parts: Vec<Value> = answer
        .parts
        .iter()
        .map(|part| match part {
            MockPart::Thought { text, signature } => {
                let mut part = json!({ "text": text, "thought": true });
                if let Some(signature) = signature {
                    part["thoughtSignature"] = json!(signature);
                }
                part
            }
            MockPart::Text { text, signature } => {
                let mut part = json!({ "text": text });
                if let Some(signature) = signature {
                    part["thoughtSignature"] = json!(signature);
                }
                part
            }
            MockPart::ToolCall { id, name, arguments, signature } => call_part(id, name, arguments, signature),
        })
        .collect();
    let mut body = chunk(parts, model);
    body["candidates"][0]["finishReason"] = json!(finish_reason(answer));
    body["usageMetadata"] = usage(answer);
    body
}
