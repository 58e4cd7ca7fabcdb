//! The API's wire types: request parameters (`*Params`, `*Query`) with their validation rules,
//! and response bodies (`*Response`, `*View`). Messages and ledger rows are sent as the core
//! types themselves, so their JSON is exactly the specification's.
//!
//! The limits written in the `#[schema]` attributes and the checks in the `Validate` impls
//! say the same thing; the fuzz run checks that they agree.

use chrono::{DateTime, Utc};
use kesoku_core::{
    ActivationKind, Lane, LedgerEntry, Message, MessageId, MessageType, Role, Session, SessionId, Status,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::control::{LaneDepths, LaneLimits, RunningTurn};
use crate::error::AppError;
use crate::extract::{Validate, check_text};
use crate::schema::{
    ActivationKindSchema, LaneSchema, LedgerEntryDoc, MessageDoc, MessageTypeSchema, RoleSchema, StatusSchema,
    TimezoneSchema,
};

/// The chatbot id of messages posted through this API (the default of `chatbot_id`).
pub const API_CHATBOT: &str = "api";
/// Longest id-like field (chatbot, channel, sender, session id), in characters.
pub const MAX_NAME_CHARS: usize = 256;
/// Most attachments on one message.
pub const MAX_ATTACHMENTS: usize = 20;
/// Default and largest page sizes of list routes.
pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_LIMIT: u32 = 1000;

/// A new user message.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PostMessageParams {
    /// The chatbot the message belongs to; its replies are delivered by that chatbot.
    /// Defaults to `api` (this API delivers those: they appear on the event stream).
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "api")]
    pub chatbot_id: Option<String>,
    /// The conversation inside the chatbot; with `chatbot_id` it selects the active session.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "web")]
    pub channel_id: String,
    /// Who wrote the message.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "Chii")]
    pub sender: String,
    /// The text of the message.
    #[schema(min_length = 1, pattern = "^[^\\u0000]*$", example = "What is the weather in Tokyo?")]
    pub content: String,
    /// Files, staged into the session's folder and listed in `metadata.attachments`.
    #[serde(default)]
    #[schema(max_items = 20)]
    pub attachments: Vec<AttachmentParams>,
    /// The client's own id for this message, unique per `chatbot_id`: a retried post with the
    /// same id (a timeout, a lost answer) is stored once and answers `200` with the first
    /// message's id instead of `202`.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "web-7f3a2c")]
    pub client_message_id: Option<String>,
    /// The person on whose behalf the agent works: tools that need a connection (`http_request`
    /// with `connection`) use that person's grants (`kesoku grants set USER NAME`). The secrets
    /// never appear in the model's context, the stored messages or this API; the id is kept in
    /// the message's `metadata.activation`.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "alice")]
    pub delegation_user: Option<String>,
    /// The message is written inside a thread: `channel_id` is the thread, hanging off
    /// `parent_channel_id` (same chatbot). Stored as `metadata.thread`; the agent is shown the
    /// thread's root and its recent replies, and an agent sitting in the parent channel may read
    /// the thread (`[[agents]] channels`).
    pub thread: Option<ThreadParams>,
}

/// Where a thread hangs.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ThreadParams {
    /// The channel the thread was opened in (not the thread itself).
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "web")]
    pub parent_channel_id: String,
    /// The id of the stored message the thread was started from, when there is one.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "msg_01J...")]
    pub root_message_id: Option<String>,
}

impl ThreadParams {
    fn validate(&self, channel_id: &str) -> Result<(), AppError> {
        check_text("thread.parent_channel_id", &self.parent_channel_id, 1, MAX_NAME_CHARS)?;
        if self.parent_channel_id == channel_id {
            return Err(AppError::invalid_field(
                "`thread.parent_channel_id` must name the channel the thread hangs off, not the thread \
                 (`channel_id`) itself",
            ));
        }
        if let Some(root) = &self.root_message_id {
            check_text("thread.root_message_id", root, 1, MAX_NAME_CHARS)?;
        }
        Ok(())
    }
}

/// One attached file.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachmentParams {
    /// A plain file name: no directories, no `..`, no absolute path, no NUL.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^/\\\\\\u0000]*[^/\\\\\\u0000.][^/\\\\\\u0000]*$",
        example = "data.csv"
    )]
    pub filename: String,
    /// The file's media type, `type/subtype`.
    #[schema(
        min_length = 3,
        max_length = 255,
        pattern = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+/[!#$%&'*+.^_`|~0-9A-Za-z-]+$",
        example = "text/csv"
    )]
    pub mime_type: String,
    /// The file's bytes, base64 (standard alphabet, padding optional).
    #[schema(
        content_encoding = "base64",
        pattern = "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}(==)?|[A-Za-z0-9+/]{3}=?)?$",
        example = "YSxiCjEsMgo="
    )]
    pub content_base64: String,
}

impl Validate for PostMessageParams {
    fn validate(&self) -> Result<(), AppError> {
        if let Some(chatbot_id) = &self.chatbot_id {
            check_text("chatbot_id", chatbot_id, 1, MAX_NAME_CHARS)?;
        }
        check_text("channel_id", &self.channel_id, 1, MAX_NAME_CHARS)?;
        check_text("sender", &self.sender, 1, MAX_NAME_CHARS)?;
        check_text("content", &self.content, 1, usize::MAX)?;
        if let Some(client_message_id) = &self.client_message_id {
            check_text("client_message_id", client_message_id, 1, MAX_NAME_CHARS)?;
        }
        check_delegation_user(self.delegation_user.as_deref())?;
        if let Some(thread) = &self.thread {
            thread.validate(&self.channel_id)?;
        }
        if self.attachments.len() > MAX_ATTACHMENTS {
            return Err(AppError::invalid_field(format!("at most {MAX_ATTACHMENTS} attachments per message")));
        }
        for (index, attachment) in self.attachments.iter().enumerate() {
            check_text(&format!("attachments[{index}].filename"), &attachment.filename, 1, 255)?;
            check_text(&format!("attachments[{index}].mime_type"), &attachment.mime_type, 3, 255)?;
            if !is_media_type(&attachment.mime_type) {
                return Err(AppError::invalid_field(format!(
                    "`attachments[{index}].mime_type` must look like `type/subtype`, for example `text/plain`"
                )));
            }
        }
        Ok(())
    }
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+.^_`|~-".contains(c)
}

/// `type/subtype` made of RFC 9110 token characters.
fn is_media_type(value: &str) -> bool {
    match value.split_once('/') {
        Some((kind, subtype)) => {
            !kind.is_empty()
                && !subtype.is_empty()
                && kind.chars().all(is_token_char)
                && subtype.chars().all(is_token_char)
        }
        None => false,
    }
}

/// A message was accepted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PostMessageResponse {
    /// The new message's id.
    #[schema(value_type = String)]
    pub id: MessageId,
    /// The session it went to.
    #[schema(value_type = String)]
    pub session_id: SessionId,
}

/// Work for the agent from an automation (a webhook, a script): a direct trigger.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PostActivationParams {
    /// What the agent should do. Stored as the Direct Trigger Message's content.
    #[schema(min_length = 1, pattern = "^[^\\u0000]*$", example = "Summarize today's open issues")]
    pub task: String,
    /// The chatbot whose channel gets the answer (`api`: this API's event stream).
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "api")]
    pub chatbot_id: String,
    /// The channel inside the chatbot; with `chatbot_id` it selects the active session.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "ops")]
    pub channel_id: String,
    /// The trigger's name, shown to the model in the trigger context (default `direct`).
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "nightly-report")]
    pub name: Option<String>,
    /// A configured model (`[models.NAME]`) to answer with instead of the default.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "fast")]
    pub model: Option<String>,
    /// A JSON Schema (an object) the final answer must follow.
    #[schema(value_type = Option<Object>, example = json!({"type": "object", "properties": {"count": {"type": "integer"}}}))]
    pub output_schema: Option<serde_json::Value>,
    /// The IANA time zone the model is shown times in.
    #[schema(value_type = Option<TimezoneSchema>, example = "Asia/Tokyo")]
    pub timezone: Option<String>,
    /// The client's own id for this request, unique per `chatbot_id`: a retried post with the
    /// same id is stored once and answers `200` with the first message instead of `202`.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "hook-2026-05-27")]
    pub client_request_id: Option<String>,
    /// The person on whose behalf the agent works: tools that need a connection (`http_request`
    /// with `connection`) use that person's grants (`kesoku grants set USER NAME`). The secrets
    /// never appear in the model's context, the stored messages or this API; the id is kept in
    /// the message's `metadata.activation`.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$", example = "alice")]
    pub delegation_user: Option<String>,
}

/// A `delegation_user`, when given: a user id as `kesoku grants` stores it (not blank).
fn check_delegation_user(user: Option<&str>) -> Result<(), AppError> {
    if let Some(user) = user {
        check_text("delegation_user", user, 1, MAX_NAME_CHARS)?;
        if user.trim().is_empty() {
            return Err(AppError::invalid_field(
                "`delegation_user` must not be blank: give the user id grants were set for (`kesoku grants list`)",
            ));
        }
    }
    Ok(())
}

/// Longest time zone name accepted (the longest IANA name is 32 characters).
pub const MAX_TIMEZONE_CHARS: usize = 64;

impl Validate for PostActivationParams {
    fn validate(&self) -> Result<(), AppError> {
        check_text("task", &self.task, 1, usize::MAX)?;
        if self.task.trim().is_empty() {
            return Err(AppError::invalid_field("`task` must not be blank: say what the agent should do"));
        }
        check_text("chatbot_id", &self.chatbot_id, 1, MAX_NAME_CHARS)?;
        check_text("channel_id", &self.channel_id, 1, MAX_NAME_CHARS)?;
        for (field, value) in
            [("name", &self.name), ("model", &self.model), ("client_request_id", &self.client_request_id)]
        {
            if let Some(value) = value {
                check_text(field, value, 1, MAX_NAME_CHARS)?;
            }
        }
        check_delegation_user(self.delegation_user.as_deref())?;
        if let Some(schema) = &self.output_schema
            && let Err(reason) = kesoku_chatbots::ingest::check_output_schema(schema)
        {
            return Err(AppError::invalid_field(format!("`output_schema` {reason}")));
        }
        if let Some(timezone) = &self.timezone {
            check_text("timezone", timezone, 1, MAX_TIMEZONE_CHARS)?;
            if timezone.parse::<chrono_tz::Tz>().is_err() {
                return Err(AppError::invalid_field(format!(
                    "`timezone` must be an IANA time zone such as `Europe/Paris`, `Asia/Tokyo` or `UTC`; `{timezone}` is not one"
                )));
            }
        }
        Ok(())
    }
}

/// A direct trigger was accepted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PostActivationResponse {
    /// The Direct Trigger Message: the root of the activation's turn.
    #[schema(value_type = String)]
    pub message_id: MessageId,
    /// The session it went to.
    #[schema(value_type = String)]
    pub session_id: SessionId,
    /// The message's status now (`pending_agent` when new; a repeated request sees how far the
    /// first one got).
    #[schema(value_type = StatusSchema)]
    pub status: Status,
}

/// What a session is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Activity {
    /// Nothing waiting, nothing running.
    Idle,
    /// Messages wait for a worker (`pending_agent`).
    Waiting,
    /// A turn runs (a message is `processing`).
    Running,
}

/// A session, with whether it is its channel's active one and what it is doing.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionView {
    #[schema(value_type = String)]
    pub id: SessionId,
    pub chatbot_id: String,
    pub channel_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// New messages on its (chatbot, channel) go to this session.
    pub active: bool,
    pub activity: Activity,
}

impl SessionView {
    pub fn new(session: Session, active: bool, activity: Activity) -> Self {
        SessionView {
            id: session.id,
            chatbot_id: session.chatbot_id,
            channel_id: session.channel_id,
            title: session.title,
            created_at: session.created_at,
            updated_at: session.updated_at,
            active,
            activity,
        }
    }
}

/// Sessions, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionListResponse {
    pub sessions: Vec<SessionView>,
}

/// Filters of `GET /v1/sessions`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SessionListQuery {
    /// Only sessions of this chatbot.
    #[param(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub chatbot_id: Option<String>,
    /// Only sessions of this channel.
    #[param(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub channel_id: Option<String>,
    /// Most sessions returned (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

fn check_limit(limit: Option<u32>) -> Result<(), AppError> {
    match limit {
        Some(limit) if !(1..=MAX_LIMIT).contains(&limit) => {
            Err(AppError::new(crate::error::ErrorCode::BadQuery, format!("`limit` must be between 1 and {MAX_LIMIT}")))
        }
        Some(_) | None => Ok(()),
    }
}

fn check_query_text(field: &str, value: Option<&str>) -> Result<(), AppError> {
    match value {
        Some(value) => check_text(field, value, 1, MAX_NAME_CHARS)
            .map_err(|error| AppError::new(crate::error::ErrorCode::BadQuery, error_message(error))),
        None => Ok(()),
    }
}

fn error_message(error: AppError) -> String {
    match error {
        AppError::Client { message, .. } => message,
        AppError::Internal(error) => error.to_string(),
    }
}

impl Validate for SessionListQuery {
    fn validate(&self) -> Result<(), AppError> {
        check_query_text("chatbot_id", self.chatbot_id.as_deref())?;
        check_query_text("channel_id", self.channel_id.as_deref())?;
        check_limit(self.limit)
    }
}

/// A session's whole history in phased order.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessagesResponse {
    #[schema(value_type = String)]
    pub session_id: SessionId,
    /// The store revision read before the history: open the event stream with `after=rev`
    /// to miss nothing that changes after this read.
    pub rev: i64,
    #[schema(value_type = Vec<MessageDoc>)]
    pub messages: Vec<Message>,
}

/// A stop request was carried out.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StopResponse {
    #[schema(value_type = String)]
    pub session_id: SessionId,
    /// Waiting messages that were interrupted.
    pub interrupted: u64,
}

/// Filters of `GET /v1/activations`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ActivationsQuery {
    /// Only activations of this session.
    #[param(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub session_id: Option<String>,
    /// `true`: only activations that did not succeed (failed, interrupted, cancelled, limit exceeded).
    pub failed: Option<bool>,
    /// Only activations of this kind.
    #[param(value_type = Option<ActivationKindSchema>)]
    pub kind: Option<ActivationKind>,
    /// Only activations of this lane.
    #[param(value_type = Option<LaneSchema>)]
    pub lane: Option<Lane>,
    /// Most rows returned, newest first (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

impl Validate for ActivationsQuery {
    fn validate(&self) -> Result<(), AppError> {
        check_query_text("session_id", self.session_id.as_deref())?;
        check_limit(self.limit)
    }
}

/// Ledger rows, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ActivationListResponse {
    #[schema(value_type = Vec<LedgerEntryDoc>)]
    pub activations: Vec<LedgerEntry>,
}

/// Parameters of `GET /v1/events`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only messages of this session (all sessions when absent).
    #[param(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub session_id: Option<String>,
    /// Start after this store revision (for example the `rev` of a history read). A
    /// `Last-Event-ID` header, sent by reconnecting clients, takes precedence.
    #[param(minimum = 0)]
    pub after: Option<i64>,
}

impl Validate for EventsQuery {
    fn validate(&self) -> Result<(), AppError> {
        check_query_text("session_id", self.session_id.as_deref())?;
        if self.after.is_some_and(|after| after < 0) {
            return Err(AppError::new(crate::error::ErrorCode::BadQuery, "`after` must not be negative"));
        }
        Ok(())
    }
}

/// One event of the stream: a message as of one change.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessageEventView {
    /// The store revision of the change (also the SSE event id).
    pub rev: i64,
    /// The change created the message (else it changed it).
    pub created: bool,
    #[schema(value_type = MessageDoc)]
    pub message: Message,
}

/// Who holds the session's `processing` message.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkerView {
    #[schema(value_type = String)]
    pub message_id: MessageId,
    /// The worker that claimed it (absent when the claim was not recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_at: Option<DateTime<Utc>>,
    /// Seconds since the claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_for_s: Option<i64>,
}

/// The newest change in the session.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LastEventView {
    #[schema(value_type = String)]
    pub message_id: MessageId,
    #[schema(value_type = RoleSchema)]
    pub role: Role,
    #[serde(rename = "type")]
    #[schema(value_type = MessageTypeSchema, rename = "type")]
    pub message_type: MessageType,
    #[schema(value_type = StatusSchema)]
    pub status: Status,
    pub sender: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<DateTime<Utc>>,
}

/// A message waiting for a worker.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WaitingView {
    #[schema(value_type = String)]
    pub message_id: MessageId,
    pub sender: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
}

/// Why a session is (or is not) moving.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionStateResponse {
    #[schema(value_type = String)]
    pub session_id: SessionId,
    pub activity: Activity,
    /// One sentence: what the session is doing or what it waits for.
    pub summary: String,
    /// The worker holding the session's `processing` message, per the store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerView>,
    /// The turn this process runs for the session, per the runtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running_turn: Option<RunningTurn>,
    /// Activations waiting per lane (all sessions).
    pub queue: LaneDepths,
    /// The session's newest change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_event: Option<LastEventView>,
    /// Limits of each lane.
    pub limits: LaneLimits,
    /// Messages waiting for a worker, oldest first.
    pub waiting: Vec<WaitingView>,
    /// Ledger rows of the session that started and never finished.
    #[schema(value_type = Vec<LedgerEntryDoc>)]
    pub unfinished_activations: Vec<LedgerEntry>,
}

/// The process is up.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HealthResponse {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    pub status: String,
}

/// The runtime snapshot plus the store's newest revision.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuntimeResponse {
    #[serde(flatten)]
    pub state: crate::control::RuntimeState,
    /// The store's newest revision.
    pub rev: i64,
}
