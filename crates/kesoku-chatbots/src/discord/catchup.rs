//! Catching up on what people wrote while the adapter was not listening.
//!
//! Discord replays missed events only when a session is resumed. After a fresh Identify (a
//! restart, or a session Discord would not resume) whatever was written meanwhile is never
//! dispatched. So on each `READY` the adapter reads, in every channel it has talked in lately,
//! the messages written after the newest one it stored there ([`missed_messages`]), and the
//! message worker hands each, oldest first, to the same handling as a live `MESSAGE_CREATE`
//! (admission, auto-thread, commands, ingest). Ingesting is idempotent on the Discord message
//! id, so a message both read here and dispatched live is stored once.
//!
//! - **Where it stopped listening** ([`cursors`]): per channel of the chatbot's stored user
//!   messages (a thread, a DM, a channel without threads), the newest one's Discord id; for a
//!   channel threads were started from (`discord_parent_channel_id`), the newest of any of its
//!   threads — a message in a thread shows the adapter was listening then.
//! - **Bounds**: only channels with a stored user message in the last [`CATCH_UP_WINDOW`], and
//!   at most [`CATCH_UP_PER_CHANNEL`] messages per channel: the newest missed ones, read
//!   backwards from the channel's end down to the cursor, so a flood of messages the bot ignores
//!   (other bots, talk among people) can never hide a later message meant for it.
//! - **Already answered**: a message the bot replied to in the history read (a command's answer
//!   or a refusal carries a `message_reference`) is not handled again.
//! - A channel Discord will not let us read (403, 404) is logged and skipped; one that fails
//!   for now (5xx, rate limits past the deadline) too — its messages are read at the next
//!   `READY`, since nothing moved its cursor.
//!
//! Messages read over REST carry neither `guild_id` nor `member`: the guild comes from the
//! channel, and the sender's name is their global name or username (no server nickname).
//!
//! Not here: what a message means ([`super::inbound`]), when catch-up runs ([`super::Discord::run`]).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::Utc;
use kesoku_core::{Message, Role};

use super::Shared;
use super::inbound::ChannelInfo;
use super::rest::DiscordApiError;
use super::wire::{MessageCreate, snowflake_at_unix_ms};

/// How far back a channel's last stored message may be for the channel to be read: a channel
/// quiet for longer is not worth a REST call per restart.
pub const CATCH_UP_WINDOW: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The most messages read per channel at one catch-up: enough for any conversation the bot
/// missed, bounded so that a busy channel cannot flood the agent after a long outage.
pub const CATCH_UP_PER_CHANNEL: usize = 200;

/// Discord's page size limit for `GET /channels/{id}/messages`.
const PAGE: u16 = 100;

/// Per Discord channel, the id of the newest message the adapter stored there or in one of its
/// threads (`newest`: the newest stored user message of each of the chatbot's channels).
pub fn cursors(newest: &[Message]) -> BTreeMap<u64, u64> {
    let mut cursors = BTreeMap::new();
    for message in newest {
        let Some(listened_up_to) = listened_up_to(message) else { continue };
        let parent = message
            .metadata
            .extra
            .get("discord_parent_channel_id")
            .and_then(serde_json::Value::as_str)
            .and_then(|id| id.parse::<u64>().ok());
        for channel in [message.channel_id.parse::<u64>().ok(), parent].into_iter().flatten() {
            let cursor = cursors.entry(channel).or_insert(listened_up_to);
            *cursor = (*cursor).max(listened_up_to);
        }
    }
    cursors
}

/// The Discord message id up to which the adapter heard a channel, given its newest stored
/// message there: that message's own id, or (for one not from Discord, e.g. posted by cron
/// into the channel's session) the first id of the moment it was stored.
fn listened_up_to(message: &Message) -> Option<u64> {
    message
        .metadata
        .discord_message_id
        .as_deref()
        .and_then(|id| id.parse().ok())
        .or_else(|| message.created_at.map(|at| snowflake_at_unix_ms(at.timestamp_millis())))
}

/// Messages of `history` (one channel, oldest first) the bot already answered in it.
pub fn answered(history: &[MessageCreate], bot_user_id: u64) -> HashSet<u64> {
    history
        .iter()
        .filter(|message| message.author.id == bot_user_id)
        .filter_map(|message| message.message_reference.as_ref()?.message_id)
        .collect()
}

/// What people wrote while the adapter was not listening, per channel oldest first, each with
/// its `guild_id` set as a dispatch would have it. Failures are logged; they never stop the
/// adapter.
pub(super) async fn missed_messages(shared: &Shared) -> Vec<MessageCreate> {
    let since = Utc::now() - chrono::Duration::from_std(CATCH_UP_WINDOW).unwrap_or(chrono::Duration::MAX);
    let newest = match shared.gateway.store().newest_per_channel(&shared.config.id, Role::User, since).await {
        Ok(newest) => newest,
        Err(error) => {
            tracing::error!(%error, "reading where the discord catch-up starts failed; messages written while offline are read at the next connection");
            return Vec::new();
        }
    };
    let mut missed = Vec::new();
    for (channel_id, after) in cursors(&newest) {
        match channel_history(shared, channel_id, after).await {
            Ok(history) => {
                let answered = answered(&history, shared.bot_user_id());
                missed.extend(history.into_iter().filter(|message| !answered.contains(&message.id)));
            }
            Err(error) if error.is_transient() => tracing::warn!(
                %error, channel_id, "reading a discord channel's missed messages failed; read again at the next connection"
            ),
            Err(error) => {
                tracing::warn!(%error, channel_id, "a discord channel cannot be read; its missed messages are skipped")
            }
        }
    }
    if !missed.is_empty() {
        tracing::info!(count = missed.len(), "discord messages written while offline are being handled");
    }
    missed
}

/// The newest (up to [`CATCH_UP_PER_CHANNEL`]) messages of `channel_id` written after `after`,
/// oldest first.
async fn channel_history(shared: &Shared, channel_id: u64, after: u64) -> Result<Vec<MessageCreate>, DiscordApiError> {
    let channel = shared.rest.channel(channel_id).await?;
    shared.channels.insert(channel_id, ChannelInfo::from(&channel));
    // Pages are read from the channel's newest message backwards until the cursor is reached.
    let mut history: Vec<MessageCreate> = Vec::new();
    let mut before = None;
    let mut reached_cursor = false;
    while history.len() < CATCH_UP_PER_CHANNEL {
        let page = shared.rest.messages_before(channel_id, before, PAGE).await?;
        let full = page.len() == usize::from(PAGE);
        let Some(oldest) = page.first().map(|message| message.id) else { break };
        reached_cursor = oldest <= after;
        let mut newer: Vec<MessageCreate> = page.into_iter().filter(|message| message.id > after).collect();
        newer.append(&mut history);
        history = newer;
        if reached_cursor || !full {
            reached_cursor = true;
            break;
        }
        before = Some(oldest);
    }
    if !reached_cursor || history.len() > CATCH_UP_PER_CHANNEL {
        tracing::warn!(
            channel_id,
            limit = CATCH_UP_PER_CHANNEL,
            "more discord messages were written in a channel while offline than are read at once; only the newest are handled"
        );
        let excess = history.len().saturating_sub(CATCH_UP_PER_CHANNEL);
        history.drain(..excess);
    }
    for message in &mut history {
        message.guild_id = message.guild_id.or(channel.guild_id);
    }
    Ok(history)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use kesoku_core::{MessageType, Metadata, SessionId, Status};
    use serde_json::json;

    use super::*;

    fn stored(channel_id: &str, metadata: serde_json::Value) -> Message {
        Message {
            id: kesoku_core::MessageId::generate(),
            session_id: SessionId::from("s"),
            parent_id: None,
            chatbot_id: "discord".to_owned(),
            channel_id: channel_id.to_owned(),
            sender: "Alice".to_owned(),
            role: Role::User,
            message_type: MessageType::Text,
            content: "hi".to_owned(),
            status: Status::PendingAgent,
            metadata: Metadata::from_value(metadata).expect("metadata"),
            step: 0,
            created_at: Utc.timestamp_millis_opt(1_462_015_105_796).single(),
            updated_at: None,
        }
    }

    #[test]
    fn cursors_take_the_newest_of_a_channel_and_of_its_threads() {
        let newest = [
            // A thread of channel 42, and another one.
            stored("900", json!({"discord_message_id": "950", "discord_parent_channel_id": "42"})),
            stored("901", json!({"discord_message_id": "990", "discord_parent_channel_id": "42"})),
            // A DM.
            stored("7", json!({"discord_message_id": "70"})),
            // Not a Discord message: the moment it was stored.
            stored("8", json!({})),
            // Not a Discord channel.
            stored("cli", json!({"discord_message_id": "5"})),
        ];
        let cursors = cursors(&newest);
        let expected_8 = snowflake_at_unix_ms(1_462_015_105_796);
        assert_eq!(
            cursors.into_iter().collect::<Vec<_>>(),
            [(7, 70), (8, expected_8), (42, 990), (900, 950), (901, 990)]
        );
    }

    #[test]
    fn a_message_the_bot_replied_to_counts_as_answered() {
        let message = |id: u64, author: u64, reply_to: Option<u64>| {
            serde_json::from_value::<MessageCreate>(json!({
                "id": id.to_string(), "channel_id": "1", "author": {"id": author.to_string(), "username": "u"},
                "content": "x", "message_reference": reply_to.map(|id| json!({"message_id": id.to_string()})),
            }))
            .expect("message")
        };
        let history =
            [message(10, 5, None), message(11, 99, Some(10)), message(12, 5, Some(11)), message(13, 6, Some(12))];
        assert_eq!(answered(&history, 99), HashSet::from([10]));
    }
}
