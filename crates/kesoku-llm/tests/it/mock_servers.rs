//! The mock vendor servers themselves: they enforce the vendors' protocol rules, replay raw
//! documented payloads, and serve fixed or slow answers for benchmarks.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kesoku_llm::{Attachment, AttachmentSource, FinishReason, LlmErrorKind, Part, Request, Secret, Turn};
use kesoku_test_support::mock_llm::{
    Behaviour, MOCK_API_KEY, MockAnswer, MockFinish, MockOptions, MockPart, MockReply, MockRule, MockServer, RawEvent,
    Vendor, openai,
};
use serde_json::{Value, json};

use crate::support::{config_for, good_model};

async fn post(server: &MockServer, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    let mut request = client.post(format!("http://{}{path}", server.addr())).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("mock answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn gemini_rejects_a_tool_role_and_unanswered_calls() {
    let server = MockServer::start(Vendor::Gemini, vec![]).await;
    let path = "/v1beta/models/gemini-2.5-flash:generateContent";
    let headers = [("x-goog-api-key", MOCK_API_KEY)];
    let body = json!({ "contents": [
        { "role": "user", "parts": [ { "text": "hi" } ] },
        { "role": "model", "parts": [ { "functionCall": { "name": "f", "args": {} } } ] },
        { "role": "tool", "parts": [ { "functionResponse": { "name": "f", "response": { "output": "x" } } } ] }
    ] });
    let (status, answer) = post(&server, path, &headers, body).await;
    assert_eq!(status, 400);
    assert_eq!(answer["error"]["status"], "INVALID_ARGUMENT");
    let violations = server.violations().join("\n");
    assert!(violations.contains("role `tool`"), "{violations}");
    assert!(violations.contains("functionResponse outside a user turn"), "{violations}");

    let server = MockServer::start(Vendor::Gemini, vec![]).await;
    let body = json!({ "contents": [
        { "role": "user", "parts": [ { "text": "hi" } ] },
        { "role": "model", "parts": [ { "functionCall": { "name": "f", "args": {} } }, { "functionCall": { "name": "g", "args": {} } } ] },
        { "role": "user", "parts": [ { "functionResponse": { "name": "f", "response": { "output": "x" } } } ] }
    ] });
    let (status, _) = post(&server, path, &headers, body).await;
    assert_eq!(status, 400);
    assert!(server.violations().join("\n").contains("answers 1 of the 2 function calls"), "{:?}", server.violations());
}

#[tokio::test]
async fn openai_rejects_a_tool_message_without_its_call() {
    let server = MockServer::start(Vendor::OpenAi, vec![]).await;
    let body = json!({ "model": "m", "messages": [
        { "role": "user", "content": "hi" },
        { "role": "tool", "tool_call_id": "call_9", "content": "orphan" }
    ] });
    let bearer = format!("Bearer {MOCK_API_KEY}");
    let (status, answer) = post(&server, "/v1/chat/completions", &[("authorization", bearer.as_str())], body).await;
    assert_eq!(status, 400);
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    assert!(server.violations().join("\n").contains("call_9"), "{:?}", server.violations());
}

#[tokio::test]
async fn anthropic_requires_alternation_and_answered_tool_uses() {
    let server = MockServer::start(Vendor::Anthropic, vec![]).await;
    let body = json!({ "model": "claude", "max_tokens": 100, "messages": [
        { "role": "user", "content": "hi" },
        { "role": "user", "content": "again" },
        { "role": "assistant", "content": [ { "type": "tool_use", "id": "t1", "name": "f", "input": {} } ] },
        { "role": "user", "content": [ { "type": "text", "text": "no result" } ] }
    ] });
    let headers = [("x-api-key", MOCK_API_KEY), ("anthropic-version", "2023-06-01")];
    let (status, answer) = post(&server, "/v1/messages", &headers, body).await;
    assert_eq!(status, 400);
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    let violations = server.violations().join("\n");
    assert!(violations.contains("alternate"), "{violations}");
    assert!(violations.contains("without `tool_result`"), "{violations}");
}

#[tokio::test]
async fn a_documented_gemini_prompt_block_is_a_blocked_answer() {
    let blocked = RawEvent {
        event: None,
        data: r#"{"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8}, "modelVersion": "gemini-2.5-flash"}"#.to_owned(),
    };
    let server = MockServer::start(Vendor::Gemini, vec![MockReply::RawEvents(vec![blocked])]).await;
    let model = good_model(Vendor::Gemini, &server);
    let mut stream = model.stream(&Request::user_text("something bad")).await.expect("a response");
    let response = kesoku_llm::collect_response(&mut stream).await.expect("completes");
    assert_eq!(response.finish_reason, FinishReason::Blocked);
    assert_eq!(response.finish_detail.as_deref(), Some("prompt blocked: SAFETY"));
    assert!(response.parts.is_empty());
    assert_eq!(response.usage.input_tokens, 8);
}

#[tokio::test]
async fn safety_and_length_finishes_are_reported() {
    for vendor in [Vendor::Gemini, Vendor::OpenAi, Vendor::Anthropic] {
        let server = MockServer::start(
            vendor,
            vec![
                MockReply::Answer(MockAnswer::text("partial").with_finish(MockFinish::Blocked)),
                MockReply::Answer(MockAnswer::text("cut off").with_finish(MockFinish::MaxTokens)),
            ],
        )
        .await;
        let model = good_model(vendor, &server);
        assert_eq!(
            model.generate(&Request::user_text("a")).await.expect("answer").finish_reason,
            FinishReason::Blocked
        );
        assert_eq!(
            model.generate(&Request::user_text("b")).await.expect("answer").finish_reason,
            FinishReason::MaxOutputTokens
        );
    }
}

#[tokio::test]
async fn an_anthropic_overload_event_before_any_content_is_retried() {
    let overloaded = vec![
        RawEvent {
            event: Some("message_start".to_owned()),
            data: r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-test","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}"#.to_owned(),
        },
        RawEvent { event: Some("ping".to_owned()), data: r#"{"type": "ping"}"#.to_owned() },
        RawEvent {
            event: Some("error".to_owned()),
            data: r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#.to_owned(),
        },
    ];
    let server =
        MockServer::start(Vendor::Anthropic, vec![MockReply::RawEvents(overloaded), MockReply::text("second try")])
            .await;
    let model = good_model(Vendor::Anthropic, &server);
    let response = model.generate(&Request::user_text("hi")).await.expect("retried");
    assert_eq!(response.text_content(), "second try");
    assert_eq!(server.requests().len(), 2);

    let always = |_| {
        MockReply::RawEvents(vec![RawEvent {
            event: Some("error".to_owned()),
            data: r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#.to_owned(),
        }])
    };
    let server = MockServer::start(Vendor::Anthropic, (0..3).map(always).collect()).await;
    let error = good_model(Vendor::Anthropic, &server).generate(&Request::user_text("hi")).await.expect_err("gives up");
    assert_eq!(error.kind(), LlmErrorKind::Overloaded);
    assert_eq!(error.status(), Some(529));
}

#[tokio::test]
async fn ollama_style_reasoning_field_is_read() {
    let chunks = [
        r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"Thinking..."},"finish_reason":null}]}"#,
        r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{"content":"Hi!"},"finish_reason":null}]}"#,
        r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}"#,
        "[DONE]",
    ];
    let events = chunks.iter().map(|data| RawEvent { event: None, data: (*data).to_owned() }).collect();
    let server = MockServer::start(Vendor::OpenAi, vec![MockReply::RawEvents(events)]).await;
    let response = good_model(Vendor::OpenAi, &server).generate(&Request::user_text("hi")).await.expect("answer");
    assert_eq!(response.thoughts(), vec![("Thinking...", None)]);
    assert_eq!(response.text_content(), "Hi!");
    assert_eq!(response.usage.total_tokens(), 9);
    assert_eq!(response.model_version.as_deref(), Some("qwen3"));
}

async fn free_address() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("address")
}

async fn wait_until_listening(address: SocketAddr) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(address).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the mock server did not start on {address}");
}

#[tokio::test]
async fn the_standalone_openai_server_answers_every_request_with_a_fixed_text() {
    let address = free_address().await;
    let server = tokio::spawn(openai::serve(address, Behaviour::FixedText("pong".to_owned())));
    wait_until_listening(address).await;
    let mut config = config_for(Vendor::OpenAi, &format!("http://{address}/v1"));
    config.api_key_env = None;
    let model = kesoku_llm::build_model("bench", &config, Some(Secret::new("anything"))).expect("builds");
    for _ in 0..3 {
        assert_eq!(model.generate(&Request::user_text("ping")).await.expect("answers").text_content(), "pong");
    }
    server.abort();
}

#[tokio::test]
async fn the_latency_mode_waits_before_the_first_byte() {
    let address = free_address().await;
    let behaviour = Behaviour::Latency {
        text: "slow and steady".to_owned(),
        first_byte: Duration::from_millis(300),
        between_chunks: Duration::from_millis(20),
    };
    let server = tokio::spawn(openai::serve(address, behaviour));
    wait_until_listening(address).await;
    let model = kesoku_llm::build_model("bench", &config_for(Vendor::OpenAi, &format!("http://{address}/v1")), None)
        .expect("builds without a key");
    let started = Instant::now();
    let report = kesoku_llm::check(model.as_ref()).await.expect("answers");
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
    assert!(report.first_event_latency >= Duration::from_millis(300));
    assert_eq!(report.reply, "slow and steady");
    server.abort();
}

#[tokio::test]
async fn file_attachments_are_read_when_the_request_is_sent() {
    let directory = tempfile::tempdir().expect("temp dir");
    let path = directory.path().join("scan.pdf");
    std::fs::write(&path, b"%PDF-1.4").expect("write");
    let attachment = |path| {
        Part::Attachment(Attachment {
            filename: "scan.pdf".to_owned(),
            mime_type: "application/pdf".to_owned(),
            source: AttachmentSource::File(path),
        })
    };
    let request =
        Request { turns: vec![Turn::user(vec![Part::text("read it"), attachment(path)])], ..Request::default() };
    let server = MockServer::start(Vendor::Anthropic, vec![MockReply::text("read")]).await;
    let model = good_model(Vendor::Anthropic, &server);
    model.generate(&request).await.expect("answer");
    let body = &server.requests()[0].body;
    assert_eq!(
        body["messages"][0]["content"][1],
        json!({ "type": "document", "source": { "type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ=" } })
    );

    let missing =
        Request { turns: vec![Turn::user(vec![attachment(directory.path().join("gone.pdf"))])], ..Request::default() };
    let error = model.generate(&missing).await.expect_err("missing file");
    assert_eq!(error.kind(), LlmErrorKind::Attachment);
    assert!(error.to_string().contains("scan.pdf"), "{error}");
    assert_eq!(server.requests().len(), 1, "nothing sent for the broken request");
}

#[tokio::test]
async fn rules_answer_each_turn_by_what_its_user_said_and_how_far_it_got() {
    let rules = vec![
        MockRule::new(
            "weather",
            vec![
                MockReply::Answer(MockAnswer::parts(vec![MockPart::tool_call("", "search", json!({ "q": "tokyo" }))])),
                MockReply::text("sunny"),
            ],
        ),
        MockRule::new("disk", vec![MockReply::text("plenty of room")]),
    ];
    let options = MockOptions { behaviour: Behaviour::Rules(rules), ..MockOptions::script(vec![]) };
    let server = MockServer::start_with(Vendor::Gemini, options).await;
    let path = "/v1beta/models/gemini-2.5-flash:generateContent";
    let headers = [("x-goog-api-key", MOCK_API_KEY)];
    let text_of = |answer: &Value| answer["candidates"][0]["content"]["parts"][0].clone();

    // The disk question comes after a finished weather turn: the latest user text decides.
    let (status, answer) = post(
        &server,
        path,
        &headers,
        json!({ "contents": [
        { "role": "user", "parts": [ { "text": "weather in Tokyo?" } ] },
        { "role": "model", "parts": [ { "text": "sunny" } ] },
        { "role": "user", "parts": [ { "text": "how is the disk?" } ] }
    ] }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(text_of(&answer)["text"], "plenty of room");

    // Consecutive user messages merged into one turn: what the user said last decides.
    let (_, answer) = post(
        &server,
        path,
        &headers,
        json!({ "contents": [
        { "role": "user", "parts": [ { "text": "how is the disk?" }, { "text": "no, the weather!" } ] }
    ] }),
    )
    .await;
    assert_eq!(text_of(&answer)["functionCall"]["name"], "search");

    // A weather turn: the tool call first, then (the function response is not user text) the answer.
    let (_, answer) = post(
        &server,
        path,
        &headers,
        json!({ "contents": [ { "role": "user", "parts": [ { "text": "weather?" } ] } ] }),
    )
    .await;
    assert_eq!(text_of(&answer)["functionCall"]["name"], "search");
    let (_, answer) = post(
        &server,
        path,
        &headers,
        json!({ "contents": [
        { "role": "user", "parts": [ { "text": "weather?" } ] },
        { "role": "model", "parts": [ { "functionCall": { "name": "search", "args": { "q": "tokyo" } } } ] },
        { "role": "user", "parts": [ { "functionResponse": { "name": "search", "response": { "output": "18 C" } } } ] }
    ] }),
    )
    .await;
    assert_eq!(text_of(&answer)["text"], "sunny");
    assert!(server.violations().is_empty(), "{:?}", server.violations());

    // Nothing matches: a 500 and a violation that says what was asked.
    let (status, _) =
        post(&server, path, &headers, json!({ "contents": [ { "role": "user", "parts": [ { "text": "hello" } ] } ] }))
            .await;
    assert_eq!(status, 500);
    assert!(
        server.violations().join("\n").contains("no rule matches the user text `hello`"),
        "{:?}",
        server.violations()
    );
}
