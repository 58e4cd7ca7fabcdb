//! What people write to the bot: the `getupdates` long poll and ingestion.
//!
//! The poll carries the `get_updates_buf` cursor. It is saved (the store's chatbot state,
//! key [`CURSOR_KEY`]) only after every message of the batch is stored, so a restart asks again
//! from the last stored batch: nothing is skipped, and what is asked again is recognised by its
//! message id ([`Inbound::platform_key`]) and not stored twice. Errors back off exponentially;
//! an expired session (errcode -14) is logged with the fix and polled again rarely.
//!
//! Mapping (spec §3.1): `channel_id` is the group (`…@chatroom`) or the sender's id; `sender`
//! is the WeChat user id. Each peer's latest `context_token` is saved before the message is
//! ingested (key `context_token:<channel>`), since every reply needs it. A voice message
//! becomes its transcription when the server sent one; images, files, video (and voice without
//! a transcription) are downloaded, decrypted and staged.
//!
//! Not here: sending ([`super::outbound`]).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use kesoku_core::Metadata;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::api::{ApiError, CdnMedia, MESSAGE_TYPE_BOT, MessageItem, WeixinMessage, item_type};
use super::crypto::AesKey;
use crate::commands;
use crate::ingest::{Inbound, Ingested, ingest};
use crate::staging::IncomingFile;

/// The chatbot-state key of the `get_updates_buf` cursor.
pub const CURSOR_KEY: &str = "get_updates_buf";

/// The chatbot-state key of a peer's latest `context_token`.
pub fn context_token_key(channel_id: &str) -> String {
    format!("context_token:{channel_id}")
}

/// Timing of the poll loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollOptions {
    /// How long one `getupdates` may be held (the server may suggest another).
    pub long_poll: Duration,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// Wait after an expired session before asking again.
    pub expired_backoff: Duration,
    /// How often "typing…" is renewed while a turn runs (the reference client: 5 s).
    pub typing_interval: Duration,
    /// How long a turn shows "typing…" at most.
    pub typing_cap: Duration,
}

impl Default for PollOptions {
    fn default() -> Self {
        PollOptions {
            long_poll: Duration::from_secs(35),
            first_backoff: Duration::from_secs(2),
            max_backoff: Duration::from_secs(30),
            expired_backoff: Duration::from_secs(300),
            typing_interval: Duration::from_secs(5),
            typing_cap: Duration::from_secs(10 * 60),
        }
    }
}

/// The channel of a message: its group, else its sender.
pub fn channel_of(message: &WeixinMessage) -> &str {
    match message.group_id.as_deref() {
        Some(group) if !group.is_empty() => group,
        Some(_) | None => &message.from_user_id,
    }
}

/// The event key of a message: its id, else its sequence number, else its client id.
pub fn event_key(message: &WeixinMessage) -> Option<String> {
    message
        .message_id
        .clone()
        .filter(|id| !id.is_empty() && id != "0")
        .or_else(|| message.seq.map(|seq| format!("seq{seq}")))
        .or_else(|| message.client_id.clone())
}

/// The header before the prompt: `` `user` at `2026-05-27 20:45:00 Asia/Shanghai`:\n ``.
pub fn header(user_id: &str, at: DateTime<Utc>, zone: Tz) -> String {
    crate::ingest::sender_header(user_id, None, at, zone)
}

/// Run the poll until `shutdown`.
pub(super) async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let options = shared.poll;
    let mut backoff = options.first_backoff;
    let mut long_poll = options.long_poll;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let cursor = match shared.gateway.store().chatbot_state(&shared.config.id, CURSOR_KEY).await {
            Ok(cursor) => cursor.unwrap_or_default(),
            Err(error) => {
                tracing::warn!(%error, chatbot_id = %shared.config.id, "reading the wechat cursor failed; trying again");
                if pause(&shutdown, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(options.max_backoff);
                continue;
            }
        };
        let polled = tokio::select! {
            () = shutdown.cancelled() => return,
            polled = shared.client.get_updates(&cursor, long_poll) => polled,
        };
        let response = match polled {
            Ok(response) => response,
            Err(error @ ApiError::SessionExpired { .. }) => {
                tracing::error!(chatbot_id = %shared.config.id, %error, "wechat stopped receiving messages");
                if pause(&shutdown, options.expired_backoff).await {
                    return;
                }
                continue;
            }
            Err(error) => {
                tracing::warn!(chatbot_id = %shared.config.id, %error, backoff_ms = backoff.as_millis() as u64, "wechat getupdates failed; backing off");
                if pause(&shutdown, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(options.max_backoff);
                continue;
            }
        };
        if let Some(suggested) = response.longpolling_timeout_ms.filter(|ms| *ms > 0) {
            long_poll = Duration::from_millis(suggested).min(options.long_poll.max(Duration::from_secs(60)));
        }
        let mut stored_all = true;
        for message in &response.msgs {
            if !handle(&shared, message).await {
                stored_all = false;
                break;
            }
        }
        if !stored_all {
            // The cursor stays: the batch is asked for again and what was stored is skipped.
            if pause(&shutdown, backoff).await {
                return;
            }
            backoff = (backoff * 2).min(options.max_backoff);
            continue;
        }
        backoff = options.first_backoff;
        if let Some(next) = response.get_updates_buf.filter(|next| !next.is_empty() && *next != cursor)
            && let Err(error) = shared.gateway.store().set_chatbot_state(&shared.config.id, CURSOR_KEY, &next).await
        {
            tracing::warn!(%error, chatbot_id = %shared.config.id, "saving the wechat cursor failed; the batch will be asked again");
        }
    }
}

/// Wait `delay`; true when shutting down.
async fn pause(shutdown: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(delay) => false,
    }
}

/// Store one message; false when it could not be stored and should be asked for again.
async fn handle(shared: &Shared, message: &WeixinMessage) -> bool {
    if message.message_type == Some(MESSAGE_TYPE_BOT) || message.from_user_id.is_empty() {
        return true;
    }
    let Some(key) = event_key(message) else {
        tracing::warn!("a wechat message without an id; skipped");
        return true;
    };
    if !shared.admits(&message.from_user_id) {
        tracing::debug!(user = %message.from_user_id, "wechat message from a user not on the allow-list; ignored");
        return true;
    }
    let channel_id = channel_of(message).to_owned();
    let store = shared.gateway.store();
    if let Some(token) = message.context_token.as_deref().filter(|token| !token.is_empty())
        && let Err(error) = store.set_chatbot_state(&shared.config.id, &context_token_key(&channel_id), token).await
    {
        tracing::warn!(%error, "saving a wechat context token failed");
        return false;
    }
    let text = text_of(&message.item_list);
    if let Some(command) = commands::parse(&text) {
        run_command(shared, &command, &channel_id, &key, message.context_token.as_deref()).await;
        return true;
    }
    let (files, notes) = download_media(shared, &message.item_list).await;
    if text.trim().is_empty() && files.is_empty() && notes.is_empty() {
        tracing::debug!(wechat_message_id = %key, "a wechat message with nothing the agent can read; skipped");
        return true;
    }
    let at = message.create_time_ms.and_then(DateTime::<Utc>::from_timestamp_millis).unwrap_or_else(Utc::now);
    let mut content = header(&message.from_user_id, at, shared.timezone);
    content.push_str(&commands::message_text(&text));
    for note in notes {
        content.push('\n');
        content.push_str(&note);
    }
    let mut metadata = Metadata::default();
    metadata.extra.insert("wechat_message_id".to_owned(), Value::String(key.clone()));
    metadata.extra.insert("wechat_user_id".to_owned(), Value::String(message.from_user_id.clone()));
    let inbound = Inbound {
        chatbot_id: shared.config.id.clone(),
        channel_id,
        sender: message.from_user_id.clone(),
        content,
        platform_key: Some(key.clone()),
        session_id: None,
        files,
        metadata,
    };
    match ingest(&shared.gateway, &shared.staging, inbound).await {
        Ok(Ingested::Posted(posted)) => {
            tracing::debug!(message_id = %posted.id, wechat_message_id = %key, "wechat message ingested");
            true
        }
        Ok(Ingested::Duplicate(id)) => {
            tracing::debug!(message_id = %id, "wechat message seen before; skipped");
            true
        }
        Err(error) if error.is_refusal() => {
            tracing::warn!(%error, wechat_message_id = %key, "a wechat message was refused");
            true
        }
        Err(error) => {
            tracing::error!(%error, wechat_message_id = %key, "storing a wechat message failed");
            false
        }
    }
}

/// The text of the items: text items, and voice transcriptions.
pub fn text_of(items: &[MessageItem]) -> String {
    let mut parts = Vec::new();
    for item in items {
        match item.item_type {
            item_type::TEXT => {
                if let Some(text) = item.text_item.as_ref().filter(|t| !t.text.is_empty()) {
                    parts.push(text.text.clone());
                }
            }
            item_type::VOICE => {
                if let Some(text) = item.voice_item.as_ref().and_then(|v| v.text.clone()).filter(|t| !t.is_empty()) {
                    parts.push(format!("[voice message] {text}"));
                }
            }
            _ => {}
        }
    }
    parts.join("\n")
}

/// The media of one item to download: its reference, key, and a file name.
fn media_of(item: &MessageItem, index: usize) -> Option<(CdnMedia, Result<AesKey, String>, String)> {
    let key_of = |media: &CdnMedia, hex: Option<&str>| -> Result<AesKey, String> {
        if let Some(hex) = hex.filter(|h| !h.is_empty()) {
            return AesKey::from_hex(hex).map_err(|error| error.to_string());
        }
        let encoded = media.aes_key.as_deref().ok_or("the item has no aes_key")?;
        AesKey::from_media_key(encoded).map_err(|error| error.to_string())
    };
    match item.item_type {
        item_type::IMAGE => {
            let image = item.image_item.as_ref()?;
            let media = image.media.clone()?;
            let key = key_of(&media, image.aeskey.as_deref());
            Some((media, key, format!("image-{}.jpg", index + 1)))
        }
        item_type::FILE => {
            let file = item.file_item.as_ref()?;
            let media = file.media.clone()?;
            let key = key_of(&media, None);
            let name =
                file.file_name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| format!("file-{}", index + 1));
            Some((media, key, name))
        }
        item_type::VIDEO => {
            let media = item.video_item.as_ref()?.media.clone()?;
            let key = key_of(&media, None);
            Some((media, key, format!("video-{}.mp4", index + 1)))
        }
        item_type::VOICE => {
            let voice = item.voice_item.as_ref()?;
            if voice.text.as_deref().is_some_and(|t| !t.is_empty()) {
                return None;
            }
            let media = voice.media.clone()?;
            let key = key_of(&media, None);
            Some((media, key, format!("voice-{}.silk", index + 1)))
        }
        _ => None,
    }
}

/// Download each media item; the ones not downloaded become notes.
async fn download_media(shared: &Shared, items: &[MessageItem]) -> (Vec<IncomingFile>, Vec<String>) {
    let mut files = Vec::new();
    let mut notes = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let Some((media, key, name)) = media_of(item, index) else { continue };
        let downloaded = match key {
            Ok(key) => shared.cdn.download(&media, &key).await.map_err(|error| error.to_string()),
            Err(reason) => Err(reason),
        };
        match downloaded {
            Ok(bytes) => files.push(IncomingFile { filename: name, mime_type: None, bytes }),
            Err(reason) => {
                tracing::warn!(%reason, file = %name, "wechat media not downloaded");
                notes.push(format!("[attachment `{name}` was not received: {reason}]"));
            }
        }
    }
    (files, notes)
}

/// Run a chat command and answer it in the channel.
async fn run_command(
    shared: &Shared,
    command: &commands::ChatCommand,
    channel_id: &str,
    key: &str,
    context_token: Option<&str>,
) {
    let text =
        commands::run_in_channel(&shared.gateway, shared.control.as_ref(), &shared.config.id, channel_id, command)
            .await;
    let text = super::text::plain_text(&text);
    let reply = super::outbound::text_message(channel_id, &format!("kesoku-cmd-{key}"), &text, context_token);
    if let Err(error) = shared.client.send_message(&reply).await {
        tracing::warn!(%error, "answering a wechat command failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wechat::api::{TextItem, VoiceItem};

    #[test]
    fn channel_key_and_text() {
        let direct =
            WeixinMessage { from_user_id: "u1@im.wechat".into(), message_id: Some("9".into()), ..Default::default() };
        assert_eq!(channel_of(&direct), "u1@im.wechat");
        assert_eq!(event_key(&direct).as_deref(), Some("9"));
        let room = WeixinMessage { group_id: Some("room1@chatroom".into()), seq: Some(4), ..direct.clone() };
        assert_eq!(channel_of(&room), "room1@chatroom");
        let no_id = WeixinMessage { message_id: None, seq: Some(4), ..direct };
        assert_eq!(event_key(&no_id).as_deref(), Some("seq4"));
        let items = vec![
            MessageItem {
                item_type: item_type::TEXT,
                text_item: Some(TextItem { text: "hi".into() }),
                ..Default::default()
            },
            MessageItem {
                item_type: item_type::VOICE,
                voice_item: Some(VoiceItem { text: Some("call me".into()), ..Default::default() }),
                ..Default::default()
            },
        ];
        assert_eq!(text_of(&items), "hi\n[voice message] call me");
        assert!(media_of(&items[1], 1).is_none(), "a transcribed voice is not downloaded");
    }

    #[test]
    fn header_names_the_user_and_local_time() {
        let at = DateTime::<Utc>::from_timestamp(1_779_885_900, 0).expect("time");
        assert_eq!(
            header("wxid_a", at, chrono_tz::Asia::Shanghai),
            "`wxid_a` at `2026-05-27 20:45:00 Asia/Shanghai`:\n"
        );
    }
}
