//! The fallback model: moves on after rate limits, overloads and timeouts, only before output.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kesoku_llm::{
    FallbackModel, LlmError, LlmErrorKind, Model, ModelInfo, Provider, Request, ScriptStep, ScriptedModel, StreamEvent,
};
use kesoku_test_support::mock_llm::{MockReply, MockServer, Vendor};

use crate::support::good_model;

fn scripted(name: &str, steps: Vec<ScriptStep>) -> ScriptedModel {
    ScriptedModel::new(name, steps)
}

fn fail(kind: LlmErrorKind) -> ScriptStep {
    ScriptStep::Fail(LlmError::new(kind, "scripted failure"))
}

#[tokio::test]
async fn rate_limits_overloads_and_timeouts_move_to_the_next_model() {
    for kind in [LlmErrorKind::RateLimited, LlmErrorKind::Overloaded, LlmErrorKind::Timeout] {
        let first = scripted("first", vec![fail(kind)]);
        let second = scripted("second", vec![ScriptStep::text("from second")]);
        let fallback =
            FallbackModel::new("both", vec![Arc::new(first.clone()), Arc::new(second.clone())]).expect("builds");
        let response = fallback.generate(&Request::user_text("hi")).await.expect("second answers");
        assert_eq!(response.text_content(), "from second", "{kind:?}");
        assert_eq!((first.requests().len(), second.requests().len()), (1, 1));
    }
}

#[tokio::test]
async fn other_failures_are_returned_without_falling_back() {
    for kind in [LlmErrorKind::Auth, LlmErrorKind::BadRequest, LlmErrorKind::ContextTooLong] {
        let first = scripted("first", vec![fail(kind)]);
        let second = scripted("second", vec![ScriptStep::text("unused")]);
        let fallback = FallbackModel::new("both", vec![Arc::new(first), Arc::new(second.clone())]).expect("builds");
        let error = fallback.generate(&Request::user_text("hi")).await.expect_err("no fallback");
        assert_eq!(error.kind(), kind);
        assert!(second.requests().is_empty());
    }
}

#[tokio::test]
async fn an_error_as_the_first_item_still_falls_back() {
    let first = scripted("first", vec![ScriptStep::Stream(vec![Err(LlmError::new(LlmErrorKind::Overloaded, "busy"))])]);
    let second = scripted("second", vec![ScriptStep::text("ok")]);
    let fallback = FallbackModel::new("both", vec![Arc::new(first), Arc::new(second)]).expect("builds");
    assert_eq!(fallback.generate(&Request::user_text("hi")).await.expect("falls back").text_content(), "ok");
}

#[tokio::test]
async fn after_output_a_failure_reaches_the_caller() {
    let first = scripted(
        "first",
        vec![ScriptStep::Stream(vec![
            Ok(StreamEvent::TextDelta("partial".to_owned())),
            Err(LlmError::new(LlmErrorKind::Overloaded, "busy")),
        ])],
    );
    let second = scripted("second", vec![ScriptStep::text("unused")]);
    let fallback = FallbackModel::new("both", vec![Arc::new(first), Arc::new(second.clone())]).expect("builds");
    let mut stream = fallback.stream(&Request::user_text("hi")).await.expect("first model streams");
    assert_eq!(stream.next().await.expect("item").expect("ok"), StreamEvent::TextDelta("partial".to_owned()));
    assert_eq!(stream.next().await.expect("item").expect_err("the error").kind(), LlmErrorKind::Overloaded);
    assert!(second.requests().is_empty(), "nothing silently retried elsewhere");
}

#[tokio::test]
async fn when_every_model_fails_the_last_error_is_returned() {
    let first = scripted("first", vec![fail(LlmErrorKind::RateLimited)]);
    let second = scripted("second", vec![fail(LlmErrorKind::Timeout)]);
    let fallback = FallbackModel::new("both", vec![Arc::new(first), Arc::new(second)]).expect("builds");
    assert_eq!(fallback.generate(&Request::user_text("hi")).await.expect_err("all fail").kind(), LlmErrorKind::Timeout);
    assert!(FallbackModel::new("none", Vec::new()).is_err());
}

#[tokio::test]
async fn the_context_window_is_the_smallest_of_all() {
    let info = |window| ModelInfo {
        provider: Provider::OpenAi,
        model: "m".to_owned(),
        context_window: window,
        max_output_tokens: 100,
    };
    let big = scripted("big", Vec::new()).with_info(info(1_000_000));
    let small = scripted("small", Vec::new()).with_info(info(32_000));
    let fallback = FallbackModel::new("both", vec![Arc::new(big), Arc::new(small)]).expect("builds");
    assert_eq!(fallback.info().context_window, 32_000);
    assert_eq!(fallback.name(), "both");
}

#[tokio::test]
async fn a_gemini_quota_spent_after_retries_falls_back_to_another_vendor() {
    let gemini = MockServer::start(Vendor::Gemini, vec![MockReply::error(429, "quota"); 3]).await;
    let openai = MockServer::start(Vendor::OpenAi, vec![MockReply::text("from openai")]).await;
    let fallback =
        FallbackModel::new("both", vec![good_model(Vendor::Gemini, &gemini), good_model(Vendor::OpenAi, &openai)])
            .expect("builds");
    let response = tokio::time::timeout(Duration::from_secs(10), fallback.generate(&Request::user_text("hi")))
        .await
        .expect("in time")
        .expect("openai answers");
    assert_eq!(response.text_content(), "from openai");
    assert_eq!(gemini.requests().len(), 3, "gemini's own retries ran first");
    assert_eq!(openai.requests().len(), 1);
}
