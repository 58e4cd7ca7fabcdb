//! Rendering a [`ChatPrompt`] into prompt text with the model's own chat template.
//!
//! The template comes from the GGUF metadata (`tokenizer.chat_template`, a Jinja template) and is
//! rendered with minijinja, configured like Hugging Face's renderer (`trim_blocks`,
//! `lstrip_blocks`, Python string methods, `raise_exception`, `strftime_now`). A file without a
//! template gets ChatML.
//!
//! Tools: when the template itself handles `tools` (Qwen-style templates), declarations, calls
//! and results are passed to it in the Hugging Face shape. Otherwise the documented fallback
//! applies (Hermes style, which ChatML models such as SmolLM2 were trained near):
//! - the tool list and calling instructions are appended to the system message;
//! - an assistant tool call is written into its content as
//!   `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`;
//! - a tool result becomes a user message
//!   `<tool_response>\n{"name": …, "content": …}\n</tool_response>`, and consecutive messages of
//!   one role are merged so strict templates still see alternating turns.
//!
//! This module renders text only; it does not tokenize.

use crate::chat::{ChatMessage, ChatPrompt, ChatRole, ToolSpec};
use crate::error::LocalError;
use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value, context};
use serde_json::json;

/// A model's chat template.
#[derive(Debug)]
pub(crate) struct ChatTemplate {
    source: Option<String>,
    bos_token: String,
    eos_token: String,
}

/// The calling instructions of the fallback, followed by the tool list.
fn tool_instructions(tools: &[ToolSpec]) -> String {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        let declaration = json!({
            "type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
        });
        text.push('\n');
        text.push_str(&declaration.to_string());
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments \
         within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \
         \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}

/// The text form of a tool call in the fallback format.
pub(crate) fn tool_call_text(name: &str, arguments: &serde_json::Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": arguments}))
}

fn tool_response_text(message: &ChatMessage) -> String {
    let name = message.tool_name.as_deref().unwrap_or("tool");
    format!("<tool_response>\n{}\n</tool_response>", json!({"name": name, "content": message.content}))
}

/// Template messages for the fallback: tool traffic written as text, same-role runs merged.
fn fallback_messages(prompt: &ChatPrompt) -> Vec<(ChatRole, String)> {
    let mut out: Vec<(ChatRole, String)> = Vec::new();
    let mut push = |role: ChatRole, text: String| match out.last_mut() {
        Some((last_role, last_text)) if *last_role == role => {
            last_text.push_str("\n\n");
            last_text.push_str(&text);
        }
        _ => out.push((role, text)),
    };
    let mut system_seen = false;
    for message in &prompt.messages {
        match message.role {
            ChatRole::System => {
                system_seen = true;
                let mut text = message.content.clone();
                if !prompt.tools.is_empty() {
                    text.push_str("\n\n");
                    text.push_str(&tool_instructions(&prompt.tools));
                }
                push(ChatRole::System, text);
            }
            ChatRole::User => push(ChatRole::User, message.content.clone()),
            ChatRole::Assistant => {
                let mut parts: Vec<String> = Vec::new();
                if !message.content.is_empty() {
                    parts.push(message.content.clone());
                }
                parts.extend(message.tool_calls.iter().map(|call| tool_call_text(&call.name, &call.arguments)));
                push(ChatRole::Assistant, parts.join("\n"));
            }
            ChatRole::Tool => push(ChatRole::User, tool_response_text(message)),
        }
    }
    if !system_seen && !prompt.tools.is_empty() {
        out.insert(0, (ChatRole::System, tool_instructions(&prompt.tools)));
    }
    out
}

/// Template messages in the Hugging Face shape, for templates that handle tools themselves.
fn native_messages(prompt: &ChatPrompt) -> Vec<serde_json::Value> {
    prompt
        .messages
        .iter()
        .map(|message| match message.role {
            ChatRole::Assistant if !message.tool_calls.is_empty() => json!({
                "role": "assistant",
                "content": message.content,
                "tool_calls": message.tool_calls.iter().map(|call| json!({
                    "type": "function",
                    "id": call.id,
                    "function": {"name": call.name, "arguments": call.arguments},
                })).collect::<Vec<_>>(),
            }),
            ChatRole::Tool => json!({
                "role": "tool",
                "content": message.content,
                "name": message.tool_name,
                "tool_call_id": message.tool_call_id,
            }),
            ChatRole::System | ChatRole::User | ChatRole::Assistant => {
                json!({"role": message.role.as_str(), "content": message.content})
            }
        })
        .collect()
}

fn template_error(error: minijinja::Error) -> LocalError {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    LocalError::Template(text)
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    chrono::Local::now().format(&format).to_string()
}

impl ChatTemplate {
    pub(crate) fn new(source: Option<String>, bos_token: String, eos_token: String) -> Self {
        Self { source, bos_token, eos_token }
    }

    /// Whether the template renders tool declarations itself.
    pub(crate) fn handles_tools(&self) -> bool {
        self.source.as_deref().is_some_and(|s| s.contains("tools"))
    }

    /// The prompt text for `prompt`, ending where the assistant's reply starts.
    pub(crate) fn render(&self, prompt: &ChatPrompt) -> Result<String, LocalError> {
        let Some(source) = &self.source else {
            return Ok(chatml(&fallback_messages(prompt)));
        };
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template("chat", source).map_err(template_error)?;
        let template = env.get_template("chat").map_err(template_error)?;
        let (messages, tools) = if self.handles_tools() {
            let tools: Vec<serde_json::Value> = prompt
                .tools
                .iter()
                .map(|tool| {
                    json!({"type": "function", "function": {
                        "name": tool.name, "description": tool.description, "parameters": tool.parameters,
                    }})
                })
                .collect();
            (native_messages(prompt), if tools.is_empty() { None } else { Some(tools) })
        } else {
            let messages = fallback_messages(prompt)
                .into_iter()
                .map(|(role, content)| json!({"role": role.as_str(), "content": content}))
                .collect();
            (messages, None)
        };
        template
            .render(context! {
                messages => Value::from(Serde(&messages)),
                tools => Value::from(Serde(&tools)),
                add_generation_prompt => true,
                bos_token => self.bos_token.clone(),
                eos_token => self.eos_token.clone(),
            })
            .map_err(template_error)
    }
}

/// ChatML, for files that carry no template.
fn chatml(messages: &[(ChatRole, String)]) -> String {
    let mut text = String::new();
    for (role, content) in messages {
        text.push_str("<|im_start|>");
        text.push_str(role.as_str());
        text.push('\n');
        text.push_str(content);
        text.push_str("<|im_end|>\n");
    }
    text.push_str("<|im_start|>assistant\n");
    text
}
