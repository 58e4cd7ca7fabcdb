//! `POST /v1/activations`: a direct trigger enters as a Direct Trigger Message through the one
//! ingest path, with the activation it asks for in `metadata.activation`; idempotency; every
//! way a request can be refused. (`GET /v1/activations` is tested with the other reads.)

use chrono::Utc;
use http::StatusCode;
use kesoku_core::activation::{ActivationKind, ActivationRequest, TriggerContext};
use kesoku_core::{Message, MessageFilter, MessageId, Metadata};
use serde_json::{Value, json};

use crate::harness::{Reply, TestServer, assert_error, post_json, send};

/// A server whose configuration names the models `main` and `fast`.
fn app(server: &TestServer) -> axum::Router {
    kesoku_server::app(server.state().with_models(["main", "fast"]).with_chatbots(["api", "cli", "discord"]))
}

async fn stored(server: &TestServer, reply: &Reply) -> Message {
    let id = MessageId::from(reply.json["message_id"].as_str().expect("a message id"));
    server.store.get_message(&id).await.expect("read").expect("stored")
}

#[tokio::test]
async fn a_direct_trigger_is_stored_as_a_direct_trigger_message_asking_for_its_activation() {
    let server = TestServer::new().await;
    let schema = json!({"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]});
    let before = Utc::now();
    let reply = send(
        &app(&server),
        post_json(
            "/v1/activations",
            &json!({
                "task": "Count today's open issues",
                "chatbot_id": "api",
                "channel_id": "ops",
                "name": "nightly-report",
                "model": "fast",
                "output_schema": schema,
                "timezone": "Asia/Tokyo",
            }),
        ),
    )
    .await;
    let after = Utc::now();
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let message = stored(&server, &reply).await;
    let session = server.store.active_session("api", "ops").await.expect("read").expect("an active session");
    assert_eq!(message.session_id, session);
    assert_eq!(
        reply.json,
        json!({"message_id": message.id.as_str(), "session_id": session.as_str(), "status": "pending_agent"})
    );

    // Exactly the spec row's fields: what `Message::direct_trigger` builds.
    let expected = Message::direct_trigger(&session, "api", "ops", "Count today's open issues");
    let shape = |m: &Message| {
        (
            m.role,
            m.message_type,
            m.sender.clone(),
            m.status,
            m.content.clone(),
            m.parent_id.clone(),
            m.chatbot_id.clone(),
            m.channel_id.clone(),
            m.step,
        )
    };
    assert_eq!(shape(&message), shape(&expected));
    assert_eq!(message.sender, "Trigger");

    let request = message.metadata.activation.clone().expect("metadata.activation");
    let fired_at = request.trigger.as_ref().expect("a trigger context").fired_at;
    assert!(before <= fired_at && fired_at <= after, "fired at {fired_at}, posted between {before} and {after}");
    let expected_metadata = Metadata {
        activation: Some(Box::new(ActivationRequest {
            trigger: Some(TriggerContext {
                name: "nightly-report".to_owned(),
                source: "api".to_owned(),
                schedule: None,
                fired_at,
            }),
            output_schema: Some(schema),
            timezone: Some("Asia/Tokyo".to_owned()),
            triggered_by: Some("api".to_owned()),
            ..ActivationRequest::new(ActivationKind::DirectTrigger)
        })),
        model: Some("fast".to_owned()),
        ..Metadata::default()
    };
    assert_eq!(message.metadata, expected_metadata);
}

#[tokio::test]
async fn a_bare_trigger_gets_the_default_name_and_no_options() {
    let server = TestServer::new().await;
    let reply = send(
        &app(&server),
        post_json("/v1/activations", &json!({"task": "ping", "chatbot_id": "discord", "channel_id": "123"})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let message = stored(&server, &reply).await;
    assert_eq!((message.chatbot_id.as_str(), message.channel_id.as_str()), ("discord", "123"));
    let request = message.metadata.activation.clone().expect("metadata.activation");
    let trigger = request.trigger.clone().expect("a trigger context");
    assert_eq!((trigger.name.as_str(), trigger.source.as_str(), trigger.schedule.as_deref()), ("direct", "api", None));
    assert_eq!(
        *request,
        ActivationRequest {
            trigger: Some(trigger),
            triggered_by: Some("api".to_owned()),
            ..ActivationRequest::new(ActivationKind::DirectTrigger)
        }
    );
    assert_eq!(message.metadata.model, None);
}

#[tokio::test]
async fn the_same_client_request_id_posts_once() {
    let server = TestServer::new().await;
    let app = app(&server);
    let body = json!({"task": "rotate logs", "chatbot_id": "api", "channel_id": "ops", "client_request_id": "hook-7"});
    let first = send(&app, post_json("/v1/activations", &body)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
    let again = send(&app, post_json("/v1/activations", &body)).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(again.json, first.json, "the first message, still pending");

    // The first one moved on: a retry reports where it is.
    let id = MessageId::from(first.json["message_id"].as_str().expect("id"));
    server.gateway.update_status(&id, kesoku_core::Status::Processing).await.expect("claim");
    let later = send(&app, post_json("/v1/activations", &body)).await;
    assert_eq!((later.status, later.json["status"].clone()), (StatusCode::OK, Value::from("processing")));

    // A message id of the same chatbot with the same text is another key space.
    let message = send(
        &app,
        post_json(
            "/v1/messages",
            &json!({"channel_id": "ops", "sender": "Chii", "content": "hi", "client_message_id": "hook-7"}),
        ),
    )
    .await;
    assert_eq!(message.status, StatusCode::ACCEPTED, "{message:?}");
    assert_ne!(message.json["id"], first.json["message_id"]);
    let all = server.store.list_messages(&MessageFilter::default()).await.expect("list");
    assert_eq!(all.len(), 2, "one trigger, one message: {all:?}");
}

#[tokio::test]
async fn bad_requests_are_refused_with_what_was_wrong_and_store_nothing() {
    let server = TestServer::new().await;
    let app = app(&server);
    let base = json!({"task": "do it", "chatbot_id": "api", "channel_id": "ops"});
    let with = |key: &str, value: Value| {
        let mut body = base.clone();
        body[key] = value;
        body
    };
    let without = |key: &str| {
        let mut body = base.clone();
        body.as_object_mut().expect("an object").remove(key);
        body
    };
    let cases = [
        (without("task"), "invalid_body", "missing field `task`"),
        (without("chatbot_id"), "invalid_body", "missing field `chatbot_id`"),
        (without("channel_id"), "invalid_body", "missing field `channel_id`"),
        (with("task", json!("")), "invalid_field", "`task` must not be empty"),
        (with("task", json!(" \n ")), "invalid_field", "`task` must not be blank"),
        (with("chatbot_id", json!("")), "invalid_field", "`chatbot_id` must not be empty"),
        (with("channel_id", json!("")), "invalid_field", "`channel_id` must not be empty"),
        (with("name", json!("")), "invalid_field", "`name` must not be empty"),
        (with("model", json!("huge")), "invalid_field", "no model `huge` is configured (configured: `main`, `fast`)"),
        (with("output_schema", json!("an object please")), "invalid_field", "JSON Schema object"),
        (with("output_schema", json!(["type", "object"])), "invalid_field", "got an array"),
        (with("output_schema", json!({"type": 12})), "invalid_field", "`output_schema` is not a valid JSON Schema"),
        (
            with("chatbot_id", json!("telegram")),
            "invalid_field",
            "no chatbot `telegram` runs in this service (running: `api`, `cli`, `discord`)",
        ),
        (with("timezone", json!("Mars/Olympus_Mons")), "invalid_field", "IANA time zone"),
        (with("timezone", json!("")), "invalid_field", "`timezone` must not be empty"),
        (with("client_request_id", json!("")), "invalid_field", "`client_request_id` must not be empty"),
        (with("priority", json!("high")), "invalid_body", "unknown field `priority`"),
    ];
    for (body, code, needle) in cases {
        let reply = send(&app, post_json("/v1/activations", &body)).await;
        assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, code);
        assert!(reply.message().contains(needle), "{body}: {}", reply.message());
    }
    assert!(server.store.list_messages(&MessageFilter::default()).await.expect("list").is_empty(), "nothing stored");

    // A server told of no models refuses every model name, and says so.
    let bare = kesoku_server::app(server.state());
    let reply = send(&bare, post_json("/v1/activations", &with("model", json!("main")))).await;
    assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert!(reply.message().contains("none are configured"), "{}", reply.message());
}

#[tokio::test]
async fn a_delegation_user_is_carried_in_the_roots_activation_request_of_a_trigger_and_a_message() {
    let server = TestServer::new().await;
    let trigger = send(
        &app(&server),
        post_json(
            "/v1/activations",
            &json!({"task": "Open an issue", "chatbot_id": "api", "channel_id": "ops", "delegation_user": "alice"}),
        ),
    )
    .await;
    assert_eq!(trigger.status, StatusCode::ACCEPTED, "{trigger:?}");
    let request = stored(&server, &trigger).await.metadata.activation.expect("an activation request");
    assert_eq!((request.kind, request.delegation_user.as_deref()), (ActivationKind::DirectTrigger, Some("alice")));

    let message = send(
        &app(&server),
        post_json(
            "/v1/messages",
            &json!({"channel_id": "web", "sender": "Alice", "content": "my repos?", "delegation_user": "discord:1234"}),
        ),
    )
    .await;
    assert_eq!(message.status, StatusCode::ACCEPTED, "{message:?}");
    let id = MessageId::from(message.json["id"].as_str().expect("an id"));
    let stored_message = server.store.get_message(&id).await.expect("read").expect("stored");
    let request = stored_message.metadata.activation.expect("a plain message asks for a message activation");
    assert_eq!(
        *request,
        ActivationRequest {
            delegation_user: Some("discord:1234".into()),
            ..ActivationRequest::new(ActivationKind::Message)
        }
    );

    // Without one, a plain message carries no activation request, as before.
    let plain =
        send(&app(&server), post_json("/v1/messages", &json!({"channel_id": "web", "sender": "Bob", "content": "hi"})))
            .await;
    let id = MessageId::from(plain.json["id"].as_str().expect("an id"));
    assert_eq!(server.store.get_message(&id).await.expect("read").expect("stored").metadata.activation, None);

    let blank = send(
        &app(&server),
        post_json(
            "/v1/activations",
            &json!({"task": "x", "chatbot_id": "api", "channel_id": "ops", "delegation_user": " "}),
        ),
    )
    .await;
    assert_error(&blank, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert!(blank.message().contains("delegation_user"), "{blank:?}");
}
