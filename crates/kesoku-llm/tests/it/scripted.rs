//! The scripted model: answers, errors, delays and hangs, on paused time.

use std::time::Duration;

use futures::StreamExt;
use kesoku_llm::{
    LlmError, LlmErrorKind, Model, Part, Request, Response, ScriptStep, ScriptedModel, StreamEvent, ToolCall,
};
use serde_json::json;

#[tokio::test(start_paused = true)]
async fn answers_in_order_and_records_every_request() {
    let model = ScriptedModel::new(
        "scripted",
        vec![
            ScriptStep::parts(vec![
                Part::thought("hmm", Some("sig".to_owned())),
                Part::text("Let me check."),
                Part::ToolCall(ToolCall {
                    id: "c1".to_owned(),
                    name: "search".to_owned(),
                    arguments: json!({ "q": "x" }),
                    signature: None,
                }),
            ]),
            ScriptStep::text("done"),
        ],
    );
    let mut stream = model.stream(&Request::user_text("first")).await.expect("step 1");
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event.expect("no error"));
    }
    assert_eq!(events[0], StreamEvent::ThoughtDelta("hmm".to_owned()));
    assert_eq!(events[1], StreamEvent::TextDelta("Let me check.".to_owned()));
    assert!(matches!(&events[2], StreamEvent::ToolCall(call) if call.id == "c1"));
    let StreamEvent::Completed(response) = &events[3] else { panic!("Completed last: {events:?}") };
    assert_eq!(response.tool_calls().len(), 1);
    assert_eq!(model.generate(&Request::user_text("second")).await.expect("step 2").text_content(), "done");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1], Request::user_text("second"));
    assert_eq!(model.remaining(), 0);
    let error = model.generate(&Request::user_text("third")).await.expect_err("script exhausted");
    assert_eq!(error.kind(), LlmErrorKind::Scripted);
    assert!(error.to_string().contains("request #3"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn scripts_errors_before_and_after_output() {
    let model = ScriptedModel::new(
        "scripted",
        vec![
            ScriptStep::Fail(LlmError::new(LlmErrorKind::RateLimited, "quota")),
            ScriptStep::Stream(vec![
                Ok(StreamEvent::TextDelta("partial".to_owned())),
                Err(LlmError::new(LlmErrorKind::Network, "connection reset")),
            ]),
        ],
    );
    let error = model.stream(&Request::user_text("a")).await.err().expect("fails up front");
    assert!(error.is_quota());
    let mut stream = model.stream(&Request::user_text("b")).await.expect("opens");
    assert_eq!(stream.next().await.expect("item").expect("ok"), StreamEvent::TextDelta("partial".to_owned()));
    assert_eq!(stream.next().await.expect("item").expect_err("then the error").kind(), LlmErrorKind::Network);
}

#[tokio::test(start_paused = true)]
async fn delays_use_tokio_time() {
    let model = ScriptedModel::new("scripted", vec![ScriptStep::text("slow").delayed(Duration::from_secs(30))]);
    let started = tokio::time::Instant::now();
    let response = model.generate(&Request::user_text("hi")).await.expect("answers");
    assert_eq!(response, Response::text("slow"));
    assert!(started.elapsed() >= Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_stream_ends_only_when_dropped() {
    let model = ScriptedModel::new(
        "scripted",
        vec![ScriptStep::HangAfter(vec![StreamEvent::TextDelta("starting".to_owned())])],
    );
    let mut stream = model.stream(&Request::user_text("go")).await.expect("opens");
    assert_eq!(stream.next().await.expect("item").expect("ok"), StreamEvent::TextDelta("starting".to_owned()));
    let waited = tokio::time::timeout(Duration::from_secs(3600), stream.next()).await;
    assert!(waited.is_err(), "still hanging after an hour");
    assert_eq!(model.cancellations(), 0);
    drop(stream);
    model.wait_for_cancellations(1).await;
    assert_eq!(model.cancellations(), 1);
}
