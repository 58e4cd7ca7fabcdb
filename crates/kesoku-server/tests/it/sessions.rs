//! Session routes: list, read, history, stop, compact, clear, state, export.

use chrono::Utc;
use http::StatusCode;
use kesoku_core::{
    Activation, ActivationId, ActivationPayload, ExpectedResponse, Lane, LedgerEntry, Message, MessageFilter,
    SessionId, Status, TurnOrigin,
};
use kesoku_server::{COMPACTION_REQUEST_TEXT, RunningTurn};

use crate::harness::{TestServer, assert_error, get, post_empty, send, user};

#[tokio::test]
async fn sessions_are_listed_newest_first_with_activity_and_active_flag() {
    let server = TestServer::new().await;
    let first = server.session("api", "a").await;
    let second = server.session("api", "b").await;
    server.post(&user(&second, "waiting")).await;
    let app = server.app();

    let reply = send(&app, get("/v1/sessions")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let sessions = reply.json["sessions"].as_array().expect("a list");
    assert_eq!(sessions.len(), 2);
    assert_eq!(sessions[0]["id"], second.id.as_str(), "newest first");
    assert_eq!(sessions[0]["activity"], "waiting");
    assert_eq!(sessions[1]["id"], first.id.as_str());
    assert_eq!(sessions[1]["activity"], "idle");
    assert_eq!(sessions[1]["active"], true);

    let filtered = send(&app, get("/v1/sessions?channel_id=a&limit=5")).await;
    let sessions = filtered.json["sessions"].as_array().expect("a list");
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["id"], first.id.as_str());

    for bad in ["/v1/sessions?limit=0", "/v1/sessions?limit=1001", "/v1/sessions?limit=abc", "/v1/sessions?channel_id="]
    {
        let reply = send(&app, get(bad)).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "bad_query");
    }
}

#[tokio::test]
async fn a_session_is_read_by_id_and_unknown_ids_are_404() {
    let server = TestServer::new().await;
    let session = server.session("api", "web").await;
    let app = server.app();
    let reply = send(&app, get(&format!("/v1/sessions/{}", session.id))).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json["id"], session.id.as_str());
    assert_eq!(reply.json["chatbot_id"], "api");
    assert_eq!(reply.json["active"], true);
    assert_eq!(reply.json["activity"], "idle");

    for path in ["", "/messages", "/state", "/export"] {
        let reply = send(&app, get(&format!("/v1/sessions/nope{path}"))).await;
        assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
        assert!(reply.message().contains("`nope`"), "{}", reply.message());
    }
    for path in ["/stop", "/compact", "/clear"] {
        let reply = send(&app, post_empty(&format!("/v1/sessions/nope{path}"))).await;
        assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
    }
    assert!(server.control.stopped.lock().expect("lock").is_empty(), "nothing stopped for an unknown session");
}

#[tokio::test]
async fn history_is_phased_and_in_the_spec_json_shape() {
    let server = TestServer::new().await;
    let session = server.session("api", "web").await;
    let root = server.post(&user(&session, "run the tests")).await;
    let origin = TurnOrigin::of(&root, "Kesoku");
    let call = origin.tool_call(1, "c1", "shell", serde_json::json!({"command": "cargo test"}));
    // Written out of phase order: call, then thought, then result, then answer.
    server.post(&call).await;
    server.post(&origin.thought(1, "I will run them.", None)).await;
    server.post(&origin.tool_result(&call, "ok", Some("5 passed".into()), None)).await;
    server.post(&origin.final_text(2, "All tests pass.", None)).await;

    let reply = send(&server.app(), get(&format!("/v1/sessions/{}/messages", session.id))).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.json["rev"].as_i64().expect("a rev") >= 5);
    let messages = reply.json["messages"].as_array().expect("messages");
    let types: Vec<&str> = messages.iter().map(|m| m["type"].as_str().unwrap_or("?")).collect();
    assert_eq!(types, ["text", "thought", "tool_call", "tool_result", "text"]);
    // The spec's field names and values.
    let call = &messages[2];
    assert_eq!(call["role"], "tool");
    assert_eq!(call["status"], "responded");
    assert_eq!(call["metadata"]["tool_name"], "shell");
    assert_eq!(call["parent_id"], root.id.as_str());
    assert_eq!(messages[0]["status"], "pending_agent");
    assert!(messages[0].get("parent_id").is_none(), "absent, not null");
}

#[tokio::test]
async fn stop_goes_to_the_agent_and_reports_interrupted_messages() {
    let server = TestServer::new().await;
    let session = server.session("api", "web").await;
    *server.control.stop_result.lock().expect("lock") = Some(Ok(2));
    let reply = send(&server.app(), post_empty(&format!("/v1/sessions/{}/stop", session.id))).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.json["interrupted"], 2);
    assert_eq!(reply.json["session_id"], session.id.as_str());
    assert_eq!(*server.control.stopped.lock().expect("lock"), vec![session.id.clone()]);
}

#[tokio::test]
async fn a_failing_stop_is_a_generic_500_that_leaks_nothing() {
    let server = TestServer::new().await;
    let session = server.session("api", "web").await;
    *server.control.stop_result.lock().expect("lock") = Some(Err("worker table at 0xdeadbeef exploded".into()));
    let reply = send(&server.app(), post_empty(&format!("/v1/sessions/{}/stop", session.id))).await;
    assert_error(&reply, StatusCode::INTERNAL_SERVER_ERROR, "internal");
    assert_eq!(reply.message(), "internal error");
    assert!(!reply.text.contains("deadbeef"), "{}", reply.text);
}

#[tokio::test]
async fn compact_posts_the_manual_compaction_trigger() {
    let server = TestServer::new().await;
    let session = server.session("discord", "room").await;
    let reply = send(&server.app(), post_empty(&format!("/v1/sessions/{}/compact", session.id))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let stored =
        server.store.get_message(&reply.json["id"].as_str().expect("id").into()).await.expect("read").expect("stored");
    let expected = Message::compaction_trigger(&session.id, "discord", "room", COMPACTION_REQUEST_TEXT);
    assert_eq!(
        (stored.role, stored.sender.as_str(), stored.status, stored.content.as_str(), stored.metadata.is_compaction),
        (expected.role, expected.sender.as_str(), Status::PendingAgent, expected.content.as_str(), Some(true))
    );
    assert_eq!((stored.chatbot_id.as_str(), stored.channel_id.as_str()), ("discord", "room"));
}

#[tokio::test]
async fn clear_starts_a_new_active_session_and_keeps_the_old_one() {
    let server = TestServer::new().await;
    let old = server.session("api", "web").await;
    server.post(&user(&old, "keep me")).await;
    let app = server.app();
    let reply = send(&app, post_empty(&format!("/v1/sessions/{}/clear", old.id))).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let fresh = SessionId::from(reply.json["id"].as_str().expect("id"));
    assert_ne!(fresh, old.id);
    assert_eq!(reply.json["active"], true);
    assert_eq!((reply.json["chatbot_id"].as_str(), reply.json["channel_id"].as_str()), (Some("api"), Some("web")));
    assert_eq!(server.store.active_session("api", "web").await.expect("read"), Some(fresh.clone()));
    let kept = server.store.list_messages(&MessageFilter::session(&old.id)).await.expect("list");
    assert_eq!(kept.len(), 1, "the old session keeps its history");
    // New messages on the channel now go to the new session.
    let posted = send(
        &app,
        crate::harness::post_json(
            "/v1/messages",
            &serde_json::json!({"channel_id": "web", "sender": "a", "content": "x"}),
        ),
    )
    .await;
    assert_eq!(posted.json["session_id"], fresh.as_str());
    let old_view = send(&app, get(&format!("/v1/sessions/{}", old.id))).await;
    assert_eq!(old_view.json["active"], false);
}

#[tokio::test]
async fn state_explains_who_holds_the_session_and_what_waits() {
    let server = TestServer::new().await;
    let session = server.session("api", "web").await;
    let app = server.app();

    let idle = send(&app, get(&format!("/v1/sessions/{}/state", session.id))).await;
    assert_eq!(idle.status, StatusCode::OK, "{idle:?}");
    assert_eq!(idle.json["activity"], "idle");
    assert!(idle.json["summary"].as_str().expect("summary").starts_with("idle"));
    assert_eq!(idle.json["limits"]["interactive"]["model_calls"], 40);
    assert_eq!(idle.json["queue"]["interactive"], 2);

    let held = server.post(&user(&session, "first")).await;
    server.gateway.claim(&held.id, Status::Processing, &[Status::PendingAgent], "worker-7").await.expect("claim");
    let waiting = server.post(&user(&session, "second")).await;
    let activation = Activation {
        id: ActivationId::generate(),
        session_id: session.id.clone(),
        chatbot_id: "api".into(),
        channel_id: "web".into(),
        triggered_by: "Chii".into(),
        delegation_user: None,
        depth: 0,
        agent: None,
        orchestration: None,
        lane: Lane::Interactive,
        expected_response: ExpectedResponse::default(),
        locale: None,
        timezone: None,
        model: None,
        output_schema: None,
        created_at: Utc::now(),
        payload: ActivationPayload::Message { message_id: held.id.clone() },
    };
    server.ledger.record_enqueued(&LedgerEntry::enqueued(&activation)).await.expect("ledger");
    server.ledger.record_started(&activation.id, Utc::now()).await.expect("ledger");

    // The store says worker-7 holds it, but this process runs no turn for it.
    let orphan = send(&app, get(&format!("/v1/sessions/{}/state", session.id))).await;
    assert_eq!(orphan.json["activity"], "running");
    assert_eq!(orphan.json["worker"]["message_id"], held.id.as_str());
    assert_eq!(orphan.json["worker"]["claimed_by"], "worker-7");
    assert!(orphan.json["worker"]["claimed_at"].is_string());
    assert_eq!(orphan.json["waiting"][0]["message_id"], waiting.id.as_str());
    assert_eq!(orphan.json["unfinished_activations"][0]["id"], activation.id.as_str());
    assert_eq!(orphan.json["last_event"]["message_id"], waiting.id.as_str(), "the newest change");
    let summary = orphan.json["summary"].as_str().expect("summary");
    assert!(summary.contains("no turn runs for it in this process") && summary.contains("worker-7"), "{summary}");

    // Once the runtime reports the turn, the summary says it runs.
    server.control.state.lock().expect("lock").running.push(RunningTurn {
        session_id: session.id.clone(),
        root_message_id: held.id.clone(),
        activation_id: activation.id.clone(),
        lane: Lane::Interactive,
        worker: "worker-7".into(),
        since: Utc::now(),
    });
    let running = send(&app, get(&format!("/v1/sessions/{}/state", session.id))).await;
    assert_eq!(running.json["running_turn"]["activation_id"], activation.id.as_str());
    assert!(running.json["summary"].as_str().expect("summary").starts_with("a turn is running"));
}

#[tokio::test]
async fn export_is_a_self_contained_escaped_page() {
    let server = TestServer::new().await;
    let session = server.session("api", "web").await;
    server.post(&user(&session, "<script>alert(1)</script>")).await;
    let reply = send(&server.app(), get(&format!("/v1/sessions/{}/export", session.id))).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.content_type().starts_with("text/html"));
    assert!(reply.text.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!reply.text.contains("<script>"));
    let disposition = reply.headers.get("content-disposition").and_then(|v| v.to_str().ok()).unwrap_or("");
    assert!(disposition.starts_with("attachment; filename=\"kesoku-sess_"), "{disposition}");
    let csp = reply.headers.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or("");
    assert!(csp.contains("default-src 'none'"), "{csp}");
}
