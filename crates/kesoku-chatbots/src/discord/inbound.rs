//! From a Discord message to an [`Inbound`] (spec §3.1): where it goes, who sent it, whether
//! to answer it, and its header.
//!
//! - **Channel**: a thread's id inside a thread; in a guild text channel a thread is started
//!   from the user's message (unless `auto_thread = false`) and its id — equal to the message's
//!   — is the channel; otherwise the channel's own id (a DM channel's included).
//! - **Sender**: the display name (server nickname, else global name, else username).
//! - **Content**: `` `Name` <@id> at `YYYY-MM-DD HH:MM:SS Area/City`: `` then the prompt,
//!   the time in the configured zone, the zone written as its IANA name.
//! - **Admission** ([`Access`]): bots are ignored (this one too); messages mentioning others
//!   but not the bot are ignored; with an allow-list, others are answered only when they
//!   mention the bot.
//! - **Commands** typed as text (`/stop`, …) are run, not ingested.
//! - **Attachments** are downloaded within the size cap and staged by [`ingest`]; one that is
//!   too large or fails is named in the message instead, so the agent knows it exists.
//!
//! The pure decisions ([`place_of`], [`route`], [`header`], [`display_name`], [`mentions`])
//! are separate from the I/O ([`handle_message`]) so they are tested without a server.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use kesoku_core::{Metadata, ThreadRef};
use serde_json::{Value, json};

use super::Shared;
use super::rest::{DiscordApi, thread_name};
use super::wire::{self, Channel, Member, MessageCreate, User, channel_kind, message_kind};
use crate::commands;
use crate::ingest::{Author, Inbound, IngestError, Ingested, ingest, platform_message_id};
use crate::staging::IncomingFile;

/// What the adapter knows about a channel (from `GUILD_CREATE`, channel events, or REST).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelInfo {
    pub kind: u8,
    pub name: Option<String>,
    pub parent_id: Option<u64>,
}

impl From<&Channel> for ChannelInfo {
    fn from(channel: &Channel) -> Self {
        ChannelInfo { kind: channel.kind, name: channel.name.clone(), parent_id: channel.parent_id }
    }
}

/// Channels and threads seen so far, by id.
#[derive(Debug, Default)]
pub struct ChannelCache {
    // A std mutex: held only to read or write one entry, never across an await.
    channels: Mutex<HashMap<u64, ChannelInfo>>,
}

impl ChannelCache {
    pub fn get(&self, channel_id: u64) -> Option<ChannelInfo> {
        self.channels.lock().ok()?.get(&channel_id).cloned()
    }

    pub fn insert(&self, channel_id: u64, info: ChannelInfo) {
        if let Ok(mut channels) = self.channels.lock() {
            channels.insert(channel_id, info);
        }
    }

    pub fn remove(&self, channel_id: u64) {
        if let Ok(mut channels) = self.channels.lock() {
            channels.remove(&channel_id);
        }
    }
}

/// Where a message was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A direct message (or group DM) channel.
    Direct,
    /// A thread; its parent channel when known.
    Thread { parent_id: Option<u64> },
    /// A guild channel that is not a thread; `can_thread` when threads can start in it.
    Channel { name: Option<String>, can_thread: bool },
}

/// Where a message in `guild_id` (none for DMs) and a channel we know `info` of was written.
pub fn place_of(guild_id: Option<u64>, info: Option<&ChannelInfo>) -> Place {
    let Some(info) = info else {
        return if guild_id.is_none() { Place::Direct } else { Place::Channel { name: None, can_thread: false } };
    };
    match info.kind {
        channel_kind::DM | channel_kind::GROUP_DM => Place::Direct,
        channel_kind::PUBLIC_THREAD | channel_kind::PRIVATE_THREAD | channel_kind::ANNOUNCEMENT_THREAD => {
            Place::Thread { parent_id: info.parent_id }
        }
        channel_kind::GUILD_TEXT | channel_kind::GUILD_ANNOUNCEMENT => {
            Place::Channel { name: info.name.clone(), can_thread: true }
        }
        _ if guild_id.is_none() => Place::Direct,
        _ => Place::Channel { name: info.name.clone(), can_thread: false },
    }
}

/// Where the conversation of a message lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The `channel_id` of the stored message: the thread, the channel or the DM channel.
    pub channel_id: u64,
    /// The channel a thread belongs to.
    pub parent_channel_id: Option<u64>,
    /// A thread is to be started from the message (its id will be the message's).
    pub start_thread: bool,
}

/// The route of message `message_id` written in `channel_id` at `place`.
pub fn route(message_id: u64, channel_id: u64, place: &Place, auto_thread: bool) -> Route {
    match place {
        Place::Direct => Route { channel_id, parent_channel_id: None, start_thread: false },
        Place::Thread { parent_id } => Route { channel_id, parent_channel_id: *parent_id, start_thread: false },
        Place::Channel { can_thread: true, .. } if auto_thread => {
            Route { channel_id: message_id, parent_channel_id: Some(channel_id), start_thread: true }
        }
        Place::Channel { .. } => Route { channel_id, parent_channel_id: None, start_thread: false },
    }
}

/// The name people see: server nickname, else global display name, else username.
pub fn display_name<'a>(author: &'a User, member: Option<&'a Member>) -> &'a str {
    let nonempty = |name: &'a Option<String>| name.as_deref().map(str::trim).filter(|name| !name.is_empty());
    member
        .and_then(|member| nonempty(&member.nick))
        .or_else(|| nonempty(&author.global_name))
        .unwrap_or(author.username.as_str())
}

/// The header before the prompt: `` `Name` <@id> at `2026-05-27 20:45:00 Asia/Shanghai`:\n ``.
pub fn header(name: &str, user_id: u64, at: DateTime<Utc>, zone: Tz) -> String {
    crate::ingest::sender_header(name, Some(&format!("<@{user_id}>")), at, zone)
}

/// When the message was written: its timestamp, else the time in its snowflake.
pub fn written_at(message: &MessageCreate) -> DateTime<Utc> {
    message
        .timestamp
        .as_deref()
        .and_then(|stamp| DateTime::parse_from_rfc3339(stamp).ok())
        .map(|stamp| stamp.with_timezone(&Utc))
        .or_else(|| Utc.timestamp_millis_opt(wire::snowflake_unix_ms(message.id)).single())
        .unwrap_or_else(Utc::now)
}

/// Whether the message mentions the bot, and whether it mentions someone else (besides its
/// author). A mention written as `<@id>` counts even when Discord left it out of `mentions`.
pub fn mentions(message: &MessageCreate, bot_user_id: u64) -> (bool, bool) {
    let me = message.mentions.iter().any(|user| user.id == bot_user_id)
        || message.content.contains(&format!("<@{bot_user_id}>"))
        || message.content.contains(&format!("<@!{bot_user_id}>"));
    let others = message.mentions.iter().any(|user| user.id != bot_user_id && user.id != message.author.id);
    (me, others)
}

/// The text with a leading mention of the bot removed (`@Kesoku /stop` is a command).
pub fn without_leading_mention(text: &str, bot_user_id: u64) -> &str {
    let trimmed = text.trim_start();
    for mention in [format!("<@{bot_user_id}>"), format!("<@!{bot_user_id}>")] {
        if let Some(rest) = trimmed.strip_prefix(&mention) {
            return rest.trim_start();
        }
    }
    trimmed
}

/// Whether the message type carries something a person wrote (not a join, pin or thread notice).
fn is_written(message: &MessageCreate) -> bool {
    matches!(message.kind, message_kind::DEFAULT | message_kind::REPLY)
}

/// Metadata of a Discord message ingested by chatbot `chatbot_id`. A message in a thread
/// carries `thread`: the channel it hangs off, and the message it was started from (a thread's
/// id is that message's id, so the stored message's id derives from it).
pub fn metadata(
    chatbot_id: &str,
    message_id: u64,
    author_id: u64,
    channel_id: u64,
    route: &Route,
    guild_id: Option<u64>,
) -> Metadata {
    let mut metadata = Metadata { discord_message_id: Some(message_id.to_string()), ..Metadata::default() };
    metadata.extra.insert("discord_author_id".into(), Value::String(author_id.to_string()));
    metadata.extra.insert("discord_channel_id".into(), Value::String(channel_id.to_string()));
    if let Some(parent) = route.parent_channel_id {
        metadata.extra.insert("discord_parent_channel_id".into(), Value::String(parent.to_string()));
        metadata.thread = Some(Box::new(ThreadRef {
            parent_channel_id: parent.to_string(),
            root_message_id: Some(platform_message_id(chatbot_id, &route.channel_id.to_string())),
        }));
    }
    if let Some(guild) = guild_id {
        metadata.extra.insert("discord_guild_id".into(), Value::String(guild.to_string()));
    }
    metadata
}

/// Handle one `MESSAGE_CREATE`: admit, run a command or start a thread and ingest.
pub(super) async fn handle_message(shared: &Shared, message: MessageCreate) {
    let bot_user_id = shared.bot_user_id();
    if !is_written(&message) {
        return;
    }
    let (mentions_me, mentions_others) = mentions(&message, bot_user_id);
    let author_id = message.author.id.to_string();
    let author = Author {
        user_id: &author_id,
        is_bot: message.author.bot || message.webhook_id.is_some() || message.author.id == bot_user_id,
        mentions_me,
        mentions_others,
    };
    if let Err(ignored) = shared.access.admit(&author) {
        tracing::debug!(message_id = message.id, ?ignored, "discord message not for the agent");
        return;
    }

    // A message without a guild is a DM: no need to ask Discord what its channel is.
    let info = match message.guild_id {
        Some(_) => shared.channel_info(message.channel_id).await,
        None => None,
    };
    let place = place_of(message.guild_id, info.as_ref());
    let text = without_leading_mention(&message.content, bot_user_id);
    if let Some(command) = commands::parse(text) {
        run_text_command(shared, &message, &command).await;
        return;
    }

    let auto_thread = match &place {
        Place::Channel { name, .. } => shared.config.auto_thread(message.channel_id, name.as_deref()),
        Place::Direct | Place::Thread { .. } => false,
    };
    // The channel's model choice; a thread follows its parent channel's.
    let model = match &place {
        Place::Channel { name, .. } => shared.config.model(message.channel_id, name.as_deref()),
        Place::Thread { parent_id: Some(parent) } => {
            let parent_name = shared.channels.get(*parent).and_then(|info| info.name);
            shared.config.model(*parent, parent_name.as_deref())
        }
        Place::Thread { parent_id: None } | Place::Direct => None,
    }
    .map(str::to_owned);
    let mut route = route(message.id, message.channel_id, &place, auto_thread);
    if route.start_thread {
        let name = display_name(&message.author, message.member.as_ref());
        let title = if text.trim().is_empty() { name.to_owned() } else { thread_name(text) };
        match shared.rest.start_thread(message.channel_id, message.id, &title).await {
            Ok(start) => {
                let info = ChannelInfo {
                    kind: channel_kind::PUBLIC_THREAD,
                    name: Some(title),
                    parent_id: Some(message.channel_id),
                };
                shared.channels.insert(start.thread_id(), info);
                route.channel_id = start.thread_id();
            }
            Err(error) => {
                // Without a thread (no permission to create one, say) the conversation stays in
                // the channel rather than being lost.
                tracing::warn!(%error, channel_id = message.channel_id, "starting a thread failed; answering in the channel");
                route = Route { channel_id: message.channel_id, parent_channel_id: None, start_thread: false };
            }
        }
    }

    let (files, notes) = download_attachments(shared, &message).await;
    let sender = display_name(&message.author, message.member.as_ref()).to_owned();
    let mut content = header(&sender, message.author.id, written_at(&message), shared.timezone);
    content.push_str(&commands::message_text(text));
    for note in notes {
        content.push('\n');
        content.push_str(&note);
    }
    let inbound = Inbound {
        chatbot_id: shared.config.id.clone(),
        channel_id: route.channel_id.to_string(),
        sender,
        content,
        platform_key: Some(message.id.to_string()),
        session_id: None,
        files,
        metadata: Metadata {
            model,
            ..metadata(&shared.config.id, message.id, message.author.id, message.channel_id, &route, message.guild_id)
        },
    };
    match ingest(&shared.gateway, &shared.staging, inbound).await {
        Ok(Ingested::Posted(posted)) => {
            tracing::debug!(message_id = %posted.id, discord_message_id = message.id, "discord message ingested");
        }
        Ok(Ingested::Duplicate(id)) => tracing::debug!(message_id = %id, "discord message seen before; skipped"),
        Err(error) if error.is_refusal() => reply(shared, route.channel_id, message.id, &refusal_text(&error)).await,
        Err(error) => tracing::error!(%error, discord_message_id = message.id, "ingesting a discord message failed"),
    }
}

fn refusal_text(error: &IngestError) -> String {
    format!("⚠️ Your message was not passed on: {error}")
}

/// Download each attachment within the cap; the ones not downloaded become notes.
async fn download_attachments(shared: &Shared, message: &MessageCreate) -> (Vec<IncomingFile>, Vec<String>) {
    let limit = shared.config.max_attachment_bytes.min(shared.staging.max_file_bytes);
    let mut files = Vec::new();
    let mut notes = Vec::new();
    for attachment in &message.attachments {
        match shared.rest.download(&attachment.url, attachment.size, limit).await {
            Ok(download) => files.push(IncomingFile {
                filename: attachment.filename.clone(),
                mime_type: attachment.content_type.clone(),
                bytes: download.bytes,
            }),
            Err(error) => {
                tracing::warn!(%error, attachment = %attachment.filename, "discord attachment not downloaded");
                notes.push(format!(
                    "[attachment `{}` was not received: {error}]",
                    attachment.filename.replace('`', "'")
                ));
            }
        }
    }
    (files, notes)
}

/// Run a command typed as a message, in the channel it was typed in, and reply there.
async fn run_text_command(shared: &Shared, message: &MessageCreate, command: &commands::ChatCommand) {
    let text = super::commands::run_command(shared, command, &message.channel_id.to_string()).await;
    reply(shared, message.channel_id, message.id, &text).await;
}

/// Post `text` in `channel_id` as a reply to `message_id` (a reference is dropped when the
/// message is elsewhere, e.g. the start of a thread).
async fn reply(shared: &Shared, channel_id: u64, message_id: u64, text: &str) {
    let body = json!({
        "content": super::commands::fit_message(text),
        "message_reference": { "message_id": message_id.to_string(), "fail_if_not_exists": false },
        "allowed_mentions": { "parse": [] },
    });
    if let Err(error) = shared.rest.create_message(channel_id, body).await {
        tracing::warn!(%error, channel_id, "replying on discord failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::{Access, Ignored};

    fn user(id: u64, username: &str, global_name: Option<&str>) -> User {
        User { id, username: username.into(), global_name: global_name.map(Into::into), bot: false }
    }

    fn message(content: &str, mentions: Vec<User>) -> MessageCreate {
        serde_json::from_value::<MessageCreate>(json!({
            "id": "1300000000000000001", "channel_id": "42", "guild_id": "7",
            "author": {"id": "112233", "username": "chii"}, "content": content,
            "timestamp": "2026-05-27T12:45:00.000000+00:00",
        }))
        .map(|mut message| {
            message.mentions = mentions;
            message
        })
        .expect("message")
    }

    #[test]
    fn header_uses_the_configured_zone_and_its_name() {
        let at = Utc.with_ymd_and_hms(2026, 5, 27, 12, 45, 0).single().expect("valid time");
        assert_eq!(
            header("Chii", 112233, at, chrono_tz::Asia::Shanghai),
            "`Chii` <@112233> at `2026-05-27 20:45:00 Asia/Shanghai`:\n"
        );
        assert_eq!(header("Chii", 112233, at, chrono_tz::UTC), "`Chii` <@112233> at `2026-05-27 12:45:00 UTC`:\n");
        // Daylight saving time is applied: New York is UTC-4 in May.
        assert_eq!(
            header("a`b", 1, at, chrono_tz::America::New_York),
            "`a'b` <@1> at `2026-05-27 08:45:00 America/New_York`:\n"
        );
    }

    #[test]
    fn message_time_comes_from_the_timestamp_or_the_snowflake() {
        let mut written = message("hi", vec![]);
        assert_eq!(written_at(&written).to_rfc3339(), "2026-05-27T12:45:00+00:00");
        written.timestamp = None;
        written.id = 175_928_847_299_117_063;
        assert_eq!(written_at(&written).timestamp_millis(), 1_462_015_105_796);
    }

    #[test]
    fn display_name_prefers_nick_then_global_name() {
        let plain = user(1, "chii", None);
        let global = user(1, "chii", Some("Chii G"));
        let nick = Member { nick: Some("Chii N".into()), user: None };
        let blank_nick = Member { nick: Some("  ".into()), user: None };
        assert_eq!(display_name(&plain, None), "chii");
        assert_eq!(display_name(&global, None), "Chii G");
        assert_eq!(display_name(&global, Some(&nick)), "Chii N");
        assert_eq!(display_name(&global, Some(&blank_nick)), "Chii G");
    }

    #[test]
    fn channel_mapping() {
        let text = ChannelInfo { kind: channel_kind::GUILD_TEXT, name: Some("general".into()), parent_id: None };
        let thread = ChannelInfo { kind: channel_kind::PUBLIC_THREAD, name: None, parent_id: Some(42) };
        let dm = ChannelInfo { kind: channel_kind::DM, name: None, parent_id: None };
        let voice = ChannelInfo { kind: 2, name: Some("lounge".into()), parent_id: None };
        let cases = [
            // (guild, channel info, auto_thread) → route of message 900 written in channel 42
            (Some(7), Some(&text), true, Route { channel_id: 900, parent_channel_id: Some(42), start_thread: true }),
            (Some(7), Some(&text), false, Route { channel_id: 42, parent_channel_id: None, start_thread: false }),
            (Some(7), Some(&thread), true, Route { channel_id: 42, parent_channel_id: Some(42), start_thread: false }),
            (None, Some(&dm), true, Route { channel_id: 42, parent_channel_id: None, start_thread: false }),
            (None, None, true, Route { channel_id: 42, parent_channel_id: None, start_thread: false }),
            (Some(7), None, true, Route { channel_id: 42, parent_channel_id: None, start_thread: false }),
            (Some(7), Some(&voice), true, Route { channel_id: 42, parent_channel_id: None, start_thread: false }),
        ];
        for (guild, info, auto_thread, expected) in cases {
            let place = place_of(guild, info);
            assert_eq!(route(900, 42, &place, auto_thread), expected, "{guild:?} {info:?} {auto_thread}");
        }
        assert_eq!(place_of(Some(7), Some(&text)), Place::Channel { name: Some("general".into()), can_thread: true });
    }

    #[test]
    fn admission_rules_table() {
        let bot = 999;
        let open = Access::default();
        let listed = Access { allowed_users: vec!["112233".into()] };
        let stranger = |content: &str, mentions: Vec<User>| {
            let mut message = message(content, mentions);
            message.author.id = 5555;
            message
        };
        let cases: Vec<(&Access, MessageCreate, Result<(), Ignored>)> = vec![
            (&open, message("hello", vec![]), Ok(())),
            (&open, message("hey <@77>", vec![user(77, "other", None)]), Err(Ignored::ForOthers)),
            (&open, message("<@999> and <@77>", vec![user(bot, "kesoku", None), user(77, "o", None)]), Ok(())),
            (&listed, message("hello", vec![]), Ok(())),
            (&listed, stranger("hello", vec![]), Err(Ignored::NotAllowed)),
            (&listed, stranger("<@999> hello", vec![user(bot, "kesoku", None)]), Ok(())),
            // A mention Discord did not list still counts (the `<@!id>` nickname form).
            (&listed, stranger("<@!999> hello", vec![]), Ok(())),
            (&listed, message("hey <@77>", vec![user(77, "other", None)]), Err(Ignored::ForOthers)),
            // Mentioning yourself is not talking to someone else.
            (&open, message("me <@112233>", vec![user(112233, "chii", None)]), Ok(())),
        ];
        for (access, message, expected) in cases {
            let (mentions_me, mentions_others) = mentions(&message, bot);
            let author_id = message.author.id.to_string();
            let author = Author { user_id: &author_id, is_bot: message.author.bot, mentions_me, mentions_others };
            assert_eq!(access.admit(&author), expected, "{}", message.content);
        }
    }

    #[test]
    fn a_leading_bot_mention_does_not_hide_a_command() {
        assert_eq!(without_leading_mention("<@999> /stop", 999), "/stop");
        assert_eq!(without_leading_mention("  <@!999>/help", 999), "/help");
        assert_eq!(without_leading_mention("<@77> /stop", 999), "<@77> /stop");
        assert_eq!(commands::parse(without_leading_mention("<@999> /stop", 999)), Some(commands::ChatCommand::Stop));
    }

    #[test]
    fn metadata_names_the_discord_ids() {
        let thread = Route { channel_id: 900, parent_channel_id: Some(42), start_thread: true };
        let metadata = metadata("discord", 900, 112233, 42, &thread, Some(7));
        assert_eq!(
            metadata.to_value(),
            json!({
                "discord_message_id": "900",
                "discord_author_id": "112233",
                "discord_channel_id": "42",
                "discord_parent_channel_id": "42",
                "discord_guild_id": "7",
                "thread": {"parent_channel_id": "42", "root_message_id": "msg_discord_900"},
            })
        );
        // A reply in an existing thread names the message the thread was started from.
        let reply = Route { channel_id: 900, parent_channel_id: Some(42), start_thread: false };
        let thread = super::metadata("discord", 901, 112233, 900, &reply, Some(7)).thread.expect("a thread");
        assert_eq!(thread.root_message_id.as_ref().map(|id| id.as_str()), Some("msg_discord_900"));
        let dm = Route { channel_id: 42, parent_channel_id: None, start_thread: false };
        let value = super::metadata("discord", 900, 112233, 42, &dm, None).to_value();
        assert!(value.get("discord_parent_channel_id").is_none() && value.get("discord_guild_id").is_none());
        assert!(value.get("thread").is_none());
    }
}
