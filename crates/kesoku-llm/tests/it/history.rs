//! History → turns, table by table: each rule of spec §5.2 / §5.4 as a fixture (messages in the
//! order they were written, then phased as the store returns them) and the expected turns.

use std::path::Path;

use kesoku_core::history::phased_order;
use kesoku_core::{Attachment, Message, MessageId};
use kesoku_llm::history::{HISTORY_START_PLACEHOLDER, INTERRUPTED_TOOL_CALL_ERROR};
use kesoku_llm::{HistoryOptions, Part, TurnRole, history_to_conversation};
use serde_json::json;

use crate::support::{origin, render, session, user, with_id};

/// Transpile `written` (phased first) with `active_root` and compare with `expect`; also check
/// the invariants every output must keep.
#[track_caller]
fn check(written: Vec<Message>, active_root: Option<&str>, expect: &str) {
    let messages = phased_order(written);
    let root = active_root.map(MessageId::from);
    let options = HistoryOptions { active_root: root.as_ref(), attachment_base: Some(Path::new("/workspace")) };
    let conversation = history_to_conversation(&messages, &options);
    let actual = render(&conversation);
    assert_eq!(actual.trim(), expect.trim(), "\n--- actual ---\n{actual}\n");

    // Strict alternation, user first.
    for (index, turn) in conversation.turns.iter().enumerate() {
        let expected = if index % 2 == 0 { TurnRole::User } else { TurnRole::Model };
        assert_eq!(turn.role, expected, "turn {index} breaks alternation:\n{actual}");
        assert!(!turn.parts.is_empty(), "turn {index} is empty");
    }
    // Every result right after the model turn holding its call, in the calls' order.
    for (index, turn) in conversation.turns.iter().enumerate() {
        let calls: Vec<&str> = turn
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::ToolCall(call) => Some(call.id.as_str()),
                Part::Text { .. } | Part::Thought { .. } | Part::ToolResult(_) | Part::Attachment(_) => None,
            })
            .collect();
        let results: Vec<&str> = conversation
            .turns
            .get(index + 1)
            .map(|next| {
                next.parts
                    .iter()
                    .filter_map(|part| match part {
                        Part::ToolResult(result) => Some(result.call_id.as_str()),
                        Part::Text { .. } | Part::Thought { .. } | Part::ToolCall(_) | Part::Attachment(_) => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if turn.role == TurnRole::Model {
            assert_eq!(calls, results, "results of turn {index} are not right after it, in order:\n{actual}");
        }
    }
}

#[test]
fn plain_exchange_with_system_prompt() {
    let root = user("u1", "hello");
    let turn = origin(&root);
    check(
        vec![
            Message::system_prompt(&session(), "You are Kesoku."),
            root.clone(),
            turn.final_text(1, "Hi there.", None),
        ],
        Some("u1"),
        r#"
system: "You are Kesoku."
user: text "hello"
model: text "Hi there."
"#,
    );
}

#[test]
fn notifications_are_left_out() {
    let root = user("u1", "hello");
    let turn = origin(&root);
    check(
        vec![
            root.clone(),
            turn.notification("🔄 Conversation history has been automatically compacted"),
            turn.final_text(1, "Hi.", None),
            Message::notification(&session(), None, "cli", "cli", "standalone notice"),
        ],
        Some("u1"),
        r#"
user: text "hello"
model: text "Hi."
"#,
    );
}

#[test]
fn thoughts_are_kept_only_in_the_active_turn() {
    let first = user("u1", "first question");
    let first_turn = origin(&first);
    let second = user("u2", "second question");
    let second_turn = origin(&second);
    check(
        vec![
            first.clone(),
            first_turn.thought(1, "old reasoning", Some("gemini:old".to_owned())),
            first_turn.final_text(1, "first answer", None),
            second.clone(),
            second_turn.thought(1, "current reasoning", Some("gemini:new".to_owned())),
        ],
        Some("u2"),
        r#"
user: text "first question"
model: text "first answer"
user: text "second question"
model: thought "current reasoning" sig=gemini:new
"#,
    );
}

#[test]
fn without_an_active_turn_every_thought_is_stripped() {
    let root = user("u1", "question");
    let turn = origin(&root);
    check(
        vec![root.clone(), turn.thought(1, "reasoning", None), turn.final_text(1, "answer", None)],
        None,
        r#"
user: text "question"
model: text "answer"
"#,
    );
}

#[test]
fn past_attachments_are_stripped_and_active_ones_sent() {
    let attach = |message: &mut Message, files: &[(&str, &str)]| {
        message.metadata.attachments = Some(
            files
                .iter()
                .map(|(name, mime)| Attachment {
                    path: format!("staging/{name}"),
                    mime_type: (*mime).to_owned(),
                    filename: (*name).to_owned(),
                })
                .collect(),
        );
    };
    let mut first = user("u1", "look at these");
    attach(&mut first, &[("a.png", "image/png"), ("b.csv", "text/csv")]);
    let first_turn = origin(&first);
    let mut second = user("u2", "and this one");
    attach(&mut second, &[("c.pdf", "application/pdf")]);
    let mut only_file = user("u0", "");
    attach(&mut only_file, &[("z.txt", "text/plain")]);
    check(
        vec![only_file, first.clone(), first_turn.final_text(1, "seen", None), second],
        Some("u2"),
        r#"
user: text "[Attachments stripped from history: z.txt]" | text "look at these\n[Attachments stripped from history: a.png, b.csv]"
model: text "seen"
user: text "and this one" | attachment c.pdf (application/pdf) file=/workspace/staging/c.pdf
"#,
    );
}

#[test]
fn tool_calls_and_results_are_kept_and_results_follow_their_calls_in_order() {
    let root = user("u1", "weather in Tokyo and Paris?");
    let turn = origin(&root);
    let call_a = turn.tool_call(1, "call_a", "weather", json!({ "city": "Tokyo" }));
    let call_b = turn.tool_call(1, "call_b", "weather", json!({ "city": "Paris" }));
    // Results written in the opposite order of the calls.
    let result_b = turn.tool_result(&call_b, "Paris: rain", None, None);
    let result_a = turn.tool_result(&call_a, "Tokyo: sunny", Some("sunny".to_owned()), None);
    check(
        vec![
            root.clone(),
            turn.thought(1, "two lookups", None),
            call_a.clone(),
            call_b.clone(),
            result_b,
            result_a,
            turn.final_text(2, "Tokyo is sunny, Paris rainy.", None),
        ],
        Some("u1"),
        r#"
user: text "weather in Tokyo and Paris?"
model: thought "two lookups" | call call_a weather {"city":"Tokyo"} | call call_b weather {"city":"Paris"}
user: result call_a weather ok "Tokyo: sunny" | result call_b weather ok "Paris: rain"
model: text "Tokyo is sunny, Paris rainy."
"#,
    );
}

#[test]
fn text_of_a_step_goes_before_its_calls_and_past_tool_logs_stay() {
    let first = user("u1", "list files");
    let first_turn = origin(&first);
    let call = first_turn.tool_call(1, "c1", "shell", json!({ "command": "ls" }));
    let result = first_turn.tool_result(&call, "a.txt", None, Some("exit status 1".to_owned()));
    let second = user("u2", "thanks");
    check(
        vec![
            first.clone(),
            call.clone(),
            first_turn.final_text(1, "Let me look.", None),
            result,
            first_turn.final_text(2, "There is a.txt.", None),
            second.clone(),
            origin(&second).final_text(1, "You're welcome.", None),
        ],
        Some("u2"),
        r#"
user: text "list files"
model: text "Let me look." | call c1 shell {"command":"ls"}
user: result c1 shell error "exit status 1" "a.txt"
model: text "There is a.txt."
user: text "thanks"
model: text "You're welcome."
"#,
    );
}

#[test]
fn nudges_become_prefixed_user_turns_between_model_steps() {
    let root = user("u1", "do it");
    let turn = origin(&root);
    check(
        vec![
            root.clone(),
            turn.thought(1, "thinking only, no answer", None),
            turn.nudge(1, "Your previous response had empty content. Please summarize."),
            turn.final_text(2, "All done.", None),
        ],
        Some("u1"),
        r#"
user: text "do it"
model: thought "thinking only, no answer"
user: text "[System Notification]\nYour previous response had empty content. Please summarize."
model: text "All done."
"#,
    );
}

#[test]
fn a_nudge_after_an_empty_step_merges_into_the_user_turn() {
    let root = user("u1", "do it");
    let turn = origin(&root);
    let call = turn.tool_call(1, "c1", "job", json!({}));
    check(
        vec![
            root.clone(),
            call.clone(),
            turn.tool_result(&call, "done", None, None),
            turn.nudge(1, "Your previous response had empty content."),
            turn.final_text(2, "All done.", None),
        ],
        Some("u1"),
        r#"
user: text "do it"
model: call c1 job {}
user: result c1 job ok "done" | text "[System Notification]\nYour previous response had empty content."
model: text "All done."
"#,
    );
}

#[test]
fn wakeup_alerts_become_prefixed_user_turns_and_merge_with_user_text() {
    let root = user("u1", "start the build");
    let turn = origin(&root);
    let alert =
        with_id(Message::wakeup_alert(&session(), "cli", "cli", "[System Alert] Background Job job_1 finished"), "w1");
    let already = with_id(Message::wakeup_alert(&session(), "cli", "cli", "[System Notification]\nsecond alert"), "w2");
    check(
        vec![root.clone(), turn.final_text(1, "Started.", None), alert, already],
        Some("w2"),
        r#"
user: text "start the build"
model: text "Started."
user: text "[System Notification]\n[System Alert] Background Job job_1 finished" | text "[System Notification]\nsecond alert"
"#,
    );
}

#[test]
fn an_orphaned_call_gets_a_synthetic_result() {
    let root = user("u1", "run it");
    let turn = origin(&root);
    let call = turn.tool_call(1, "c1", "shell", json!({ "command": "sleep 100" }));
    let next = user("u2", "hello again");
    check(
        vec![root.clone(), call, next],
        Some("u2"),
        &format!(
            r#"
user: text "run it"
model: call c1 shell {{"command":"sleep 100"}}
user: result c1 shell error "{INTERRUPTED_TOOL_CALL_ERROR}" "" | text "hello again"
"#
        ),
    );
}

#[test]
fn a_result_whose_call_is_missing_is_dropped() {
    let root = user("u1", "question");
    let turn = origin(&root);
    let call = turn.tool_call(1, "c_gone", "search", json!({}));
    let result = turn.tool_result(&call, "stale output", None, None);
    check(
        vec![root.clone(), result, turn.final_text(2, "answer", None)],
        Some("u1"),
        r#"
user: text "question"
model: text "answer"
"#,
    );
}

#[test]
fn a_history_starting_with_the_model_gets_a_user_turn_first() {
    let root = user("u1", "hello");
    let mut stray = origin(&root).final_text(1, "left over", None);
    stray.parent_id = None;
    check(
        vec![stray, root.clone()],
        Some("u1"),
        &format!(
            r#"
user: text "{HISTORY_START_PLACEHOLDER}"
model: text "left over"
user: text "hello"
"#
        ),
    );
}

#[test]
fn signatures_are_carried_on_thoughts_calls_and_text() {
    let root = user("u1", "go");
    let turn = origin(&root);
    let mut call = turn.tool_call(1, "c1", "lookup", json!({ "q": "x" }));
    call.metadata.thought_signature = Some("gemini:call-sig".to_owned());
    let mut answer = turn.final_text(2, "found", None);
    answer.metadata.thought_signature = Some("gemini:text-sig".to_owned());
    check(
        vec![
            root.clone(),
            turn.thought(1, "", Some("anthropic:only-sig".to_owned())),
            call.clone(),
            turn.tool_result(&call, "x=1", None, None),
            answer,
        ],
        Some("u1"),
        r#"
user: text "go"
model: thought "" sig=anthropic:only-sig | call c1 lookup {"q":"x"} sig=gemini:call-sig
user: result c1 lookup ok "x=1"
model: text "found" sig=gemini:text-sig
"#,
    );
}

#[test]
fn calls_stored_without_a_provider_id_use_the_message_id() {
    let root = user("u1", "go");
    let turn = origin(&root);
    let mut call = with_id(turn.tool_call(1, "ignored", "legacy_tool", json!({ "a": 1 })), "msg_call_legacy");
    call.metadata.tool_call_id = None;
    let mut result = turn.tool_result(&call, "legacy output", None, None);
    result.metadata.tool_call_id = None;
    check(
        vec![root.clone(), call, result],
        Some("u1"),
        r#"
user: text "go"
model: call msg_call_legacy legacy_tool {"a":1}
user: result msg_call_legacy legacy_tool ok "legacy output"
"#,
    );
}

#[test]
fn the_system_prompt_is_never_a_turn_even_in_mid_history() {
    let root = user("u1", "hi");
    check(
        vec![
            root.clone(),
            Message::system_prompt(&session(), "Rule one."),
            Message::system_prompt(&session(), "Rule two."),
        ],
        Some("u1"),
        r#"
system: "Rule one.\n\nRule two."
user: text "hi"
"#,
    );
}

#[test]
fn the_spec_trajectory_6_1_transpiles() {
    let root = with_id(user("msg_user_001", "Run tests for agent history module"), "msg_user_001");
    let turn = origin(&root);
    let call = with_id(
        turn.tool_call(1, "call_001", "run_shell_command", json!({ "command": "uv run pytest tests/test_history.py" })),
        "msg_call_001",
    );
    check(
        vec![
            root.clone(),
            turn.thought(1, "I need to run the unit tests.", None),
            call.clone(),
            turn.tool_result(&call, "5 passed in 0.42s", Some("5 passed in 0.42s".to_owned()), None),
            turn.final_text(2, "All 5 tests passed.", None),
        ],
        None,
        r#"
user: text "Run tests for agent history module"
model: call call_001 run_shell_command {"command":"uv run pytest tests/test_history.py"}
user: result call_001 run_shell_command ok "5 passed in 0.42s"
model: text "All 5 tests passed."
"#,
    );
}
