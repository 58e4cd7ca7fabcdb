//! Whole turns: the spec's trajectory 6.1, parallel tools, nudges, failures, limits.

use kesoku_agent::{LaneLimits, Limits};
use kesoku_core::{MessageType, Outcome, Role, Status};
use kesoku_llm::{LlmError, LlmErrorKind, Part, ScriptStep, ToolCall, TurnRole};
use serde_json::json;

use crate::harness::{Harness, Options, shape};

fn call(id: &str, command: &str) -> Part {
    Part::ToolCall(ToolCall {
        id: id.to_owned(),
        name: "run_shell_command".to_owned(),
        arguments: json!({ "command": command }),
        signature: None,
    })
}

#[tokio::test]
async fn trajectory_6_1_standard_turn_with_tool_execution() {
    let h = Harness::start(vec![
        ScriptStep::parts(vec![
            Part::thought(
                "I need to run the unit tests for the history module using uv. I will search for the test file first.",
                Some("sig-thought".to_owned()),
            ),
            call("call_001", "echo '5 passed in 0.42s'"),
        ]),
        ScriptStep::text(
            "I have successfully executed the tests for the agent history module. All 5 tests passed in 0.42 seconds.",
        ),
    ])
    .await;
    let user = h.post_user("`Chii` <@112233> at `2026-05-27 20:50:00 SGT`:\nRun tests for agent history module").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);

    let messages = h.history().await;
    assert_eq!(
        shape(&messages),
        vec![
            (Role::User, MessageType::Text, "Chii".into(), Status::Processed),
            (Role::Assistant, MessageType::Thought, "Kesoku".into(), Status::Responded),
            (Role::Tool, MessageType::ToolCall, "Kesoku".into(), Status::Responded),
            (Role::Tool, MessageType::ToolResult, "run_shell_command".into(), Status::Responded),
            (Role::Assistant, MessageType::Text, "Kesoku".into(), Status::Pending),
        ]
    );
    let [root, thought, call, result, reply] = &messages[..] else { panic!("five messages") };
    for message in [thought, call, reply] {
        assert_eq!(message.parent_id.as_ref(), Some(&root.id), "steps answer the user message");
        assert_eq!((message.chatbot_id.as_str(), message.channel_id.as_str()), ("discord", "1234567890123"));
    }
    assert_eq!(result.parent_id.as_ref(), Some(&call.id), "the result answers its call");
    assert_eq!(thought.metadata.thought_signature.as_deref(), Some("sig-thought"));
    assert_eq!(call.metadata.tool_name.as_deref(), Some("run_shell_command"));
    assert_eq!(call.metadata.tool_arguments, Some(json!({"command": "echo '5 passed in 0.42s'"})));
    assert!(call.content.starts_with("Calling tool `run_shell_command` with arguments:\n```json\n"));
    assert_eq!(result.metadata.tool_name.as_deref(), Some("run_shell_command"));
    assert_eq!(result.metadata.tool_result.as_deref(), Some("5 passed in 0.42s"));
    assert_eq!(result.content, "=== STDOUT ===\n5 passed in 0.42s\n=== STDERR ===\n");
    assert_eq!((thought.step, call.step, result.step, reply.step), (1, 1, 1, 2));
    let metrics = reply.metadata.turn_metrics.as_ref().expect("turn metrics");
    assert_eq!((metrics.session_turns, metrics.turn_tool_calls), (1, 1));

    // The second model call saw the thought (active turn), the call and its result.
    let requests = h.model.requests();
    assert_eq!(requests.len(), 2);
    let second = &requests[1];
    let last_model = second.turns.iter().rev().find(|t| t.role == TurnRole::Model).expect("a model turn");
    assert!(
        last_model.parts.iter().any(|p| matches!(p, Part::Thought { signature: Some(s), .. } if s == "sig-thought"))
    );
    let last_user = second.turns.last().expect("turns");
    assert!(matches!(&last_user.parts[0], Part::ToolResult(r) if r.call_id == "call_001"));
    // The model-facing entries: the system prompt and the activation context, never lanes or ids.
    assert!(second.system.as_deref().is_some_and(|s| s.contains("Kesoku")));
    let first_user_text = format!("{:?}", second.turns[0]);
    assert!(first_user_text.contains("[Activation context]"), "{first_user_text}");
    assert!(!first_user_text.contains("interactive") && !first_user_text.contains("act_"), "{first_user_text}");

    let ledger = h.finished_ledger_for(&root.id).await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].outcome, Some(Outcome::Succeeded));
    assert_eq!((ledger[0].usage.model_calls, ledger[0].usage.tool_calls), (2, 1));
    assert_eq!(ledger[0].lane, kesoku_core::Lane::Interactive);
    assert_eq!(ledger[0].triggered_by, "Chii");
}

#[tokio::test]
async fn parallel_tool_calls_run_concurrently_and_stay_together() {
    // Each command waits (up to 5 s) for the other to have started: both print "together" only
    // when they really ran at the same time.
    let a = "touch a.started; for i in $(seq 50); do [ -f b.started ] && break; sleep 0.1; done; [ -f b.started ] && echo together-a";
    let b = "touch b.started; for i in $(seq 50); do [ -f a.started ] && break; sleep 0.1; done; [ -f a.started ] && echo together-b";
    let h =
        Harness::start(vec![ScriptStep::parts(vec![call("a", a), call("b", b)]), ScriptStep::text("both done")]).await;
    let user = h.post_user("run both").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let messages = h.history().await;
    let types: Vec<MessageType> = messages.iter().map(|m| m.message_type).collect();
    assert_eq!(
        types,
        vec![
            MessageType::Text,
            MessageType::ToolCall,
            MessageType::ToolCall,
            MessageType::ToolResult,
            MessageType::ToolResult,
            MessageType::Text
        ]
    );
    let results: Vec<&str> =
        messages.iter().filter(|m| m.message_type == MessageType::ToolResult).map(|m| m.content.as_str()).collect();
    assert!(results.iter().any(|r| r.contains("together-a")), "{results:?}");
    assert!(results.iter().any(|r| r.contains("together-b")), "{results:?}");
    // Both calls were posted before either result (all calls of one response before any tool runs).
    let stored = h.handle.store.list_messages(&kesoku_core::MessageFilter::session(&h.session.id)).await.expect("list");
    let order: Vec<MessageType> = stored.iter().map(|m| m.message_type).collect();
    assert_eq!(&order[1..3], &[MessageType::ToolCall, MessageType::ToolCall]);
}

/// A tool that answers with the time it started (µs since the epoch), declared read-only or not.
struct Clock {
    spec: kesoku_tools::ToolSpec,
    read_only: bool,
    /// How long the tool takes after reading the time.
    delay: std::time::Duration,
}

impl Clock {
    fn new(read_only: bool) -> Clock {
        let spec = kesoku_tools::ToolSpec {
            name: "clock".to_owned(),
            description: "The time now.".to_owned(),
            parameters: json!({"type": "object", "properties": {}}),
        };
        Clock { spec, read_only, delay: std::time::Duration::ZERO }
    }

    fn taking(mut self, delay: std::time::Duration) -> Clock {
        self.delay = delay;
        self
    }
}

#[async_trait::async_trait]
impl kesoku_tools::Tool for Clock {
    fn spec(&self) -> &kesoku_tools::ToolSpec {
        &self.spec
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    async fn call(&self, _ctx: &kesoku_tools::ToolContext, _arguments: serde_json::Value) -> kesoku_tools::ToolOutput {
        let now = chrono::Utc::now().timestamp_micros();
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        kesoku_tools::ToolOutput::success(now.to_string())
    }
}

/// When the `clock` tool started, relative to its call's write (the call's stamp is taken as
/// its write begins): µs from the stamp to the tool's start.
async fn clock_start_after_its_call(read_only: bool) -> i64 {
    let (messages, _) = clock_turn(Clock::new(read_only)).await;
    let written = messages[1].created_at.expect("the call's stamp").timestamp_micros();
    let started: i64 = messages[2].content.parse().expect("the tool's answer");
    started - written
}

/// A turn that calls `clock` once and answers: its messages (text, call, result, answer) and
/// when each model request came in.
async fn clock_turn(clock: Clock) -> (Vec<kesoku_core::Message>, Vec<chrono::DateTime<chrono::Utc>>) {
    let mut registry = kesoku_tools::Registry::new();
    registry.register(clock).expect("register");
    let options = Options { tools: Some(std::sync::Arc::new(registry)), ..Options::default() };
    let steps = vec![
        ScriptStep::parts(vec![Part::ToolCall(ToolCall {
            id: "c1".to_owned(),
            name: "clock".to_owned(),
            arguments: json!({}),
            signature: None,
        })]),
        ScriptStep::text("done"),
    ];
    let h = Harness::start_with(steps, options).await;
    let user = h.post_user("what time is it?").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let messages = h.history().await;
    let types: Vec<MessageType> = messages.iter().map(|m| m.message_type).collect();
    assert_eq!(types, [MessageType::Text, MessageType::ToolCall, MessageType::ToolResult, MessageType::Text]);
    assert_eq!(messages[2].parent_id.as_ref(), Some(&messages[1].id), "the result answers the call");
    (messages, h.model.requested_at())
}

#[tokio::test]
async fn a_read_only_tool_starts_while_its_call_is_written_and_others_wait_for_the_write() {
    // A read-only tool starts before its call's write begins (it runs beside the write)...
    let early = clock_start_after_its_call(true).await;
    assert!(early <= 0, "the read-only tool started {early} µs after its call's write began");
    // ...any other tool only once its call is stored: a crash cannot leave its effect unrecorded.
    let late = clock_start_after_its_call(false).await;
    assert!(late > 0, "the tool started {} µs before its call's write began", -late);
}

#[tokio::test]
async fn a_quick_read_only_tool_has_its_call_written_with_its_result() {
    // One write stamps all its messages alike: a quick read-only tool's call is written with
    // its result (one transaction instead of two)...
    let (quick, _) = clock_turn(Clock::new(true)).await;
    assert_eq!(quick[1].created_at, quick[2].created_at, "the call and its result in one write");
    // ...a slow one's call is written while it runs, so whoever watches the turn sees it...
    let (slow, _) = clock_turn(Clock::new(true).taking(std::time::Duration::from_millis(200))).await;
    let (call, result) = (slow[1].created_at.expect("stamp"), slow[2].created_at.expect("stamp"));
    assert!(result - call >= chrono::Duration::milliseconds(150), "call {call}, result {result}");
    // ...and any other tool's call is written before the tool starts, in a write of its own.
    let (other, _) = clock_turn(Clock::new(false)).await;
    assert!(other[1].created_at < other[2].created_at, "{:?} vs {:?}", other[1].created_at, other[2].created_at);
}

#[tokio::test]
async fn what_a_step_left_unwritten_is_written_after_the_next_request_went_out() {
    // A tool's result (and a quick read-only tool's call with it) is written beside the next
    // model call, after the request was handed over: the write's stamp is taken as it begins.
    for read_only in [false, true] {
        let (messages, requested_at) = clock_turn(Clock::new(read_only)).await;
        let (asked, written) = (requested_at[1], messages[2].created_at.expect("the result's stamp"));
        assert!(
            asked <= written,
            "read-only {read_only}: the second request at {asked}, the result written at {written}"
        );
    }
}

#[tokio::test]
async fn an_empty_answer_gets_one_nudge_then_the_answer() {
    let h = Harness::start(vec![ScriptStep::parts(vec![]), ScriptStep::text("Here is the summary.")]).await;
    let user = h.post_user("summarize").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let messages = h.history().await;
    assert_eq!(
        shape(&messages),
        vec![
            (Role::User, MessageType::Text, "Chii".into(), Status::Processed),
            (Role::System, MessageType::Text, "System".into(), Status::Responded),
            (Role::Assistant, MessageType::Text, "Kesoku".into(), Status::Pending),
        ]
    );
    assert_eq!(messages[1].parent_id.as_ref(), Some(&user.id), "the nudge belongs to the turn");
    let second = &h.model.requests()[1];
    let last = format!("{:?}", second.turns.last().expect("turns"));
    assert!(last.contains("[System Notification]\\nYour previous response had empty content"), "{last}");
}

#[tokio::test]
async fn two_empty_answers_end_with_a_short_fallback_reply() {
    let h = Harness::start(vec![ScriptStep::parts(vec![]), ScriptStep::parts(vec![])]).await;
    let user = h.post_user("hello?").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let reply = h.history().await.pop().expect("messages");
    assert_eq!(reply.content, kesoku_agent::turn::EMPTY_FALLBACK_TEXT);
    assert_eq!(h.model.requests().len(), 2, "exactly one nudge");
}

#[tokio::test]
async fn a_provider_failure_marks_the_message_error_and_tells_the_user_briefly() {
    let failure = LlmError::new(LlmErrorKind::Server, "upstream returned 500 after 4 attempts").with_status(500);
    let h = Harness::start(vec![ScriptStep::Fail(failure)]).await;
    let user = h.post_user("hi").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Error);
    let messages = h.history().await;
    let notice = messages.last().expect("a notification");
    assert_eq!((notice.role, notice.sender.as_str(), notice.status), (Role::Assistant, "Kesoku", Status::Pending));
    assert!(notice.content.starts_with("⚠️ An error occurred while processing your request: "), "{}", notice.content);
    assert!(notice.content.chars().count() <= 500);
    let ledger = h.finished_ledger_for(&user.id).await;
    assert_eq!(ledger[0].outcome, Some(Outcome::Failed));
    let errors = h.agent.session_dir(&h.session.id).join("errors").join(format!("{}.txt", ledger[0].id));
    let detail = std::fs::read_to_string(&errors).expect("full error saved in the staging folder");
    assert!(detail.contains("upstream returned 500"), "{detail}");

    // The service stays up: the next message is answered.
    h.model.push(ScriptStep::text("back again"));
    let next = h.post_user("still there?").await;
    assert_eq!(h.wait_terminal(&next.id).await, Status::Processed);
}

#[tokio::test]
async fn the_model_call_limit_ends_the_turn_with_a_message_naming_it() {
    let looping = || ScriptStep::tool_call("run_shell_command", json!({"command": "true"}));
    let limits = LaneLimits {
        interactive: Some(Limits { runtime_s: 60, model_calls: 2, tool_calls: 10 }),
        ..LaneLimits::default()
    };
    let h = Harness::start_with(vec![looping(), looping(), looping()], Options { limits, ..Options::default() }).await;
    let user = h.post_user("loop forever").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let reply = h.history().await.pop().expect("messages");
    assert_eq!(reply.message_type, MessageType::Text);
    assert!(reply.content.contains("model call limit of 2"), "{}", reply.content);
    assert_eq!(h.model.requests().len(), 2);
    let ledger = h.finished_ledger_for(&user.id).await;
    assert_eq!(ledger[0].outcome, Some(Outcome::LimitExceeded));
    assert_eq!(ledger[0].error.as_deref(), Some("model call limit of 2"));
}

#[tokio::test]
async fn the_tool_call_limit_refuses_extra_calls_and_ends_the_turn() {
    let limits = LaneLimits {
        interactive: Some(Limits { runtime_s: 60, model_calls: 10, tool_calls: 1 }),
        ..LaneLimits::default()
    };
    let h = Harness::start_with(
        vec![ScriptStep::parts(vec![call("a", "echo one"), call("b", "echo two")])],
        Options { limits, ..Options::default() },
    )
    .await;
    let user = h.post_user("two calls").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let messages = h.history().await;
    let results: Vec<&kesoku_core::Message> =
        messages.iter().filter(|m| m.message_type == MessageType::ToolResult).collect();
    assert_eq!(results.len(), 2, "every call has a result");
    assert!(results.iter().any(|r| r.content.contains("one")));
    assert!(
        results.iter().any(|r| r.metadata.tool_error.as_deref().is_some_and(|e| e.contains("tool call limit of 1")))
    );
    assert!(messages.last().expect("reply").content.contains("tool call limit of 1"));
    assert_eq!(h.finished_ledger_for(&user.id).await[0].outcome, Some(Outcome::LimitExceeded));
}

#[tokio::test]
async fn the_runtime_limit_stops_a_hanging_model() {
    let limits = LaneLimits {
        interactive: Some(Limits { runtime_s: 1, model_calls: 10, tool_calls: 10 }),
        ..LaneLimits::default()
    };
    let h = Harness::start_with(vec![ScriptStep::hang()], Options { limits, ..Options::default() }).await;
    let user = h.post_user("think forever").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    assert!(h.history().await.pop().expect("reply").content.contains("runtime limit of 1 s"));
    assert_eq!(h.model.cancellations(), 1, "the in-flight stream was dropped");
    assert_eq!(h.finished_ledger_for(&user.id).await[0].outcome, Some(Outcome::LimitExceeded));
}

#[tokio::test]
async fn a_message_for_a_missing_session_ends_in_error() {
    let h = Harness::start(vec![]).await;
    let orphan =
        kesoku_core::Message::user_text(&kesoku_core::SessionId::from("sess_gone"), "discord", "c", "Chii", "hi");
    h.gateway.post(&orphan).await.expect("post");
    assert_eq!(h.wait_terminal(&orphan.id).await, Status::Error);
    let ledger = h.finished_ledger_for(&orphan.id).await;
    assert!(ledger[0].error.as_deref().is_some_and(|e| e.contains("missing session")), "{:?}", ledger[0].error);
}

#[tokio::test]
async fn debug_mode_writes_each_model_call_to_the_session_folder() {
    let options = Options {
        config: kesoku_agent::AgentConfig { debug: true, ..kesoku_agent::AgentConfig::default() },
        ..Options::default()
    };
    let h = Harness::start_with(vec![ScriptStep::text("logged answer")], options).await;
    let user = h.post_user("log this").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let log = std::fs::read_to_string(h.agent.session_dir(&h.session.id).join("model-log.jsonl")).expect("log");
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["step"], 1);
    assert!(lines[0]["request"].to_string().contains("log this"));
    assert!(lines[0]["response"].to_string().contains("logged answer"));
}

#[tokio::test]
async fn a_cron_trigger_gets_a_trigger_context_entry_and_the_responsive_lane() {
    let h = Harness::start(vec![ScriptStep::text("Diagnostics completed successfully.")]).await;
    let mut cron = kesoku_core::Message::cronjob_trigger(
        &h.session.id,
        "discord",
        "1234567890123",
        "`Cronjob` at `2026-05-27 21:00:00 CST`:\nRun active diagnostics and output status summary.",
    );
    cron.metadata.extra.insert("cron_job".into(), json!("diagnostics"));
    h.gateway.post(&cron).await.expect("post");
    assert_eq!(h.wait_terminal(&cron.id).await, Status::Processed);
    let request = format!("{:?}", h.model.requests()[0].turns);
    assert!(
        request.contains("[Trigger context]") && request.contains("workflow: diagnostics (source: cron)"),
        "{request}"
    );
    let ledger = h.ledger_for(&cron.id).await;
    assert_eq!((ledger[0].lane, ledger[0].triggered_by.as_str()), (kesoku_core::Lane::Responsive, "cron"));
}

#[tokio::test]
async fn activations_are_checked_at_load_time_for_access_and_depth() {
    let h = Harness::start(vec![]).await;
    // A message of another session, referenced by an activation claiming this one.
    let other = kesoku_core::Message::user_text(
        &kesoku_core::SessionId::from("sess_other"),
        "discord",
        "elsewhere",
        "Eve",
        "secret",
    );
    h.handle
        .store
        .insert_message(&{
            let mut m = other.clone();
            m.status = Status::Responded;
            m
        })
        .await
        .expect("insert");
    let forged = kesoku_core::Activation {
        id: kesoku_core::ActivationId::generate(),
        session_id: h.session.id.clone(),
        chatbot_id: "discord".into(),
        channel_id: "1234567890123".into(),
        triggered_by: "Mallory".into(),
        delegation_user: None,
        depth: 0,
        lane: kesoku_core::Lane::Interactive,
        expected_response: Default::default(),
        locale: None,
        timezone: None,
        created_at: chrono::Utc::now(),
        payload: kesoku_core::ActivationPayload::Message { message_id: other.id.clone() },
    };
    h.handle.ledger.record_enqueued(&kesoku_core::LedgerEntry::enqueued(&forged)).await.expect("ledger");
    h.agent.run_activation(&forged).await;
    let row = h.handle.ledger.get_activation(&forged.id).await.expect("get").expect("row");
    assert_eq!(row.outcome, Some(Outcome::Failed));
    assert!(row.error.as_deref().is_some_and(|e| e.starts_with("access denied")), "{:?}", row.error);

    let mut deep = forged.clone();
    deep.id = kesoku_core::ActivationId::generate();
    deep.depth = 9;
    h.handle.ledger.record_enqueued(&kesoku_core::LedgerEntry::enqueued(&deep)).await.expect("ledger");
    h.agent.run_activation(&deep).await;
    let row = h.handle.ledger.get_activation(&deep.id).await.expect("get").expect("row");
    assert_eq!(row.outcome, Some(Outcome::LimitExceeded));
    assert!(row.error.as_deref().is_some_and(|e| e.contains("depth limit of 4")), "{:?}", row.error);
    assert!(h.model.requests().is_empty(), "the model never saw either");
}
