//! Whole turns: the spec's trajectory 6.1, parallel tools, nudges, failures, limits.

use std::sync::Arc;

use kesoku_agent::{LaneLimits, Limits};
use kesoku_core::{Message, MessageId, MessageType, Outcome, Role, Status};
use kesoku_llm::{LlmError, LlmErrorKind, Part, ScriptStep, ScriptedModel, ToolCall, TurnRole};
use serde_json::json;

use crate::harness::{BOT, CHANNEL, Harness, Options, shape};

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

/// A tool that looks its own call up in the store when it runs and answers whether it found it.
struct FindsItsCall {
    spec: kesoku_tools::ToolSpec,
    store: std::sync::Arc<dyn kesoku_store::Store>,
}

#[async_trait::async_trait]
impl kesoku_tools::Tool for FindsItsCall {
    fn spec(&self) -> &kesoku_tools::ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &kesoku_tools::ToolContext, _arguments: serde_json::Value) -> kesoku_tools::ToolOutput {
        let stored = match self.store.session_history(&ctx.session_id).await {
            Ok(history) => history,
            Err(error) => return kesoku_tools::ToolOutput::failure(error.to_string()),
        };
        let found = stored.iter().any(|m| {
            m.message_type == MessageType::ToolCall && m.metadata.tool_call_id.as_deref() == Some(ctx.call_id.as_str())
        });
        kesoku_tools::ToolOutput::success(if found { "my call is stored" } else { "my call is not stored" })
    }
}

/// A scripted model that, at each request, counts the tool results stored in the session.
struct CountsStoredResults {
    script: kesoku_llm::ScriptedModel,
    store: std::sync::Arc<dyn kesoku_store::Store>,
    session: kesoku_core::SessionId,
    stored_at_each_request: std::sync::Mutex<Vec<usize>>,
}

#[async_trait::async_trait]
impl kesoku_llm::Model for CountsStoredResults {
    fn name(&self) -> &str {
        self.script.name()
    }

    fn info(&self) -> &kesoku_llm::ModelInfo {
        self.script.info()
    }

    async fn stream(&self, request: &kesoku_llm::Request) -> Result<kesoku_llm::ResponseStream, LlmError> {
        let history = self.store.session_history(&self.session).await.expect("history");
        let results = history.iter().filter(|m| m.message_type == MessageType::ToolResult).count();
        self.stored_at_each_request.lock().expect("lock").push(results);
        self.script.stream(request).await
    }
}

fn probe_call(id: &str) -> Part {
    Part::ToolCall(ToolCall { id: id.to_owned(), name: "probe".to_owned(), arguments: json!({}), signature: None })
}

#[tokio::test]
async fn a_tool_runs_only_after_its_call_is_stored_and_the_model_only_after_every_result() {
    let mut h = Harness::start(vec![]).await;
    let mut registry = kesoku_tools::Registry::new();
    let spec = kesoku_tools::ToolSpec {
        name: "probe".to_owned(),
        description: "Whether this call is stored.".to_owned(),
        parameters: json!({"type": "object", "properties": {}}),
    };
    registry.register(FindsItsCall { spec, store: std::sync::Arc::clone(&h.handle.store) }).expect("register");
    let model = std::sync::Arc::new(CountsStoredResults {
        script: kesoku_llm::ScriptedModel::new(
            "scripted",
            vec![
                ScriptStep::parts(vec![probe_call("p1"), probe_call("p2")]),
                ScriptStep::parts(vec![probe_call("p3")]),
                ScriptStep::text("done"),
            ],
        ),
        store: std::sync::Arc::clone(&h.handle.store),
        session: h.session.id.clone(),
        stored_at_each_request: std::sync::Mutex::new(Vec::new()),
    });
    let options = Options { tools: Some(std::sync::Arc::new(registry)), ..Options::default() };
    h.reboot_with_model(model.clone(), options).await;
    let user = h.post_user("probe twice").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);

    let messages = h.history().await;
    let results: Vec<&str> =
        messages.iter().filter(|m| m.message_type == MessageType::ToolResult).map(|m| m.content.as_str()).collect();
    assert_eq!(results, ["my call is stored"; 3], "every tool found its call stored when it ran");
    // Each model call went out after every result of the steps before it was stored.
    assert_eq!(*model.stored_at_each_request.lock().expect("lock"), [0, 2, 3]);
    // Stored in step order: calls before their results, results before the next step.
    let steps: Vec<(u32, MessageType)> = messages[1..].iter().map(|m| (m.step, m.message_type)).collect();
    assert_eq!(
        steps,
        [
            (1, MessageType::ToolCall),
            (1, MessageType::ToolCall),
            (1, MessageType::ToolResult),
            (1, MessageType::ToolResult),
            (2, MessageType::ToolCall),
            (2, MessageType::ToolResult),
            (3, MessageType::Text),
        ]
    );
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
    cron.metadata.cron_job = Some("diagnostics".to_owned());
    h.gateway.post(&cron).await.expect("post");
    assert_eq!(h.wait_terminal(&cron.id).await, Status::Processed);
    let request = format!("{:?}", h.model.requests()[0].turns);
    assert!(
        request.contains("[Trigger context]") && request.contains("workflow: diagnostics (source: cron)"),
        "{request}"
    );
    let ledger = h.ledger_for(&cron.id).await;
    assert_eq!((ledger[0].lane, ledger[0].triggered_by.as_str()), (kesoku_core::Lane::Responsive, "cron:diagnostics"));
    assert_eq!(ledger[0].kind, kesoku_core::ActivationKind::Workflow);
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
        agent: None,
        orchestration: None,
        lane: kesoku_core::Lane::Interactive,
        expected_response: Default::default(),
        locale: None,
        timezone: None,
        model: None,
        output_schema: None,
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
    assert_eq!(row.outcome, Some(Outcome::Refused));
    assert!(row.error.as_deref().is_some_and(|e| e.contains("depth limit of 3")), "{:?}", row.error);
    // Another session's message is not closed by a forged activation.
    assert_eq!(h.status_of(&other.id).await, Status::Responded);
    assert!(h.model.requests().is_empty(), "the model never saw either");
}

#[tokio::test]
async fn a_message_naming_a_model_is_answered_by_it_and_an_unknown_name_by_the_default() {
    let fast = ScriptedModel::new("fast", vec![ScriptStep::text("from fast")]);
    let options = Options { extra_models: vec![Arc::new(fast.clone())], ..Options::default() };
    let harness = Harness::start_with(vec![ScriptStep::text("from the default")], options).await;
    let answer_to = |root: MessageId| {
        move |m: &Message| {
            m.role == Role::Assistant && m.message_type == MessageType::Text && m.parent_id.as_ref() == Some(&root)
        }
    };

    let mut chosen = Message::user_text(&harness.session.id, BOT, CHANNEL, "Chii", "quick one");
    chosen.metadata.model = Some("fast".into());
    let chosen = harness.gateway.post(&chosen).await.expect("post").message;
    assert_eq!(harness.wait_for(answer_to(chosen.id.clone())).await.content, "from fast");
    assert_eq!(fast.requests().len(), 1);

    let mut unknown = Message::user_text(&harness.session.id, BOT, CHANNEL, "Chii", "another");
    unknown.metadata.model = Some("no-such-model".into());
    let unknown = harness.gateway.post(&unknown).await.expect("post").message;
    assert_eq!(harness.wait_for(answer_to(unknown.id.clone())).await.content, "from the default");
    assert_eq!(fast.requests().len(), 1, "the unknown name did not reach the fast model");
}
