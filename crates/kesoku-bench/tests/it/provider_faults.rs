//! Provider faults: the OpenAI-style mock answers 429 with `Retry-After`, 500s, breaks the
//! stream mid-answer and stalls. Each turn completes after retries or ends in `error` with a
//! notification, and the agent keeps serving: a healthy turn afterwards is answered.

use std::sync::Arc;
use std::time::Duration;

use kesoku_agent::{LaneLimits, Limits};
use kesoku_bench::mock::MockHost;
use kesoku_bench::system::{AgentSetup, Backend, Client, StoreSetup, System};
use kesoku_core::Status;
use kesoku_llm::{ModelConfig, Provider, RetryPolicy, Timeouts};
use kesoku_test_support::mock_llm::{MockAnswer, MockOptions, MockReply, Vendor};

use crate::support::has_error_notification;

fn answer(text: &str) -> MockAnswer {
    MockAnswer::text(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_end_in_an_answer_or_an_error_notification_and_the_agent_stays_up() {
    // (what the mock does for each request of the turn, how the turn must end)
    let cases: Vec<(&str, Vec<MockReply>, Status)> = vec![
        (
            "429 with Retry-After, then an answer",
            vec![MockReply::rate_limited("0.2"), MockReply::text("after the rate limit")],
            Status::Processed,
        ),
        (
            "two 500s, then an answer",
            vec![MockReply::error(500, "boom"), MockReply::error(503, "busy"), MockReply::text("after two errors")],
            Status::Processed,
        ),
        (
            "500s until the retries are spent",
            vec![MockReply::error(500, "boom"), MockReply::error(500, "boom"), MockReply::error(500, "boom")],
            Status::Error,
        ),
        ("Retry-After longer than the policy allows", vec![MockReply::rate_limited("3600")], Status::Error),
        (
            "connection reset mid-stream",
            vec![MockReply::BreakAfter { answer: answer("this answer breaks off half way"), events: 2 }],
            Status::Error,
        ),
        (
            "a stall after the first chunk (keep-alive comments only)",
            vec![MockReply::HangAfter { answer: answer("this answer stalls"), events: 1 }],
            Status::Processed,
        ),
        (
            "a stall before any byte, then an answer",
            vec![
                MockReply::Delayed { delay: Duration::from_secs(5), reply: Box::new(MockReply::text("too late")) },
                MockReply::text("after a stall"),
            ],
            Status::Processed,
        ),
        ("a healthy turn after all that", vec![MockReply::text("still here")], Status::Processed),
    ];
    let mock = MockHost::start(Vendor::OpenAi, MockOptions::script(Vec::new()));
    let mut config = ModelConfig::new(Provider::OpenAi, "mock-model");
    config.base_url = Some(mock.base_url());
    config.retry = RetryPolicy { max_attempts: 3, base_delay_seconds: 0.05, max_delay_seconds: 1.0 };
    config.timeouts = Timeouts { connect_seconds: 2.0, first_byte_seconds: 0.5, idle_seconds: 0.4 };
    let key = kesoku_llm::Secret::new(kesoku_test_support::mock_llm::MOCK_API_KEY);
    let model = kesoku_llm::build_model("mock", &config, Some(key)).expect("model");
    let store = StoreSetup::open(&Backend::Sqlite).await.expect("store");
    // A stalled stream that keeps sending keep-alive comments is not idle for the provider;
    // the turn's runtime limit ends it.
    let limits = LaneLimits {
        interactive: Some(Limits { runtime_s: 3, model_calls: 10, tool_calls: 10 }),
        ..LaneLimits::default()
    };
    let setup = AgentSetup { limits, ..AgentSetup::with_model(Arc::clone(&model)) };
    let system = System::start(store, setup).await.expect("agent");
    let client = Client::start(&system.gateway).await;

    for (index, (name, replies, expected)) in cases.into_iter().enumerate() {
        let requests_before = mock.server().requests().len();
        let scripted = replies.len();
        for reply in replies {
            mock.server().push(reply);
        }
        let session = client.new_session(&format!("fault-{index}")).await.expect("session");
        let answered = tokio::time::timeout(Duration::from_secs(30), client.ask(&session, name))
            .await
            .unwrap_or_else(|_| panic!("{name}: the turn never ended"))
            .expect("ask");
        assert_eq!(answered.status, expected, "{name}");
        let history = system.gateway.store().session_history(&session.id).await.expect("history");
        let root = history.iter().find(|m| m.id == answered.root).expect("the root is stored");
        match expected {
            Status::Processed if name.starts_with("a stall after") => {
                let reply = history.iter().rev().find(|m| m.parent_id.as_ref() == Some(&root.id)).expect("a reply");
                assert!(reply.content.contains("runtime"), "{name}: the limit is named: {}", reply.content);
            }
            Status::Processed => assert_eq!(answered.answers, 1, "{name}: one answer"),
            Status::Error => assert!(has_error_notification(&history, root), "{name}: the user is told it failed"),
            other @ (Status::PendingAgent
            | Status::Processing
            | Status::Interrupted
            | Status::Pending
            | Status::Delivered
            | Status::Responded) => panic!("{name}: no case expects {other}"),
        }
        let used = mock.server().requests().len() - requests_before;
        if name.starts_with("Retry-After longer") {
            assert_eq!(used, 1, "{name}: a wait longer than allowed is not retried");
        } else {
            assert_eq!(used, scripted, "{name}: every scripted reply was asked for (retries happened)");
        }
    }
    assert!(mock.server().violations().is_empty(), "{:?}", mock.server().violations());
    system.stop().await;
}
