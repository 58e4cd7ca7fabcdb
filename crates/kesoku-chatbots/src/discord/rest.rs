//! Discord's REST API as the adapter uses it: messages, threads, typing, application commands,
//! interaction responses, attachment downloads.
//!
//! Requests go through twilight-http's client, so they share its per-route rate-limit buckets
//! (learned from 429 responses, which carry `X-RateLimit-Scope`) and it waits and retries a 429
//! itself. We build the bodies ourselves as JSON (`Request::builder(&Route::…)`): twilight's
//! typed create-message builder cannot send `enforce_nonce`, which effectively-once delivery
//! needs. Errors are [`DiscordApiError`]: transient (429 beyond our deadline, 5xx, timeouts,
//! connection failures) or permanent (the 4xx answers), and never contain the token.
//!
//! [`DiscordApi`] is the small surface the status and delivery code (`status.rs`,
//! `progress.rs`) is written against, so that it can be tested with a fake.
//!
//! Not here: deciding what to send (delivery, status rendering) or what a reply means.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use twilight_http::Client;
use twilight_http::error::ErrorType;
use twilight_http::request::{Form, Request};
use twilight_http::routing::Route;

use super::config::{DiscordConfig, DiscordConfigError, DiscordToken};
use super::wire::{Channel, Created, ErrorBody, GatewayBot, MessageCreate};

/// How long one REST call may take, 429 waits included. twilight retries a 429 after the time
/// Discord names, as often as Discord answers 429; past this deadline the call is reported as
/// transient so the caller's own backoff (and its record of what is pending) takes over.
const CALL_DEADLINE: Duration = Duration::from_secs(60);

/// One HTTP attempt's timeout inside twilight.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);

/// Discord's error code for "a thread has already been created for this message".
pub const THREAD_ALREADY_CREATED: u64 = 160_004;
/// Discord's error code for "Unknown Message".
pub const UNKNOWN_MESSAGE: u64 = 10_008;

/// Discord's limit on a create-message `nonce`, in characters.
pub const MAX_NONCE_CHARS: usize = 25;

/// A create-message `nonce` for `key`, to send with `enforce_nonce`: the same for the same key
/// in every process and version (FNV-1a, unlike std's hasher), `prefix` then 16 hex digits.
/// Keep `prefix` short (two characters) so the nonce stays within [`MAX_NONCE_CHARS`].
pub fn create_nonce(prefix: &str, key: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{prefix}{hash:016x}")
}

/// Minutes of inactivity after which Discord archives a thread the adapter starts (one day).
const THREAD_AUTO_ARCHIVE_MINUTES: u32 = 1440;

/// Why a Discord call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DiscordApiError {
    /// Worth retrying later: rate limited past the deadline, a 5xx, a timeout, no connection.
    #[error("discord is unavailable for now ({reason}); retrying later")]
    Transient { reason: String, retry_after: Option<Duration> },
    /// Retrying will not help: the channel or message is gone, the bot lacks a permission, the
    /// request was refused.
    #[error("discord refused the request (HTTP {status}{}): {reason}", code.map(|code| format!(", code {code}")).unwrap_or_default())]
    Permanent { status: u16, code: Option<u64>, reason: String },
}

impl DiscordApiError {
    pub fn is_transient(&self) -> bool {
        matches!(self, DiscordApiError::Transient { .. })
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            DiscordApiError::Transient { retry_after, .. } => *retry_after,
            DiscordApiError::Permanent { .. } => None,
        }
    }

    /// Discord's JSON error code, when it sent one.
    pub fn code(&self) -> Option<u64> {
        match self {
            DiscordApiError::Transient { .. } => None,
            DiscordApiError::Permanent { code, .. } => *code,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            DiscordApiError::Transient { .. } => None,
            DiscordApiError::Permanent { status, .. } => Some(*status),
        }
    }
}

/// The calls the live status and delivery code makes. Bodies are Discord's own JSON (Create
/// Message: `content`, `nonce`, `enforce_nonce`, `components`, `message_reference`, …).
#[async_trait]
pub trait DiscordApi: Send + Sync {
    /// Create a message; returns its id.
    async fn create_message(&self, channel_id: u64, body: Value) -> Result<u64, DiscordApiError>;
    /// Create a message with files: the body as `payload_json`, the files as `files[n]`.
    async fn create_message_with_files(
        &self,
        channel_id: u64,
        body: Value,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<u64, DiscordApiError>;
    async fn edit_message(&self, channel_id: u64, message_id: u64, body: Value) -> Result<(), DiscordApiError>;
    /// Delete a message; one that is already gone (404 Unknown Message) counts as deleted.
    async fn delete_message(&self, channel_id: u64, message_id: u64) -> Result<(), DiscordApiError>;
    /// Show "typing…" in the channel for about ten seconds.
    async fn trigger_typing(&self, channel_id: u64) -> Result<(), DiscordApiError>;
}

/// What starting a thread from a message gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadStart {
    /// We created it.
    Created { thread_id: u64 },
    /// It existed already (another bot, or our own earlier attempt): its id is the message's.
    Existing { thread_id: u64 },
}

impl ThreadStart {
    pub fn thread_id(self) -> u64 {
        match self {
            ThreadStart::Created { thread_id } | ThreadStart::Existing { thread_id } => thread_id,
        }
    }
}

/// A downloaded attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Download {
    pub bytes: Vec<u8>,
}

/// Why an attachment was not downloaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownloadError {
    #[error("the file is {size} bytes, over the {limit}-byte limit (max_attachment_bytes)")]
    TooLarge { size: u64, limit: u64 },
    #[error("downloading the file failed: {0}")]
    Failed(String),
}

/// The REST client: twilight-http pointed at `api_base_url`, plus a plain HTTP client for
/// attachment downloads (CDN URLs are not API routes and carry no token).
pub struct DiscordRest {
    client: Client,
    downloads: reqwest::Client,
    token: DiscordToken,
}

impl std::fmt::Debug for DiscordRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordRest").finish_non_exhaustive()
    }
}

impl DiscordRest {
    pub fn new(config: &DiscordConfig, token: DiscordToken) -> Result<DiscordRest, DiscordConfigError> {
        let target = config.rest_target()?;
        let mut builder = Client::builder().token(format!("Bot {}", token.expose())).timeout(ATTEMPT_TIMEOUT);
        if target.host != "discord.com" || target.use_http {
            builder = builder.proxy(target.host, target.use_http);
        }
        let downloads = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(300))
            .build()
            .map_err(|_| DiscordConfigError::ApiBaseUrl { id: config.id.clone(), url: config.api_base_url.clone() })?;
        Ok(DiscordRest { client: builder.build(), downloads, token })
    }

    /// Send `request`; the response body on success.
    async fn send(&self, request: Result<Request, twilight_http::Error>) -> Result<Vec<u8>, DiscordApiError> {
        let request = request.map_err(|error| self.map_error(error))?;
        let call = async {
            let response = self.client.request::<()>(request).await.map_err(|error| self.map_error(error))?;
            response.bytes().await.map_err(|error| DiscordApiError::Transient {
                reason: format!("reading the response failed: {error}"),
                retry_after: None,
            })
        };
        match tokio::time::timeout(CALL_DEADLINE, call).await {
            Ok(result) => result,
            Err(_) => Err(DiscordApiError::Transient {
                reason: format!("no answer within {} s (rate limited or slow)", CALL_DEADLINE.as_secs()),
                retry_after: None,
            }),
        }
    }

    async fn send_for<T: DeserializeOwned>(
        &self,
        request: Result<Request, twilight_http::Error>,
    ) -> Result<T, DiscordApiError> {
        let body = self.send(request).await?;
        serde_json::from_slice(&body).map_err(|error| DiscordApiError::Transient {
            reason: format!("discord's answer was not the expected JSON: {error}"),
            retry_after: None,
        })
    }

    fn map_error(&self, error: twilight_http::Error) -> DiscordApiError {
        let description = self.token.scrub(&error.to_string());
        let (kind, _source) = error.into_parts();
        map_error_kind(kind, description)
    }

    /// `GET /gateway/bot`: the websocket URL to connect to.
    pub async fn gateway_url(&self) -> Result<String, DiscordApiError> {
        let gateway: GatewayBot = self.send_for(Request::builder(&Route::GetGatewayBot).build()).await?;
        Ok(gateway.url)
    }

    /// `GET /channels/{id}`.
    pub async fn channel(&self, channel_id: u64) -> Result<Channel, DiscordApiError> {
        self.send_for(Request::builder(&Route::GetChannel { channel_id }).build()).await
    }

    /// `GET /channels/{id}/messages?before=…&limit=…`: the (at most `limit`, 1 to 100) newest
    /// messages written before `before` (the newest of the channel when `None`), oldest first
    /// (Discord answers newest first).
    pub async fn messages_before(
        &self,
        channel_id: u64,
        before: Option<u64>,
        limit: u16,
    ) -> Result<Vec<MessageCreate>, DiscordApiError> {
        let route = Route::GetMessages { after: None, around: None, before, channel_id, limit: Some(limit) };
        let mut messages: Vec<MessageCreate> = self.send_for(Request::builder(&route).build()).await?;
        messages.sort_by_key(|message| message.id);
        Ok(messages)
    }

    /// Start a public thread from `message_id` in `channel_id`, or find the one that exists.
    pub async fn start_thread(
        &self,
        channel_id: u64,
        message_id: u64,
        name: &str,
    ) -> Result<ThreadStart, DiscordApiError> {
        let body = json!({ "name": thread_name(name), "auto_archive_duration": THREAD_AUTO_ARCHIVE_MINUTES });
        let request = Request::builder(&Route::CreateThreadFromMessage { channel_id, message_id }).json(&body).build();
        match self.send_for::<Created>(request).await {
            Ok(created) => Ok(ThreadStart::Created { thread_id: created.id }),
            Err(error) if error.code() == Some(THREAD_ALREADY_CREATED) => {
                // A thread started from a message has the message's id. Another bot was first
                // (or our own earlier attempt was, before a restart): join it so its messages
                // reach us even if it becomes private.
                if let Err(error) = self.join_thread(message_id).await {
                    tracing::debug!(%error, thread_id = message_id, "joining the existing thread failed");
                }
                Ok(ThreadStart::Existing { thread_id: message_id })
            }
            Err(error) => Err(error),
        }
    }

    /// `PUT /channels/{thread}/thread-members/@me`.
    pub async fn join_thread(&self, thread_id: u64) -> Result<(), DiscordApiError> {
        self.send(Request::builder(&Route::JoinThread { channel_id: thread_id }).build()).await.map(drop)
    }

    /// `PUT /applications/{id}/commands`: replace the global application commands.
    pub async fn set_global_commands(&self, application_id: u64, commands: &Value) -> Result<(), DiscordApiError> {
        let request = Request::builder(&Route::SetGlobalCommands { application_id }).json(commands).build();
        self.send(request).await.map(drop)
    }

    /// `POST /interactions/{id}/{token}/callback`. Authorised by the interaction token, not
    /// the bot's.
    pub async fn interaction_callback(
        &self,
        interaction_id: u64,
        interaction_token: &str,
        body: &Value,
    ) -> Result<(), DiscordApiError> {
        let route = Route::InteractionCallback { interaction_id, interaction_token, with_response: false };
        let request = Request::builder(&route).json(body).use_authorization_token(false).build();
        self.send(request).await.map(drop)
    }

    /// `POST /webhooks/{application}/{token}`: a follow-up message to an interaction (after a
    /// deferred response, the first one replaces the "thinking…" placeholder).
    pub async fn create_followup(
        &self,
        application_id: u64,
        interaction_token: &str,
        body: &Value,
    ) -> Result<(), DiscordApiError> {
        let route = Route::ExecuteWebhook {
            thread_id: None,
            token: interaction_token,
            wait: Some(true),
            with_components: None,
            webhook_id: application_id,
        };
        let request = Request::builder(&route).json(body).use_authorization_token(false).build();
        self.send(request).await.map(drop)
    }

    /// Download an attachment, refusing more than `limit` bytes (checked on the announced size,
    /// then while reading, since the announced size may be missing or wrong).
    pub async fn download(&self, url: &str, announced_size: u64, limit: u64) -> Result<Download, DownloadError> {
        if announced_size > limit {
            return Err(DownloadError::TooLarge { size: announced_size, limit });
        }
        let response = self
            .downloads
            .get(url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|error| DownloadError::Failed(error.without_url().to_string()))?;
        if let Some(length) = response.content_length()
            && length > limit
        {
            return Err(DownloadError::TooLarge { size: length, limit });
        }
        let mut bytes = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| DownloadError::Failed(error.without_url().to_string()))?;
            bytes.extend_from_slice(&chunk);
            let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
            if size > limit {
                return Err(DownloadError::TooLarge { size, limit });
            }
        }
        Ok(Download { bytes })
    }
}

#[async_trait]
impl DiscordApi for DiscordRest {
    async fn create_message(&self, channel_id: u64, body: Value) -> Result<u64, DiscordApiError> {
        let request = Request::builder(&Route::CreateMessage { channel_id }).json(&body).build();
        Ok(self.send_for::<Created>(request).await?.id)
    }

    async fn create_message_with_files(
        &self,
        channel_id: u64,
        body: Value,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<u64, DiscordApiError> {
        let form = multipart_form(&body, &files)?;
        let request = Request::builder(&Route::CreateMessage { channel_id }).form(form).build();
        Ok(self.send_for::<Created>(request).await?.id)
    }

    async fn edit_message(&self, channel_id: u64, message_id: u64, body: Value) -> Result<(), DiscordApiError> {
        let request = Request::builder(&Route::UpdateMessage { channel_id, message_id }).json(&body).build();
        self.send(request).await.map(drop)
    }

    async fn delete_message(&self, channel_id: u64, message_id: u64) -> Result<(), DiscordApiError> {
        let request = Request::builder(&Route::DeleteMessage { channel_id, message_id }).build();
        match self.send(request).await {
            Ok(_) => Ok(()),
            Err(DiscordApiError::Permanent { status: 404, code, .. })
                if code.is_none_or(|code| code == UNKNOWN_MESSAGE) =>
            {
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    async fn trigger_typing(&self, channel_id: u64) -> Result<(), DiscordApiError> {
        self.send(Request::builder(&Route::CreateTypingTrigger { channel_id }).build()).await.map(drop)
    }
}

/// Discord's multipart create-message body: `payload_json` with an `attachments` array naming
/// each file by index, and the files as `files[n]`.
pub fn multipart_form(body: &Value, files: &[(String, Vec<u8>)]) -> Result<Form, DiscordApiError> {
    let mut payload = body.clone();
    let attachments: Vec<Value> =
        files.iter().enumerate().map(|(index, (name, _))| json!({ "id": index, "filename": name })).collect();
    match payload.as_object_mut() {
        Some(object) => {
            object.insert("attachments".to_owned(), Value::Array(attachments));
        }
        None => {
            return Err(DiscordApiError::Permanent {
                status: 0,
                code: None,
                reason: "a message body must be a JSON object".to_owned(),
            });
        }
    }
    let payload = serde_json::to_vec(&payload).map_err(|error| DiscordApiError::Permanent {
        status: 0,
        code: None,
        reason: format!("encoding the message failed: {error}"),
    })?;
    let mut form = Form::new().json_part(b"payload_json", &payload);
    for (index, (name, bytes)) in files.iter().enumerate() {
        let field = format!("files[{index}]");
        form = form.file_part(field.as_bytes(), safe_header_filename(name).as_bytes(), bytes);
    }
    Ok(form)
}

/// A file name fit for a multipart header: no quotes, backslashes or line breaks.
fn safe_header_filename(name: &str) -> String {
    let cleaned: String =
        name.chars().map(|c| if matches!(c, '"' | '\\' | '\r' | '\n') || c.is_control() { '_' } else { c }).collect();
    if cleaned.trim().is_empty() { "file".to_owned() } else { cleaned }
}

/// Sort an error response by its status and Discord's JSON error body.
fn map_response(status: u16, body: &[u8]) -> DiscordApiError {
    let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
    let code = parsed.as_ref().and_then(|body| body.code);
    let reason = parsed
        .as_ref()
        .and_then(|body| body.message.clone())
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect());
    if status == 429 || status >= 500 {
        let retry_after = parsed
            .and_then(|body| body.retry_after)
            .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
            .map(Duration::from_secs_f64);
        DiscordApiError::Transient { reason: format!("HTTP {status}: {reason}"), retry_after }
    } else {
        DiscordApiError::Permanent { status, code, reason }
    }
}

/// A thread name from a prompt: its first line, 1 to 100 characters.
pub fn thread_name(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty()).unwrap_or("");
    let name: String = line.chars().take(100).collect();
    if name.is_empty() { "Conversation".to_owned() } else { name }
}

/// Sort a twilight error into transient and permanent. `description` is the error's text with
/// the token scrubbed.
fn map_error_kind(kind: ErrorType, description: String) -> DiscordApiError {
    #[expect(
        clippy::wildcard_enum_match_arm,
        reason = "ErrorType is non-exhaustive: a new kind is treated as transient, so nothing is dropped"
    )]
    match kind {
        ErrorType::Response { body, status, .. } => map_response(status.get(), &body),
        ErrorType::Unauthorized => DiscordApiError::Permanent {
            status: 401,
            code: None,
            reason: "the bot token was rejected (401): check the token in the environment variable named by token_env"
                .to_owned(),
        },
        ErrorType::BuildingRequest | ErrorType::CreatingHeader { .. } | ErrorType::Json | ErrorType::Validation => {
            DiscordApiError::Permanent { status: 0, code: None, reason: description }
        }
        // An error body that is not Discord's JSON: a proxy or load balancer answered (a 502
        // page), which passes.
        ErrorType::Parsing { .. } => DiscordApiError::Transient { reason: description, retry_after: None },
        _ => DiscordApiError::Transient { reason: description, retry_after: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_names_are_the_first_line_within_limits() {
        assert_eq!(thread_name("\n  Run the tests\nplease"), "Run the tests");
        assert_eq!(thread_name("   "), "Conversation");
        assert_eq!(thread_name(&"x".repeat(150)).chars().count(), 100);
    }

    #[test]
    fn multipart_names_files_by_index() {
        let form = multipart_form(
            &json!({"content": "hi", "nonce": "1", "enforce_nonce": true}),
            &[("a\"b.txt".to_owned(), b"one".to_vec()), ("c.png".to_owned(), b"two".to_vec())],
        )
        .expect("object body");
        let text = String::from_utf8_lossy(&form.build()).into_owned();
        assert!(text.contains("name=\"payload_json\""), "{text}");
        assert!(
            text.contains(r#""attachments":[{"id":0,"filename":"a\"b.txt"},{"id":1,"filename":"c.png"}]"#),
            "{text}"
        );
        assert!(text.contains("name=\"files[0]\"; filename=\"a_b.txt\""), "{text}");
        assert!(text.contains("name=\"files[1]\"; filename=\"c.png\""), "{text}");
        assert!(text.contains(r#""enforce_nonce":true"#), "{text}");
        assert!(multipart_form(&json!("text"), &[]).is_err());
    }

    #[test]
    fn error_statuses_sort_into_transient_and_permanent() {
        let response = |status: u16, body: &str| map_response(status, body.as_bytes());
        let gone = response(404, r#"{"code": 10003, "message": "Unknown Channel"}"#);
        assert_eq!(
            gone,
            DiscordApiError::Permanent { status: 404, code: Some(10003), reason: "Unknown Channel".into() }
        );
        let thread =
            response(400, r#"{"code": 160004, "message": "A thread has already been created for this message"}"#);
        assert_eq!(thread.code(), Some(THREAD_ALREADY_CREATED));
        let forbidden = response(403, r#"{"code": 50013, "message": "Missing Permissions"}"#);
        assert!(!forbidden.is_transient());
        let busy = response(503, "<html>");
        assert!(busy.is_transient());
        let limited = response(429, r#"{"message": "You are being rate limited.", "retry_after": 1.5}"#);
        assert_eq!(limited.retry_after(), Some(Duration::from_millis(1500)));
        assert!(map_error_kind(ErrorType::RequestTimedOut, "timed out".into()).is_transient());
        assert_eq!(map_error_kind(ErrorType::Unauthorized, String::new()).status(), Some(401));
    }
}
