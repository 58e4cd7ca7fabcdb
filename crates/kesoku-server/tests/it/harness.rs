//! One server per test: a fresh SQLite store in a temporary directory (also the workspace), an
//! in-process broker, a fake agent control, and helpers to send requests through the router.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use http::{HeaderMap, Method, Request, StatusCode};
use kesoku_broker::MemoryBroker;
use kesoku_chatbots::ChatbotError;
use kesoku_chatbots::control::{SessionControl, StopAck, TurnStop};
use kesoku_core::{Message, SessionId};
use kesoku_gateway::Gateway;
use kesoku_server::{AgentControl, LaneDepths, LaneLimits, RuntimeState, ServerState, TurnLimits};
use kesoku_store::{Ledger, Store};
use serde_json::Value;
use tempfile::TempDir;
use tower::ServiceExt;

/// The fake runtime: records stop requests, reports whatever state a test sets.
#[derive(Default)]
pub struct FakeControl {
    /// Sessions asked to stop, in order.
    pub stopped: Mutex<Vec<SessionId>>,
    /// What `stop_session` answers: the number of waiting messages interrupted, or a failure.
    pub stop_result: Mutex<Option<Result<usize, String>>>,
    pub state: Mutex<RuntimeState>,
}

#[async_trait]
impl SessionControl for FakeControl {
    async fn stop_session(&self, session_id: &SessionId) -> Result<StopAck, ChatbotError> {
        self.stopped.lock().expect("lock").push(session_id.clone());
        let result = self.stop_result.lock().expect("lock").clone().unwrap_or(Ok(0));
        let interrupted_waiting = result.map_err(ChatbotError::Stop)?;
        Ok(StopAck { turn: TurnStop::Requested, interrupted_waiting })
    }
}

#[async_trait]
impl AgentControl for FakeControl {
    async fn runtime_state(&self) -> RuntimeState {
        self.state.lock().expect("lock").clone()
    }
}

pub fn limits() -> LaneLimits {
    LaneLimits {
        interactive: TurnLimits { runtime_s: 900, model_calls: 40, tool_calls: 100 },
        responsive: TurnLimits { runtime_s: 1800, model_calls: 60, tool_calls: 200 },
        background: TurnLimits { runtime_s: 600, model_calls: 8, tool_calls: 0 },
    }
}

pub struct TestServer {
    pub dir: TempDir,
    pub gateway: Gateway,
    pub store: Arc<dyn Store>,
    pub ledger: Arc<dyn Ledger>,
    pub control: Arc<FakeControl>,
}

impl TestServer {
    pub async fn new() -> TestServer {
        let (dir, url) = kesoku_test_support::db::temp_sqlite_url();
        let handle = kesoku_store::open(&url).await.expect("open a sqlite store");
        let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
        let control = Arc::new(FakeControl::default());
        *control.state.lock().expect("lock") = RuntimeState {
            running: Vec::new(),
            queue: LaneDepths { interactive: 2, responsive: 1, background: 0, running: 0 },
            limits: limits(),
            queue_unreadable: false,
        };
        TestServer { dir, gateway, store: handle.store, ledger: handle.ledger, control }
    }

    pub fn state(&self) -> ServerState {
        let control: Arc<dyn AgentControl> = self.control.clone();
        ServerState::new(self.gateway.clone(), Arc::clone(&self.ledger), control, self.dir.path().to_path_buf())
    }

    pub fn app(&self) -> Router {
        kesoku_server::app(self.state())
    }

    /// The `api` chatbot's deliverer, as the binary wires it (with the ledger).
    pub fn deliverer(&self) -> kesoku_chatbots::Deliverer {
        kesoku_chatbots::Deliverer::new(self.gateway.clone(), self.dir.path()).with_ledger(Arc::clone(&self.ledger))
    }

    /// Post a message through the gateway (as an adapter or the agent would).
    pub async fn post(&self, message: &Message) -> Message {
        self.gateway.post(message).await.expect("post through the gateway").message
    }

    /// A session made directly in the store, active for its channel.
    pub async fn session(&self, chatbot: &str, channel: &str) -> kesoku_core::Session {
        self.gateway.resolve_session(chatbot, channel).await.expect("resolve a session")
    }
}

/// A response, its body parsed as JSON when it is JSON.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
    pub json: Value,
}

impl Reply {
    /// The `error.code` of an error body.
    pub fn code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("<no error code>")
    }

    pub fn message(&self) -> &str {
        self.json["error"]["message"].as_str().unwrap_or("<no error message>")
    }

    pub fn content_type(&self) -> &str {
        self.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

/// Send a request through the router.
pub async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.expect("the router answers");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("read the body");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply { status, headers, text, json }
}

pub fn get(uri: &str) -> Request<Body> {
    Request::builder().uri(uri).body(Body::empty()).expect("a request")
}

pub fn post_empty(uri: &str) -> Request<Body> {
    Request::builder().method(Method::POST).uri(uri).body(Body::empty()).expect("a request")
}

pub fn post_json(uri: &str, body: &Value) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("a request")
}

pub fn post_raw(uri: &str, content_type: &str, body: impl Into<Body>) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("content-type", content_type)
        .body(body.into())
        .expect("a request")
}

/// A user message in `session`.
pub fn user(session: &kesoku_core::Session, content: &str) -> Message {
    Message::user_text(&session.id, &session.chatbot_id, &session.channel_id, "Chii", content)
}

/// Assert an error reply: status, code, and that the message says something.
#[track_caller]
pub fn assert_error(reply: &Reply, status: StatusCode, code: &str) {
    assert_eq!(reply.status, status, "status of {reply:?}");
    assert_eq!(reply.code(), code, "code of {reply:?}");
    assert!(reply.content_type().starts_with("application/json"), "content type of {reply:?}");
    assert!(!reply.message().is_empty(), "message of {reply:?}");
}
