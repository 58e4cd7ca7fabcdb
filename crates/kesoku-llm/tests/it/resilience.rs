//! Retries, backoff, `Retry-After`, and the three timeouts (first byte, idle, connect).

use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use futures::StreamExt;
use kesoku_llm::retry::parse_retry_after;
use kesoku_llm::{LlmError, LlmErrorKind, Request, RetryPolicy, Secret, StreamEvent, Timeouts};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockOptions, MockReply, MockServer, Vendor};

use crate::support::config_for;

#[test]
fn retry_after_takes_seconds_and_http_dates() {
    let now = Utc.with_ymd_and_hms(2015, 10, 21, 7, 28, 0).single().expect("valid date");
    assert_eq!(parse_retry_after("30", now), Some(Duration::from_secs(30)));
    assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
    assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:45 GMT", now), Some(Duration::from_secs(45)));
    assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now), Some(Duration::ZERO), "a past date means now");
    assert_eq!(parse_retry_after("soon", now), None);
    assert_eq!(parse_retry_after("-5", now), None);
}

#[test]
fn the_policy_backs_off_exponentially_with_jitter_and_gives_up() {
    let policy = RetryPolicy { max_attempts: 5, base_delay_seconds: 1.0, max_delay_seconds: 6.0 };
    for _ in 0..50 {
        let first = policy.backoff(1);
        assert!(first >= Duration::from_millis(500) && first <= Duration::from_secs(1), "{first:?}");
        let third = policy.backoff(3);
        assert!(third >= Duration::from_secs(2) && third <= Duration::from_secs(4), "{third:?}");
        let capped = policy.backoff(10);
        assert!(capped >= Duration::from_secs(3) && capped <= Duration::from_secs(6), "{capped:?}");
    }
    let server_error = LlmError::new(LlmErrorKind::Server, "boom");
    assert!(policy.delay_before_retry(&server_error, 1).is_some());
    assert!(policy.delay_before_retry(&server_error, 5).is_none(), "attempts spent");
    let bad_request = LlmError::new(LlmErrorKind::BadRequest, "no");
    assert!(policy.delay_before_retry(&bad_request, 1).is_none(), "not retryable");
    let asked = LlmError::new(LlmErrorKind::RateLimited, "slow down").with_retry_after(Some(Duration::from_secs(4)));
    assert_eq!(policy.delay_before_retry(&asked, 1), Some(Duration::from_secs(4)), "Retry-After wins over backoff");
    let too_long = LlmError::new(LlmErrorKind::RateLimited, "tomorrow").with_retry_after(Some(Duration::from_secs(60)));
    assert_eq!(policy.delay_before_retry(&too_long, 1), None, "longer than max_delay: give up");
}

fn quick_timeouts(first_byte: f64, idle: f64) -> Timeouts {
    Timeouts { connect_seconds: 1.0, first_byte_seconds: first_byte, idle_seconds: idle }
}

#[tokio::test]
async fn a_slow_first_byte_times_out_and_is_retried() {
    let slow = MockReply::Delayed { delay: Duration::from_secs(3), reply: Box::new(MockReply::text("late")) };
    let server = MockServer::start(Vendor::OpenAi, vec![slow, MockReply::text("in time")]).await;
    let mut config = config_for(Vendor::OpenAi, &server.base_url());
    config.timeouts = quick_timeouts(0.3, 5.0);
    let model = kesoku_llm::build_model("slow", &config, Some(Secret::new(MOCK_API_KEY))).expect("builds");
    let started = Instant::now();
    let response = model.generate(&Request::user_text("hi")).await.expect("the retry is in time");
    assert_eq!(response.text_content(), "in time");
    assert!(started.elapsed() < Duration::from_secs(3), "did not wait for the slow answer");
    assert_eq!(server.requests().len(), 2);

    let slow = MockReply::Delayed { delay: Duration::from_secs(3), reply: Box::new(MockReply::text("late")) };
    let server = MockServer::start(Vendor::Anthropic, vec![slow]).await;
    let mut config = config_for(Vendor::Anthropic, &server.base_url());
    config.timeouts = quick_timeouts(0.2, 5.0);
    config.retry = RetryPolicy::no_retries();
    let model = kesoku_llm::build_model("slow", &config, Some(Secret::new(MOCK_API_KEY))).expect("builds");
    let error = model.generate(&Request::user_text("hi")).await.expect_err("times out");
    assert!(error.is_timeout() && error.should_try_fallback(), "{error}");
    assert!(error.to_string().contains("first-byte"), "{error}");
}

#[tokio::test]
async fn silence_between_chunks_ends_the_stream_with_an_idle_timeout() {
    let options = MockOptions {
        chunk_delay: Duration::from_secs(2),
        ..MockOptions::script(vec![MockReply::text("one two three four")])
    };
    let server = MockServer::start_with(Vendor::Gemini, options).await;
    let mut config = config_for(Vendor::Gemini, &server.base_url());
    config.timeouts = quick_timeouts(5.0, 0.3);
    let model = kesoku_llm::build_model("idle", &config, Some(Secret::new(MOCK_API_KEY))).expect("builds");
    let mut stream = model.stream(&Request::user_text("hi")).await.expect("first chunk arrives at once");
    let first = stream.next().await.expect("event").expect("ok");
    assert!(matches!(first, StreamEvent::TextDelta(_)));
    let error = loop {
        match stream.next().await.expect("an error ends the stream") {
            Ok(StreamEvent::Completed(_)) => panic!("cannot complete"),
            Ok(_) => {}
            Err(error) => break error,
        }
    };
    assert!(error.is_timeout(), "{error}");
    assert!(error.to_string().contains("idle"), "{error}");
    assert_eq!(server.requests().len(), 1, "output was handed out: no retry");
}

#[tokio::test]
async fn a_refused_connection_is_a_retryable_network_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let mut config = config_for(Vendor::OpenAi, &format!("http://{address}/v1"));
    config.retry = RetryPolicy { max_attempts: 2, base_delay_seconds: 0.01, max_delay_seconds: 0.1 };
    let model = kesoku_llm::build_model("gone", &config, Some(Secret::new(MOCK_API_KEY))).expect("builds");
    let error = model.generate(&Request::user_text("hi")).await.expect_err("nobody listens");
    assert_eq!(error.kind(), LlmErrorKind::Network, "{error}");
    assert!(error.is_retryable());
    assert!(error.to_string().contains("could not connect"), "{error}");
}
