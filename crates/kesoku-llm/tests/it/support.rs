//! Shared helpers: models pointed at mock servers, message fixtures, and a compact rendering of
//! conversations for table tests.

use std::sync::Arc;

use kesoku_core::{Message, MessageId, SessionId, TurnOrigin};
use kesoku_llm::{
    AttachmentSource, Conversation, Model, ModelConfig, Part, Provider, RetryPolicy, Secret, Turn, TurnRole,
};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockServer, Vendor};

/// The environment variable name the test configs claim the key comes from.
pub const KEY_ENV: &str = "KESOKU_TEST_KEY";

pub fn provider_of(vendor: Vendor) -> Provider {
    match vendor {
        Vendor::Gemini => Provider::Gemini,
        Vendor::OpenAi => Provider::OpenAi,
        Vendor::Anthropic => Provider::Anthropic,
    }
}

pub fn vendor_name(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Gemini => "gemini",
        Vendor::OpenAi => "openai",
        Vendor::Anthropic => "anthropic",
    }
}

/// A config for `vendor` pointing at `base_url`, with fast retries.
pub fn config_for(vendor: Vendor, base_url: &str) -> ModelConfig {
    let model = match vendor {
        Vendor::Gemini => "gemini-2.5-flash",
        Vendor::OpenAi => "gpt-test",
        Vendor::Anthropic => "claude-test",
    };
    let mut config = ModelConfig::new(provider_of(vendor), model);
    config.base_url = Some(base_url.to_owned());
    config.api_key_env = Some(KEY_ENV.to_owned());
    config.max_output_tokens = Some(4096);
    config.retry = RetryPolicy { max_attempts: 3, base_delay_seconds: 0.01, max_delay_seconds: 2.0 };
    config
}

/// A model for `server`, with the key the server accepts (or `key`).
pub fn model_for(vendor: Vendor, server: &MockServer, key: &str) -> Arc<dyn Model> {
    let config = config_for(vendor, &server.base_url());
    kesoku_llm::build_model("mock", &config, Some(Secret::new(key))).expect("model builds")
}

pub fn good_model(vendor: Vendor, server: &MockServer) -> Arc<dyn Model> {
    model_for(vendor, server, MOCK_API_KEY)
}

// ---- message fixtures ----------------------------------------------------------------------

pub fn session() -> SessionId {
    SessionId::from("sess_test")
}

/// A user message with a fixed id.
pub fn user(id: &str, text: &str) -> Message {
    let mut message = Message::user_text(&session(), "cli", "cli", "User", text);
    message.id = MessageId::from(id);
    message
}

pub fn origin(root: &Message) -> TurnOrigin {
    TurnOrigin::of(root, "Kesoku")
}

/// Give a message a fixed id (for readable fixtures and parent links).
pub fn with_id(mut message: Message, id: &str) -> Message {
    message.id = MessageId::from(id);
    message
}

// ---- compact rendering ---------------------------------------------------------------------

fn quote(text: &str) -> String {
    format!("{text:?}")
}

fn render_part(part: &Part) -> String {
    let signed = |signature: &Option<String>| signature.as_ref().map(|s| format!(" sig={s}")).unwrap_or_default();
    match part {
        Part::Text { text, signature } => format!("text {}{}", quote(text), signed(signature)),
        Part::Thought { text, signature } => format!("thought {}{}", quote(text), signed(signature)),
        Part::ToolCall(call) => format!("call {} {} {}{}", call.id, call.name, call.arguments, signed(&call.signature)),
        Part::ToolResult(result) => match &result.error {
            None => format!("result {} {} ok {}", result.call_id, result.name, quote(&result.output)),
            Some(error) => {
                format!("result {} {} error {} {}", result.call_id, result.name, quote(error), quote(&result.output))
            }
        },
        Part::Attachment(attachment) => {
            let source = match &attachment.source {
                AttachmentSource::File(path) => format!("file={}", path.display()),
                AttachmentSource::Inline(bytes) => format!("inline={} bytes", bytes.len()),
            };
            format!("attachment {} ({}) {source}", attachment.filename, attachment.mime_type)
        }
    }
}

fn render_turn(turn: &Turn) -> String {
    let role = match turn.role {
        TurnRole::User => "user",
        TurnRole::Model => "model",
    };
    let parts: Vec<String> = turn.parts.iter().map(render_part).collect();
    format!("{role}: {}", parts.join(" | "))
}

/// One line for the system instruction (if any), one per turn.
pub fn render(conversation: &Conversation) -> String {
    let mut lines = Vec::new();
    if let Some(system) = &conversation.system {
        lines.push(format!("system: {}", quote(system)));
    }
    lines.extend(conversation.turns.iter().map(render_turn));
    lines.join("\n")
}
