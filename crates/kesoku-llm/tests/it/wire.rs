//! The wire body each provider builds from the same conversations (history → turns → request),
//! as snapshots, plus the provider-specific rules that are easy to get wrong.

use kesoku_core::history::phased_order;
use kesoku_core::{Attachment, Message, MessageId};
use kesoku_llm::providers::{anthropic, gemini, openai};
use kesoku_llm::{
    AttachmentSource, HistoryOptions, ModelConfig, Part, Provider, Request, ThinkingLevel, ToolCall, ToolDeclaration,
    Turn, history_to_conversation,
};
use serde_json::{Value, json};

use crate::support::{origin, session, user};

fn inline_attachments(request: &mut Request) {
    for part in request.turns.iter_mut().flat_map(|turn| turn.parts.iter_mut()) {
        if let Part::Attachment(attachment) = part
            && let AttachmentSource::File(path) = &attachment.source
        {
            attachment.source = AttachmentSource::Inline(std::fs::read(path).expect("fixture attachment readable"));
        }
    }
}

fn tools() -> Vec<ToolDeclaration> {
    vec![ToolDeclaration {
        name: "weather".to_owned(),
        description: "Current weather of a city.".to_owned(),
        parameters: json!({
            "type": "object",
            "properties": { "city": { "type": "string" } },
            "required": ["city"],
            "additionalProperties": false
        }),
    }]
}

/// A session with a past turn (attachment stripped, thought stripped) and an active tool loop
/// with signed thoughts from both Gemini and Anthropic, a signed call, its result and a nudge.
fn rich_request() -> Request {
    let directory = tempfile::tempdir().expect("temp dir");
    std::fs::write(directory.path().join("photo.png"), [0x89, b'P', b'N', b'G']).expect("write fixture");
    let mut past = user("u1", "what is in this file?");
    past.metadata.attachments = Some(vec![Attachment {
        path: "old.csv".to_owned(),
        mime_type: "text/csv".to_owned(),
        filename: "old.csv".to_owned(),
    }]);
    let past_turn = origin(&past);
    let mut active = user("u2", "weather where this photo was taken?");
    active.metadata.attachments = Some(vec![Attachment {
        path: "photo.png".to_owned(),
        mime_type: "image/png".to_owned(),
        filename: "photo.png".to_owned(),
    }]);
    let turn = origin(&active);
    let mut call = turn.tool_call(1, "call_1", "weather", json!({ "city": "Tokyo" }));
    call.metadata.thought_signature = Some("gemini:sig-call".to_owned());
    let written = vec![
        Message::system_prompt(&session(), "You are Kesoku."),
        past.clone(),
        past_turn.thought(1, "old thought", Some("gemini:old".to_owned())),
        past_turn.final_text(1, "A table of numbers.", None),
        active.clone(),
        turn.thought(1, "The photo shows Tokyo Tower.", Some("gemini:sig-thought".to_owned())),
        turn.thought(1, "I should check the weather.", Some("anthropic:sig-thinking".to_owned())),
        call.clone(),
        turn.tool_result(&call, "Tokyo: sunny, 24°C", None, None),
    ];
    let messages = phased_order(written);
    let root = MessageId::from("u2");
    let options = HistoryOptions { active_root: Some(&root), attachment_base: Some(directory.path()) };
    let mut request = history_to_conversation(&messages, &options).into_request();
    request.tools = tools();
    request.temperature = Some(0.2);
    inline_attachments(&mut request);
    request
}

fn config(provider: Provider, model: &str) -> ModelConfig {
    let mut config = ModelConfig::new(provider, model);
    config.thinking = Some(ThinkingLevel::Low);
    config.max_output_tokens = Some(4096);
    config
}

#[test]
fn gemini_body_for_a_tool_loop() {
    let body = gemini::build_request_body(&rich_request(), &config(Provider::Gemini, "gemini-2.5-flash"));
    insta::assert_json_snapshot!("gemini_tool_loop", body);
}

#[test]
fn openai_body_for_a_tool_loop() {
    let mut config = config(Provider::OpenAi, "gpt-test");
    config.base_url = Some("http://127.0.0.1:11434/v1".to_owned());
    let body = openai::build_request_body(&rich_request(), &config);
    insta::assert_json_snapshot!("openai_tool_loop", body);
}

#[test]
fn anthropic_body_for_a_tool_loop() {
    let body = anthropic::build_request_body(&rich_request(), &config(Provider::Anthropic, "claude-test"));
    insta::assert_json_snapshot!("anthropic_tool_loop", body);
}

fn structured_request() -> Request {
    Request {
        system: Some("Be brief.".to_owned()),
        turns: vec![Turn::user(vec![
            Part::text("Summarise the notes."),
            Part::Attachment(kesoku_llm::Attachment {
                filename: "notes.md".to_owned(),
                mime_type: "text/markdown".to_owned(),
                source: AttachmentSource::Inline(b"# Notes\n- one".to_vec()),
            }),
            Part::Attachment(kesoku_llm::Attachment {
                filename: "data.bin".to_owned(),
                mime_type: "application/octet-stream".to_owned(),
                source: AttachmentSource::Inline(vec![0, 1, 2]),
            }),
        ])],
        thinking: Some(ThinkingLevel::Off),
        output_schema: Some(json!({ "type": "object", "properties": { "summary": { "type": "string" } } })),
        ..Request::default()
    }
}

#[test]
fn bodies_for_structured_output_with_thinking_off() {
    let request = structured_request();
    let bodies = json!({
        "gemini": gemini::build_request_body(&request, &ModelConfig::new(Provider::Gemini, "gemini-3-flash-preview")),
        "openai": openai::build_request_body(&request, &ModelConfig::new(Provider::OpenAi, "gpt-4.1")),
        "anthropic": anthropic::build_request_body(&request, &ModelConfig::new(Provider::Anthropic, "claude-test")),
    });
    insta::assert_json_snapshot!("structured_output", bodies);
}

#[test]
fn gemini_3_takes_a_thinking_level_and_gemini_2_a_budget() {
    let request = Request { thinking: Some(ThinkingLevel::High), ..Request::user_text("hi") };
    let three = gemini::build_request_body(&request, &ModelConfig::new(Provider::Gemini, "gemini-3-pro-preview"));
    assert_eq!(
        three["generationConfig"]["thinkingConfig"],
        json!({ "includeThoughts": true, "thinkingLevel": "high" })
    );
    let two = gemini::build_request_body(&request, &ModelConfig::new(Provider::Gemini, "models/gemini-2.5-pro"));
    assert_eq!(two["generationConfig"]["thinkingConfig"], json!({ "includeThoughts": true, "thinkingBudget": 24576 }));
}

fn foreign_tool_loop() -> Request {
    // A call made by another provider: no signature at all.
    Request {
        turns: vec![
            Turn::user(vec![Part::text("weather?")]),
            Turn::model(vec![Part::ToolCall(ToolCall {
                id: "call_x".to_owned(),
                name: "weather".to_owned(),
                arguments: json!({ "city": "Oslo" }),
                signature: None,
            })]),
            Turn::user(vec![Part::ToolResult(kesoku_llm::ToolResult {
                call_id: "call_x".to_owned(),
                name: "weather".to_owned(),
                output: "snow".to_owned(),
                error: None,
            })]),
        ],
        thinking: Some(ThinkingLevel::Medium),
        ..Request::default()
    }
}

#[test]
fn gemini_gives_an_unsigned_call_of_the_current_turn_the_placeholder_signature() {
    let body =
        gemini::build_request_body(&foreign_tool_loop(), &ModelConfig::new(Provider::Gemini, "gemini-3-pro-preview"));
    assert_eq!(body["contents"][1]["parts"][0]["thoughtSignature"], json!("skip_thought_signature_validator"));
    assert_eq!(body["contents"][2]["role"], json!("user"));
    assert_eq!(body["contents"][2]["parts"][0]["functionResponse"]["response"], json!({ "output": "snow" }));
}

#[test]
fn anthropic_sends_no_thinking_when_the_tool_loop_began_without_it() {
    let body =
        anthropic::build_request_body(&foreign_tool_loop(), &ModelConfig::new(Provider::Anthropic, "claude-test"));
    assert_eq!(body.get("thinking"), None, "{body:#}");
    let mut with_thinking = foreign_tool_loop();
    with_thinking.turns[1].parts.insert(0, Part::thought("plan", Some("anthropic:sig".to_owned())));
    let body = anthropic::build_request_body(&with_thinking, &ModelConfig::new(Provider::Anthropic, "claude-test"));
    assert_eq!(body["thinking"], json!({ "type": "enabled", "budget_tokens": 8191 }), "{body:#}");
    assert_eq!(
        body["messages"][1]["content"][0],
        json!({ "type": "thinking", "thinking": "plan", "signature": "sig" })
    );
}

#[test]
fn openai_itself_gets_max_completion_tokens_and_other_servers_max_tokens() {
    let request = Request { max_output_tokens: Some(100), ..Request::user_text("hi") };
    let openai_body = openai::build_request_body(&request, &ModelConfig::new(Provider::OpenAi, "gpt-4.1"));
    assert_eq!(openai_body["max_completion_tokens"], json!(100));
    assert_eq!(openai_body.get("max_tokens"), None);
    let mut local = ModelConfig::new(Provider::OpenAi, "llama3.2");
    local.base_url = Some("http://localhost:11434/v1".to_owned());
    let local_body: Value = openai::build_request_body(&request, &local);
    assert_eq!(local_body["max_tokens"], json!(100));
    assert_eq!(local_body["stream_options"], json!({ "include_usage": true }));
}
