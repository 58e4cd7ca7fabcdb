//! The fake's state and the rules of each endpoint: tokens, the subscription's leases and
//! redelivery, Chat messages with their names, threads, idempotency keys and limits.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{FakeChatMessage, FakeGoogleChatOptions, RecordedRequest};

/// The fake's public key, matching [`super::TEST_PRIVATE_KEY_PEM`].
const TEST_PUBLIC_KEY_PEM: &str = include_str!("../../fixtures/google_chat/test-service-account.pub.pem");

/// An HTTP error in Google's shape: `{"error": {"code", "message", "status"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct GoogleError {
    pub code: u16,
    pub status: &'static str,
    pub message: String,
}

impl GoogleError {
    pub fn new(code: u16, status: &'static str, message: impl Into<String>) -> Self {
        GoogleError { code, status, message: message.into() }
    }

    pub fn body(&self) -> Value {
        json!({ "error": { "code": self.code, "message": self.message, "status": self.status } })
    }

    /// The error for an injected fault with this HTTP status.
    pub fn for_status(code: u16) -> Self {
        let status = match code {
            400 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            409 => "ALREADY_EXISTS",
            429 => "RESOURCE_EXHAUSTED",
            503 => "UNAVAILABLE",
            504 => "DEADLINE_EXCEEDED",
            _ => "INTERNAL",
        };
        GoogleError::new(code, status, format!("injected failure ({status})"))
    }
}

/// One Pub/Sub message and its delivery state.
#[derive(Debug, Clone)]
pub(super) struct Published {
    pub id: String,
    pub data: String,
    pub publish_time: String,
    pub attempts: u32,
    pub lease: Lease,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Lease {
    Available,
    Leased { ack_id: String, deadline: Instant },
    Acked,
}

#[derive(Debug, Deserialize)]
struct Claims {
    scope: String,
    iat: i64,
    exp: i64,
}

/// Everything the fake holds.
pub struct FakeState {
    pub(super) options: FakeGoogleChatOptions,
    pub(super) base_url: String,
    pub(super) tokens: HashMap<String, Instant>,
    pub(super) tokens_issued: usize,
    pub(super) unauthorized: usize,
    pub(super) published: Vec<Published>,
    pub(super) spaces: HashMap<String, bool>,
    pub(super) messages: Vec<FakeChatMessage>,
    /// (space, requestId) → message name.
    pub(super) request_ids: HashMap<(String, String), String>,
    pub(super) requests: Vec<RecordedRequest>,
    /// Statuses for the next Chat calls; 0 lets a call through.
    pub(super) chat_faults: Vec<u16>,
    pub(super) pull_faults: Vec<u16>,
    pub(super) ack_faults: usize,
    /// Pulls whose answer is lost after the messages were leased.
    pub(super) lost_pulls: usize,
    pub(super) next_id: u64,
}

impl FakeState {
    pub(super) fn new(options: FakeGoogleChatOptions, base_url: String) -> Self {
        FakeState {
            options,
            base_url,
            tokens: HashMap::new(),
            tokens_issued: 0,
            unauthorized: 0,
            published: Vec::new(),
            spaces: HashMap::new(),
            messages: Vec::new(),
            request_ids: HashMap::new(),
            requests: Vec::new(),
            chat_faults: Vec::new(),
            pull_faults: Vec::new(),
            ack_faults: 0,
            lost_pulls: 0,
            next_id: 1,
        }
    }

    pub(super) fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) fn token_uri(&self) -> String {
        format!("{}/token", self.base_url)
    }

    // --- OAuth ---

    /// The JWT bearer grant: checks the assertion as Google does, then issues a token.
    pub(super) fn grant(&mut self, form: &HashMap<String, String>) -> Result<Value, (u16, Value)> {
        let refuse =
            |error: &str, description: &str| (400, json!({ "error": error, "error_description": description }));
        if form.get("grant_type").map(String::as_str) != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
            return Err(refuse("unsupported_grant_type", "Invalid grant_type"));
        }
        let Some(assertion) = form.get("assertion") else {
            return Err(refuse("invalid_request", "Missing required parameter: assertion"));
        };
        let key = DecodingKey::from_rsa_pem(TEST_PUBLIC_KEY_PEM.as_bytes())
            .map_err(|error| (500, json!({ "error": "internal", "error_description": error.to_string() })))?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_audience(&[self.token_uri()]);
        validation.set_issuer(&[self.options.client_email.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let claims = jsonwebtoken::decode::<Claims>(assertion, &key, &validation)
            .map_err(|error| refuse("invalid_grant", &format!("Invalid JWT: {error}")))?
            .claims;
        if claims.exp - claims.iat > 3600 {
            return Err(refuse("invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes)"));
        }
        for scope in ["https://www.googleapis.com/auth/chat.bot", "https://www.googleapis.com/auth/pubsub"] {
            if !claims.scope.split(' ').any(|granted| granted == scope) {
                return Err(refuse("invalid_scope", &format!("the assertion does not ask for {scope}")));
            }
        }
        self.tokens_issued += 1;
        let serial = self.fresh_id();
        let token = format!("ya29.fake-{}-{serial}", self.tokens_issued);
        let lifetime = self.options.token_lifetime;
        self.tokens.insert(token.clone(), Instant::now() + lifetime);
        Ok(json!({ "access_token": token, "expires_in": lifetime.as_secs(), "token_type": "Bearer" }))
    }

    /// Whether `authorization` carries a live token (a 401 is counted otherwise).
    pub(super) fn authorize(&mut self, authorization: Option<&str>) -> Result<(), GoogleError> {
        let token = authorization.and_then(|value| value.strip_prefix("Bearer "));
        let live = token.and_then(|token| self.tokens.get(token)).is_some_and(|expires| Instant::now() < *expires);
        if live {
            return Ok(());
        }
        self.unauthorized += 1;
        Err(GoogleError::new(
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
        ))
    }

    pub(super) fn expire_tokens(&mut self) {
        let now = Instant::now();
        for expires in self.tokens.values_mut() {
            *expires = now;
        }
    }

    // --- Pub/Sub ---

    pub(super) fn publish(&mut self, event: &Value) -> String {
        let id = format!("{}", 9_000_000_000_000u64 + self.fresh_id());
        let data = base64::engine::general_purpose::STANDARD.encode(event.to_string());
        self.published.push(Published {
            id: id.clone(),
            data,
            publish_time: Utc::now().to_rfc3339(),
            attempts: 0,
            lease: Lease::Available,
        });
        id
    }

    pub(super) fn publish_again(&mut self, pubsub_id: &str) -> String {
        let data = self.published.iter().find(|message| message.id == pubsub_id).map(|message| message.data.clone());
        let Some(data) = data else { panic!("no pub/sub message {pubsub_id}") };
        let id = format!("{}", 9_000_000_000_000u64 + self.fresh_id());
        self.published.push(Published {
            id: id.clone(),
            data,
            publish_time: Utc::now().to_rfc3339(),
            attempts: 0,
            lease: Lease::Available,
        });
        id
    }

    /// Leases past their deadline become available again (Pub/Sub redelivers them).
    fn release_expired(&mut self) {
        let now = Instant::now();
        for message in &mut self.published {
            if matches!(&message.lease, Lease::Leased { deadline, .. } if *deadline <= now) {
                message.lease = Lease::Available;
            }
        }
    }

    pub(super) fn expire_leases(&mut self) {
        let now = Instant::now();
        for message in &mut self.published {
            if let Lease::Leased { deadline, .. } = &mut message.lease {
                *deadline = now;
            }
        }
    }

    /// Whether a pull would deliver something now (without changing anything).
    pub(super) fn has_available(&self) -> bool {
        let now = Instant::now();
        self.published.iter().any(|message| match &message.lease {
            Lease::Available => true,
            Lease::Leased { deadline, .. } => *deadline <= now,
            Lease::Acked => false,
        })
    }

    pub(super) fn check_subscription(&self, subscription: &str) -> Result<(), GoogleError> {
        if subscription == self.options.subscription {
            Ok(())
        } else {
            Err(GoogleError::new(404, "NOT_FOUND", format!("Resource not found (resource={subscription}).")))
        }
    }

    pub(super) fn pull(&mut self, max_messages: usize) -> Result<Value, GoogleError> {
        if !self.pull_faults.is_empty() {
            return Err(GoogleError::for_status(self.pull_faults.remove(0)));
        }
        self.release_expired();
        let deadline = Instant::now() + self.options.ack_deadline;
        let mut received = Vec::new();
        let mut ack_ids = Vec::new();
        for message in self.published.iter_mut().filter(|message| message.lease == Lease::Available) {
            if received.len() >= max_messages {
                break;
            }
            message.attempts += 1;
            let ack_id = format!("ack-{}-{}", message.id, message.attempts);
            message.lease = Lease::Leased { ack_id: ack_id.clone(), deadline };
            ack_ids.push(ack_id.clone());
            received.push(json!({
                "ackId": ack_id,
                "message": {
                    "data": message.data,
                    "messageId": message.id,
                    "publishTime": message.publish_time,
                    "attributes": {},
                },
                "deliveryAttempt": message.attempts,
            }));
        }
        if received.is_empty() {
            return Ok(json!({}));
        }
        if self.lost_pulls > 0 {
            // The messages are leased, but the answer never reaches the subscriber: they come
            // again once the lease ends.
            self.lost_pulls -= 1;
            return Err(GoogleError::new(
                503,
                "UNAVAILABLE",
                "The service was unable to fulfill your request (connection lost).",
            ));
        }
        Ok(json!({ "receivedMessages": received }))
    }

    pub(super) fn acknowledge(&mut self, ack_ids: &[String]) -> Result<Value, GoogleError> {
        if self.ack_faults > 0 {
            self.ack_faults -= 1;
            return Err(GoogleError::for_status(503));
        }
        for message in &mut self.published {
            // An ack id from an earlier delivery no longer counts, as on Pub/Sub.
            if matches!(&message.lease, Lease::Leased { ack_id, .. } if ack_ids.contains(ack_id)) {
                message.lease = Lease::Acked;
            }
        }
        Ok(json!({}))
    }

    pub(super) fn modify_ack_deadline(&mut self, ack_ids: &[String], seconds: u64) -> Result<Value, GoogleError> {
        if seconds > 600 {
            return Err(GoogleError::new(400, "INVALID_ARGUMENT", "ackDeadlineSeconds must be between 0 and 600"));
        }
        let deadline = Instant::now() + Duration::from_secs(seconds);
        for message in &mut self.published {
            if let Lease::Leased { ack_id, deadline: current } = &mut message.lease
                && ack_ids.contains(ack_id)
            {
                *current = deadline;
            }
        }
        self.release_expired();
        Ok(json!({}))
    }

    // --- Chat ---

    pub(super) fn take_chat_fault(&mut self) -> Result<(), GoogleError> {
        if self.chat_faults.is_empty() {
            return Ok(());
        }
        // 0: a call let through before the failures start.
        match self.chat_faults.remove(0) {
            0 => Ok(()),
            status => Err(GoogleError::for_status(status)),
        }
    }

    fn check_content(body: &Value) -> Result<(), GoogleError> {
        if let Some(text) = body.get("text").and_then(Value::as_str)
            && text.chars().count() > 4096
        {
            return Err(GoogleError::new(
                400,
                "INVALID_ARGUMENT",
                format!("Message text is too long: {} characters, the maximum is 4096.", text.chars().count()),
            ));
        }
        let bytes = body.to_string().len();
        if bytes > 32_000 {
            return Err(GoogleError::new(
                400,
                "INVALID_ARGUMENT",
                format!("Message is too large: {bytes} bytes, the maximum is 32000."),
            ));
        }
        Ok(())
    }

    /// `spaces.messages.create`.
    pub(super) fn create(
        &mut self,
        space: &str,
        query: &HashMap<String, String>,
        body: &Value,
    ) -> Result<Value, GoogleError> {
        if !self.spaces.contains_key(space) {
            return Err(GoogleError::new(
                404,
                "NOT_FOUND",
                format!("Space {space} not found or the app is not a member."),
            ));
        }
        if let Some(request_id) = query.get("requestId")
            && let Some(name) = self.request_ids.get(&(space.to_owned(), request_id.clone()))
        {
            let existing = self.messages.iter().find(|message| &message.name == name).map(FakeChatMessage::to_json);
            return existing.ok_or_else(|| GoogleError::new(404, "NOT_FOUND", "the message was deleted"));
        }
        let client_id = query.get("messageId").cloned();
        if let Some(id) = &client_id {
            let valid = id.starts_with("client-")
                && id.len() <= 63
                && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !valid {
                return Err(GoogleError::new(
                    400,
                    "INVALID_ARGUMENT",
                    format!(
                        "Invalid message ID `{id}`: it must start with `client-`, be at most 63 characters, and contain only lowercase letters, numbers and hyphens."
                    ),
                ));
            }
            if self.messages.iter().any(|message| message.name == format!("{space}/messages/{id}")) {
                return Err(GoogleError::new(
                    409,
                    "ALREADY_EXISTS",
                    format!("Message {space}/messages/{id} already exists."),
                ));
            }
        }
        let text = body.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
        let cards = body.get("cardsV2").cloned().unwrap_or_else(|| json!([]));
        if text.is_empty() && cards.as_array().is_none_or(Vec::is_empty) {
            return Err(GoogleError::new(400, "INVALID_ARGUMENT", "Message cannot be empty: set text or cardsV2."));
        }
        Self::check_content(body)?;
        let wanted_thread = body.get("thread").and_then(|thread| thread.get("name")).and_then(Value::as_str);
        let option = query.get("messageReplyOption").map(String::as_str);
        let known_thread = |name: &str| name.starts_with(&format!("{space}/threads/"));
        let thread = match (option, wanted_thread) {
            (Some("REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"), Some(name)) if known_thread(name) => name.to_owned(),
            (Some("REPLY_MESSAGE_OR_FAIL"), Some(name)) if known_thread(name) => name.to_owned(),
            (Some("REPLY_MESSAGE_OR_FAIL"), _) => {
                return Err(GoogleError::new(404, "NOT_FOUND", "Thread not found."));
            }
            _ => format!("{space}/threads/t{}", self.fresh_id()),
        };
        let name = match &client_id {
            Some(id) => format!("{space}/messages/{id}"),
            None => format!("{space}/messages/m{}.m{}", self.fresh_id(), self.next_id),
        };
        let message = FakeChatMessage {
            name: name.clone(),
            space: space.to_owned(),
            thread,
            text,
            cards_v2: cards,
            from_app: true,
            sender: "users/app".to_owned(),
            edits: 0,
            deleted: false,
        };
        let answer = message.to_json();
        self.messages.push(message);
        if let Some(request_id) = query.get("requestId") {
            self.request_ids.insert((space.to_owned(), request_id.clone()), name);
        }
        Ok(answer)
    }

    fn find_mut(&mut self, name: &str) -> Result<&mut FakeChatMessage, GoogleError> {
        self.messages
            .iter_mut()
            .find(|message| message.name == name && !message.deleted)
            .ok_or_else(|| GoogleError::new(404, "NOT_FOUND", format!("Message {name} not found.")))
    }

    /// `spaces.messages.patch`.
    pub(super) fn patch(&mut self, name: &str, update_mask: Option<&str>, body: &Value) -> Result<Value, GoogleError> {
        let Some(mask) = update_mask.filter(|mask| !mask.is_empty()) else {
            return Err(GoogleError::new(400, "INVALID_ARGUMENT", "update_mask is required."));
        };
        let fields: Vec<&str> = mask.split(',').map(str::trim).collect();
        if let Some(bad) = fields
            .iter()
            .find(|field| !["text", "cardsV2", "cards_v2", "attachment", "accessoryWidgets"].contains(field))
        {
            return Err(GoogleError::new(400, "INVALID_ARGUMENT", format!("Invalid update_mask field `{bad}`.")));
        }
        Self::check_content(body)?;
        let message = self.find_mut(name)?;
        if !message.from_app {
            return Err(GoogleError::new(403, "PERMISSION_DENIED", "An app can only update its own messages."));
        }
        for field in fields {
            match field {
                "text" => message.text = body.get("text").and_then(Value::as_str).unwrap_or_default().to_owned(),
                "cardsV2" | "cards_v2" => message.cards_v2 = body.get("cardsV2").cloned().unwrap_or_else(|| json!([])),
                _ => {}
            }
        }
        message.edits += 1;
        Ok(message.to_json())
    }

    pub(super) fn delete(&mut self, name: &str) -> Result<Value, GoogleError> {
        let message = self.find_mut(name)?;
        if !message.from_app {
            return Err(GoogleError::new(403, "PERMISSION_DENIED", "An app can only delete its own messages."));
        }
        message.deleted = true;
        Ok(json!({}))
    }

    pub(super) fn get(&mut self, name: &str) -> Result<Value, GoogleError> {
        Ok(self.find_mut(name)?.to_json())
    }
}
