//! The interruption state machine (ARCHITECTURE.md): every mode, mid-stream and mid-tool.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kesoku_agent::{AgentConfig, QueueMode};
use kesoku_broker::StopReason;
use kesoku_core::{Message, MessageType, Outcome, Role, Status};
use kesoku_llm::{Part, ScriptStep, ToolCall};
use serde_json::json;

use crate::harness::{Harness, Options, shape};

fn options(mode: QueueMode) -> Options {
    Options { config: AgentConfig { queue_mode: mode, ..AgentConfig::default() }, ..Options::default() }
}

fn slow_call() -> ScriptStep {
    ScriptStep::parts(vec![
        Part::thought("The user wants a web component. I will start by sketching its structure.", None),
        Part::ToolCall(ToolCall {
            id: "call_slow".into(),
            name: "run_shell_command".into(),
            arguments: json!({"command": "echo $$ > slow.pid; sleep 30"}),
            signature: None,
        }),
    ])
}

#[tokio::test]
async fn trajectory_6_3_a_newer_message_interrupts_mid_tool_and_kills_the_process() {
    let h = Harness::start(vec![slow_call(), ScriptStep::text("Here is a command line tool.")]).await;
    let user_a = h.post_user("Build a new web component").await;
    let call = h.wait_for(|m| m.message_type == MessageType::ToolCall).await;
    // Wait for the command to be running.
    let pid_file = h.dir.path().join("workspace").join("slow.pid");
    for _ in 0..500 {
        if std::fs::read_to_string(&pid_file).is_ok_and(|p| !p.trim().is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid: i32 = std::fs::read_to_string(&pid_file).expect("pid file").trim().parse().expect("pid");
    let started = Instant::now();
    let user_b = h.post_user("Wait, actually build a command line tool instead").await;
    assert_eq!(h.wait_terminal(&user_a.id).await, Status::Interrupted);
    assert!(started.elapsed() < Duration::from_secs(10), "interrupted promptly, not after the sleep");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the tool's process was killed");
    assert_eq!(h.wait_terminal(&user_b.id).await, Status::Processed);

    let messages = h.history().await;
    assert_eq!(
        shape(&messages),
        vec![
            (Role::User, MessageType::Text, "Chii".into(), Status::Interrupted),
            (Role::Assistant, MessageType::Thought, "Kesoku".into(), Status::Responded),
            (Role::Tool, MessageType::ToolCall, "Kesoku".into(), Status::Interrupted),
            (Role::Tool, MessageType::ToolResult, "run_shell_command".into(), Status::Responded),
            (Role::User, MessageType::Text, "Chii".into(), Status::Processed),
            (Role::Assistant, MessageType::Text, "Kesoku".into(), Status::Pending),
        ]
    );
    let synthetic = &messages[3];
    assert_eq!(synthetic.parent_id.as_ref(), Some(&call.id));
    assert!(synthetic.content.contains("a newer message arrived"), "{}", synthetic.content);
    assert!(synthetic.metadata.tool_error.is_some());
    assert_eq!(h.finished_ledger_for(&user_a.id).await[0].outcome, Some(Outcome::Interrupted));
    assert_eq!(h.finished_ledger_for(&user_b.id).await[0].outcome, Some(Outcome::Succeeded));
    // The new turn saw the interrupted one in its history.
    let last_request = h.model.requests().pop().expect("requests");
    assert!(format!("{:?}", last_request.turns).contains("Build a new web component"));
}

#[tokio::test]
async fn a_newer_message_interrupts_mid_stream_and_drops_the_request() {
    let h = Harness::start(vec![ScriptStep::hang(), ScriptStep::text("answer to b")]).await;
    let user_a = h.post_user("first").await;
    h.wait_status(&user_a.id, &[Status::Processing]).await;
    // Let the model call start.
    for _ in 0..500 {
        if !h.model.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let user_b = h.post_user("second").await;
    assert_eq!(h.wait_terminal(&user_a.id).await, Status::Interrupted);
    assert_eq!(h.wait_terminal(&user_b.id).await, Status::Processed);
    assert_eq!(h.model.cancellations(), 1, "the in-flight stream was dropped");
    let messages = h.history().await;
    assert_eq!(messages.iter().filter(|m| m.message_type == MessageType::Text && m.role == Role::Assistant).count(), 1);
}

#[tokio::test]
async fn queue_mode_lets_the_running_turn_finish_first() {
    let h = Harness::start_with(
        vec![ScriptStep::text("answer to a").delayed(Duration::from_millis(300)), ScriptStep::text("answer to b")],
        options(QueueMode::Queue),
    )
    .await;
    let user_a = h.post_user("first").await;
    h.wait_status(&user_a.id, &[Status::Processing]).await;
    let user_b = h.post_user("second").await;
    assert_eq!(h.wait_terminal(&user_a.id).await, Status::Processed);
    assert_eq!(h.wait_terminal(&user_b.id).await, Status::Processed);
    let replies: Vec<String> =
        h.history().await.into_iter().filter(|m| m.role == Role::Assistant).map(|m| m.content).collect();
    assert_eq!(replies, vec!["answer to a".to_owned(), "answer to b".to_owned()]);
    assert_eq!(h.model.cancellations(), 0);
}

#[tokio::test]
async fn automation_never_interrupts_a_human_turn() {
    let h = Harness::start(vec![
        ScriptStep::text("answer to the person").delayed(Duration::from_millis(300)),
        ScriptStep::text("job noted"),
    ])
    .await;
    let user = h.post_user("please help").await;
    h.wait_status(&user.id, &[Status::Processing]).await;
    let alert = kesoku_core::Message::wakeup_alert(
        &h.session.id,
        "discord",
        "1234567890123",
        "[System Alert] Background Job job_1 finished",
    );
    h.gateway.post(&alert).await.expect("post");
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    assert_eq!(h.wait_terminal(&alert.id).await, Status::Processed);
    let ledger = h.ledger_for(&alert.id).await;
    assert_eq!(ledger[0].lane, kesoku_core::Lane::Responsive, "system work rides the responsive lane");
}

#[tokio::test]
async fn a_stop_request_interrupts_the_turn_and_the_waiting_messages() {
    let h = Harness::start_with(vec![slow_call()], options(QueueMode::Queue)).await;
    let user_a = h.post_user("long task").await;
    h.wait_for(|m| m.message_type == MessageType::ToolCall).await;
    let user_b = h.post_user("queued behind").await;
    let interrupted_waiting = h.agent.stop_session(&h.session.id, StopReason::UserRequest).await.expect("stop");
    assert_eq!(interrupted_waiting, 1);
    assert_eq!(h.wait_terminal(&user_a.id).await, Status::Interrupted);
    assert_eq!(h.status_of(&user_b.id).await, Status::Interrupted);
    let result = h.wait_for(|m| m.message_type == MessageType::ToolResult).await;
    assert!(result.content.contains("the user stopped the turn"), "{}", result.content);
}

#[tokio::test]
async fn a_burst_of_messages_supersedes_the_middle_ones() {
    let h = Harness::start(vec![slow_call(), ScriptStep::text("answer to the last")]).await;
    let first = h.post_user("one").await;
    h.wait_for(|m| m.message_type == MessageType::ToolCall).await;
    // Two more arrive while the first turn runs: the first is stopped, the second is superseded
    // by the third before it starts, the third is answered and sees all three.
    let second = h.post_user("two").await;
    let third = h.post_user("three").await;
    let mut finals = BTreeMap::new();
    for (name, id) in [("one", &first.id), ("two", &second.id), ("three", &third.id)] {
        finals.insert(name, h.wait_terminal(id).await);
    }
    assert_eq!(finals["one"], Status::Interrupted);
    assert_eq!(finals["two"], Status::Interrupted);
    assert_eq!(finals["three"], Status::Processed);
    assert_eq!(h.model.requests().len(), 2, "the superseded message never reached the model on its own");
    let seen = format!("{:?}", h.model.requests()[1].turns);
    assert!(seen.contains("two") && seen.contains("three"));
    assert_eq!(h.finished_ledger_for(&second.id).await[0].error.as_deref(), Some("superseded by a newer message"));
}

#[tokio::test]
async fn shutdown_hands_a_running_turn_back_and_the_next_start_finishes_it() {
    let mut h =
        Harness::start_with(vec![ScriptStep::hang()], Options { grace: Duration::ZERO, ..Options::default() }).await;
    let user = h.post_user("are you there").await;
    h.wait_status(&user.id, &[Status::Processing]).await;
    for _ in 0..500 {
        if !h.model.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.shut_down().await;
    assert_eq!(h.status_of(&user.id).await, Status::PendingAgent, "handed back, not lost");
    assert_eq!(h.ledger_for(&user.id).await[0].outcome, Some(Outcome::Cancelled));

    h.model.push(ScriptStep::text("yes, here"));
    h.reboot(Options::default()).await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let replies = h.history().await.into_iter().filter(|m| m.role == Role::Assistant).count();
    assert_eq!(replies, 1, "answered exactly once");
}

#[tokio::test]
async fn steer_mode_adds_a_newer_message_to_the_running_turn_after_its_tools() {
    let h = Harness::start_with(
        vec![
            ScriptStep::tool_call("run_shell_command", json!({"command": "sleep 1; echo built"})),
            ScriptStep::text("Built it, and added the tests you asked for."),
        ],
        options(QueueMode::Steer),
    )
    .await;
    let user_a = h.post_user("build the component").await;
    h.wait_for(|m| m.message_type == MessageType::ToolCall).await;
    let user_b = h.post_user("also add tests please").await;
    assert_eq!(h.wait_terminal(&user_a.id).await, Status::Processed);
    assert_eq!(h.wait_terminal(&user_b.id).await, Status::Processed);
    let requests = h.model.requests();
    assert_eq!(requests.len(), 2, "one turn answered both");
    let seen = format!("{:?}", requests[1].turns.last().expect("turns"));
    assert!(seen.contains("also add tests please"), "the second call saw the new message last: {seen}");
    let result = h.wait_for(|m| m.message_type == MessageType::ToolResult).await;
    assert!(result.content.contains("built"), "the running tool finished: {}", result.content);
    assert_eq!(h.model.cancellations(), 0);
    let replies = h.history().await.into_iter().filter(|m| m.role == Role::Assistant).count();
    assert_eq!(replies, 1);
    assert_eq!(
        h.finished_ledger_for(&user_b.id).await[0].outcome,
        Some(Outcome::Cancelled),
        "B's own activation found it taken"
    );
}

#[tokio::test]
async fn steer_mode_skips_calls_that_had_not_started() {
    let h = Harness::start_with(
        vec![
            ScriptStep::tool_call("run_shell_command", json!({"command": "echo should-not-run"}))
                .delayed(Duration::from_millis(400)),
            ScriptStep::text("Done the new way."),
        ],
        options(QueueMode::Steer),
    )
    .await;
    let user_a = h.post_user("do it the old way").await;
    for _ in 0..500 {
        if !h.model.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let user_b = h.post_user("no, the new way").await;
    assert_eq!(h.wait_terminal(&user_a.id).await, Status::Processed);
    assert_eq!(h.wait_terminal(&user_b.id).await, Status::Processed);
    let result = h.wait_for(|m| m.message_type == MessageType::ToolResult).await;
    assert!(result.content.contains("skipped"), "{}", result.content);
    assert!(!result.content.contains("should-not-run"));
    assert!(format!("{:?}", h.model.requests()[1].turns).contains("no, the new way"));
}

/// A tool's result is stored before the next model call; a stop during that call leaves the
/// call with its real result (and no second, synthetic one).
#[tokio::test]
async fn a_stop_during_the_model_call_after_a_tool_keeps_the_tools_real_result() {
    let h = Harness::start_with(
        vec![ScriptStep::tool_call("run_shell_command", json!({"command": "echo real output"})), ScriptStep::hang()],
        options(QueueMode::Queue),
    )
    .await;
    let user = h.post_user("run it").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.model.requests().len() < 2 {
        assert!(Instant::now() < deadline, "the second model call never came");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.agent.stop_session(&h.session.id, StopReason::UserRequest).await.expect("stop");
    assert_eq!(h.wait_terminal(&user.id).await, Status::Interrupted);
    let history = h.history().await;
    let results: Vec<&Message> = history.iter().filter(|m| m.message_type == MessageType::ToolResult).collect();
    assert_eq!(results.len(), 1, "one result for the one call: {results:?}");
    assert!(results[0].content.contains("real output"), "{}", results[0].content);
    let call = history.iter().find(|m| m.message_type == MessageType::ToolCall).expect("the call");
    assert_eq!(results[0].parent_id.as_ref(), Some(&call.id));
    // The second request already carried that result.
    let seen = format!("{:?}", h.model.requests()[1].turns);
    assert!(seen.contains("real output"), "{seen}");
}
