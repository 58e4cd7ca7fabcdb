//! Finding tool calls in a local model's output text.
//!
//! Accepted forms, in order:
//! 1. `<tool_call>{…}</tool_call>` blocks (Hermes/Qwen style; the closing tag may be missing at
//!    the very end), each holding one call object or an array of them;
//! 2. otherwise, the whole output (optionally in a ```json fence, optionally after
//!    `<|python_tag|>`) being a call object or an array of call objects, provided every name is
//!    one of the offered tools — so a model asked for plain JSON is not mistaken for a call.
//!
//! A call object is `{"name", "arguments"}` (or `"parameters"`), optionally wrapped as
//! `{"type": "function", "function": {…}}`; arguments may be an object or a string holding one.
//! Anything malformed stays text: this module never fails.

use crate::chat::ToolCall;
use serde_json::Value;

/// Model output split into visible text and tool calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedOutput {
    /// The output with every recognised call removed, trimmed.
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

fn call_from_value(value: &Value) -> Option<ToolCall> {
    let object = value.as_object()?;
    let inner = match object.get("function") {
        Some(function @ Value::Object(_)) => function.as_object()?,
        _ => object,
    };
    let name = inner.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let arguments = match inner.get("arguments").or_else(|| inner.get("parameters")) {
        None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
        Some(Value::Object(map)) => Value::Object(map.clone()),
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(parsed @ Value::Object(_)) => parsed,
            Ok(_) | Err(_) => return None,
        },
        Some(_) => return None,
    };
    Some(ToolCall { id: None, name: name.to_owned(), arguments })
}

/// One call object or a non-empty array of them; `None` if any element is malformed.
fn calls_from_json(text: &str) -> Option<Vec<ToolCall>> {
    let value: Value = serde_json::from_str(text.trim()).ok()?;
    match &value {
        Value::Array(items) if !items.is_empty() => items.iter().map(call_from_value).collect(),
        Value::Object(_) => call_from_value(&value).map(|call| vec![call]),
        Value::Array(_) | Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => None,
    }
}

fn strip_fence(text: &str) -> &str {
    let trimmed = text.trim();
    let Some(rest) = trimmed.strip_prefix("```") else {
        return trimmed;
    };
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

/// Splits `output` into text and tool calls. `offered` lists the tool names offered to the model;
/// untagged JSON counts as calls only when every name is among them.
pub fn parse_tool_calls(output: &str, offered: &[&str]) -> ParsedOutput {
    if output.contains(OPEN) {
        return parse_tagged(output);
    }
    let candidate = strip_fence(output.trim().trim_start_matches("<|python_tag|>"));
    if (candidate.starts_with('{') || candidate.starts_with('['))
        && let Some(calls) = calls_from_json(candidate)
        && calls.iter().all(|call| offered.contains(&call.name.as_str()))
    {
        return ParsedOutput { text: String::new(), tool_calls: calls };
    }
    ParsedOutput { text: output.trim().to_owned(), tool_calls: Vec::new() }
}

fn parse_tagged(output: &str) -> ParsedOutput {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut rest = output;
    while let Some(start) = rest.find(OPEN) {
        text.push_str(&rest[..start]);
        let after_open = &rest[start + OPEN.len()..];
        let (body, consumed, closed) = match after_open.find(CLOSE) {
            Some(end) => (&after_open[..end], end + CLOSE.len(), true),
            None => (after_open, after_open.len(), false),
        };
        match calls_from_json(strip_fence(body)) {
            Some(calls) => tool_calls.extend(calls),
            None => {
                // Malformed: keep the block as it was written.
                text.push_str(OPEN);
                text.push_str(body);
                if closed {
                    text.push_str(CLOSE);
                }
            }
        }
        rest = &after_open[consumed..];
    }
    text.push_str(rest);
    ParsedOutput { text: text.trim().to_owned(), tool_calls }
}

/// How a partial output should be streamed while tool calls may be coming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamHold {
    /// Everything so far is plain text.
    Release,
    /// The output (from this byte on) may be a tool call: hold it until the end.
    HoldFrom(usize),
}

/// Decides, for text streamed so far, which part may be shown before the output is complete.
pub(crate) fn stream_hold(so_far: &str) -> StreamHold {
    if let Some(at) = so_far.find(OPEN) {
        return StreamHold::HoldFrom(at);
    }
    // A tag may be arriving: hold a trailing prefix of "<tool_call>".
    for len in (1..OPEN.len()).rev() {
        if so_far.ends_with(&OPEN[..len]) {
            return StreamHold::HoldFrom(so_far.len() - len);
        }
    }
    let trimmed = so_far.trim_start();
    let leading = so_far.len() - trimmed.len();
    if trimmed.is_empty()
        || trimmed.starts_with('{')
        || trimmed.starts_with('[')
        || trimmed.starts_with("```")
        || "```".starts_with(trimmed)
        || trimmed.starts_with("<|python_tag|>")
    {
        return StreamHold::HoldFrom(leading.min(so_far.len()));
    }
    StreamHold::Release
}
