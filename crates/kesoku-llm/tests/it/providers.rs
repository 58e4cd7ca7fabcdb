//! Each provider against its mock vendor server: plain, streamed, tool call round trip, thought
//! signatures, 429 with Retry-After, 500 then success, cancellation mid-stream, bad key. The
//! same suite runs for every vendor; request bodies are compared whole, as snapshots.

use std::time::{Duration, Instant};

use futures::StreamExt;
use kesoku_llm::{
    FinishReason, LlmErrorKind, Part, Request, StreamEvent, ToolDeclaration, ToolResult, Turn, collect_response,
};
use kesoku_test_support::mock_llm::{MockAnswer, MockPart, MockReply, MockServer, MockUsage, RecordedRequest, Vendor};
use serde_json::{Value, json};

use crate::support::{KEY_ENV, good_model, model_for, vendor_name};

fn tools() -> Vec<ToolDeclaration> {
    vec![ToolDeclaration {
        name: "get_weather".to_owned(),
        description: "Weather of a city.".to_owned(),
        parameters: json!({ "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] }),
    }]
}

fn only_request(server: &MockServer) -> RecordedRequest {
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "expected one request, got {requests:#?}");
    requests.into_iter().next().expect("one request")
}

fn assert_no_violations(server: &MockServer) {
    assert_eq!(server.violations(), Vec::<String>::new(), "the mock saw protocol violations");
}

/// The key went where the vendor wants it, and the path is the vendor's.
fn assert_wire_basics(vendor: Vendor, request: &RecordedRequest, streaming: bool) {
    match vendor {
        Vendor::Gemini => {
            assert_eq!(request.header("x-goog-api-key"), Some(kesoku_test_support::mock_llm::MOCK_API_KEY));
            let method = if streaming { "streamGenerateContent" } else { "generateContent" };
            assert_eq!(request.path, format!("/v1beta/models/gemini-2.5-flash:{method}"));
            assert_eq!(request.query.as_deref(), streaming.then_some("alt=sse"));
        }
        Vendor::OpenAi => {
            let expected = format!("Bearer {}", kesoku_test_support::mock_llm::MOCK_API_KEY);
            assert_eq!(request.header("authorization"), Some(expected.as_str()));
            assert_eq!(request.path, "/v1/chat/completions");
        }
        Vendor::Anthropic => {
            assert_eq!(request.header("x-api-key"), Some(kesoku_test_support::mock_llm::MOCK_API_KEY));
            assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
            assert_eq!(request.path, "/v1/messages");
        }
    }
}

pub async fn plain(vendor: Vendor) {
    let usage = MockUsage { input: 21, output: 5, thought: 3, cached: 4 };
    let server = MockServer::start(
        vendor,
        vec![MockReply::Answer(MockAnswer::text("Hello there, how can I help?").with_usage(usage))],
    )
    .await;
    let model = good_model(vendor, &server);
    let request = Request { system: Some("Be kind.".to_owned()), ..Request::user_text("hi") };
    let response = model.generate(&request).await.expect("answer");
    assert_eq!(response.text_content(), "Hello there, how can I help?");
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert_eq!(response.usage.input_tokens, 21);
    assert_eq!(response.usage.output_tokens, 8, "output includes thought tokens");
    assert_eq!(response.usage.thought_tokens, if vendor == Vendor::Anthropic { 0 } else { 3 });
    assert_eq!(response.usage.cached_tokens, 4);
    let recorded = only_request(&server);
    // Gemini's non-streaming call uses generateContent; the others stream underneath.
    assert_wire_basics(vendor, &recorded, vendor != Vendor::Gemini);
    insta::assert_json_snapshot!(format!("{}_plain", vendor_name(vendor)), recorded.body);
    assert_no_violations(&server);
}

pub async fn streamed(vendor: Vendor) {
    let answer = MockAnswer::parts(vec![
        MockPart::thought("Let me think about greetings.", None),
        MockPart::text("Hello there, friend of mine."),
    ]);
    let server = MockServer::start(vendor, vec![MockReply::Answer(answer)]).await;
    let model = good_model(vendor, &server);
    let mut stream = model.stream(&Request::user_text("hi")).await.expect("stream opens");
    let mut text = String::new();
    let mut thought = String::new();
    let mut text_deltas = 0;
    let mut completed = None;
    while let Some(event) = stream.next().await {
        match event.expect("no stream error") {
            StreamEvent::TextDelta(piece) => {
                text_deltas += 1;
                text.push_str(&piece);
            }
            StreamEvent::ThoughtDelta(piece) => thought.push_str(&piece),
            StreamEvent::ToolCall(call) => panic!("unexpected call {call:?}"),
            StreamEvent::Completed(response) => {
                assert!(completed.is_none(), "Completed came twice");
                completed = Some(response);
            }
        }
    }
    let response = completed.expect("Completed is the last event");
    assert_eq!(text, "Hello there, friend of mine.");
    assert!(text_deltas > 1, "text came in several deltas");
    assert_eq!(thought, "Let me think about greetings.");
    assert_eq!(response.text_content(), text);
    assert_eq!(response.thoughts(), vec![("Let me think about greetings.", None)]);
    let recorded = only_request(&server);
    assert_wire_basics(vendor, &recorded, true);
    insta::assert_json_snapshot!(format!("{}_streamed", vendor_name(vendor)), recorded.body);
    assert_no_violations(&server);
}

pub async fn tool_round_trip(vendor: Vendor) {
    let first = MockAnswer::parts(vec![
        MockPart::thought("I need the weather.", Some("sig-thought-1")),
        MockPart::signed_tool_call("call_1", "get_weather", json!({ "city": "Tokyo" }), "sig-call-1"),
        MockPart::tool_call("call_2", "get_weather", json!({ "city": "Paris" })),
    ]);
    let second = MockAnswer::text("Tokyo is sunny; Paris is rainy.");
    let server = MockServer::start(vendor, vec![MockReply::Answer(first), MockReply::Answer(second)]).await;
    let model = good_model(vendor, &server);
    let mut request = Request { tools: tools(), ..Request::user_text("Weather in Tokyo and Paris?") };

    let mut stream = model.stream(&request).await.expect("stream opens");
    let mut streamed_calls = Vec::new();
    let mut response = None;
    while let Some(event) = stream.next().await {
        match event.expect("no stream error") {
            StreamEvent::ToolCall(call) => streamed_calls.push(call),
            StreamEvent::Completed(done) => response = Some(done),
            StreamEvent::TextDelta(_) | StreamEvent::ThoughtDelta(_) => {}
        }
    }
    let response = response.expect("completed");
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    let calls = response.tool_calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(streamed_calls.iter().collect::<Vec<_>>(), calls, "streamed calls are the completed ones");
    assert_eq!((calls[0].id.as_str(), calls[0].name.as_str()), ("call_1", "get_weather"));
    assert_eq!(calls[0].arguments, json!({ "city": "Tokyo" }));
    assert_eq!(calls[1].arguments, json!({ "city": "Paris" }));

    // Send the model turn back with both results, as the agent does.
    request.turns.push(Turn::model(response.parts.clone()));
    request.turns.push(Turn::user(
        calls
            .iter()
            .map(|call| {
                Part::ToolResult(ToolResult {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    output: format!("{}: fine", call.arguments["city"].as_str().unwrap_or_default()),
                    error: None,
                })
            })
            .collect(),
    ));
    let final_answer = model.generate(&request).await.expect("second answer");
    assert_eq!(final_answer.text_content(), "Tokyo is sunny; Paris is rainy.");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    insta::assert_json_snapshot!(format!("{}_tool_round_trip", vendor_name(vendor)), requests[1].body);
    assert_no_violations(&server);
}

pub async fn thought_signatures(vendor: Vendor) {
    let answer = MockAnswer::parts(vec![
        MockPart::thought("Planning the answer.", Some("sig-thought")),
        MockPart::signed_text("Here is my answer.", "sig-text"),
    ]);
    let server = MockServer::start(vendor, vec![MockReply::Answer(answer), MockReply::text("ok")]).await;
    let model = good_model(vendor, &server);
    let mut request = Request::user_text("question");
    let response = model.generate(&request).await.expect("answer");
    let thoughts = response.thoughts();
    match vendor {
        Vendor::Gemini => {
            assert_eq!(thoughts, vec![("Planning the answer.", Some("gemini:sig-thought"))]);
            assert_eq!(response.text_signature(), Some("gemini:sig-text"));
        }
        Vendor::Anthropic => {
            assert_eq!(thoughts, vec![("Planning the answer.", Some("anthropic:sig-thought"))]);
            assert_eq!(response.text_signature(), None);
        }
        Vendor::OpenAi => {
            assert_eq!(thoughts, vec![("Planning the answer.", None)], "reasoning_content is read, unsigned");
            assert_eq!(response.text_signature(), None);
        }
    }
    assert_eq!(response.text_content(), "Here is my answer.");

    request.turns.push(Turn::model(response.parts.clone()));
    request.turns.push(Turn::user(vec![Part::text("and then?")]));
    model.generate(&request).await.expect("second answer");
    let body = &server.requests()[1].body;
    match vendor {
        Vendor::Gemini => {
            assert_eq!(
                body["contents"][1]["parts"],
                json!([
                    { "text": "Planning the answer.", "thought": true, "thoughtSignature": "sig-thought" },
                    { "text": "Here is my answer.", "thoughtSignature": "sig-text" }
                ])
            );
        }
        Vendor::Anthropic => {
            assert_eq!(
                body["messages"][1]["content"],
                json!([
                    { "type": "thinking", "thinking": "Planning the answer.", "signature": "sig-thought" },
                    { "type": "text", "text": "Here is my answer." }
                ])
            );
        }
        Vendor::OpenAi => {
            assert_eq!(body["messages"][1], json!({ "role": "assistant", "content": "Here is my answer." }));
        }
    }
    assert_no_violations(&server);
}

pub async fn rate_limited_with_retry_after(vendor: Vendor) {
    let server = MockServer::start(vendor, vec![MockReply::rate_limited("1"), MockReply::text("after the wait")]).await;
    let model = good_model(vendor, &server);
    let started = Instant::now();
    let response = model.generate(&Request::user_text("hi")).await.expect("succeeds on the retry");
    let elapsed = started.elapsed();
    assert_eq!(response.text_content(), "after the wait");
    assert_eq!(server.requests().len(), 2);
    assert!(elapsed >= Duration::from_millis(950), "Retry-After: 1 was honoured, waited {elapsed:?}");
    assert_eq!(server.requests()[0].body, server.requests()[1].body, "the retry sends the same body");

    // A Retry-After beyond the policy's longest delay is not waited for: the caller decides.
    let server = MockServer::start(vendor, vec![MockReply::rate_limited("120")]).await;
    let model = good_model(vendor, &server);
    let error = model.generate(&Request::user_text("hi")).await.expect_err("gives up");
    assert!(error.is_quota() && error.is_retryable(), "{error}");
    assert_eq!(error.retry_after(), Some(Duration::from_secs(120)));
    assert_eq!(error.status(), Some(429));
    assert_eq!(server.requests().len(), 1);
}

pub async fn server_error_then_success(vendor: Vendor) {
    let server =
        MockServer::start(vendor, vec![MockReply::error(500, "internal error"), MockReply::text("recovered")]).await;
    let model = good_model(vendor, &server);
    let response = model.generate(&Request::user_text("hi")).await.expect("second attempt works");
    assert_eq!(response.text_content(), "recovered");
    assert_eq!(server.requests().len(), 2);

    let server = MockServer::start(
        vendor,
        vec![
            MockReply::error(503, "overloaded"),
            MockReply::error(503, "overloaded"),
            MockReply::error(503, "overloaded"),
        ],
    )
    .await;
    let model = good_model(vendor, &server);
    let error = model.generate(&Request::user_text("hi")).await.expect_err("attempts spent");
    assert_eq!(error.kind(), LlmErrorKind::Overloaded);
    assert!(error.should_try_fallback());
    assert_eq!(server.requests().len(), 3, "max_attempts = 3");
}

pub async fn cancellation_mid_stream(vendor: Vendor) {
    let answer = MockAnswer::text("one two three four five six seven eight nine");
    // The first events (and, for some vendors, a preamble), then the server hangs.
    let events = match vendor {
        Vendor::Gemini => 1,
        Vendor::OpenAi => 2,
        Vendor::Anthropic => 4,
    };
    let server = MockServer::start(vendor, vec![MockReply::HangAfter { answer, events }]).await;
    let model = good_model(vendor, &server);
    let mut stream = model.stream(&Request::user_text("count")).await.expect("stream opens");
    let first = stream.next().await.expect("an event").expect("not an error");
    assert!(matches!(first, StreamEvent::TextDelta(_)), "{first:?}");
    assert_eq!(server.disconnects(), 0);
    drop(stream);
    assert!(server.wait_for_disconnects(1, Duration::from_secs(5)).await, "the mock server saw the connection close");
}

pub async fn cancellation_before_the_first_byte(vendor: Vendor) {
    let slow = MockReply::Delayed { delay: Duration::from_secs(30), reply: Box::new(MockReply::text("too late")) };
    let server = MockServer::start(vendor, vec![slow]).await;
    let model = good_model(vendor, &server);
    let request = Request::user_text("hi");
    let waited = tokio::time::timeout(Duration::from_millis(300), model.stream(&request)).await;
    assert!(waited.is_err(), "still waiting for the answer");
    assert!(server.wait_for_disconnects(1, Duration::from_secs(5)).await, "dropping the future closed the connection");
}

pub async fn bad_key(vendor: Vendor) {
    let server = MockServer::start(vendor, vec![MockReply::text("never")]).await;
    let secret = "sk-wrong-key-9876543210";
    let model = model_for(vendor, &server, secret);
    let error = model.generate(&Request::user_text("hi")).await.expect_err("rejected");
    assert!(error.is_auth(), "{error:?}");
    assert!(!error.is_retryable());
    let text = error.to_string();
    assert!(text.contains(KEY_ENV), "names the variable: {text}");
    assert!(!text.contains(secret) && !text.contains("9876543210"), "never the key: {text}");
    assert!(!format!("{error:?}").contains(secret));
    assert!(!format!("{error:?}").contains("543210"));
    assert_eq!(server.requests().len(), 1, "auth errors are not retried");
}

/// The answer broke off after output was handed out: an error item, and no retry.
pub async fn broken_stream_is_not_retried(vendor: Vendor) {
    let answer = MockAnswer::text("one two three four five six");
    let events = match vendor {
        Vendor::Gemini => 2,
        Vendor::OpenAi => 3,
        Vendor::Anthropic => 5,
    };
    let server =
        MockServer::start(vendor, vec![MockReply::BreakAfter { answer, events }, MockReply::text("retried")]).await;
    let model = good_model(vendor, &server);
    let mut stream = model.stream(&Request::user_text("count")).await.expect("opens");
    let mut texts = Vec::new();
    let mut failure = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(StreamEvent::TextDelta(piece)) => texts.push(piece),
            Ok(StreamEvent::Completed(_)) => panic!("a broken stream cannot complete"),
            Ok(_) => {}
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    assert!(!texts.is_empty(), "some text was handed out first");
    let failure = failure.expect("the break is reported");
    assert!(failure.is_retryable(), "a network error: {failure}");
    assert_eq!(server.requests().len(), 1, "not retried behind the caller's back");
}

/// A server answering with the wrong wire shape is a protocol error, not a panic.
pub async fn garbage_is_a_protocol_error(vendor: Vendor) {
    let server = MockServer::start(
        vendor,
        vec![MockReply::Raw {
            status: 200,
            headers: vec![("content-type".to_owned(), "text/event-stream".to_owned())],
            body: "data: {not json\n\n".to_owned(),
        }],
    )
    .await;
    let model = good_model(vendor, &server);
    let error = model.stream(&Request::user_text("hi")).await.err().expect("fails before any event");
    assert_eq!(error.kind(), LlmErrorKind::Protocol, "{error}");
    assert_eq!(server.requests().len(), 1, "protocol errors are not retried");
}

/// `check` reports usage and latency.
pub async fn check_reports(vendor: Vendor) {
    let usage = MockUsage { input: 9, output: 1, thought: 0, cached: 0 };
    let server = MockServer::start(vendor, vec![MockReply::Answer(MockAnswer::text("ok").with_usage(usage))]).await;
    let model = good_model(vendor, &server);
    let report = kesoku_llm::check(model.as_ref()).await.expect("check passes");
    assert_eq!(report.reply, "ok");
    assert_eq!(report.usage.input_tokens, 9);
    assert_eq!(report.name, "mock");
    assert!(report.first_event_latency <= report.total_latency);
    let body: Value = only_request(&server).body;
    assert!(body.to_string().contains(kesoku_llm::check::CHECK_PROMPT));
}

/// `generate` on a stream assembles the same answer (used by `Model::generate`'s default).
pub async fn collect_matches_generate(vendor: Vendor) {
    let server = MockServer::start(vendor, vec![MockReply::text("same answer"), MockReply::text("same answer")]).await;
    let model = good_model(vendor, &server);
    let mut stream = model.stream(&Request::user_text("hi")).await.expect("opens");
    let streamed = collect_response(&mut stream).await.expect("collects");
    let generated = model.generate(&Request::user_text("hi")).await.expect("generates");
    assert_eq!(streamed.parts, generated.parts);
    assert_eq!(streamed.finish_reason, generated.finish_reason);
}

macro_rules! provider_suite {
    ($module:ident, $vendor:expr) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn plain_answer() {
                plain($vendor).await;
            }

            #[tokio::test]
            async fn streamed_answer() {
                streamed($vendor).await;
            }

            #[tokio::test]
            async fn tool_call_round_trip() {
                tool_round_trip($vendor).await;
            }

            #[tokio::test]
            async fn thought_signatures_go_back() {
                thought_signatures($vendor).await;
            }

            #[tokio::test]
            async fn rate_limit_honours_retry_after() {
                rate_limited_with_retry_after($vendor).await;
            }

            #[tokio::test]
            async fn server_error_is_retried() {
                server_error_then_success($vendor).await;
            }

            #[tokio::test]
            async fn dropping_the_stream_closes_the_connection() {
                cancellation_mid_stream($vendor).await;
            }

            #[tokio::test]
            async fn dropping_the_request_before_the_answer_closes_the_connection() {
                cancellation_before_the_first_byte($vendor).await;
            }

            #[tokio::test]
            async fn bad_key_is_an_auth_error_naming_the_variable() {
                bad_key($vendor).await;
            }

            #[tokio::test]
            async fn a_stream_broken_after_output_is_not_retried() {
                broken_stream_is_not_retried($vendor).await;
            }

            #[tokio::test]
            async fn garbage_answer_is_a_protocol_error() {
                garbage_is_a_protocol_error($vendor).await;
            }

            #[tokio::test]
            async fn check_reports_usage_and_latency() {
                check_reports($vendor).await;
            }

            #[tokio::test]
            async fn streaming_and_generate_agree() {
                collect_matches_generate($vendor).await;
            }
        }
    };
}

provider_suite!(gemini, Vendor::Gemini);
provider_suite!(openai, Vendor::OpenAi);
provider_suite!(anthropic, Vendor::Anthropic);
