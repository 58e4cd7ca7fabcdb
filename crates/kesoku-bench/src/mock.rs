//! Local model servers for benchmarks and tests, each on a thread and runtime of its own (so the
//! server's work is not scheduled on the runtime being measured), bound to `127.0.0.1:0`.
//!
//! - [`MockHost`] runs a mock vendor server of `kesoku-test-support` (instant answers, 200 ms
//!   latency, scripts of errors, resets and stalls).
//! - [`PolicyServer`] is an OpenAI-style chat-completions server that decides each answer from
//!   the request (see [`crate::models::Policy`]): a turn makes N tool calls then answers, however
//!   often it was cut off and re-run. The crash loop needs that; a script would be consumed by
//!   requests whose process was killed. It writes each answer (the whole SSE stream) in one
//!   piece, which is also why the timing benchmarks use it: the vendor mocks stream one small
//!   write per event on sockets without `TCP_NODELAY`, and Nagle's algorithm meeting the
//!   client's delayed ACK adds about 40 ms to every "instant" answer.
//!
//! Neither is a model, and neither listens anywhere but 127.0.0.1.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use kesoku_test_support::mock_llm::{MockOptions, MockServer, Vendor};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// A thread running a current-thread runtime until the host is dropped.
struct HostThread {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostThread {
    /// Run `start` on a new thread's runtime; its output comes back once it is ready.
    fn spawn<T, F, Fut>(name: &str, start: F) -> (HostThread, T)
    where
        T: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(error) => panic!("cannot start the mock server's runtime: {error}"),
                };
                runtime.block_on(async move {
                    let value = start().await;
                    if ready_tx.send(value).is_err() {
                        return;
                    }
                    let _ = stop_rx.await;
                });
            })
            .unwrap_or_else(|error| panic!("cannot start the mock server's thread: {error}"));
        let value = ready_rx.recv().unwrap_or_else(|_| panic!("the mock server's thread stopped while starting"));
        (HostThread { stop: Some(stop_tx), thread: Some(thread) }, value)
    }
}

impl Drop for HostThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A mock vendor server on its own thread.
pub struct MockHost {
    // Dropped before the thread: aborting its task needs the runtime alive.
    server: Option<MockServer>,
    _thread: HostThread,
}

impl std::fmt::Debug for MockHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockHost").field("addr", &self.server.as_ref().map(MockServer::addr)).finish()
    }
}

impl MockHost {
    pub fn start(vendor: Vendor, options: MockOptions) -> MockHost {
        let (thread, server) =
            HostThread::spawn("kesoku-mock-llm", move || async move { MockServer::start_with(vendor, options).await });
        MockHost { server: Some(server), _thread: thread }
    }

    pub fn server(&self) -> &MockServer {
        match &self.server {
            Some(server) => server,
            None => unreachable_server(),
        }
    }

    pub fn base_url(&self) -> String {
        self.server().base_url()
    }
}

fn unreachable_server() -> ! {
    panic!("the mock server is only taken out when the host is dropped")
}

impl Drop for MockHost {
    fn drop(&mut self) {
        drop(self.server.take());
    }
}

/// An OpenAI-style server answering by [`crate::models::Policy`] rules, read from the request.
pub struct PolicyServer {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    arrivals: Arc<Mutex<Vec<Instant>>>,
    _thread: HostThread,
}

impl std::fmt::Debug for PolicyServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyServer").field("addr", &self.addr).finish()
    }
}

/// What the policy server does per turn.
#[derive(Debug, Clone)]
pub struct HttpPolicy {
    /// Tool calls per turn, one per model step.
    pub calls: usize,
    pub tool: String,
    pub arguments: Value,
    /// Wait this long before answering (nothing is sent meanwhile).
    pub latency: Duration,
}

impl HttpPolicy {
    /// Answer every request at once with text.
    pub fn instant_text() -> Self {
        HttpPolicy { calls: 0, tool: String::new(), arguments: Value::Null, latency: Duration::ZERO }
    }
}

impl PolicyServer {
    pub fn start(policy: HttpPolicy) -> PolicyServer {
        let requests = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&requests);
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let arrived = Arc::clone(&arrivals);
        let (thread, addr) = HostThread::spawn("kesoku-policy-llm", move || async move {
            let listener = match tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await {
                Ok(listener) => listener,
                Err(error) => panic!("the policy server cannot bind 127.0.0.1:0: {error}"),
            };
            let addr = listener.local_addr().unwrap_or_else(|error| panic!("no local address: {error}"));
            let policy = Arc::new(policy);
            // Requests carry whole histories: no body limit.
            let app = Router::new().fallback(move |body: Bytes| {
                let policy = Arc::clone(&policy);
                let counter = Arc::clone(&counter);
                let arrived = Arc::clone(&arrived);
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    arrived.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(Instant::now());
                    if !policy.latency.is_zero() {
                        tokio::time::sleep(policy.latency).await;
                    }
                    answer(&policy, &body)
                }
            });
            let app = app.layer(axum::extract::DefaultBodyLimit::disable());
            tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            addr
        });
        PolicyServer { addr, requests, arrivals, _thread: thread }
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// When each request arrived (the handler started), oldest first.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.arrivals.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

fn answer(policy: &HttpPolicy, body: &[u8]) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return plain(400, "the body is not JSON");
    };
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let last_user = messages.iter().rposition(|m| m["role"] == "user");
    let made: usize = messages[last_user.map_or(0, |i| i + 1)..]
        .iter()
        .filter(|m| m["role"] == "assistant")
        .map(|m| m["tool_calls"].as_array().map_or(0, Vec::len))
        .sum();
    let model = request["model"].as_str().unwrap_or("policy").to_owned();
    let mut deltas = vec![json!({"role": "assistant", "content": ""})];
    let finish = if made < policy.calls {
        deltas.push(json!({"tool_calls": [{
            "index": 0,
            "id": format!("call_{}", ulid::Ulid::generate()),
            "type": "function",
            "function": {"name": policy.tool, "arguments": policy.arguments.to_string()}
        }]}));
        "tool_calls"
    } else {
        let question = last_user.map(|i| user_text(&messages[i])).unwrap_or_default();
        deltas.push(json!({"content": format!("{}{question}", crate::models::ANSWER_PREFIX)}));
        "stop"
    };
    let mut frames = String::new();
    for delta in deltas {
        frames.push_str(&frame(&model, json!([{"index": 0, "delta": delta, "finish_reason": null}]), None));
    }
    frames.push_str(&frame(&model, json!([{"index": 0, "delta": {}, "finish_reason": finish}]), None));
    let usage = json!({"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19});
    frames.push_str(&frame(&model, json!([]), Some(usage)));
    frames.push_str("data: [DONE]\n\n");
    let mut response = Response::new(Body::from(frames));
    response.headers_mut().insert("content-type", HeaderValue::from_static("text/event-stream"));
    response
}

fn user_text(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p["text"].as_str()).next_back().unwrap_or_default().to_owned()
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::Object(_) => String::new(),
    }
}

fn frame(model: &str, choices: Value, usage: Option<Value>) -> String {
    let mut chunk = json!({
        "id": "chatcmpl-policy",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "choices": choices,
    });
    if let Some(usage) = usage {
        chunk["usage"] = usage;
    }
    format!("data: {chunk}\n\n")
}

fn plain(status: u16, text: &str) -> Response {
    let mut response = Response::new(Body::from(text.to_owned()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    response
}
