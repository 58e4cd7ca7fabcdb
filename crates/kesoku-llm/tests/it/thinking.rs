//! Thoughts show by default: each provider asks thinking models for their thoughts when the
//! config sets no `thinking` level, without changing how hard they think, and `thinking = "off"`
//! turns them off. Checked against the mock vendor servers on whole request bodies.

use kesoku_llm::{ModelConfig, Request, Secret, ThinkingLevel};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockPart, MockReply, MockServer, Vendor};
use serde_json::{Value, json};

use crate::support::config_for;

fn thinking_answer() -> MockReply {
    MockReply::Answer(MockAnswer::parts(vec![
        MockPart::thought("The user greets me.", Some("sig-1")),
        MockPart::text("Hello!"),
    ]))
}

/// One request (`hi`) to `model` of `vendor` with `thinking`; the thoughts of the answer and
/// the whole body the server received.
async fn ask(vendor: Vendor, model: &str, thinking: Option<ThinkingLevel>) -> (Vec<String>, Value) {
    let server = MockServer::start(vendor, vec![thinking_answer()]).await;
    let config = ModelConfig { model: model.to_owned(), thinking, ..config_for(vendor, &server.base_url()) };
    let built = kesoku_llm::build_model("mock", &config, Some(Secret::new(MOCK_API_KEY))).expect("model builds");
    let response = built.generate(&Request::user_text("hi")).await.expect("an answer");
    assert!(server.violations().is_empty(), "{:?}", server.violations());
    assert_eq!(response.text_content(), "Hello!");
    let thoughts = response.thoughts().into_iter().map(|(text, _)| text.to_owned()).collect();
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    (thoughts, requests[0].body.clone())
}

fn gemini_body(generation: Value) -> Value {
    json!({
        "contents": [ { "role": "user", "parts": [ { "text": "hi" } ] } ],
        "generationConfig": generation
    })
}

#[tokio::test]
async fn gemini_thinking_models_show_their_thoughts_by_default() {
    for model in ["gemini-2.5-flash", "gemini-3-pro-preview", "gemini-flash-latest"] {
        let (thoughts, body) = ask(Vendor::Gemini, model, None).await;
        // The summaries are asked for; the model's own budget or level is not touched.
        assert_eq!(
            body,
            gemini_body(json!({ "maxOutputTokens": 4096, "thinkingConfig": { "includeThoughts": true } })),
            "{model}"
        );
        assert_eq!(thoughts, vec!["The user greets me."], "{model}");
    }
}

#[tokio::test]
async fn gemini_thinking_off_shows_no_thoughts() {
    let (thoughts, body) = ask(Vendor::Gemini, "gemini-2.5-flash", Some(ThinkingLevel::Off)).await;
    assert_eq!(body, gemini_body(json!({ "maxOutputTokens": 4096, "thinkingConfig": { "thinkingBudget": 0 } })));
    assert!(thoughts.is_empty(), "{thoughts:?}");
    // 2.5 Pro and Gemini 3 cannot stop thinking (a budget of 0 is refused): no summaries asked.
    for model in ["gemini-2.5-pro", "gemini-3-pro-preview"] {
        let (thoughts, body) = ask(Vendor::Gemini, model, Some(ThinkingLevel::Off)).await;
        assert_eq!(body, gemini_body(json!({ "maxOutputTokens": 4096 })), "{model}");
        assert!(thoughts.is_empty(), "{model}: {thoughts:?}");
    }
}

#[tokio::test]
async fn gemini_models_that_cannot_think_get_no_thinking_config() {
    for model in ["gemini-2.0-flash", "gemini-1.5-pro", "gemma-3-27b-it"] {
        let (_, body) = ask(Vendor::Gemini, model, None).await;
        assert_eq!(body, gemini_body(json!({ "maxOutputTokens": 4096 })), "{model}");
    }
}

fn anthropic_body(model: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": 4096,
        "messages": [ { "role": "user", "content": [ { "type": "text", "text": "hi" } ] } ],
        "stream": true
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

#[tokio::test]
async fn claude_thinking_models_are_asked_for_thoughts_by_default() {
    // Claude 3.7 Sonnet to 4.5: extended thinking at the smallest budget Anthropic accepts.
    for model in
        ["claude-sonnet-4-5-20250929", "claude-opus-4-20250514", "claude-haiku-4-5", "claude-3-7-sonnet-latest"]
    {
        let (thoughts, body) = ask(Vendor::Anthropic, model, None).await;
        let thinking = json!({ "thinking": { "type": "enabled", "budget_tokens": 1024 } });
        assert_eq!(body, anthropic_body(model, thinking), "{model}");
        assert_eq!(thoughts, vec!["The user greets me."], "{model}");
    }
    // Claude 4.6 and later: adaptive thinking at the model's own effort, summaries shown (Opus
    // 4.7 and later omit them unless asked).
    for model in ["claude-opus-4-7", "claude-sonnet-4-6", "claude-opus-5"] {
        let (_, body) = ask(Vendor::Anthropic, model, None).await;
        let thinking = json!({ "thinking": { "type": "adaptive", "display": "summarized" } });
        assert_eq!(body, anthropic_body(model, thinking), "{model}");
    }
}

#[tokio::test]
async fn claude_levels_off_and_models_that_cannot_think() {
    let (_, body) = ask(Vendor::Anthropic, "claude-opus-4-7", Some(ThinkingLevel::Medium)).await;
    let adaptive = json!({
        "thinking": { "type": "adaptive", "display": "summarized" },
        "output_config": { "effort": "medium" }
    });
    assert_eq!(body, anthropic_body("claude-opus-4-7", adaptive));
    let (_, body) = ask(Vendor::Anthropic, "claude-sonnet-4-5", Some(ThinkingLevel::Medium)).await;
    let budget = json!({ "thinking": { "type": "enabled", "budget_tokens": 4095 } });
    assert_eq!(body, anthropic_body("claude-sonnet-4-5", budget), "8192 tokens lowered below max_tokens");
    for model in ["claude-sonnet-4-5", "claude-opus-4-7"] {
        let (_, body) = ask(Vendor::Anthropic, model, Some(ThinkingLevel::Off)).await;
        assert_eq!(body, anthropic_body(model, json!({})), "{model}");
    }
    for model in ["claude-3-5-haiku-latest", "claude-test"] {
        let (_, body) = ask(Vendor::Anthropic, model, None).await;
        assert_eq!(body, anthropic_body(model, json!({})), "{model}");
    }
}

#[tokio::test]
async fn openai_style_reasoning_is_a_thought_unless_thinking_is_off() {
    let body = json!({
        "model": "gpt-test",
        "messages": [ { "role": "user", "content": "hi" } ],
        "stream": true,
        "stream_options": { "include_usage": true },
        "max_tokens": 4096
    });
    let (thoughts, sent) = ask(Vendor::OpenAi, "gpt-test", None).await;
    assert_eq!(sent, body);
    assert_eq!(thoughts, vec!["The user greets me."], "reasoning_content is read as a thought");
    let (thoughts, sent) = ask(Vendor::OpenAi, "gpt-test", Some(ThinkingLevel::Off)).await;
    assert_eq!(sent, body, "nothing asks such a server to stop reasoning");
    assert!(thoughts.is_empty(), "{thoughts:?}");
}
