//! The gateway connection: one twilight shard, read until shutdown or a fatal close.
//!
//! twilight-gateway does the protocol work — hello, identify, heartbeats, resume after a drop,
//! a fresh identify when the session cannot be resumed, backoff between attempts. This module
//! chooses the intents, points the shard at `gateway_url` (or the URL `GET /gateway/bot`
//! names), turns the dispatches we use into [`Dispatch`] values, and turns a fatal close code
//! into a [`DiscordError`] that says what to fix.
//!
//! It never blocks the shard: handling an event (REST calls, downloads, the store) happens in
//! the caller's tasks, since a shard that is not polled misses its heartbeats.
//!
//! No compression is requested (the `zstd` and `zlib` features are off), so frames are JSON text.

use futures::StreamExt;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use twilight_gateway::{CloseFrame, ConfigBuilder, Intents, Message, Shard, ShardId, ShardState};
use twilight_model::gateway::CloseCode;

use super::DiscordError;
use super::config::DiscordToken;
use super::wire::{Channel, GatewayFrame, GuildCreate, Interaction, MessageCreate, Ready};

/// Gateway opcode of a dispatch (an event).
const OP_DISPATCH: u8 = 0;

/// What the adapter needs to hear: guilds and their channels, guild messages with their
/// content (privileged), members (privileged; display names), and direct messages.
pub fn intents() -> Intents {
    Intents::GUILDS
        | Intents::GUILD_MESSAGES
        | Intents::MESSAGE_CONTENT
        | Intents::GUILD_MEMBERS
        | Intents::DIRECT_MESSAGES
}

/// A dispatch the adapter acts on.
#[derive(Debug, Clone)]
pub enum Dispatch {
    Ready(Box<Ready>),
    GuildCreate(Box<GuildCreate>),
    /// A channel or thread was created or changed (`CHANNEL_CREATE/UPDATE`, `THREAD_CREATE/UPDATE`).
    ChannelUpsert(Box<Channel>),
    /// A channel or thread is gone (`CHANNEL_DELETE`, `THREAD_DELETE`).
    ChannelDelete {
        channel_id: u64,
    },
    MessageCreate(Box<MessageCreate>),
    InteractionCreate(Box<Interaction>),
}

/// Parse one gateway text frame; `Ok(None)` for frames and events the adapter does not use.
pub fn parse_dispatch(text: &str) -> Result<Option<Dispatch>, serde_json::Error> {
    let frame: GatewayFrame = serde_json::from_str(text)?;
    if frame.op != OP_DISPATCH {
        return Ok(None);
    }
    let Some(event) = frame.t.as_deref() else {
        return Ok(None);
    };
    fn data<T: DeserializeOwned>(value: serde_json::Value) -> Result<Box<T>, serde_json::Error> {
        serde_json::from_value(value).map(Box::new)
    }
    Ok(Some(match event {
        "READY" => Dispatch::Ready(data(frame.d)?),
        "GUILD_CREATE" => Dispatch::GuildCreate(data(frame.d)?),
        "CHANNEL_CREATE" | "CHANNEL_UPDATE" | "THREAD_CREATE" | "THREAD_UPDATE" => {
            Dispatch::ChannelUpsert(data(frame.d)?)
        }
        "CHANNEL_DELETE" | "THREAD_DELETE" => Dispatch::ChannelDelete { channel_id: data::<Channel>(frame.d)?.id },
        "MESSAGE_CREATE" => Dispatch::MessageCreate(data(frame.d)?),
        "INTERACTION_CREATE" => Dispatch::InteractionCreate(data(frame.d)?),
        _ => return Ok(None),
    }))
}

/// The error for a close code after which twilight does not reconnect.
pub fn fatal_close_error(code: Option<u16>, reason: &str, token_env: &str) -> DiscordError {
    const AUTHENTICATION_FAILED: u16 = CloseCode::AuthenticationFailed as u16;
    const DISALLOWED_INTENTS: u16 = CloseCode::DisallowedIntents as u16;
    match code {
        Some(AUTHENTICATION_FAILED) => DiscordError::TokenRejected { token_env: token_env.to_owned() },
        Some(DISALLOWED_INTENTS) => DiscordError::PrivilegedIntents,
        Some(code) => {
            let meaning = CloseCode::try_from(code).map(|close| format!("{close}: ")).unwrap_or_default();
            DiscordError::GatewayClosed { code, reason: format!("{meaning}{reason}") }
        }
        None => DiscordError::GatewayClosed { code: 0, reason: reason.to_owned() },
    }
}

/// Read the gateway at `url` until `shutdown` fires (`Ok`) or Discord closes the connection
/// for good (`Err`, saying what to fix). Each dispatch we use goes to `on_dispatch`, which must
/// return quickly.
pub async fn run_shard(
    token: &DiscordToken,
    url: &str,
    token_env: &str,
    shutdown: CancellationToken,
    mut on_dispatch: impl FnMut(Dispatch),
) -> Result<(), DiscordError> {
    let config = ConfigBuilder::new(token.expose().to_owned(), intents())
        .proxy_url(url.trim_end_matches('/').to_owned())
        .build();
    let mut shard = Shard::with_config(ShardId::ONE, config);
    // The last close frame Discord sent: when the shard then ends, its code says why.
    let mut last_close: Option<(u16, String)> = None;
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => {
                shard.close(CloseFrame::NORMAL);
                return Ok(());
            }
            next = shard.next() => next,
        };
        match next {
            None => {
                let (code, reason) = match last_close.take() {
                    Some((code, reason)) => (Some(code), reason),
                    None => (None, "the gateway ended the connection".to_owned()),
                };
                return Err(fatal_close_error(code, &reason, token_env));
            }
            Some(Ok(Message::Text(text))) => match parse_dispatch(&text) {
                Ok(Some(dispatch)) => on_dispatch(dispatch),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "a gateway event could not be read; skipped"),
            },
            Some(Ok(Message::Close(frame))) => {
                if let Some(frame) = &frame {
                    last_close = Some((frame.code, frame.reason.to_string()));
                }
                if shard.state() == ShardState::FatallyClosed {
                    tracing::error!(
                        code = frame.as_ref().map(|frame| frame.code),
                        "the gateway closed the connection for good"
                    );
                } else {
                    tracing::info!(
                        code = frame.as_ref().map(|frame| frame.code),
                        "gateway connection closed; resuming"
                    );
                }
            }
            Some(Err(error)) => {
                // twilight reconnects by itself (with backoff); this is only worth a note.
                tracing::warn!(%error, "gateway connection failed; reconnecting");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fatal_close_codes_say_the_fix() {
        let rejected = fatal_close_error(Some(4004), "Authentication failed.", "MY_BOT_TOKEN").to_string();
        assert!(rejected.contains("MY_BOT_TOKEN"), "{rejected}");
        assert!(rejected.contains("4004"), "{rejected}");
        let intents = fatal_close_error(Some(4014), "Disallowed intent(s).", "DISCORD_TOKEN").to_string();
        assert!(intents.contains("Message Content"), "{intents}");
        assert!(intents.contains("Server Members"), "{intents}");
        assert!(intents.contains("Developer Portal"), "{intents}");
        let sharding = fatal_close_error(Some(4011), "Sharding required.", "DISCORD_TOKEN").to_string();
        assert!(sharding.contains("4011"), "{sharding}");
        let unknown = fatal_close_error(None, "gone", "DISCORD_TOKEN");
        assert!(matches!(unknown, DiscordError::GatewayClosed { code: 0, .. }));
    }

    #[test]
    fn dispatches_are_parsed_and_other_frames_skipped() {
        let hello = r#"{"op": 10, "d": {"heartbeat_interval": 41250}}"#;
        assert!(parse_dispatch(hello).expect("json").is_none());
        let typing = r#"{"op": 0, "s": 3, "t": "TYPING_START", "d": {}}"#;
        assert!(parse_dispatch(typing).expect("json").is_none());
        let message = r#"{"op": 0, "s": 4, "t": "MESSAGE_CREATE", "d": {"id": "10", "channel_id": "20",
            "author": {"id": "30", "username": "chii"}, "content": "hi"}}"#;
        match parse_dispatch(message).expect("json") {
            Some(Dispatch::MessageCreate(message)) => assert_eq!((message.id, message.channel_id), (10, 20)),
            other => panic!("expected a message, got {other:?}"),
        }
        let thread = r#"{"op": 0, "t": "THREAD_DELETE", "d": {"id": "5", "type": 11, "parent_id": "20"}}"#;
        assert!(matches!(parse_dispatch(thread).expect("json"), Some(Dispatch::ChannelDelete { channel_id: 5 })));
        assert!(parse_dispatch(r#"{"op": 0, "t": "MESSAGE_CREATE", "d": {"id": "x"}}"#).is_err());
    }

    #[test]
    fn intents_include_the_privileged_ones() {
        let intents = intents();
        assert!(intents.contains(Intents::MESSAGE_CONTENT | Intents::GUILD_MEMBERS | Intents::DIRECT_MESSAGES));
        assert!(!intents.contains(Intents::GUILD_PRESENCES));
    }
}
