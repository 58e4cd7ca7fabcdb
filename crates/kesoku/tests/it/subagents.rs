//! Sub-agents through the real binary: the service's model delegates a task, the sub-agent
//! answers in a session of its own one level deeper, its result comes back as a turn of the
//! parent session, and `kesoku ledger` shows each activation's depth.

use std::time::{Duration, Instant};

use chrono::Utc;
use kesoku_agent::subagents::{AGENT_CHATBOT, child_ids, result_message_id};
use kesoku_core::{Message, Role, Session, Status};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockPart, MockReply, MockServer, Vendor};
use serde_json::json;

use crate::support::{Service, Workspace, mock_model, stderr, stdout};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegated_task_comes_back_to_the_parent_and_the_ledger_shows_depth() {
    // The parent's second step and the sub-agent's only step run at once, in either order: they
    // get the same answer, so the test does not depend on which comes first.
    let server = MockServer::start(
        Vendor::OpenAi,
        vec![
            MockReply::Answer(MockAnswer::parts(vec![MockPart::tool_call(
                "call_1",
                "delegate",
                json!({ "task": "Compute 6 times 7." }),
            )])),
            MockReply::text("42"),
            MockReply::text("42"),
            MockReply::text("The sub-agent says 42."),
        ],
    )
    .await;
    let workspace =
        Workspace::with_config(&format!("{}\n[service]\nshutdown_grace_s = 1\n", mock_model(&server.base_url())));
    let init = workspace.run(&["init", "--no-model"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let url = format!("sqlite://{}", workspace.path().join(".kesoku/kesoku.db").display());
    let store = kesoku_store::open_existing(&url).await.expect("open the workspace's store");
    let session = Session::new("cli", "cli", Utc::now());
    store.store.create_session(&session).await.expect("create a session");
    store.store.set_active_session("cli", "cli", &session.id).await.expect("activate it");
    let prompt = Message::user_text(&session.id, "cli", "cli", "User", "what is 6 times 7? ask a sub-agent");
    store.store.insert_message(&prompt).await.expect("insert the prompt");

    let service = Service::spawn(&workspace, "service.log", &[KEY]);
    let (child_session, child_root) = child_ids(&prompt.id, "call_1");
    let result_id = result_message_id(&child_root);
    let deadline = Instant::now() + WAIT;
    loop {
        let result = store.store.get_message(&result_id).await.expect("read");
        if result.is_some_and(|m| m.status == Status::Processed) {
            break;
        }
        assert!(Instant::now() < deadline, "no result turn; log:\n{}", service.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let history = store.store.session_history(&session.id).await.expect("history");
    let answer = history
        .iter()
        .find(|m| m.parent_id.as_ref() == Some(&result_id) && m.role == Role::Assistant)
        .expect("an answer to the result");
    assert_eq!(answer.content, "The sub-agent says 42.");
    let child = store.store.get_session(&child_session).await.expect("read").expect("the sub-agent's session");
    assert_eq!((child.chatbot_id.as_str(), child.channel_id.as_str()), (AGENT_CHATBOT, session.id.as_str()));
    let last_request = server.requests().pop().expect("the result's request").body.to_string();
    assert!(
        last_request.contains("[Sub-agent result] The sub-agent you delegated a task to finished"),
        "{last_request}"
    );

    let ledger = workspace.run(&["ledger"], &[]).await;
    assert!(ledger.status.success(), "{}", stderr(&ledger));
    let lines = stdout(&ledger);
    let line_of = |kind: &str| {
        lines
            .lines()
            .find(|line| line.contains(&format!(" {kind} ")))
            .unwrap_or_else(|| panic!("no {kind} row: {lines}"))
    };
    assert!(line_of("direct_trigger").contains("depth 1 "), "{lines}");
    assert!(line_of("direct_trigger").contains(&format!("session {child_session}")), "{lines}");
    assert!(line_of("sub_agent_result").contains("depth 0 "), "{lines}");
    assert!(line_of("message").contains("depth 0 "), "{lines}");
    let (status, service) = service.terminate().await;
    assert_eq!(status.code(), Some(0), "log:\n{}", service.log());
}
