//! The `api` chatbot runs the conformance kit: a person speaks through `POST /v1/messages`
//! (the platform event id is the `client_message_id`), and what the platform shows is what a
//! client reads from the history route: the chatbot's delivered messages.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use http::StatusCode;
use kesoku_chatbots::Chatbot;
use kesoku_chatbots::conformance::{Flaky, Harness, run_all};
use kesoku_gateway::Gateway;
use kesoku_server::ApiChatbot;
use serde_json::json;

use crate::harness::{TestServer, get, post_json, send};

const CHANNEL: &str = "web";

struct ApiHarness {
    server: TestServer,
    app: Router,
    chatbot: Arc<Flaky>,
}

#[async_trait]
impl Harness for ApiHarness {
    fn chatbot(&self) -> Arc<dyn Chatbot> {
        self.chatbot.clone()
    }

    fn gateway(&self) -> Gateway {
        self.server.gateway.clone()
    }

    fn workspace(&self) -> PathBuf {
        self.server.dir.path().to_owned()
    }

    fn channel_id(&self) -> String {
        CHANNEL.to_owned()
    }

    /// The contents of the channel's delivered messages, as the history route returns them.
    async fn visible(&self) -> Vec<String> {
        let session = self.server.session("api", CHANNEL).await;
        let reply = send(&self.app, get(&format!("/v1/sessions/{}/messages", session.id))).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        reply.json["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .filter(|message| message["status"] == "delivered")
            .map(|message| message["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    async fn fail_transiently(&self, n: usize) {
        self.chatbot.fail_transiently(n);
    }

    async fn fail_permanently(&self) {
        self.chatbot.fail_permanently();
    }

    async fn user_says(&self, text: &str, event_id: &str) {
        let body = json!({"channel_id": CHANNEL, "sender": "Tester", "content": text, "client_message_id": event_id});
        let reply = send(&self.app, post_json("/v1/messages", &body)).await;
        assert!(matches!(reply.status, StatusCode::ACCEPTED | StatusCode::OK), "{reply:?}");
        assert!(reply.json["id"].is_string(), "{reply:?}");
    }

    /// Each request stands alone: there is no connection to lose.
    async fn drop_connection(&self) {}

    /// A part is the stored message itself: it cannot be shown twice.
    fn dedups_part_keys(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn the_api_chatbot_passes_the_conformance_kit() {
    let server = TestServer::new().await;
    let app = server.app();
    let harness = ApiHarness { server, app, chatbot: Arc::new(Flaky::new(Arc::new(ApiChatbot))) };
    run_all(&harness).await;
}

#[tokio::test]
async fn a_retried_post_with_the_same_client_message_id_is_stored_once() {
    let server = TestServer::new().await;
    let app = server.app();
    let body = json!({"channel_id": CHANNEL, "sender": "Chii", "content": "hi", "client_message_id": "web-1"});
    let first = send(&app, post_json("/v1/messages", &body)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
    let again = send(&app, post_json("/v1/messages", &body)).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!((&again.json["id"], &again.json["session_id"]), (&first.json["id"], &first.json["session_id"]));
    // Another chatbot's id space is its own.
    let other = json!({"chatbot_id": "other", "channel_id": CHANNEL, "sender": "Chii", "content": "hi",
                       "client_message_id": "web-1"});
    let elsewhere = send(&app, post_json("/v1/messages", &other)).await;
    assert_eq!(elsewhere.status, StatusCode::ACCEPTED, "{elsewhere:?}");
    assert_ne!(elsewhere.json["id"], first.json["id"]);
    let stored = server.store.list_messages(&Default::default()).await.expect("list");
    assert_eq!(stored.len(), 2);
    let empty = json!({"channel_id": CHANNEL, "sender": "Chii", "content": "hi", "client_message_id": ""});
    let reply = send(&app, post_json("/v1/messages", &empty)).await;
    crate::harness::assert_error(&reply, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert!(reply.message().contains("client_message_id"), "{}", reply.message());
}
