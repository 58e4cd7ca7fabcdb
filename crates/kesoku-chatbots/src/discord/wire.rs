//! The Discord payloads the adapter reads, as Discord documents them (gateway v10, REST v10).
//!
//! Only the fields we use are declared, and every one Discord may leave out is optional or has a
//! default: reading a dispatch never fails because Discord added, or a proxy dropped, a field we
//! do not need. We do not use twilight-model's full types here for that reason, and because an
//! event it cannot parse is an event silently lost. Ids (snowflakes) arrive as strings and are
//! kept as `u64`.
//!
//! These are wire types only: no behaviour beyond small accessors.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Channel types (Discord's `channel.type`) the adapter tells apart.
pub mod channel_kind {
    pub const GUILD_TEXT: u8 = 0;
    pub const DM: u8 = 1;
    pub const GROUP_DM: u8 = 3;
    pub const GUILD_ANNOUNCEMENT: u8 = 5;
    pub const ANNOUNCEMENT_THREAD: u8 = 10;
    pub const PUBLIC_THREAD: u8 = 11;
    pub const PRIVATE_THREAD: u8 = 12;
}

/// Message types (Discord's `message.type`) that carry something a person wrote.
pub mod message_kind {
    pub const DEFAULT: u8 = 0;
    pub const REPLY: u8 = 19;
}

/// Interaction types.
pub mod interaction_kind {
    pub const PING: u8 = 1;
    pub const APPLICATION_COMMAND: u8 = 2;
    pub const MESSAGE_COMPONENT: u8 = 3;
}

/// One frame of the gateway: `{op, d, s, t}`.
#[derive(Debug, Deserialize)]
pub struct GatewayFrame {
    pub op: u8,
    #[serde(default)]
    pub t: Option<String>,
    #[serde(default)]
    pub d: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub struct User {
    #[serde(deserialize_with = "snowflake")]
    pub id: u64,
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub global_name: Option<String>,
    #[serde(default)]
    pub bot: bool,
}

/// A guild member as embedded in a message (no `user`) or an interaction (with `user`).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct Member {
    #[serde(default)]
    pub nick: Option<String>,
    #[serde(default)]
    pub user: Option<User>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Attachment {
    #[serde(deserialize_with = "snowflake")]
    pub id: u64,
    pub filename: String,
    #[serde(default)]
    pub size: u64,
    pub url: String,
    #[serde(default)]
    pub content_type: Option<String>,
}

/// `MESSAGE_CREATE`'s `d`.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageCreate {
    #[serde(deserialize_with = "snowflake")]
    pub id: u64,
    #[serde(deserialize_with = "snowflake")]
    pub channel_id: u64,
    #[serde(default, deserialize_with = "optional_snowflake")]
    pub guild_id: Option<u64>,
    pub author: User,
    #[serde(default)]
    pub member: Option<Member>,
    #[serde(default)]
    pub content: String,
    /// ISO 8601; the snowflake's own time is used when it is missing or unreadable.
    #[serde(default)]
    pub timestamp: Option<String>,
    #[serde(default)]
    pub mentions: Vec<User>,
    #[serde(default)]
    pub mention_everyone: bool,
    #[serde(default)]
    pub attachments: Vec<Attachment>,
    #[serde(rename = "type", default)]
    pub kind: u8,
    #[serde(default, deserialize_with = "optional_snowflake")]
    pub webhook_id: Option<u64>,
    /// The message this one replies to.
    #[serde(default)]
    pub message_reference: Option<MessageReference>,
}

/// A message's `message_reference` (a reply's target).
#[derive(Debug, Clone, Deserialize)]
pub struct MessageReference {
    #[serde(default, deserialize_with = "optional_snowflake")]
    pub message_id: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Channel {
    #[serde(deserialize_with = "snowflake")]
    pub id: u64,
    #[serde(rename = "type", default)]
    pub kind: u8,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "optional_snowflake")]
    pub parent_id: Option<u64>,
    #[serde(default, deserialize_with = "optional_snowflake")]
    pub guild_id: Option<u64>,
}

/// `GUILD_CREATE`'s `d`: the guild's channels and active threads (absent when unavailable).
#[derive(Debug, Clone, Deserialize)]
pub struct GuildCreate {
    #[serde(deserialize_with = "snowflake")]
    pub id: u64,
    #[serde(default)]
    pub channels: Vec<Channel>,
    #[serde(default)]
    pub threads: Vec<Channel>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ReadyApplication {
    #[serde(deserialize_with = "snowflake")]
    pub id: u64,
}

/// `READY`'s `d`, the parts we use.
#[derive(Debug, Clone, Deserialize)]
pub struct Ready {
    pub user: User,
    pub application: ReadyApplication,
}

/// `INTERACTION_CREATE`'s `d`.
#[derive(Debug, Clone, Deserialize)]
pub struct Interaction {
    #[serde(deserialize_with = "snowflake")]
    pub id: u64,
    #[serde(deserialize_with = "snowflake")]
    pub application_id: u64,
    #[serde(rename = "type")]
    pub kind: u8,
    pub token: String,
    #[serde(default)]
    pub data: Option<InteractionData>,
    #[serde(default, deserialize_with = "optional_snowflake")]
    pub guild_id: Option<u64>,
    #[serde(default)]
    pub channel: Option<Channel>,
    #[serde(default, deserialize_with = "optional_snowflake")]
    pub channel_id: Option<u64>,
    /// Set in guilds (with `user` inside).
    #[serde(default)]
    pub member: Option<Member>,
    /// Set in DMs.
    #[serde(default)]
    pub user: Option<User>,
    /// The message a clicked component is on.
    #[serde(default)]
    pub message: Option<ComponentMessage>,
}

impl Interaction {
    /// Who acted: the member's user in a guild, the user in a DM.
    pub fn actor(&self) -> Option<&User> {
        self.member.as_ref().and_then(|member| member.user.as_ref()).or(self.user.as_ref())
    }

    pub fn channel_id(&self) -> Option<u64> {
        self.channel.as_ref().map(|channel| channel.id).or(self.channel_id)
    }
}

/// `data` of an application command (`name`) or a component click (`custom_id`).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct InteractionData {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub custom_id: Option<String>,
}

/// The message a component sits on: its id and its components as sent (kept as JSON so that
/// an update can send them back with only `disabled` changed).
#[derive(Debug, Clone, Deserialize)]
pub struct ComponentMessage {
    #[serde(deserialize_with = "snowflake")]
    pub id: u64,
    #[serde(default)]
    pub components: Vec<Value>,
}

/// A REST error body: `{"code": 160004, "message": "..."}` (plus details we do not read).
#[derive(Debug, Clone, Deserialize)]
pub struct ErrorBody {
    #[serde(default)]
    pub code: Option<u64>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub retry_after: Option<f64>,
}

/// A REST response we only need the id of (a created message or thread).
#[derive(Debug, Clone, Deserialize)]
pub struct Created {
    #[serde(deserialize_with = "snowflake")]
    pub id: u64,
}

/// `GET /gateway/bot`.
#[derive(Debug, Clone, Deserialize)]
pub struct GatewayBot {
    pub url: String,
}

/// A snowflake: Discord sends ids as strings (numbers are accepted too).
pub fn snowflake<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Number(u64),
    }
    match Raw::deserialize(deserializer)? {
        Raw::Number(number) => Ok(number),
        Raw::Text(text) => text.parse().map_err(|_| serde::de::Error::custom(format!("`{text}` is not a snowflake"))),
    }
}

pub fn optional_snowflake<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    struct Wrapper(#[serde(deserialize_with = "snowflake")] u64);
    Ok(Option::<Wrapper>::deserialize(deserializer)?.map(|Wrapper(id)| id))
}

/// Milliseconds since the Unix epoch at which a snowflake was made.
pub fn snowflake_unix_ms(id: u64) -> i64 {
    i64::try_from((id >> 22) + DISCORD_EPOCH_MS).unwrap_or(i64::MAX)
}

/// The smallest snowflake of the millisecond `unix_ms` (0 before Discord's epoch): what to pass
/// as `after` to read what was written from about then on.
pub fn snowflake_at_unix_ms(unix_ms: i64) -> u64 {
    u64::try_from(unix_ms).map_or(0, |ms| ms.saturating_sub(DISCORD_EPOCH_MS) << 22)
}

/// Discord's epoch (the first millisecond of 2015) in Unix milliseconds.
const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_message_parses_and_ids_are_numbers() {
        let message: MessageCreate = serde_json::from_value(serde_json::json!({
            "id": "1300000000000000001",
            "channel_id": "42",
            "author": {"id": "112233", "username": "chii"},
            "content": "hi",
            "member": {"nick": null},
            "guild_id": null
        }))
        .expect("parses");
        assert_eq!(message.id, 1_300_000_000_000_000_001);
        assert_eq!(message.channel_id, 42);
        assert_eq!(message.guild_id, None);
        assert_eq!(message.kind, message_kind::DEFAULT);
        assert!(!message.author.bot);
    }

    #[test]
    fn snowflake_time() {
        // Discord's documented example: 175928847299117063 was made at 2016-04-30 11:18:25.796 UTC.
        assert_eq!(snowflake_unix_ms(175_928_847_299_117_063), 1_462_015_105_796);
        let at = snowflake_at_unix_ms(1_462_015_105_796);
        assert_eq!(snowflake_unix_ms(at), 1_462_015_105_796);
        assert!(at <= 175_928_847_299_117_063 && 175_928_847_299_117_063 - at < 1 << 22);
        assert_eq!(snowflake_at_unix_ms(0), 0);
    }
}
