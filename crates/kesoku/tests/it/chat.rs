//! `kesoku chat` one-shot turns against a mock OpenAI-style server.

use kesoku_core::{Message, MessageType, Role, Status};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockPart, MockReply, MockServer, Vendor};
use serde_json::json;

use crate::support::{Workspace, mock_model, stderr, stdout};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);

async fn init(workspace: &Workspace) {
    let output = workspace.run(&["init"], &[]).await;
    assert!(output.status.success(), "init failed: {}", stderr(&output));
}

async fn history(workspace: &Workspace) -> Vec<Message> {
    let list = workspace.run(&["history", "list"], &[]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    let session = stdout(&list).split_whitespace().next().expect("a session id").to_owned();
    let show = workspace.run(&["history", "show", &session, "--json"], &[]).await;
    assert!(show.status.success(), "{}", stderr(&show));
    serde_json::from_slice(&show.stdout).expect("history --json is a list of messages")
}

#[tokio::test]
async fn a_tool_turn_runs_end_to_end_and_is_stored_as_the_spec_says() {
    let server = MockServer::start(
        Vendor::OpenAi,
        vec![
            MockReply::Answer(MockAnswer::parts(vec![MockPart::tool_call(
                "call_1",
                "run_shell_command",
                json!({"command": "echo $((25 + 15))"}),
            )])),
            MockReply::text("25 + 15 = 40."),
        ],
    )
    .await;
    let workspace = Workspace::with_config(&mock_model(&server.base_url()));
    init(&workspace).await;
    let output = workspace.run(&["chat", "What is 25 + 15?"], &[KEY]).await;
    let out = stdout(&output);
    assert!(output.status.success(), "chat failed: {}\n{out}", stderr(&output));
    assert!(out.contains("25 + 15 = 40."), "{out}");
    assert!(out.contains("run_shell_command"), "the tool call is shown: {out}");
    assert!(out.contains("40"), "{out}");

    let messages = history(&workspace).await;
    let shape: Vec<(Role, MessageType, &str, Status)> =
        messages.iter().map(|m| (m.role, m.message_type, m.sender.as_str(), m.status)).collect();
    assert_eq!(
        shape,
        vec![
            (Role::User, MessageType::Text, "User", Status::Processed),
            (Role::Tool, MessageType::ToolCall, "Kesoku", Status::Delivered),
            (Role::Tool, MessageType::ToolResult, "run_shell_command", Status::Delivered),
            (Role::Assistant, MessageType::Text, "Kesoku", Status::Delivered),
        ]
    );
    let root = &messages[0];
    assert_eq!((root.chatbot_id.as_str(), root.channel_id.as_str()), ("cli", "cli"));
    assert_eq!(messages[1].parent_id.as_ref(), Some(&root.id));
    assert_eq!(messages[2].parent_id.as_ref(), Some(&messages[1].id), "a result answers its call");
    assert!(messages[2].content.starts_with("=== STDOUT ===\n40"), "{}", messages[2].content);
    let metrics = messages[3].metadata.turn_metrics.as_ref().expect("turn metrics on the final text");
    assert_eq!((metrics.session_turns, metrics.turn_tool_calls), (1, 1));

    // The second request carried the tool result after the call, and the secret never left the process.
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let body = requests[1].body.to_string();
    assert!(body.contains("call_1") && body.contains("=== STDOUT ==="), "{body}");

    let ledger = workspace.run(&["ledger"], &[]).await;
    let rows = stdout(&ledger);
    assert!(rows.contains("interactive message               depth 0  succeeded"), "{rows}");
    let filtered = workspace.run(&["ledger", "--kind", "message", "--lane", "interactive"], &[]).await;
    assert_eq!(stdout(&filtered), rows, "the one activation is an interactive message");
    let background = workspace.run(&["ledger", "--lane", "background"], &[]).await;
    assert_eq!(stdout(&background).trim(), "no activations recorded");
    let bad = workspace.run(&["ledger", "--kind", "chat"], &[]).await;
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("expected one of message, workflow"), "{}", stderr(&bad));
}

#[tokio::test]
async fn a_provider_outage_ends_in_error_with_a_notification_and_a_nonzero_exit() {
    let server = MockServer::start(
        Vendor::OpenAi,
        vec![MockReply::error(500, "upstream exploded"), MockReply::error(500, "upstream exploded")],
    )
    .await;
    let workspace = Workspace::with_config(&mock_model(&server.base_url()));
    init(&workspace).await;
    let output = workspace.run(&["chat", "hello"], &[KEY]).await;
    assert!(!output.status.success());
    let out = stdout(&output);
    assert!(out.contains("⚠️ An error occurred while processing your request"), "{out}");
    assert!(!out.contains(MOCK_API_KEY) && !stderr(&output).contains(MOCK_API_KEY), "no secret in output");
    let messages = history(&workspace).await;
    assert_eq!(messages[0].status, Status::Error);
    assert_eq!(messages.last().map(|m| m.status), Some(Status::Delivered));
}

#[tokio::test]
async fn missing_key_and_missing_model_say_exactly_what_to_set() {
    let workspace = Workspace::with_config(&mock_model("http://127.0.0.1:9/v1"));
    init(&workspace).await;
    let output = workspace.run(&["chat", "hi"], &[]).await;
    assert!(!output.status.success());
    assert!(stderr(&output).contains("KESOKU_TEST_MOCK_KEY"), "{}", stderr(&output));

    let bare = Workspace::with_config("");
    init(&bare).await;
    let output = bare.run(&["chat", "hi"], &[]).await;
    assert!(!output.status.success());
    assert!(stderr(&output).contains("[models.NAME]"), "{}", stderr(&output));
}

#[tokio::test]
async fn a_typo_in_the_config_names_the_key_the_file_and_the_line() {
    let workspace = Workspace::with_config("[agent]\nname = \"Kesoku\"\nqueue_mod = \"queue\"\n");
    let output = workspace.run(&["history", "list"], &[]).await;
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("kesoku.toml:3:"), "{err}");
    assert!(err.contains("queue_mod"), "{err}");
    assert!(err.contains("queue_mode"), "says what is expected: {err}");
}

#[tokio::test]
async fn a_bad_cron_job_or_http_address_is_refused_with_the_file_named() {
    let workspace = Workspace::with_config(
        "[[cron]]\nname = \"nightly\"\nschedule = \"0 25 * * *\"\nprompt = \"x\"\nchannel = \"ops\"\n",
    );
    let output = workspace.run(&["history", "list"], &[]).await;
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("kesoku.toml") && err.contains("nightly") && err.contains("0 25 * * *"), "{err}");

    let workspace = Workspace::with_config("[http]\nlisten = \"localhost\"\n");
    let output = workspace.run(&["history", "list"], &[]).await;
    let err = stderr(&output);
    assert!(err.contains("kesoku.toml:2") && err.contains("IP:PORT"), "{err}");
}

#[tokio::test]
async fn models_check_reports_latency_and_usage_or_a_clear_auth_error() {
    let server = MockServer::start(Vendor::OpenAi, vec![MockReply::text("pong")]).await;
    let workspace = Workspace::with_config(&mock_model(&server.base_url()));
    let output = workspace.run(&["models", "check", "mock"], &[KEY]).await;
    let out = stdout(&output);
    assert!(output.status.success(), "{}\n{out}", stderr(&output));
    assert!(out.contains("mock: ok") && out.contains("usage:") && out.contains("pong"), "{out}");

    let wrong = workspace.run(&["models", "check", "mock"], &[("KESOKU_TEST_MOCK_KEY", "sk-wrong-secret-value")]).await;
    assert!(!wrong.status.success());
    let err = format!("{}{}", stderr(&wrong), stdout(&wrong));
    assert!(err.contains("KESOKU_TEST_MOCK_KEY"), "names the variable: {err}");
    assert!(!err.contains("sk-wrong-secret-value"), "never the key: {err}");
    let listed = workspace.run(&["models", "list"], &[]).await;
    assert!(stdout(&listed).contains("mock-model"), "{}", stdout(&listed));
}
