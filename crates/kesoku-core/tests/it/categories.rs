//! One constructor per message category, each checked against its row of the spec's field table (§3).

use kesoku_core::message::{ERROR_NOTIFICATION_MAX_CHARS, ERROR_NOTIFICATION_PREFIX};
use kesoku_core::{Message, MessageType, Role, SessionId, Status, TurnMetrics, TurnOrigin};
use serde_json::json;

/// Where chatbot and channel ids must come from, per the table.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scope {
    /// The active chatbot and the platform's channel.
    Platform,
    /// Hardcoded `"system"`.
    System,
}

/// A row of the spec's table, as data.
struct Row {
    category: &'static str,
    role: Role,
    message_type: MessageType,
    scope: Scope,
    sender: &'static str,
    initial_status: Status,
    /// The metadata keys the message carries (sorted).
    metadata_keys: &'static [&'static str],
    /// Whether the message belongs to a turn (has a parent).
    has_parent: bool,
}

fn check(message: &Message, row: &Row) {
    let category = row.category;
    assert_eq!(message.role, row.role, "{category}: role");
    assert_eq!(message.message_type, row.message_type, "{category}: type");
    let (chatbot, channel) = match row.scope {
        Scope::Platform => ("discord", "1234567890123"),
        Scope::System => ("system", "system"),
    };
    assert_eq!(message.chatbot_id, chatbot, "{category}: chatbot_id");
    assert_eq!(message.channel_id, channel, "{category}: channel_id");
    assert_eq!(message.sender, row.sender, "{category}: sender");
    assert_eq!(message.status, row.initial_status, "{category}: initial status");
    assert_eq!(message.parent_id.is_some(), row.has_parent, "{category}: parent");
    let value = message.metadata.to_value();
    let mut keys: Vec<&str> = value.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
    keys.sort_unstable();
    assert_eq!(keys, row.metadata_keys, "{category}: metadata keys");
    // The JSON form uses the spec's names.
    let json = serde_json::to_value(message).expect("serializes");
    assert_eq!(json["type"], json!(row.message_type.as_str()), "{category}: JSON type");
    assert_eq!(json["status"], json!(row.initial_status.as_str()), "{category}: JSON status");
}

#[test]
fn every_category_matches_its_row() {
    let session = SessionId::from("sess_table");
    let (bot, channel) = ("discord", "1234567890123");
    let mut user = Message::user_text(&session, bot, channel, "Chii", "What is the weather in Tokyo?");
    user.metadata.discord_message_id = Some("998877".into());
    let origin = TurnOrigin::of(&user, "Kesoku");
    let call = origin.tool_call(1, "call_1", "web_search", json!({"query": "Tokyo weather"}));
    let metrics =
        TurnMetrics { session_turns: 1, context_tokens: 10, turn_tool_calls: 1, turn_tokens: 20, turn_time: 0.5 };

    let cases: Vec<(Message, Row)> = vec![
        (
            user.clone(),
            Row {
                category: "Standard User Message",
                role: Role::User,
                message_type: MessageType::Text,
                scope: Scope::Platform,
                sender: "Chii",
                initial_status: Status::PendingAgent,
                metadata_keys: &["discord_message_id"],
                has_parent: false,
            },
        ),
        (
            Message::cronjob_trigger(&session, bot, channel, "Run status diagnostics"),
            Row {
                category: "Cronjob Trigger Message",
                role: Role::User,
                message_type: MessageType::Text,
                scope: Scope::Platform,
                sender: "Cronjob",
                initial_status: Status::PendingAgent,
                metadata_keys: &["is_cronjob"],
                has_parent: false,
            },
        ),
        (
            Message::compaction_trigger(
                &session,
                bot,
                channel,
                "[System Notification] The user manually requested compaction",
            ),
            Row {
                category: "Manual Compaction Trigger",
                role: Role::User,
                message_type: MessageType::Text,
                scope: Scope::Platform,
                sender: "System",
                initial_status: Status::PendingAgent,
                metadata_keys: &["is_compaction"],
                has_parent: false,
            },
        ),
        (
            origin.thought(1, "I need to check Tokyo weather using the search tool.", None),
            Row {
                category: "Assistant Thought",
                role: Role::Assistant,
                message_type: MessageType::Thought,
                scope: Scope::Platform,
                sender: "Kesoku",
                initial_status: Status::Responded,
                metadata_keys: &[],
                has_parent: true,
            },
        ),
        (
            origin.final_text(2, "The current weather in Tokyo is sunny, 24°C.", Some(metrics)),
            Row {
                category: "Assistant Final Text",
                role: Role::Assistant,
                message_type: MessageType::Text,
                scope: Scope::Platform,
                sender: "Kesoku",
                initial_status: Status::Pending,
                metadata_keys: &["turn_metrics"],
                has_parent: true,
            },
        ),
        (
            call.clone(),
            Row {
                category: "Tool Call Message",
                role: Role::Tool,
                message_type: MessageType::ToolCall,
                scope: Scope::Platform,
                sender: "Kesoku",
                initial_status: Status::Responded,
                metadata_keys: &["tool_arguments", "tool_call_id", "tool_name"],
                has_parent: true,
            },
        ),
        (
            origin.tool_result(&call, "[STDOUT] Tokyo: Sunny, 24°C ...", Some("Sunny, 24°C".into()), None),
            Row {
                category: "Tool Result Message",
                role: Role::Tool,
                message_type: MessageType::ToolResult,
                scope: Scope::Platform,
                sender: "web_search",
                initial_status: Status::Responded,
                metadata_keys: &["tool_call_id", "tool_name", "tool_result"],
                has_parent: true,
            },
        ),
        (
            Message::system_prompt(&session, "# System Instructions\nYou are Kesoku..."),
            Row {
                category: "System Prompt Message",
                role: Role::System,
                message_type: MessageType::Text,
                scope: Scope::System,
                sender: "System",
                initial_status: Status::Responded,
                metadata_keys: &[],
                has_parent: false,
            },
        ),
        (
            Message::wakeup_alert(&session, bot, channel, "[System Alert] Background Job job_123 finished..."),
            Row {
                category: "Background Wakeup Alert",
                role: Role::System,
                message_type: MessageType::Text,
                scope: Scope::Platform,
                sender: "System",
                initial_status: Status::PendingAgent,
                metadata_keys: &[],
                has_parent: false,
            },
        ),
        (
            origin.nudge(1, "Your previous response had empty content. Please summarize..."),
            Row {
                category: "Nudge Message",
                role: Role::System,
                message_type: MessageType::Text,
                scope: Scope::Platform,
                sender: "System",
                initial_status: Status::Responded,
                metadata_keys: &[],
                has_parent: true,
            },
        ),
        (
            Message::notification(
                &session,
                None,
                bot,
                channel,
                "🔄 Conversation history has been automatically compacted...",
            ),
            Row {
                category: "User-Facing Notification",
                role: Role::Assistant,
                message_type: MessageType::Text,
                scope: Scope::Platform,
                sender: "Notification",
                initial_status: Status::Pending,
                metadata_keys: &[],
                has_parent: false,
            },
        ),
        (
            origin.error_notification(1, "provider unavailable"),
            Row {
                category: "System Error Notification",
                role: Role::Assistant,
                message_type: MessageType::Text,
                scope: Scope::Platform,
                sender: "Kesoku",
                initial_status: Status::Pending,
                metadata_keys: &[],
                has_parent: true,
            },
        ),
    ];
    assert_eq!(cases.len(), 12, "one case per row of the table");
    for (message, row) in &cases {
        check(message, row);
    }
}

/// The row Kesoku adds to the spec's table (documented in `kesoku_core::message`).
#[test]
fn a_compaction_summary_matches_its_documented_row() {
    let session = SessionId::from("sess_table");
    let summary = Message::compaction_summary(
        &session,
        "discord",
        "1234567890123",
        "[Summary of earlier conversation] (3 turns)\nThe user asked …",
    );
    check(
        &summary,
        &Row {
            category: "Compaction Summary",
            role: Role::System,
            message_type: MessageType::Text,
            scope: Scope::Platform,
            sender: "System",
            initial_status: Status::Responded,
            metadata_keys: &[],
            has_parent: false,
        },
    );
    assert_eq!(summary.step, 0, "it belongs to no model step");
    assert!(!summary.awaits_delivery(), "no chat window shows it");
    assert!(!summary.is_notification(), "the model sees it, unlike a user-facing notification");
    // `responded` is final: no worker claims it and no chatbot delivers it.
    assert!(summary.status.check_transition(Status::Processing).is_err());
}

#[test]
fn hidden_system_messages_never_await_delivery() {
    let session = SessionId::from("s");
    let user = Message::user_text(&session, "api", "web", "User", "hi");
    let origin = TurnOrigin::of(&user, "Kesoku");
    let call = origin.tool_call(1, "c1", "search", json!({}));
    let hidden = [
        Message::system_prompt(&session, "You are Kesoku."),
        Message::wakeup_alert(&session, "api", "web", "[System Alert] job done"),
        origin.nudge(1, "Your previous response had empty content."),
        Message::compaction_summary(&session, "api", "web", "summary"),
        user.clone(),
    ];
    for message in &hidden {
        assert!(!message.awaits_delivery(), "{:?} {:?} is not delivered", message.role, message.content);
    }
    let shown = [
        origin.thought(1, "thinking", None),
        origin.tool_result(&call, "out", None, None),
        call,
        origin.final_text(1, "answer", None),
        origin.notification("🔄 compacted"),
        origin.error_notification(1, "boom"),
    ];
    for message in &shown {
        assert!(message.awaits_delivery(), "{:?} {:?} is delivered", message.role, message.content);
    }
}

#[test]
fn tool_messages_link_and_render_as_the_spec_shows() {
    let session = SessionId::from("s");
    let user = Message::user_text(&session, "cli", "cli", "User", "run tests");
    let origin = TurnOrigin::of(&user, "Kesoku");
    let call =
        origin.tool_call(3, "c1", "run_shell_command", json!({"command": "uv run pytest tests/test_history.py"}));
    assert_eq!(
        call.content,
        "Calling tool `run_shell_command` with arguments:\n```json\n{\n  \"command\": \"uv run pytest tests/test_history.py\"\n}\n```"
    );
    assert_eq!(call.parent_id.as_ref(), Some(&user.id));
    let result = origin.tool_result(&call, "out", None, Some("exit code 1".into()));
    assert_eq!(result.parent_id.as_ref(), Some(&call.id), "a result answers its call");
    assert_eq!(result.step, 3, "a result belongs to its call's step");
    assert_eq!(result.metadata.tool_error.as_deref(), Some("exit code 1"));
    assert_eq!(result.metadata.tool_call_id.as_deref(), Some("c1"));
}

#[test]
fn error_notification_is_short() {
    let session = SessionId::from("s");
    let user = Message::user_text(&session, "cli", "cli", "User", "x");
    let origin = TurnOrigin::of(&user, "Kesoku");
    let long = "e".repeat(5_000);
    let message = origin.error_notification(1, &long);
    assert!(message.content.starts_with(ERROR_NOTIFICATION_PREFIX));
    assert!(message.content.chars().count() <= ERROR_NOTIFICATION_MAX_CHARS, "{}", message.content.len());
    assert!(message.content.ends_with('…'));
}
