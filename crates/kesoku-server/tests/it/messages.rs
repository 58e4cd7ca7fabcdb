//! `POST /v1/messages`: ingestion, attachments, and every way a body can be wrong.

use http::StatusCode;
use kesoku_core::{MessageId, Role, Status};
use serde_json::json;

use crate::harness::{TestServer, assert_error, post_json, post_raw, send};

#[tokio::test]
async fn a_message_is_stored_pending_agent_in_the_active_session() {
    let server = TestServer::new().await;
    let app = server.app();
    let reply =
        send(&app, post_json("/v1/messages", &json!({"channel_id": "web", "sender": "Chii", "content": "hi"}))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let id = MessageId::from(reply.json["id"].as_str().expect("an id"));
    let stored = server.store.get_message(&id).await.expect("read").expect("stored");
    assert_eq!(stored.status, Status::PendingAgent);
    assert_eq!(stored.role, Role::User);
    assert_eq!(stored.chatbot_id, "api", "the chatbot defaults to api");
    assert_eq!((stored.channel_id.as_str(), stored.sender.as_str(), stored.content.as_str()), ("web", "Chii", "hi"));
    let active = server.store.active_session("api", "web").await.expect("read").expect("an active session");
    assert_eq!(reply.json["session_id"], active.as_str());
    assert_eq!(stored.session_id, active);

    // A second message on the same channel goes to the same session; another chatbot gets its own.
    let again =
        send(&app, post_json("/v1/messages", &json!({"channel_id": "web", "sender": "Chii", "content": "again"})))
            .await;
    assert_eq!(again.json["session_id"], reply.json["session_id"]);
    let other = send(
        &app,
        post_json(
            "/v1/messages",
            &json!({"chatbot_id": "discord", "channel_id": "web", "sender": "Chii", "content": "x"}),
        ),
    )
    .await;
    assert_eq!(other.status, StatusCode::ACCEPTED);
    assert_ne!(other.json["session_id"], reply.json["session_id"]);
}

#[tokio::test]
async fn attachments_are_staged_under_the_session_and_listed_in_metadata() {
    let server = TestServer::new().await;
    let body = json!({
        "channel_id": "web", "sender": "Chii", "content": "see files",
        "attachments": [
            {"filename": "data.csv", "mime_type": "text/csv", "content_base64": "YSxiCjEsMgo="},
            {"filename": "data.csv", "mime_type": "text/csv", "content_base64": "eA"},
            {"filename": "we:ird?.txt", "mime_type": "text/plain", "content_base64": ""}
        ]
    });
    let reply = send(&server.app(), post_json("/v1/messages", &body)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let stored = server
        .store
        .get_message(&MessageId::from(reply.json["id"].as_str().expect("id")))
        .await
        .expect("read")
        .expect("stored");
    let session = reply.json["session_id"].as_str().expect("session");
    let attachments = stored.attachments();
    assert_eq!(attachments.len(), 3);
    let base = format!("sessions/{session}/attachments");
    assert_eq!(attachments[0].path, format!("{base}/data.csv"));
    assert_eq!(attachments[1].path, format!("{base}/2-data.csv"), "a taken name is never overwritten");
    assert_eq!(attachments[2].path, format!("{base}/we_ird_.txt"));
    assert_eq!((attachments[0].filename.as_str(), attachments[0].mime_type.as_str()), ("data.csv", "text/csv"));
    assert_eq!(attachments[2].filename, "we:ird?.txt", "the user's name is kept in metadata");
    let first = std::fs::read(server.dir.path().join(&attachments[0].path)).expect("staged file");
    assert_eq!(first, b"a,b\n1,2\n");
    let second = std::fs::read(server.dir.path().join(&attachments[1].path)).expect("staged file");
    assert_eq!(second, b"x");
}

#[tokio::test]
async fn unsafe_attachment_names_and_bad_content_are_refused_and_leave_nothing() {
    let server = TestServer::new().await;
    let app = server.app();
    let cases = [
        ("../escape.txt", "text/plain", "eA==", "filename"),
        ("/etc/passwd", "text/plain", "eA==", "filename"),
        ("dir\\x.txt", "text/plain", "eA==", "filename"),
        ("..", "text/plain", "eA==", "filename"),
        ("a\u{0}b", "text/plain", "eA==", "NUL"),
        ("ok.txt", "text/plain", "not base64!", "base64"),
        ("ok.txt", "plain", "eA==", "mime_type"),
    ];
    for (filename, mime_type, content, needle) in cases {
        let body = json!({
            "channel_id": "web", "sender": "Chii", "content": "x",
            "attachments": [{"filename": filename, "mime_type": mime_type, "content_base64": content}]
        });
        let reply = send(&app, post_json("/v1/messages", &body)).await;
        assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
        assert!(reply.message().contains(needle), "{filename:?}: {}", reply.message());
    }
    assert!(server.store.list_messages(&Default::default()).await.expect("list").is_empty(), "nothing stored");
    assert!(!server.dir.path().join("sessions").exists(), "nothing staged");
    assert!(!server.dir.path().join("escape.txt").exists());
}

#[tokio::test]
async fn malformed_bodies_get_json_errors_that_say_what_was_wrong() {
    let server = TestServer::new().await;
    let app = server.app();

    let reply = send(&app, post_raw("/v1/messages", "application/json", "{\"channel_id\": ")).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "bad_json");

    let reply = send(&app, post_json("/v1/messages", &json!({"channel_id": "web", "content": "x"}))).await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    assert!(reply.message().contains("missing field `sender`"), "{}", reply.message());

    let reply = send(&app, post_json("/v1/messages", &json!({"channel_id": 7, "sender": "a", "content": "x"}))).await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    assert!(reply.message().contains("invalid type"), "{}", reply.message());

    let reply =
        send(&app, post_json("/v1/messages", &json!({"channel_id": "w", "sender": "a", "content": "x", "bogus": 1})))
            .await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    assert!(reply.message().contains("unknown field `bogus`"), "{}", reply.message());

    let reply = send(&app, post_json("/v1/messages", &json!({"channel_id": "", "sender": "a", "content": "x"}))).await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert!(reply.message().contains("channel_id"), "{}", reply.message());

    let reply =
        send(&app, post_json("/v1/messages", &json!({"channel_id": "w", "sender": "a", "content": "x\u{0}"}))).await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");

    let reply =
        send(&app, post_json("/v1/messages", &json!({"channel_id": "w".repeat(257), "sender": "a", "content": "x"})))
            .await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert!(reply.message().contains("too long"), "{}", reply.message());

    let invalid_utf8: Vec<u8> = b"{\"channel_id\": \"\xff\xfe\", \"sender\": \"a\", \"content\": \"x\"}".to_vec();
    let reply = send(&app, post_raw("/v1/messages", "application/json", invalid_utf8)).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_utf8");

    let reply = send(&app, post_raw("/v1/messages", "text/plain", "{}")).await;
    assert_error(&reply, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type");

    let reply = send(&app, post_raw("/v1/messages", "application/json", "[]")).await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");

    assert!(server.store.list_messages(&Default::default()).await.expect("list").is_empty(), "nothing stored");
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_json() {
    let server = TestServer::new().await;
    let app = kesoku_server::app(server.state().with_body_limit(1024));
    let big = json!({"channel_id": "w", "sender": "a", "content": "x".repeat(4096)});
    // With a Content-Length (rejected before reading) …
    let reply = send(&app, post_json("/v1/messages", &big)).await;
    assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    // … and streamed without one (rejected while reading).
    let chunks: Vec<Result<String, std::io::Error>> = vec![Ok(big.to_string())];
    let body = axum::body::Body::from_stream(futures::stream::iter(chunks));
    let reply = send(&app, post_raw("/v1/messages", "application/json", body)).await;
    assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    // A small one still passes.
    let small = json!({"channel_id": "w", "sender": "a", "content": "ok"});
    assert_eq!(send(&app, post_json("/v1/messages", &small)).await.status, StatusCode::ACCEPTED);
}

#[tokio::test]
async fn a_message_posted_in_a_thread_carries_where_the_thread_hangs() {
    let server = TestServer::new().await;
    let app = server.app();
    let started = send(
        &app,
        post_json("/v1/messages", &json!({"channel_id": "web", "sender": "Chii", "content": "ship friday?"})),
    )
    .await;
    let root_id = started.json["id"].as_str().expect("an id").to_owned();
    let body = json!({
        "channel_id": "web-thread-1",
        "sender": "Ola",
        "content": "yes, after the tests",
        "thread": {"parent_channel_id": "web", "root_message_id": root_id},
    });
    let reply = send(&app, post_json("/v1/messages", &body)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let id = MessageId::from(reply.json["id"].as_str().expect("an id"));
    let stored = server.store.get_message(&id).await.expect("read").expect("stored");
    assert_eq!(stored.channel_id, "web-thread-1", "the thread is the message's channel");
    let thread = stored.metadata.thread.as_deref().expect("metadata.thread");
    assert_eq!(thread.parent_channel_id, "web");
    assert_eq!(thread.root_message_id.as_ref().map(|id| id.as_str()), Some(root_id.as_str()));
    assert_ne!(reply.json["session_id"], started.json["session_id"], "a thread is a conversation of its own");

    // The root is optional; the parent is not, and it is not the thread itself.
    let no_root = json!({"channel_id": "t2", "sender": "a", "content": "x", "thread": {"parent_channel_id": "web"}});
    let reply = send(&app, post_json("/v1/messages", &no_root)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let id = MessageId::from(reply.json["id"].as_str().expect("an id"));
    let stored = server.store.get_message(&id).await.expect("read").expect("stored");
    assert_eq!(stored.metadata.thread.as_deref().and_then(|t| t.root_message_id.clone()), None);

    let itself = json!({"channel_id": "t3", "sender": "a", "content": "x", "thread": {"parent_channel_id": "t3"}});
    let reply = send(&app, post_json("/v1/messages", &itself)).await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert!(reply.message().contains("thread.parent_channel_id"), "{}", reply.message());
    let missing = json!({"channel_id": "t4", "sender": "a", "content": "x", "thread": {"root_message_id": "m"}});
    let reply = send(&app, post_json("/v1/messages", &missing)).await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    assert!(reply.message().contains("parent_channel_id"), "{}", reply.message());
    let empty = json!({"channel_id": "t5", "sender": "a", "content": "x", "thread": {"parent_channel_id": ""}});
    let reply = send(&app, post_json("/v1/messages", &empty)).await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");

    // The document describes the parameter.
    let document = serde_json::to_value(kesoku_server::openapi_document()).expect("json");
    let thread = &document["components"]["schemas"]["ThreadParams"];
    assert_eq!(thread["required"], json!(["parent_channel_id"]), "{thread}");
}
