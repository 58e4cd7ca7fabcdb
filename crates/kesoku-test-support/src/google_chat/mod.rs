//! A local fake of what a Google Chat app talks to, written from Google's published REST
//! documentation: the OAuth 2.0 token endpoint (JWT bearer grant), Cloud Pub/Sub's
//! `projects.subscriptions.pull / acknowledge / modifyAckDeadline`, and the Chat API's
//! `spaces.messages.create / patch / delete / get` and attachment upload.
//!
//! One axum server on `127.0.0.1:0`. Tests play the people ([`FakeGoogleChat::user_says`],
//! [`FakeGoogleChat::click`], [`FakeGoogleChat::add_app_to_space`]) — each publishes the Chat
//! event Chat would publish to the app's topic —, inject faults ([`FakeGoogleChat::fail_chat`],
//! [`FakeGoogleChat::fail_pulls`], [`FakeGoogleChat::fail_acks`], [`FakeGoogleChat::lose_pulls`],
//! [`FakeGoogleChat::expire_tokens`], [`FakeGoogleChat::expire_leases`]) and read what the app
//! did ([`FakeGoogleChat::messages_in`], [`FakeGoogleChat::requests`], …).
//!
//! Rules it enforces as Google does: the assertion's RS256 signature (against the fixed test
//! key pair in `fixtures/google_chat`, never a real key), `iss`, `aud`, `exp`, scopes; bearer
//! tokens that expire (401 `UNAUTHENTICATED`); leases with ack deadlines and redelivery of
//! unacknowledged messages; `client-…` message ids (409 `ALREADY_EXISTS` when taken),
//! `requestId` answering the first message, `messageReplyOption` threading, `updateMask`,
//! the 4,096-character and 32,000-byte limits, 403 on attachment upload by an app; errors in
//! Google's `{"error": {code, message, status}}` shape.
//!
//! It is not Google: one project, one subscription, no IAM, no real long-polling (a pull waits
//! at most [`FakeGoogleChatOptions::pull_wait`]).

mod state;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use axum::routing::any;
use chrono::Utc;
use serde_json::{Value, json};

pub use state::FakeState;
use state::GoogleError;

/// The fixed test private key (PKCS#8 PEM), generated once with `openssl genrsa`; only for tests.
pub const TEST_PRIVATE_KEY_PEM: &str = include_str!("../../fixtures/google_chat/test-service-account.key.pem");

/// How the fake is set up.
#[derive(Debug, Clone)]
pub struct FakeGoogleChatOptions {
    /// The service account whose assertions are accepted.
    pub client_email: String,
    pub subscription: String,
    /// How long an issued access token is accepted (`expires_in`).
    pub token_lifetime: Duration,
    /// The subscription's ack deadline.
    pub ack_deadline: Duration,
    /// How long a pull with nothing to deliver waits before answering `{}`.
    pub pull_wait: Duration,
}

impl Default for FakeGoogleChatOptions {
    fn default() -> Self {
        FakeGoogleChatOptions {
            client_email: "kesoku-app@kesoku-test.iam.gserviceaccount.com".to_owned(),
            subscription: "projects/kesoku-test/subscriptions/chat-events".to_owned(),
            token_lifetime: Duration::from_secs(3600),
            ack_deadline: Duration::from_secs(10),
            pull_wait: Duration::from_millis(500),
        }
    }
}

/// A person in Chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeUser {
    /// `users/123`.
    pub name: String,
    pub display_name: String,
    pub email: String,
}

impl FakeUser {
    pub fn new(id: u64, display_name: &str, email: &str) -> Self {
        FakeUser { name: format!("users/{id}"), display_name: display_name.to_owned(), email: email.to_owned() }
    }

    fn to_json(&self) -> Value {
        json!({ "name": self.name, "displayName": self.display_name, "email": self.email, "type": "HUMAN" })
    }
}

/// A message in a space, as it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeChatMessage {
    /// `spaces/S/messages/M`.
    pub name: String,
    pub space: String,
    /// `spaces/S/threads/T`.
    pub thread: String,
    pub text: String,
    /// `cardsV2` as last sent (`[]` when none).
    pub cards_v2: Value,
    /// Posted by the app (through the API), not by a person.
    pub from_app: bool,
    pub sender: String,
    pub edits: usize,
    pub deleted: bool,
}

impl FakeChatMessage {
    fn to_json(&self) -> Value {
        let sender_type = if self.from_app { "BOT" } else { "HUMAN" };
        let client_id = self.name.rsplit('/').next().filter(|id| id.starts_with("client-"));
        let mut value = json!({
            "name": self.name,
            "sender": { "name": self.sender, "type": sender_type },
            "createTime": Utc::now().to_rfc3339(),
            "text": self.text,
            "cardsV2": self.cards_v2,
            "thread": { "name": self.thread },
            "space": { "name": self.space },
        });
        if let Some(id) = client_id {
            value["clientAssignedMessageId"] = Value::String(id.to_owned());
        }
        value
    }

    /// What a person sees: the text, then each card's title, subtitle, section headers,
    /// paragraphs and button labels, one per line.
    pub fn rendered(&self) -> String {
        let mut lines = Vec::new();
        if !self.text.is_empty() {
            lines.push(self.text.clone());
        }
        for card in self.cards_v2.as_array().into_iter().flatten() {
            let card = &card["card"];
            for key in ["title", "subtitle"] {
                if let Some(text) = card["header"][key].as_str() {
                    lines.push(text.to_owned());
                }
            }
            for section in card["sections"].as_array().into_iter().flatten() {
                if let Some(header) = section["header"].as_str() {
                    lines.push(header.to_owned());
                }
                for widget in section["widgets"].as_array().into_iter().flatten() {
                    if let Some(text) = widget["textParagraph"]["text"].as_str() {
                        lines.push(text.to_owned());
                    }
                    for button in widget["buttonList"]["buttons"].as_array().into_iter().flatten() {
                        if let Some(text) = button["text"].as_str() {
                            lines.push(format!("[{text}]"));
                        }
                    }
                }
            }
        }
        lines.join("\n")
    }
}

/// A request as the fake received it (the bearer token left out).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: HashMap<String, String>,
    pub body: Value,
    pub status: u16,
}

/// What [`FakeGoogleChat::user_says`] published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Said {
    /// The Chat message's name.
    pub message: String,
    pub thread: String,
    /// The Pub/Sub message id of the event.
    pub pubsub_id: String,
}

/// What the server and the test share.
type Shared = crate::watched::Watched<FakeState>;

/// A running fake; stopped when dropped.
pub struct FakeGoogleChat {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for FakeGoogleChat {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("FakeGoogleChat").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Drop for FakeGoogleChat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeGoogleChat {
    /// Start on `127.0.0.1:0`. Must be called inside a tokio runtime; panics if it cannot bind.
    pub fn start(options: FakeGoogleChatOptions) -> FakeGoogleChat {
        FakeGoogleChat::start_on(options, 0)
    }

    /// Start on a given port (0: any), e.g. to come back on the same address after a restart.
    pub fn start_on(options: FakeGoogleChatOptions, port: u16) -> FakeGoogleChat {
        let listener = match std::net::TcpListener::bind(("127.0.0.1", port))
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .and_then(tokio::net::TcpListener::from_std)
        {
            Ok(listener) => listener,
            Err(error) => panic!("fake google chat could not bind 127.0.0.1:{port}: {error}"),
        };
        let addr = match listener.local_addr() {
            Ok(addr) => addr,
            Err(error) => panic!("fake google chat has no local address: {error}"),
        };
        let shared = Arc::new(Shared::new(FakeState::new(options, format!("http://{addr}"))));
        let app = Router::new().route("/{*rest}", any(handle)).with_state(Arc::clone(&shared));
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                eprintln!("fake google chat stopped: {error}");
            }
        });
        FakeGoogleChat { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT`: both `chat_base_url` and `pubsub_base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn token_uri(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    pub fn subscription(&self) -> String {
        self.shared.read(|state| state.options.subscription.clone())
    }

    /// A service-account key file (JSON) whose `token_uri` is this fake, signed by the test key.
    pub fn service_account_json(&self) -> String {
        let email = self.shared.read(|state| state.options.client_email.clone());
        json!({
            "type": "service_account",
            "project_id": "kesoku-test",
            "private_key_id": "test-key-1",
            "private_key": TEST_PRIVATE_KEY_PEM,
            "client_email": email,
            "client_id": "100000000000000000001",
            "token_uri": self.token_uri(),
        })
        .to_string()
    }

    /// Add a space the app is a member of; `direct`: a one-to-one conversation with the app.
    pub fn add_space(&self, id: &str, direct: bool) -> String {
        let name = format!("spaces/{id}");
        self.shared.update(|state| state.spaces.insert(name.clone(), direct));
        name
    }

    fn space_json(state: &FakeState, space: &str) -> Value {
        let direct = state.spaces.get(space).copied().unwrap_or(false);
        if direct {
            json!({ "name": space, "type": "DM", "spaceType": "DIRECT_MESSAGE", "singleUserBotDm": true })
        } else {
            json!({ "name": space, "type": "ROOM", "spaceType": "SPACE", "displayName": "Team" })
        }
    }

    /// `user` writes `text` in `space`, in `thread` (a reply) or starting a new one; in a room
    /// the text starts with the app's @mention (Chat only tells the app about messages that
    /// mention it there). Publishes the MESSAGE event.
    pub fn user_says(&self, space: &str, thread: Option<&str>, user: &FakeUser, text: &str) -> Said {
        self.shared.update(|state| {
            let direct = state.spaces.get(space).copied().unwrap_or_else(|| panic!("no space {space}"));
            let id = state.fresh_id();
            let name = format!("{space}/messages/u{id}.u{id}");
            let thread_name = thread.map_or_else(|| format!("{space}/threads/u{id}"), str::to_owned);
            let full_text = if direct { text.to_owned() } else { format!("@Kesoku {text}") };
            state.messages.push(FakeChatMessage {
                name: name.clone(),
                space: space.to_owned(),
                thread: thread_name.clone(),
                text: full_text.clone(),
                cards_v2: json!([]),
                from_app: false,
                sender: user.name.clone(),
                edits: 0,
                deleted: false,
            });
            let mut message = json!({
                "name": name,
                "sender": user.to_json(),
                "createTime": Utc::now().to_rfc3339(),
                "text": full_text,
                "argumentText": if direct { text.to_owned() } else { format!(" {text}") },
                "thread": { "name": thread_name },
                "threadReply": thread.is_some(),
                "space": { "name": space },
            });
            if !direct {
                message["annotations"] = json!([{ "type": "USER_MENTION", "startIndex": 0, "length": 7,
                    "userMention": { "user": { "name": "users/app", "displayName": "Kesoku", "type": "BOT" }, "type": "MENTION" } }]);
            }
            let event = json!({
                "type": "MESSAGE",
                "eventTime": Utc::now().to_rfc3339(),
                "space": Self::space_json(state, space),
                "message": message,
                "user": user.to_json(),
                "common": { "userLocale": "en", "hostApp": "CHAT" },
            });
            let pubsub_id = state.publish(&event);
            Said { message: name, thread: thread_name, pubsub_id }
        })
    }

    /// Publish an event as it is (for events the helpers do not build).
    pub fn publish(&self, event: &Value) -> String {
        self.shared.update(|state| state.publish(event))
    }

    /// Chat publishes the event of Pub/Sub message `pubsub_id` once more, as a new Pub/Sub
    /// message (at-least-once delivery on Chat's side): the app must store it once.
    pub fn publish_again(&self, pubsub_id: &str) -> String {
        self.shared.update(|state| state.publish_again(pubsub_id))
    }

    /// `user` adds the app to `space`: ADDED_TO_SPACE.
    pub fn add_app_to_space(&self, space: &str, user: &FakeUser) -> String {
        self.shared.update(|state| {
            let event = json!({
                "type": "ADDED_TO_SPACE",
                "eventTime": Utc::now().to_rfc3339(),
                "space": Self::space_json(state, space),
                "user": user.to_json(),
            });
            state.publish(&event)
        })
    }

    /// `user` clicks the button labelled `label` on message `name`: CARD_CLICKED with the
    /// button's function and parameters, in both the `action` and `common` forms. Panics when
    /// there is no such button.
    pub fn click(&self, name: &str, label: &str, user: &FakeUser) -> String {
        self.shared.update(|state| {
            let message = state.messages.iter().find(|m| m.name == name && !m.deleted).cloned();
            let Some(message) = message else { panic!("no message {name}") };
            let button = message
                .cards_v2
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|card| card["card"]["sections"].as_array().cloned().unwrap_or_default())
                .flat_map(|section| section["widgets"].as_array().cloned().unwrap_or_default())
                .flat_map(|widget| widget["buttonList"]["buttons"].as_array().cloned().unwrap_or_default())
                .find(|button| button["text"] == label);
            let Some(button) = button else { panic!("no button {label} on {name}") };
            let action = &button["onClick"]["action"];
            let parameters = action["parameters"].as_array().cloned().unwrap_or_default();
            let map: serde_json::Map<String, Value> = parameters
                .iter()
                .filter_map(|pair| Some((pair["key"].as_str()?.to_owned(), pair["value"].clone())))
                .collect();
            let event = json!({
                "type": "CARD_CLICKED",
                "eventTime": Utc::now().to_rfc3339(),
                "space": Self::space_json(state, &message.space),
                "message": message.to_json(),
                "user": user.to_json(),
                "action": { "actionMethodName": action["function"], "parameters": parameters },
                "common": { "invokedFunction": action["function"], "parameters": map },
            });
            state.publish(&event)
        })
    }

    /// The next `n` Chat API calls fail with `status` (Google's error body for it).
    pub fn fail_chat(&self, n: usize, status: u16) {
        self.shared.update(|state| state.chat_faults.extend(std::iter::repeat_n(status, n)));
    }

    /// After `ok` more Chat API calls succeed, the next `n` fail with `status`.
    pub fn fail_chat_after(&self, ok: usize, n: usize, status: u16) {
        self.shared.update(|state| {
            state.chat_faults.extend(std::iter::repeat_n(0, ok).chain(std::iter::repeat_n(status, n)));
        });
    }

    /// The next `n` pulls fail with `status`.
    pub fn fail_pulls(&self, n: usize, status: u16) {
        self.shared.update(|state| state.pull_faults.extend(std::iter::repeat_n(status, n)));
    }

    /// The answers of the next `n` pulls that deliver something are lost (after the messages
    /// were leased, as when a connection drops mid-answer): those messages come again once
    /// their lease ends.
    pub fn lose_pulls(&self, n: usize) {
        self.shared.update(|state| state.lost_pulls += n);
    }

    /// The next `n` acknowledge calls fail (503), as if the app died before acknowledging.
    pub fn fail_acks(&self, n: usize) {
        self.shared.update(|state| state.ack_faults += n);
    }

    /// Forget the injected faults not met yet.
    pub fn clear_faults(&self) {
        self.shared.update(|state| {
            state.chat_faults.clear();
            state.pull_faults.clear();
            state.ack_faults = 0;
            state.lost_pulls = 0;
        });
    }

    /// Every token issued so far stops being accepted (the next call answers 401).
    pub fn expire_tokens(&self) {
        self.shared.update(FakeState::expire_tokens);
    }

    /// Every lease ends now: unacknowledged messages are delivered again at the next pull.
    pub fn expire_leases(&self) {
        self.shared.update(FakeState::expire_leases);
    }

    /// Messages now visible in a thread (`spaces/S/threads/T`) or a whole space, oldest first.
    pub fn messages_in(&self, place: &str) -> Vec<FakeChatMessage> {
        self.shared.read(|state| {
            state.messages.iter().filter(|m| !m.deleted && (m.thread == place || m.space == place)).cloned().collect()
        })
    }

    /// A message by name, deleted or not.
    pub fn message(&self, name: &str) -> Option<FakeChatMessage> {
        self.shared.read(|state| state.messages.iter().find(|m| m.name == name).cloned())
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.read(|state| state.requests.clone())
    }

    pub fn tokens_issued(&self) -> usize {
        self.shared.read(|state| state.tokens_issued)
    }

    /// Calls refused with 401.
    pub fn unauthorized(&self) -> usize {
        self.shared.read(|state| state.unauthorized)
    }

    /// Pub/Sub message `id`: (delivery attempts, acknowledged).
    pub fn delivery(&self, id: &str) -> Option<(u32, bool)> {
        self.shared.read(|state| {
            state.published.iter().find(|m| m.id == id).map(|m| (m.attempts, m.lease == state::Lease::Acked))
        })
    }

    /// Whether every published message was acknowledged.
    pub fn all_acked(&self) -> bool {
        self.shared.read(|state| state.published.iter().all(|m| m.lease == state::Lease::Acked))
    }

    /// Wait until `what` holds (re-checked after every change), at most `timeout`.
    pub async fn wait_for(&self, what: impl Fn(&FakeGoogleChat) -> bool, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.shared.subscribe();
        loop {
            changes.borrow_and_update();
            if what(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return what(self),
            }
        }
    }
}

fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((percent_decode(key), percent_decode(value)))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json_response(status: u16, body: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json; charset=UTF-8")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = parse_query(request.uri().query());
    let authorization =
        request.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).map(str::to_owned);
    let bytes: Bytes = match axum::body::to_bytes(request.into_body(), 1024 * 1024).await {
        Ok(bytes) => bytes,
        Err(_) => return json_response(413, &GoogleError::new(413, "INVALID_ARGUMENT", "body too large").body()),
    };

    if method == Method::POST && path == "/token" {
        let form = parse_query(std::str::from_utf8(&bytes).ok());
        let (status, body) = match shared.update(|state| state.grant(&form)) {
            Ok(body) => (200, body),
            Err((status, body)) => (status, body),
        };
        let recorded = json!({ "grant_type": form.get("grant_type") });
        shared.update(|state| {
            state.requests.push(RecordedRequest { method: "POST".into(), path, query, body: recorded, status });
        });
        return json_response(status, &body);
    }

    let body: Value = if bytes.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(body) => body,
            Err(error) => {
                let error =
                    GoogleError::new(400, "INVALID_ARGUMENT", format!("Invalid JSON payload received. {error}"));
                return json_response(400, &error.body());
            }
        }
    };

    // A pull with nothing to deliver waits a little for a message, like the real long poll.
    let is_pull = method == Method::POST && path.ends_with(":pull");
    if is_pull {
        let wait = shared.read(|state| state.options.pull_wait);
        let deadline = tokio::time::Instant::now() + wait;
        let mut changes = shared.subscribe();
        loop {
            changes.borrow_and_update();
            let ready = shared.read(|state| state.has_available() || !state.pull_faults.is_empty());
            if ready {
                break;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => break,
            }
        }
    }

    let outcome = shared.update(|state| -> Result<Value, GoogleError> {
        state.authorize(authorization.as_deref())?;
        route(state, &method, &path, &query, &body)
    });
    let (status, answer) = match outcome {
        Ok(answer) => (200, answer),
        Err(error) => (error.code, error.body()),
    };
    shared.update(|state| {
        state.requests.push(RecordedRequest { method: method.to_string(), path, query, body, status });
    });
    json_response(status, &answer)
}

fn route(
    state: &mut FakeState,
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
    body: &Value,
) -> Result<Value, GoogleError> {
    let not_found = || GoogleError::new(404, "NOT_FOUND", format!("{method} {path} is not an endpoint of this fake"));
    if let Some(rest) = path.strip_prefix("/v1/projects/") {
        let (subscription, verb) = rest.rsplit_once(':').ok_or_else(not_found)?;
        state.check_subscription(&format!("projects/{subscription}"))?;
        if *method != Method::POST {
            return Err(not_found());
        }
        let ack_ids: Vec<String> = body["ackIds"]
            .as_array()
            .map(|ids| ids.iter().filter_map(|id| id.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        return match verb {
            "pull" => {
                let max = body["maxMessages"].as_u64().filter(|max| *max > 0).ok_or_else(|| {
                    GoogleError::new(400, "INVALID_ARGUMENT", "maxMessages must be a positive integer")
                })?;
                state.pull(usize::try_from(max).unwrap_or(usize::MAX))
            }
            "acknowledge" if !ack_ids.is_empty() => state.acknowledge(&ack_ids),
            "modifyAckDeadline" if !ack_ids.is_empty() => {
                let seconds = body["ackDeadlineSeconds"]
                    .as_u64()
                    .ok_or_else(|| GoogleError::new(400, "INVALID_ARGUMENT", "ackDeadlineSeconds is required"))?;
                state.modify_ack_deadline(&ack_ids, seconds)
            }
            "acknowledge" | "modifyAckDeadline" => {
                Err(GoogleError::new(400, "INVALID_ARGUMENT", "No ack ids specified."))
            }
            _ => Err(not_found()),
        };
    }
    if path.starts_with("/upload/v1/spaces/") && path.ends_with("/attachments:upload") {
        return Err(GoogleError::new(
            403,
            "PERMISSION_DENIED",
            "This method doesn't support app authentication with a service account. Authenticate with a user account.",
        ));
    }
    let Some(rest) = path.strip_prefix("/v1/spaces/") else {
        return Err(not_found());
    };
    state.take_chat_fault()?;
    let segments: Vec<&str> = rest.split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("POST", [space, "messages"]) => state.create(&format!("spaces/{space}"), query, body),
        ("PATCH" | "PUT", [space, "messages", message]) => state.patch(
            &format!("spaces/{space}/messages/{message}"),
            query.get("updateMask").map(String::as_str),
            body,
        ),
        ("DELETE", [space, "messages", message]) => state.delete(&format!("spaces/{space}/messages/{message}")),
        ("GET", [space, "messages", message]) => state.get(&format!("spaces/{space}/messages/{message}")),
        _ => Err(not_found()),
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        let query = parse_query(Some("updateMask=text%2CcardsV2&a=b+c"));
        assert_eq!(query["updateMask"], "text,cardsV2");
        assert_eq!(query["a"], "b c");
    }
}
