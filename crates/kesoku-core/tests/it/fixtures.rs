//! The spec's section 6 trajectories round-trip through serde unchanged.

use kesoku_core::{Message, MessageType, Role, Status};
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

fn check_round_trip(name: &str) -> Vec<Message> {
    let original = load(name);
    let messages: Vec<Message> = serde_json::from_value(original.clone()).expect("fixture deserializes as messages");
    let back = serde_json::to_value(&messages).expect("messages serialize");
    assert_eq!(back, original, "{name} must round-trip unchanged");
    messages
}

#[test]
fn trajectory_6_1_round_trips_with_typed_metadata() {
    let messages = check_round_trip("trajectory_6_1.json");
    let call = &messages[2];
    assert_eq!((call.role, call.message_type, call.status), (Role::Tool, MessageType::ToolCall, Status::Responded));
    assert_eq!(call.metadata.tool_name.as_deref(), Some("run_shell_command"));
    assert_eq!(
        call.metadata.tool_arguments.as_ref().and_then(|a| a.get("command")).and_then(Value::as_str),
        Some("uv run pytest tests/test_history.py")
    );
    let result = &messages[3];
    assert_eq!(result.parent_id.as_ref().map(|p| p.as_str()), Some("msg_call_001"));
    assert_eq!(result.metadata.tool_result.as_deref(), Some("5 passed in 0.42s"));
    let metrics = messages[4].metadata.turn_metrics.as_ref().expect("final text has turn_metrics");
    assert_eq!((metrics.session_turns, metrics.context_tokens, metrics.turn_tool_calls), (3, 8421, 1));
    assert_eq!((metrics.turn_tokens, metrics.turn_time), (1042, 2.1));
}

#[test]
fn trajectory_6_2_keeps_unknown_platform_keys() {
    let messages = check_round_trip("trajectory_6_2.json");
    assert_eq!(messages[0].metadata.extra.get("wechat_cronjob"), Some(&Value::Bool(true)));
    assert_eq!(messages[0].sender, "Cronjob");
}

#[test]
fn trajectory_6_3_round_trips() {
    let messages = check_round_trip("trajectory_6_3.json");
    assert_eq!(messages[0].status, Status::Interrupted);
    assert_eq!(messages[2].status, Status::PendingAgent);
}

#[test]
fn null_metadata_reads_as_empty_and_bad_enum_is_an_error() {
    let json = r#"{"id":"m","session_id":"s","chatbot_id":"cli","channel_id":"cli","sender":"User",
        "role":"user","type":"text","content":"hi","status":"pending_agent","metadata":null}"#;
    let message: Message = serde_json::from_str(json).expect("null metadata is accepted");
    assert!(message.metadata.is_empty());
    let bad = json.replace("pending_agent", "pending_agnet");
    let error = serde_json::from_str::<Message>(&bad).expect_err("unknown status is rejected");
    assert!(error.to_string().contains("pending_agnet"), "{error}");
}
