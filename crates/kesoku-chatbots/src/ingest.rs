//! Ingestion: the one way a person's message (or a scheduled prompt) enters the system.
//!
//! Every producer — the CLI, the HTTP API, cron, each chat platform — builds an [`Inbound`] and
//! calls [`ingest`], which resolves the session, checks the message ([`IngestError`]), stages
//! its files and posts it as a `pending_agent` message through the gateway (stored, then
//! broadcast). A platform event carries its own id as [`Inbound::platform_key`]: the stored
//! message id is derived from it, so an event delivered twice (a gateway replay after a
//! reconnect, a webhook retry) is stored once and the second call answers
//! [`Ingested::Duplicate`].
//!
//! [`Access`] holds the admission rules chat platforms share (bots ignored, allow-list,
//! mentions); a platform decides them from its event before building the `Inbound`.
//!
//! Not here: commands (parsed by the caller before ingesting, [`crate::commands`]), platform
//! payloads, downloading files.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use kesoku_core::{Message, MessageId, Metadata, SessionId};
use kesoku_gateway::{Gateway, GatewayError};
use kesoku_store::StoreError;

use crate::staging::{IncomingFile, Staging, StagingError};

/// Longest message accepted, in characters: a safety cap far above what people type, as large
/// as the HTTP API's default body limit (10 MiB), which is the tighter bound there.
pub const MAX_CONTENT_CHARS: usize = 10 * 1024 * 1024;

/// A message arriving from a person or a schedule.
#[derive(Debug, Clone)]
pub struct Inbound {
    pub chatbot_id: String,
    pub channel_id: String,
    pub sender: String,
    pub content: String,
    /// The platform's id for the event (its message id): the same key twice is stored once.
    pub platform_key: Option<String>,
    /// Post into this session instead of the channel's active one (the CLI's `--session`).
    pub session_id: Option<SessionId>,
    pub files: Vec<IncomingFile>,
    /// Metadata to store with the message (platform keys; `attachments` is filled in here).
    pub metadata: Metadata,
}

impl Inbound {
    /// A text message from `sender` on (`chatbot_id`, `channel_id`).
    pub fn text(chatbot_id: &str, channel_id: &str, sender: &str, content: impl Into<String>) -> Self {
        Inbound {
            chatbot_id: chatbot_id.to_owned(),
            channel_id: channel_id.to_owned(),
            sender: sender.to_owned(),
            content: content.into(),
            platform_key: None,
            session_id: None,
            files: Vec::new(),
            metadata: Metadata::default(),
        }
    }
}

/// What [`ingest`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Ingested {
    /// Stored and announced: the message waits for the agent.
    Posted(Box<Message>),
    /// This platform event was ingested before; nothing was posted.
    Duplicate(MessageId),
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("the message is empty: send some text or a file")]
    Empty,
    #[error(
        "the message is {chars} characters long, over the limit of {MAX_CONTENT_CHARS}: split it or attach it as a file"
    )]
    TooLong { chars: usize },
    #[error("`{field}` must not be empty")]
    MissingField { field: &'static str },
    #[error(
        "session `{session_id}` is not a session of `{chatbot_id}` channel `{channel_id}`: \
         pick one of the channel's sessions (they are listed by `/sessions`) or leave it out"
    )]
    ForeignSession { session_id: SessionId, chatbot_id: String, channel_id: String },
    #[error(transparent)]
    Staging(#[from] StagingError),
    #[error(transparent)]
    Gateway(#[from] GatewayError),
}

impl IngestError {
    /// The sender's mistake (tell them), as opposed to a failure of ours (retry later).
    pub fn is_refusal(&self) -> bool {
        match self {
            IngestError::Empty
            | IngestError::TooLong { .. }
            | IngestError::MissingField { .. }
            | IngestError::ForeignSession { .. }
            | IngestError::Staging(StagingError::BadName { .. } | StagingError::TooLarge { .. }) => true,
            IngestError::Staging(StagingError::BadSession(_) | StagingError::Io { .. }) | IngestError::Gateway(_) => {
                false
            }
        }
    }
}

/// The message id for a platform event: `msg_<chatbot>_<key>`, with characters outside
/// `[A-Za-z0-9_.-]` replaced, so ids stay safe in paths and URLs.
pub fn platform_message_id(chatbot_id: &str, key: &str) -> MessageId {
    let clean = |text: &str| -> String {
        text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') { c } else { '_' }).collect()
    };
    MessageId::from(format!("msg_{}_{}", clean(chatbot_id), clean(key)))
}

/// Check `inbound`, stage its files, and post it as a `pending_agent` message.
pub async fn ingest(gateway: &Gateway, staging: &Staging, inbound: Inbound) -> Result<Ingested, IngestError> {
    let Inbound { chatbot_id, channel_id, sender, content, platform_key, session_id, files, mut metadata } = inbound;
    for (field, value) in [("chatbot_id", &chatbot_id), ("channel_id", &channel_id), ("sender", &sender)] {
        if value.trim().is_empty() {
            return Err(IngestError::MissingField { field });
        }
    }
    if content.trim().is_empty() && files.is_empty() {
        return Err(IngestError::Empty);
    }
    let chars = content.chars().count();
    if chars > MAX_CONTENT_CHARS {
        return Err(IngestError::TooLong { chars });
    }
    let id = platform_key.as_deref().map(|key| platform_message_id(&chatbot_id, key));
    if let Some(id) = &id
        && gateway.store().get_message(id).await.map_err(GatewayError::from)?.is_some()
    {
        return Ok(Ingested::Duplicate(id.clone()));
    }
    let session_id = match session_id {
        // A named session must exist and belong to the channel the message comes from.
        Some(session_id) => match gateway.store().get_session(&session_id).await.map_err(GatewayError::from)? {
            Some(session) if session.chatbot_id == chatbot_id && session.channel_id == channel_id => session_id,
            Some(_) | None => return Err(IngestError::ForeignSession { session_id, chatbot_id, channel_id }),
        },
        None => gateway.resolve_session(&chatbot_id, &channel_id).await?.id,
    };
    if !files.is_empty() {
        let staged = staging.stage(&session_id, files).await?;
        metadata.attachments.get_or_insert_with(Vec::new).extend(staged);
    }
    let mut message = Message::user_text(&session_id, &chatbot_id, &channel_id, &sender, content);
    if let Some(id) = id {
        message.id = id;
    }
    message.metadata = metadata;
    match gateway.post(&message).await {
        Ok(event) => Ok(Ingested::Posted(Box::new(event.message))),
        // Two deliveries of one event raced past the check above: the first one won.
        Err(GatewayError::Store(StoreError::Duplicate { .. })) if platform_key.is_some() => {
            Ok(Ingested::Duplicate(message.id))
        }
        Err(error) => Err(error.into()),
    }
}

/// The line a chat message's content starts with (spec 3.1): who wrote it, how to mention them
/// on the platform if it has mentions, and when, in the chatbot's zone:
/// `` `Name` <@id> at `2026-05-27 20:45:00 Asia/Shanghai`:\n ``. A backtick in the name would end
/// the code span early, so it becomes `'`.
pub fn sender_header(name: &str, mention: Option<&str>, at: DateTime<Utc>, zone: Tz) -> String {
    let name = name.replace('`', "'");
    let local = at.with_timezone(&zone);
    let mention = mention.map(|mention| format!(" {mention}")).unwrap_or_default();
    format!("`{name}`{mention} at `{} {}`:\n", local.format("%Y-%m-%d %H:%M:%S"), zone.name())
}

/// Who sent a platform message, as the admission rules need it.
#[derive(Debug, Clone, Copy)]
pub struct Author<'a> {
    pub user_id: &'a str,
    pub is_bot: bool,
    /// The message mentions this chatbot's own account.
    pub mentions_me: bool,
    /// The message mentions someone else.
    pub mentions_others: bool,
}

/// Why a message was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// Sent by a bot (this one included).
    FromBot,
    /// Addressed to other people, not to this bot.
    ForOthers,
    /// From a user not on the allow-list, who did not mention the bot.
    NotAllowed,
}

/// The admission rules chat platforms share.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// User ids answered without mentioning the bot; empty means everyone.
    pub allowed_users: Vec<String>,
}

impl Access {
    /// Whether to answer a message: bots are ignored; a message mentioning others but not the
    /// bot is ignored; with a non-empty allow-list, other users are answered only when they
    /// mention the bot.
    pub fn admit(&self, author: &Author<'_>) -> Result<(), Ignored> {
        if author.is_bot {
            return Err(Ignored::FromBot);
        }
        if author.mentions_others && !author.mentions_me {
            return Err(Ignored::ForOthers);
        }
        let allowed = self.allowed_users.is_empty() || self.allowed_users.iter().any(|id| id == author.user_id);
        if !allowed && !author.mentions_me {
            return Err(Ignored::NotAllowed);
        }
        Ok(())
    }
}

/// Check an output schema a producer asks for (`[[cron]] output_schema`, a direct trigger's
/// `output_schema`) before any work is stored: it must be a JSON object that compiles as a JSON
/// Schema. The error says what was wrong, for the producer to put in its own words.
pub fn check_output_schema(schema: &serde_json::Value) -> Result<(), String> {
    use serde_json::Value;
    let kind = match schema {
        Value::Object(_) => None,
        Value::Null => Some("null"),
        Value::Bool(_) => Some("a boolean"),
        Value::Number(_) => Some("a number"),
        Value::String(_) => Some("a string"),
        Value::Array(_) => Some("an array"),
    };
    if let Some(kind) = kind {
        return Err(format!("must be a JSON Schema object, for example {{\"type\": \"object\"}}; got {kind}"));
    }
    jsonschema::validator_for(schema).map(|_| ()).map_err(|error| format!("is not a valid JSON Schema: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_rules() {
        let open = Access::default();
        let listed = Access { allowed_users: vec!["1".into()] };
        let author =
            |user_id, is_bot, mentions_me, mentions_others| Author { user_id, is_bot, mentions_me, mentions_others };
        let cases = [
            (&open, author("9", false, false, false), Ok(())),
            (&open, author("9", true, true, false), Err(Ignored::FromBot)),
            (&open, author("9", false, false, true), Err(Ignored::ForOthers)),
            (&open, author("9", false, true, true), Ok(())),
            (&listed, author("1", false, false, false), Ok(())),
            (&listed, author("2", false, false, false), Err(Ignored::NotAllowed)),
            (&listed, author("2", false, true, false), Ok(())),
            (&listed, author("1", false, false, true), Err(Ignored::ForOthers)),
        ];
        for (access, author, expected) in cases {
            assert_eq!(access.admit(&author), expected, "{access:?} {author:?}");
        }
    }

    #[test]
    fn platform_ids_are_safe() {
        assert_eq!(platform_message_id("discord", "123").as_str(), "msg_discord_123");
        assert_eq!(
            platform_message_id("google_chat", "spaces/A/messages/B.C").as_str(),
            "msg_google_chat_spaces_A_messages_B.C"
        );
    }
}
