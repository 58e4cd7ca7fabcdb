//! The phased order of spec §5.1 on in-memory messages.

use kesoku_core::history::phased_order;
use kesoku_core::{Message, MessageType, SessionId, TurnOrigin};
use serde_json::json;

fn label(message: &Message) -> String {
    format!("{}:{}", message.message_type.as_str(), message.content)
}

#[test]
fn parallel_calls_stay_together_and_results_follow_calls() {
    let session = SessionId::from("s");
    let first = Message::user_text(&session, "cli", "cli", "User", "u1");
    let origin = TurnOrigin::of(&first, "Kesoku");
    let call_a = origin.tool_call(1, "a", "ta", json!({}));
    let call_b = origin.tool_call(1, "b", "tb", json!({}));
    let thought = origin.thought(1, "t1", None);
    // Written in an order that interleaves: results land before the second call was stored,
    // and the step-2 thought is written before a late step-1 result.
    let result_a = origin.tool_result(&call_a, "ra", None, None);
    let result_b = origin.tool_result(&call_b, "rb", None, None);
    let thought2 = origin.thought(2, "t2", None);
    let answer = origin.final_text(2, "done", None);
    let second = Message::user_text(&session, "cli", "cli", "User", "u2");
    let written = vec![
        first.clone(),
        call_a.clone(),
        result_a.clone(),
        thought.clone(),
        second.clone(),
        call_b.clone(),
        thought2.clone(),
        result_b.clone(),
        answer.clone(),
    ];
    let ordered: Vec<String> = phased_order(written).iter().map(label).collect();
    assert_eq!(
        ordered,
        vec![
            "text:u1".to_string(),
            "thought:t1".into(),
            label(&call_a),
            label(&call_b),
            "tool_result:ra".into(),
            "tool_result:rb".into(),
            "thought:t2".into(),
            "text:done".into(),
            "text:u2".into(),
        ]
    );
    assert_eq!(answer.message_type, MessageType::Text);
}
