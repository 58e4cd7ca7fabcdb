//! The shareable HTML page of a trajectory.

use chrono::{TimeZone, Utc};
use kesoku_core::{Attachment, Message, Session, SessionId, Status, TurnMetrics, TurnOrigin};
use kesoku_server::{escape_html, render_trajectory_html};

fn session() -> Session {
    let at = Utc.with_ymd_and_hms(2026, 5, 27, 12, 50, 0).single().expect("a time");
    let mut session = Session::new("discord", "<chan>", at);
    session.id = SessionId::from("sess_demo");
    session
}

#[test]
fn everything_from_messages_is_escaped() {
    let session = session();
    let mut root =
        Message::user_text(&session.id, "discord", "<chan>", "<b>Chii</b>", "<script>alert('x')</script> & more");
    root.metadata.attachments =
        Some(vec![Attachment { path: "p".into(), mime_type: "text/plain".into(), filename: "<img src=x>.txt".into() }]);
    let origin = TurnOrigin::of(&root, "Kesoku");
    let call = origin.tool_call(1, "c", "<tool>", serde_json::json!({"q": "</pre><script>"}));
    let messages = vec![
        root.clone(),
        origin.thought(1, "<thinking>", None),
        call.clone(),
        origin.tool_result(&call, "\"quoted\" <out>", None, Some("<err>".into())),
        origin.final_text(2, "</div><script>bad()</script>", None),
    ];
    let page = render_trajectory_html(&session, &messages);
    assert!(!page.contains("<script"), "no script element may appear:\n{page}");
    assert!(!page.contains("<img"), "no image element may appear");
    assert!(!page.contains("<b>Chii"));
    assert!(
        !page.contains("<tool>") && !page.contains("<thinking>") && !page.contains("<err>") && !page.contains("<chan>")
    );
    for escaped in [
        "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; more",
        "&lt;b&gt;Chii&lt;/b&gt;",
        "&lt;img src=x&gt;.txt",
        "&quot;quoted&quot; &lt;out&gt;",
        "&lt;/div&gt;&lt;script&gt;bad()&lt;/script&gt;",
        "&lt;chan&gt;",
    ] {
        assert!(page.contains(escaped), "missing `{escaped}`");
    }
    assert_eq!(escape_html("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
}

#[test]
fn the_page_is_self_contained_and_shows_the_trajectory() {
    let session = session();
    let root = Message::user_text(&session.id, "discord", "c", "Chii", "Run tests");
    let origin = TurnOrigin::of(&root, "Kesoku");
    let ok_call = origin.tool_call(1, "c1", "shell", serde_json::json!({"command": "pytest"}));
    let bad_call = origin.tool_call(1, "c2", "search", serde_json::json!({}));
    let open_call = origin.tool_call(1, "c3", "fetch", serde_json::json!({}));
    let mut cut_call = origin.tool_call(1, "c4", "sleep", serde_json::json!({}));
    cut_call.status = Status::Interrupted;
    let metrics =
        TurnMetrics { session_turns: 3, context_tokens: 8421, turn_tool_calls: 1, turn_tokens: 1042, turn_time: 2.1 };
    let messages = vec![
        root.clone(),
        origin.thought(1, "I will run them.", None),
        ok_call.clone(),
        bad_call.clone(),
        open_call,
        cut_call,
        origin.tool_result(&ok_call, "5 passed", None, None),
        origin.tool_result(&bad_call, "503", None, Some("service down".into())),
        origin.final_text(2, "All 5 tests passed.", Some(metrics)),
        origin.notification("🔄 compacted"),
    ];
    let page = render_trajectory_html(&session, &messages);
    assert!(page.starts_with("<!doctype html>"));
    for external in ["http://", "https://", "<link", "<script", "@import", "url("] {
        assert!(!page.contains(external), "the page must not load `{external}`");
    }
    assert!(page.contains("Content-Security-Policy") && page.contains("default-src 'none'"));
    assert!(page.contains("<details class=\"thought\"><summary>💭 Thought</summary>"));
    assert!(page.contains("✅ 🛠️ shell"), "a call with a result is ✅");
    assert!(page.contains("❌ 🛠️ search") && page.contains("service down"), "a call with tool_error is ❌");
    assert!(page.contains("⏳ 🛠️ fetch"), "a call without result is ⏳");
    assert!(page.contains("⛔ 🛠️ sleep"), "an interrupted call without result is ⛔");
    assert!(page.contains("All 5 tests passed.") && page.contains("2.1 s") && page.contains("1042 tokens"));
    assert!(page.contains("class=\"msg notification\""));
    assert_eq!(page.matches("<section class=\"turn\">").count(), 1, "one turn");
    assert_eq!(page.matches("5 passed").count(), 1, "a result is shown once, with its call");
}

#[test]
fn an_empty_session_says_so() {
    let page = render_trajectory_html(&session(), &[]);
    assert!(page.contains("This session has no messages."));
}
