//! Mock vendor LLM servers (Gemini, OpenAI-style chat completions, Anthropic) for tests.
//!
//! Each server is axum on `127.0.0.1:0` (or a given address) speaking the vendor's documented
//! wire format: it replays scripted answers as the vendor streams them (thoughts, signatures,
//! text, tool calls, usage), vendor-shaped errors with `Retry-After`, streams that hang or break.
//! It records every request (whole JSON body and headers) so tests can assert on exactly what
//! was sent, and it enforces the vendor's protocol rules (every tool result has its call, no
//! `tool` role for Gemini, alternation for Anthropic, …): a violation is answered with a 400
//! like the vendor's and listed in [`MockServer::violations`].
//!
//! It is not a model: answers come from the script (or a fixed text), never from the request.

pub mod anthropic;
pub mod gemini;
pub mod openai;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::Value;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// The API key the mock servers accept unless told otherwise.
pub const MOCK_API_KEY: &str = "mock-key-0123456789";

/// Most requests kept in memory (older ones are forgotten, for long benchmark runs).
const MAX_RECORDED_REQUESTS: usize = 1000;

/// Which vendor's wire format a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    Gemini,
    OpenAi,
    Anthropic,
}

/// One piece of a scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub enum MockPart {
    Thought {
        text: String,
        signature: Option<String>,
    },
    Text {
        text: String,
        signature: Option<String>,
    },
    /// An empty `id` is left out where the vendor allows it (Gemini).
    ToolCall {
        id: String,
        name: String,
        arguments: Value,
        signature: Option<String>,
    },
}

impl MockPart {
    pub fn text(text: impl Into<String>) -> Self {
        MockPart::Text { text: text.into(), signature: None }
    }

    pub fn signed_text(text: impl Into<String>, signature: impl Into<String>) -> Self {
        MockPart::Text { text: text.into(), signature: Some(signature.into()) }
    }

    pub fn thought(text: impl Into<String>, signature: Option<&str>) -> Self {
        MockPart::Thought { text: text.into(), signature: signature.map(str::to_owned) }
    }

    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        MockPart::ToolCall { id: id.into(), name: name.into(), arguments, signature: None }
    }

    pub fn signed_tool_call(id: impl Into<String>, name: impl Into<String>, arguments: Value, signature: &str) -> Self {
        MockPart::ToolCall { id: id.into(), name: name.into(), arguments, signature: Some(signature.to_owned()) }
    }
}

/// How a scripted answer ends (tool calls end as the vendor's tool-use reason automatically).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MockFinish {
    #[default]
    Stop,
    MaxTokens,
    /// Safety block / content filter / refusal.
    Blocked,
}

/// Token counts reported with an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MockUsage {
    pub input: u64,
    pub output: u64,
    pub thought: u64,
    pub cached: u64,
}

impl Default for MockUsage {
    fn default() -> Self {
        MockUsage { input: 12, output: 7, thought: 0, cached: 0 }
    }
}

/// A scripted answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MockAnswer {
    pub parts: Vec<MockPart>,
    pub finish: MockFinish,
    pub usage: MockUsage,
}

impl MockAnswer {
    pub fn text(text: impl Into<String>) -> Self {
        MockAnswer { parts: vec![MockPart::text(text)], ..MockAnswer::default() }
    }

    pub fn parts(parts: Vec<MockPart>) -> Self {
        MockAnswer { parts, ..MockAnswer::default() }
    }

    pub fn with_usage(mut self, usage: MockUsage) -> Self {
        self.usage = usage;
        self
    }

    pub fn with_finish(mut self, finish: MockFinish) -> Self {
        self.finish = finish;
        self
    }

    fn has_tool_calls(&self) -> bool {
        self.parts.iter().any(|part| matches!(part, MockPart::ToolCall { .. }))
    }
}

/// One raw Server-Sent Event (`event:` name optional).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent {
    pub event: Option<String>,
    pub data: String,
}

/// What the server does with one request.
#[derive(Debug, Clone, PartialEq)]
pub enum MockReply {
    /// Answer (streamed when the request asks for a stream).
    Answer(MockAnswer),
    /// An error with the vendor's error body; `retry_after` becomes the `Retry-After` header.
    Error { status: u16, message: String, retry_after: Option<String> },
    /// Send the first `events` events of the streamed answer, then keep the connection open
    /// (with SSE comments every 20 ms) until the client goes away.
    HangAfter { answer: MockAnswer, events: usize },
    /// Send the first `events` events of the streamed answer, then break the connection.
    BreakAfter { answer: MockAnswer, events: usize },
    /// Stream these events exactly (for payloads copied from vendor documentation).
    RawEvents(Vec<RawEvent>),
    /// Answer with this status, headers and body exactly.
    Raw { status: u16, headers: Vec<(String, String)>, body: String },
    /// Wait before answering at all (no header, no byte).
    Delayed { delay: Duration, reply: Box<MockReply> },
}

impl MockReply {
    pub fn text(text: impl Into<String>) -> Self {
        MockReply::Answer(MockAnswer::text(text))
    }

    pub fn error(status: u16, message: impl Into<String>) -> Self {
        MockReply::Error { status, message: message.into(), retry_after: None }
    }

    pub fn rate_limited(retry_after: impl Into<String>) -> Self {
        MockReply::Error {
            status: 429,
            message: "rate limit exceeded".to_owned(),
            retry_after: Some(retry_after.into()),
        }
    }
}

/// What a server answers: a script (one reply per request, in order) or the same reply to all.
#[derive(Debug, Clone, PartialEq)]
pub enum Behaviour {
    /// One reply per request; a request past the end gets a 500 and a violation.
    Script(Vec<MockReply>),
    /// Every request gets this text at once (benchmarks, end-to-end tests).
    FixedText(String),
    /// Every request gets this text after `first_byte`, chunks `between_chunks` apart.
    Latency { text: String, first_byte: Duration, between_chunks: Duration },
    /// A reply chosen by what the conversation says (a long-running server that many turns of
    /// many sessions share, as in the console's browser test): the rule whose
    /// [`MockRule::when_user_says`] ends last in the latest user text answers (the first such
    /// rule on a tie; an empty text matches at the start), with its reply for the
    /// number of model turns since that text (0: the user just spoke; 1: after the first tool
    /// results; …). No rule, or a rule out of replies: a 500 and a violation.
    Rules(Vec<MockRule>),
}

/// One rule of [`Behaviour::Rules`].
#[derive(Debug, Clone, PartialEq)]
pub struct MockRule {
    /// Text the latest user message must contain (an empty text matches every conversation).
    pub when_user_says: String,
    /// The reply to each request of the turn, in order.
    pub replies: Vec<MockReply>,
}

impl MockRule {
    pub fn new(when_user_says: impl Into<String>, replies: Vec<MockReply>) -> Self {
        MockRule { when_user_says: when_user_says.into(), replies }
    }
}

/// Where a conversation stands, read from a request body in any vendor's format: the latest
/// text a user wrote (tool results, which Gemini and Anthropic send in user turns, are not
/// text a user wrote) and how many model turns came after it.
fn conversation_position(vendor: Vendor, body: &Value) -> Option<(String, usize)> {
    let (turns, model_role) = match vendor {
        Vendor::Gemini => (body["contents"].as_array()?, "model"),
        Vendor::OpenAi | Vendor::Anthropic => (body["messages"].as_array()?, "assistant"),
    };
    let user_text = |turn: &Value| -> Option<String> {
        if turn["role"].as_str() != Some("user") {
            return None;
        }
        let parts = match vendor {
            Vendor::Gemini => &turn["parts"],
            Vendor::OpenAi | Vendor::Anthropic => &turn["content"],
        };
        if let Some(text) = parts.as_str() {
            return Some(text.to_owned());
        }
        let texts: Vec<&str> = parts
            .as_array()?
            .iter()
            .filter(|part| part.get("type").is_none_or(|kind| kind == "text"))
            .filter_map(|part| part["text"].as_str())
            .collect();
        (!texts.is_empty()).then(|| texts.join("\n"))
    };
    let (index, text) = turns.iter().enumerate().rev().find_map(|(index, turn)| Some((index, user_text(turn)?)))?;
    let model_turns = turns[index + 1..].iter().filter(|turn| turn["role"].as_str() == Some(model_role)).count();
    Some((text, model_turns))
}

/// The reply [`Behaviour::Rules`] gives to `body`, or why none.
fn rule_reply(rules: &[MockRule], vendor: Vendor, body: &Value) -> Result<MockReply, String> {
    let (text, model_turns) =
        conversation_position(vendor, body).ok_or_else(|| "no user text in the conversation".to_owned())?;
    // Clients merge consecutive user messages into one turn (a stopped question followed by a
    // new one), so the rule whose text comes last in the user's turn is what the user said last.
    let rule = rules
        .iter()
        .filter_map(|rule| match rule.when_user_says.as_str() {
            "" => Some((0, rule)),
            said => Some((text.rfind(said)? + said.len(), rule)),
        })
        .rev()
        .max_by_key(|(end, _)| *end)
        .map(|(_, rule)| rule)
        .ok_or_else(|| format!("no rule matches the user text `{text}`"))?;
    rule.replies
        .get(model_turns)
        .cloned()
        .ok_or_else(|| format!("the rule for `{}` has no reply after {model_turns} model turns", rule.when_user_says))
}

/// A request as the server received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// Header names in lowercase.
    pub headers: BTreeMap<String, String>,
    /// The JSON body (`Null` if it was not JSON).
    pub body: Value,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }
}

/// Options of a mock server.
#[derive(Debug, Clone)]
pub struct MockOptions {
    /// The key the server accepts (`None`: any key or none).
    pub api_key: Option<String>,
    /// Pause between two streamed events.
    pub chunk_delay: Duration,
    pub behaviour: Behaviour,
}

impl MockOptions {
    pub fn script(replies: Vec<MockReply>) -> Self {
        MockOptions {
            api_key: Some(MOCK_API_KEY.to_owned()),
            chunk_delay: Duration::ZERO,
            behaviour: Behaviour::Script(replies),
        }
    }
}

#[derive(Debug)]
struct State {
    vendor: Vendor,
    api_key: Option<String>,
    chunk_delay: Duration,
    // Short critical sections only, never held across an await.
    replies: Mutex<VecDeque<MockReply>>,
    behaviour: Behaviour,
    requests: Mutex<VecDeque<RecordedRequest>>,
    violations: Mutex<Vec<String>>,
    disconnects: AtomicUsize,
    disconnected: Notify,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running mock server; stopped when dropped.
#[derive(Debug)]
pub struct MockServer {
    vendor: Vendor,
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockServer {
    /// Start on `127.0.0.1:0` with `replies`, accepting [`MOCK_API_KEY`].
    pub async fn start(vendor: Vendor, replies: Vec<MockReply>) -> MockServer {
        Self::start_with(vendor, MockOptions::script(replies)).await
    }

    /// Start on `127.0.0.1:0` with `options`.
    pub async fn start_with(vendor: Vendor, options: MockOptions) -> MockServer {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        match Self::start_on(addr, vendor, options).await {
            Ok(server) => server,
            Err(error) => panic!("mock {vendor:?} server could not bind 127.0.0.1:0: {error}"),
        }
    }

    /// Start on `addr`.
    pub async fn start_on(addr: SocketAddr, vendor: Vendor, options: MockOptions) -> std::io::Result<MockServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(new_state(vendor, options));
        let app = router(Arc::clone(&state));
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                eprintln!("mock server stopped: {error}");
            }
        });
        Ok(MockServer { vendor, addr, state, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL a client is configured with (`…/v1` for OpenAI-style).
    pub fn base_url(&self) -> String {
        match self.vendor {
            Vendor::OpenAi => format!("http://{}/v1", self.addr),
            Vendor::Gemini | Vendor::Anthropic => format!("http://{}", self.addr),
        }
    }

    /// Requests received, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state.requests).iter().cloned().collect()
    }

    /// Protocol rules the requests broke.
    pub fn violations(&self) -> Vec<String> {
        lock(&self.state.violations).clone()
    }

    /// Add a reply at the end of the script.
    pub fn push(&self, reply: MockReply) {
        lock(&self.state.replies).push_back(reply);
    }

    /// Streams the client dropped before they ended.
    pub fn disconnects(&self) -> usize {
        self.state.disconnects.load(Ordering::SeqCst)
    }

    /// Wait (up to `limit`) until at least `count` streams were dropped by the client.
    pub async fn wait_for_disconnects(&self, count: usize, limit: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.state.disconnected.notified();
                if self.disconnects() >= count {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

fn new_state(vendor: Vendor, options: MockOptions) -> State {
    let replies = match &options.behaviour {
        Behaviour::Script(replies) => replies.iter().cloned().collect(),
        Behaviour::FixedText(_) | Behaviour::Latency { .. } | Behaviour::Rules(_) => VecDeque::new(),
    };
    State {
        vendor,
        api_key: options.api_key,
        chunk_delay: options.chunk_delay,
        replies: Mutex::new(replies),
        behaviour: options.behaviour,
        requests: Mutex::new(VecDeque::new()),
        violations: Mutex::new(Vec::new()),
        disconnects: AtomicUsize::new(0),
        disconnected: Notify::new(),
    }
}

/// Serve `vendor`'s wire format on `addr` until the returned future is dropped.
pub async fn serve_vendor(addr: SocketAddr, vendor: Vendor, behaviour: Behaviour) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let options = MockOptions { api_key: None, chunk_delay: Duration::ZERO, behaviour };
    axum::serve(listener, router(Arc::new(new_state(vendor, options)))).await
}

fn router(state: Arc<State>) -> Router {
    Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
        let state = Arc::clone(&state);
        async move { handle(state, method, uri, headers, body).await }
    })
}

/// What a vendor module decided about a request.
pub(crate) struct Accepted {
    /// The client asked for a stream.
    pub streaming: bool,
    /// The model id from the path or body.
    pub model: String,
    /// OpenAI: the client asked for the usage chunk.
    pub include_usage: bool,
    /// Gemini: the client asked for thought summaries (`thinkingConfig.includeThoughts`); without
    /// it Gemini sends none, so scripted thoughts are left out. Always true for the others.
    pub include_thoughts: bool,
}

impl Accepted {
    /// `answer` as the vendor would send it for this request.
    fn shape<'a>(&self, answer: &'a MockAnswer) -> std::borrow::Cow<'a, MockAnswer> {
        if self.include_thoughts {
            return std::borrow::Cow::Borrowed(answer);
        }
        let parts = answer.parts.iter().filter(|part| !matches!(part, MockPart::Thought { .. })).cloned().collect();
        std::borrow::Cow::Owned(MockAnswer { parts, ..answer.clone() })
    }
}

/// One event of a streamed answer, ready to send.
pub(crate) struct Frame(pub String);

async fn handle(state: Arc<State>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let recorded = RecordedRequest {
        method: method.to_string(),
        path: uri.path().to_owned(),
        query: uri.query().map(str::to_owned),
        headers: headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.to_str().unwrap_or_default().to_owned()))
            .collect(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    {
        let mut requests = lock(&state.requests);
        if requests.len() >= MAX_RECORDED_REQUESTS {
            requests.pop_front();
        }
        requests.push_back(recorded.clone());
    }
    let vendor = state.vendor;
    if let Some(expected) = &state.api_key {
        let given = match vendor {
            Vendor::Gemini => recorded.header("x-goog-api-key").map(str::to_owned),
            Vendor::OpenAi => {
                recorded.header("authorization").and_then(|value| value.strip_prefix("Bearer ")).map(str::to_owned)
            }
            Vendor::Anthropic => recorded.header("x-api-key").map(str::to_owned),
        };
        if given.as_deref() != Some(expected.as_str()) {
            return match vendor {
                Vendor::Gemini => gemini::auth_error(),
                Vendor::OpenAi => openai::auth_error(given.as_deref().unwrap_or_default()),
                Vendor::Anthropic => anthropic::auth_error(),
            };
        }
    }
    let checked = match vendor {
        Vendor::Gemini => gemini::check_request(&recorded),
        Vendor::OpenAi => openai::check_request(&recorded),
        Vendor::Anthropic => anthropic::check_request(&recorded),
    };
    let accepted = match checked {
        Ok(accepted) => accepted,
        Err(problems) => {
            let message = format!("mock protocol violation: {}", problems.join("; "));
            lock(&state.violations).extend(problems);
            return error_response(vendor, 400, &message, None);
        }
    };
    let reply = match &state.behaviour {
        Behaviour::Script(_) => match lock(&state.replies).pop_front() {
            Some(reply) => reply,
            None => {
                lock(&state.violations).push("request after the end of the script".to_owned());
                return error_response(vendor, 500, "mock script exhausted", None);
            }
        },
        Behaviour::FixedText(text) => MockReply::text(text.clone()),
        Behaviour::Latency { text, first_byte, .. } => {
            MockReply::Delayed { delay: *first_byte, reply: Box::new(MockReply::text(text.clone())) }
        }
        Behaviour::Rules(rules) => match rule_reply(rules, vendor, &recorded.body) {
            Ok(reply) => reply,
            Err(problem) => {
                let message = format!("mock rules: {problem}");
                lock(&state.violations).push(problem);
                return error_response(vendor, 500, &message, None);
            }
        },
    };
    let chunk_delay = match &state.behaviour {
        Behaviour::Latency { between_chunks, .. } => *between_chunks,
        Behaviour::Script(_) | Behaviour::FixedText(_) | Behaviour::Rules(_) => state.chunk_delay,
    };
    render(state, reply, &accepted, chunk_delay).await
}

fn render(
    state: Arc<State>,
    reply: MockReply,
    accepted: &Accepted,
    chunk_delay: Duration,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + '_>> {
    Box::pin(async move {
        let vendor = state.vendor;
        match reply {
            MockReply::Delayed { delay, reply } => {
                // Counted as a disconnect if the client goes away while we wait (hyper then
                // drops this future).
                let guard = DisconnectGuard { state: Arc::clone(&state), armed: true };
                tokio::time::sleep(delay).await;
                guard.disarm();
                render(state, *reply, accepted, chunk_delay).await
            }
            MockReply::Error { status, message, retry_after } => {
                error_response(vendor, status, &message, retry_after.as_deref())
            }
            MockReply::Raw { status, headers, body } => {
                let mut response = Response::new(Body::from(body));
                *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                for (name, value) in headers {
                    if let (Ok(name), Ok(value)) =
                        (axum::http::HeaderName::try_from(name.as_str()), HeaderValue::from_str(&value))
                    {
                        response.headers_mut().insert(name, value);
                    }
                }
                response
            }
            MockReply::RawEvents(events) => {
                let frames = events
                    .into_iter()
                    .map(|event| match event.event {
                        Some(name) => Frame(format!("event: {name}\ndata: {}\n\n", event.data)),
                        None => Frame(format!("data: {}\n\n", event.data)),
                    })
                    .collect();
                sse_response(state, frames, Ending::Complete, chunk_delay)
            }
            MockReply::Answer(answer) if accepted.streaming => {
                sse_response(state, stream_frames(vendor, &answer, accepted), Ending::Complete, chunk_delay)
            }
            MockReply::Answer(answer) => {
                let answer = accepted.shape(&answer);
                let body = match vendor {
                    Vendor::Gemini => gemini::full_answer(&answer, &accepted.model),
                    Vendor::OpenAi => openai::full_answer(&answer, &accepted.model),
                    Vendor::Anthropic => anthropic::full_answer(&answer, &accepted.model),
                };
                json_response(200, &body, None)
            }
            MockReply::HangAfter { answer, events } => {
                let mut frames = stream_frames(vendor, &answer, accepted);
                frames.truncate(events);
                sse_response(state, frames, Ending::Hang, chunk_delay)
            }
            MockReply::BreakAfter { answer, events } => {
                let mut frames = stream_frames(vendor, &answer, accepted);
                frames.truncate(events);
                sse_response(state, frames, Ending::Break, chunk_delay)
            }
        }
    })
}

fn stream_frames(vendor: Vendor, answer: &MockAnswer, accepted: &Accepted) -> Vec<Frame> {
    let answer = &*accepted.shape(answer);
    match vendor {
        Vendor::Gemini => gemini::stream_frames(answer, &accepted.model),
        Vendor::OpenAi => openai::stream_frames(answer, &accepted.model, accepted.include_usage),
        Vendor::Anthropic => anthropic::stream_frames(answer, &accepted.model),
    }
}

fn error_response(vendor: Vendor, status: u16, message: &str, retry_after: Option<&str>) -> Response {
    let body = match vendor {
        Vendor::Gemini => gemini::error_body(status, message),
        Vendor::OpenAi => openai::error_body(status, message),
        Vendor::Anthropic => anthropic::error_body(status, message),
    };
    json_response(status, &body, retry_after)
}

pub(crate) fn json_response(status: u16, body: &Value, retry_after: Option<&str>) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    if let Some(value) = retry_after.and_then(|value| HeaderValue::from_str(value).ok()) {
        response.headers_mut().insert("retry-after", value);
    }
    response
}

/// Counts a disconnect when dropped while armed.
struct DisconnectGuard {
    state: Arc<State>,
    armed: bool,
}

impl DisconnectGuard {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for DisconnectGuard {
    fn drop(&mut self) {
        if self.armed {
            self.state.disconnects.fetch_add(1, Ordering::SeqCst);
            self.state.disconnected.notify_waiters();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// All frames sent, then the body ends.
    Complete,
    /// Keep the connection open until the client leaves.
    Hang,
    /// Break the connection after the frames.
    Break,
}

/// How often a hanging stream writes an SSE comment (that is how a closed client is noticed).
const KEEP_ALIVE: Duration = Duration::from_millis(20);

fn sse_response(state: Arc<State>, frames: Vec<Frame>, ending: Ending, chunk_delay: Duration) -> Response {
    let (sender, receiver) = mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        let mut gone = false;
        for (index, Frame(frame)) in frames.into_iter().enumerate() {
            if index > 0 && !chunk_delay.is_zero() {
                tokio::time::sleep(chunk_delay).await;
            }
            if sender.send(Ok(Bytes::from(frame))).await.is_err() {
                gone = true;
                break;
            }
        }
        match ending {
            Ending::Complete if !gone => return,
            Ending::Break if !gone => {
                let _ = sender.send(Err(std::io::Error::other("mock server broke the stream"))).await;
                return;
            }
            Ending::Hang if !gone => loop {
                tokio::time::sleep(KEEP_ALIVE).await;
                if sender.send(Ok(Bytes::from_static(b": keep-alive\n\n"))).await.is_err() {
                    break;
                }
            },
            Ending::Complete | Ending::Break | Ending::Hang => {}
        }
        state.disconnects.fetch_add(1, Ordering::SeqCst);
        state.disconnected.notify_waiters();
    });
    let mut response = Response::new(Body::from_stream(ReceiverStream::new(receiver)));
    response.headers_mut().insert("content-type", HeaderValue::from_static("text/event-stream"));
    response.headers_mut().insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

/// Split `text` into up to three pieces that join back to it (breaking after spaces), the way
/// vendors stream text in several chunks.
pub(crate) fn split_text(text: &str) -> Vec<String> {
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    if words.len() <= 1 {
        return vec![text.to_owned()];
    }
    let per_piece = words.len().div_ceil(3);
    words.chunks(per_piece).map(|chunk| chunk.concat()).collect()
}

/// Split a string (JSON arguments) into two or three fragments at character boundaries.
pub(crate) fn split_fragments(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() < 3 {
        return vec![text.to_owned()];
    }
    let per_piece = chars.len().div_ceil(3);
    chars.chunks(per_piece).map(|chunk| chunk.iter().collect()).collect()
}
