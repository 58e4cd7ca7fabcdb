//! The kesoku-llm `Model` adapter: request conversion, streaming through the trait, errors,
//! cancellation by dropping the stream, and the real model answering through the trait.

use crate::support::{TestResult, real_model, repeating, tiny};
use futures::StreamExt;
use kesoku_llm::{
    Attachment, AttachmentSource, FinishReason, LlmErrorKind, Model, Part, Provider, Request, StreamEvent, ToolCall,
    ToolDeclaration, ToolResult, Turn, collect_response,
};
use kesoku_local::testing::TinyModel;
use kesoku_local::{
    ChatMessage, ChatPrompt, LocalChatModel, LocalModel, LocalModelConfig, ToolCall as LocalCall, ToolSpec,
    request_to_prompt,
};
use serde_json::json;
use std::time::Duration;

#[test]
fn requests_become_chat_prompts() {
    let request = Request {
        system: Some("Be brief.".into()),
        turns: vec![
            Turn::user(vec![
                Part::text("Weather in Oslo?"),
                Part::Attachment(Attachment {
                    filename: "notes.txt".into(),
                    mime_type: "text/plain".into(),
                    source: AttachmentSource::Inline(b"bring a coat".to_vec()),
                }),
                Part::Attachment(Attachment {
                    filename: "map.png".into(),
                    mime_type: "image/png".into(),
                    source: AttachmentSource::Inline(vec![0x89, 0x50]),
                }),
            ]),
            Turn::model(vec![
                Part::thought("they want weather", None),
                Part::text("Checking."),
                Part::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "get_weather".into(),
                    arguments: json!({"city": "Oslo"}),
                    signature: None,
                }),
            ]),
            Turn::user(vec![
                Part::ToolResult(ToolResult {
                    call_id: "c1".into(),
                    name: "get_weather".into(),
                    output: "-3 C".into(),
                    error: None,
                }),
                Part::ToolResult(ToolResult {
                    call_id: "c2".into(),
                    name: "get_time".into(),
                    output: String::new(),
                    error: Some("no such tool".into()),
                }),
                Part::text("And tomorrow?"),
            ]),
        ],
        tools: vec![ToolDeclaration {
            name: "get_weather".into(),
            description: "Weather".into(),
            parameters: json!({"type": "object"}),
        }],
        max_output_tokens: None,
        temperature: None,
        thinking: None,
        output_schema: Some(json!({"type": "object"})),
    };
    let expected = ChatPrompt {
        messages: vec![
            ChatMessage::system(
                "Be brief.\n\nAnswer only with a JSON value that follows this JSON Schema:\n{\"type\":\"object\"}",
            ),
            ChatMessage::user(
                "Weather in Oslo?\n[attachment notes.txt]\nbring a coat\n[attachment map.png (image/png): not shown, this local model reads text only]",
            ),
            ChatMessage::assistant_calls(
                "Checking.",
                vec![LocalCall {
                    id: Some("c1".into()),
                    name: "get_weather".into(),
                    arguments: json!({"city": "Oslo"}),
                }],
            ),
            ChatMessage::tool_result("get_weather", Some("c1".into()), "-3 C"),
            ChatMessage::tool_result("get_time", Some("c2".into()), "error: no such tool"),
            ChatMessage::user("And tomorrow?"),
        ],
        tools: vec![ToolSpec {
            name: "get_weather".into(),
            description: "Weather".into(),
            parameters: json!({"type": "object"}),
        }],
    };
    assert_eq!(request_to_prompt(&request), expected);
}

#[tokio::test]
async fn the_trait_streams_text_usage_and_limits() -> TestResult {
    let (_dir, model) = tiny(repeating("a"))?;
    let chat = LocalChatModel::new("local", model, Provider::OpenAi);
    assert_eq!(chat.name(), "local");
    assert_eq!(chat.info().model, "tiny test model");
    let request = Request { max_output_tokens: Some(4), ..Request::user_text("hi") };
    let mut stream = chat.stream(&request).await?;
    let (mut deltas, mut response) = (String::new(), None);
    while let Some(event) = stream.next().await {
        match event? {
            StreamEvent::TextDelta(text) => deltas.push_str(&text),
            StreamEvent::Completed(done) => response = Some(done),
            StreamEvent::ThoughtDelta(_) | StreamEvent::ToolCall(_) => return Err("unexpected event".into()),
        }
    }
    let response = response.ok_or("no Completed event")?;
    assert_eq!(deltas, "aaaa");
    assert_eq!(response.text_content(), "aaaa");
    assert_eq!(response.finish_reason, FinishReason::MaxOutputTokens);
    assert_eq!(response.usage.output_tokens, 4);
    assert!(response.usage.input_tokens > 0);
    Ok(())
}

#[tokio::test]
async fn a_prompt_too_long_is_an_error_before_any_event() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.gguf");
    TinyModel::default().write(&path)?;
    let model = LocalModel::load(&LocalModelConfig { context_window: Some(8), ..LocalModelConfig::new(&path) })?;
    let chat = LocalChatModel::new("local", model, Provider::OpenAi);
    match chat.stream(&Request::user_text("this prompt is far too long for eight tokens")).await {
        Err(error) => {
            assert_eq!(error.kind(), LlmErrorKind::ContextTooLong);
            assert!(error.is_context_too_long() && !error.is_retryable());
            assert!(error.to_string().contains("model `local`"), "{error}");
        }
        Ok(_) => return Err("expected an error".into()),
    }
    Ok(())
}

#[tokio::test]
async fn dropping_the_response_stream_stops_generation() -> TestResult {
    let spec = TinyModel {
        layers: 8,
        embedding: 256,
        heads: 8,
        kv_heads: 4,
        feed_forward: 1024,
        context_length: 16_384,
        ..repeating("a")
    };
    let (_dir, model) = tiny(spec)?;
    let chat = LocalChatModel::new("local", model, Provider::OpenAi);
    let mut stream = chat.stream(&Request { max_output_tokens: Some(16_000), ..Request::user_text("go") }).await?;
    stream.next().await.transpose()?;
    drop(stream);
    let quick = Request { max_output_tokens: Some(2), ..Request::user_text("again") };
    let response = tokio::time::timeout(Duration::from_secs(10), chat.generate(&quick)).await??;
    assert_eq!(response.text_content(), "aa", "{response:?}");
    Ok(())
}

#[tokio::test]
async fn the_real_model_answers_through_the_trait() -> TestResult {
    let Some(model) = real_model().await else { return Ok(()) };
    let chat = LocalChatModel::new("smollm2", model, Provider::OpenAi);
    let request =
        Request { max_output_tokens: Some(48), temperature: Some(0.0), ..Request::user_text("What is 25 + 15?") };
    let mut stream = chat.stream(&request).await?;
    let response = collect_response(&mut stream).await?;
    println!("through the trait: {:?}", response.text_content());
    assert!(!response.text_content().trim().is_empty());
    assert!(response.usage.input_tokens > 0 && response.usage.output_tokens > 0);
    Ok(())
}
