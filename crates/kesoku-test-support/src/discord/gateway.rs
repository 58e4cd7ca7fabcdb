//! The gateway websocket (`/gateway`, v10, JSON, uncompressed): Hello, Identify, Heartbeat,
//! Resume, close codes. Dispatches themselves are made in the state and arrive here as frames
//! on the connection's channel, so a frame is never sent out of sequence order.
//!
//! It does not speak zlib or zstd transport compression: a connection asking for it is closed
//! at once with a reason that says so, rather than sending frames the client cannot read.

use std::sync::Arc;

use axum::Router;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::response::Response;
use axum::routing::get;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Shared;
use super::intents;
use super::state::{Live, Outbound};

/// Close codes (Discord's gateway close event codes).
const UNKNOWN_OPCODE: u16 = 4001;
const DECODE_ERROR: u16 = 4002;
const NOT_AUTHENTICATED: u16 = 4003;
const AUTHENTICATION_FAILED: u16 = 4004;
const ALREADY_AUTHENTICATED: u16 = 4005;
const INVALID_SHARD: u16 = 4010;
const INVALID_API_VERSION: u16 = 4012;
const DISALLOWED_INTENTS: u16 = 4014;

pub(super) fn routes() -> Router<Arc<Shared>> {
    // twilight appends `/?v=10…` to the configured URL, so both spellings are the gateway.
    Router::new().route("/gateway", get(upgrade)).route("/gateway/", get(upgrade))
}

async fn upgrade(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery, upgrade: WebSocketUpgrade) -> Response {
    let refusal = refusal(query.as_deref().unwrap_or(""));
    upgrade.on_upgrade(move |socket| async move {
        match refusal {
            Some((code, reason)) => close(socket, code, &reason).await,
            None => serve(shared, socket).await,
        }
    })
}

/// Why the connection URL cannot be served, as a close code and reason.
fn refusal(query: &str) -> Option<(u16, String)> {
    let mut version = None;
    for (key, value) in query.split('&').filter_map(|pair| pair.split_once('=')) {
        match key {
            "v" => version = Some(value.to_owned()),
            "encoding" if value != "json" => {
                return Some((DECODE_ERROR, format!("fake discord speaks encoding=json only, not {value}")));
            }
            "compress" => {
                // A fatal code, so a client does not reconnect in a loop; the reason names the fix.
                return Some((
                    INVALID_API_VERSION,
                    format!("fake discord does not compress (compress={value}); connect without transport compression"),
                ));
            }
            _ => {}
        }
    }
    match version.as_deref() {
        Some("10") | None => None,
        Some(other) => Some((INVALID_API_VERSION, format!("fake discord speaks gateway v10 only, not v={other}"))),
    }
}

async fn close(mut socket: WebSocket, code: u16, reason: &str) {
    let _ = socket.send(Message::Close(Some(CloseFrame { code, reason: reason.into() }))).await;
    // Let the client answer the close before the socket goes away.
    while let Some(Ok(message)) = socket.recv().await {
        if matches!(message, Message::Close(_)) {
            break;
        }
    }
}

fn frame(op: u8, data: Value) -> String {
    json!({"op": op, "d": data, "s": null, "t": null}).to_string()
}

/// One connection: Hello, then commands in and frames out until either side goes away.
async fn serve(shared: Arc<Shared>, mut socket: WebSocket) {
    let (connection, heartbeat_interval) = shared.update(|state| {
        state.next_connection += 1;
        (state.next_connection, state.options.heartbeat_interval.as_millis() as u64)
    });
    let (sender, mut outbound) = mpsc::unbounded_channel();
    if socket.send(Message::Text(frame(10, json!({"heartbeat_interval": heartbeat_interval})).into())).await.is_err() {
        return;
    }
    let mut attached = false;
    loop {
        tokio::select! {
            command = outbound.recv() => match command {
                Some(Outbound::Frame(text)) => {
                    if socket.send(Message::Text(text.into())).await.is_err() {
                        break;
                    }
                }
                // Dropping the socket without a close frame: an abrupt end of the TCP stream.
                Some(Outbound::Drop) | None => break,
            },
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    match handle(&shared, connection, &sender, attached, text.as_str()) {
                        Handled::Continue { attached: now } => attached = now,
                        Handled::Close(code, reason) => {
                            close(socket, code, &reason).await;
                            shared.update(|state| state.detach(connection));
                            return;
                        }
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    close(socket, DECODE_ERROR, "fake discord reads JSON text frames only").await;
                    shared.update(|state| state.detach(connection));
                    return;
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => break,
            },
        }
    }
    shared.update(|state| state.detach(connection));
}

enum Handled {
    Continue { attached: bool },
    Close(u16, String),
}

/// One gateway command from the client.
fn handle(
    shared: &Shared,
    connection: u64,
    sender: &mpsc::UnboundedSender<Outbound>,
    attached: bool,
    text: &str,
) -> Handled {
    let Ok(payload) = serde_json::from_str::<Value>(text) else {
        return Handled::Close(DECODE_ERROR, "Error while decoding payload.".to_owned());
    };
    let data = &payload["d"];
    match payload["op"].as_u64() {
        // Heartbeat: acknowledged whether or not the session is identified.
        Some(1) => {
            let _ = sender.send(Outbound::Frame(frame(11, Value::Null)));
            Handled::Continue { attached }
        }
        Some(2) => {
            if attached {
                return Handled::Close(ALREADY_AUTHENTICATED, "You sent more than one identify payload.".to_owned());
            }
            identify(shared, connection, sender, data)
        }
        Some(6) => {
            if attached {
                return Handled::Close(ALREADY_AUTHENTICATED, "You sent more than one identify payload.".to_owned());
            }
            resume(shared, connection, sender, data)
        }
        // Presence, voice state, member requests: accepted once identified, not acted on.
        Some(3 | 4 | 8 | 31) => {
            if attached {
                Handled::Continue { attached }
            } else {
                Handled::Close(NOT_AUTHENTICATED, "You sent a payload prior to identifying.".to_owned())
            }
        }
        Some(_) | None => Handled::Close(UNKNOWN_OPCODE, "You sent an invalid Gateway opcode.".to_owned()),
    }
}

fn identify(shared: &Shared, connection: u64, sender: &mpsc::UnboundedSender<Outbound>, data: &Value) -> Handled {
    let token = data["token"].as_str().unwrap_or("");
    let Some(requested) = data["intents"].as_u64() else {
        return Handled::Close(DECODE_ERROR, "Error while decoding payload.".to_owned());
    };
    if data["compress"].as_bool() == Some(true) {
        return Handled::Close(
            INVALID_API_VERSION,
            "fake discord does not compress payloads; identify with compress=false".to_owned(),
        );
    }
    let Some(shard) = shard_of(&data["shard"]) else {
        return Handled::Close(INVALID_SHARD, "You sent an invalid shard when identifying.".to_owned());
    };
    shared.update(|state| {
        if !state.token_matches(token) {
            return Handled::Close(AUTHENTICATION_FAILED, "Authentication failed.".to_owned());
        }
        if requested & intents::MESSAGE_CONTENT != 0 && !state.options.message_content_intent_enabled {
            return Handled::Close(DISALLOWED_INTENTS, "Disallowed intent(s).".to_owned());
        }
        state.identify(requested, shard, Live { connection, sender: sender.clone() });
        Handled::Continue { attached: true }
    })
}

fn resume(shared: &Shared, connection: u64, sender: &mpsc::UnboundedSender<Outbound>, data: &Value) -> Handled {
    let token = data["token"].as_str().unwrap_or("");
    let session_id = data["session_id"].as_str().unwrap_or("");
    let Some(sequence) = data["seq"].as_u64() else {
        return Handled::Close(DECODE_ERROR, "Error while decoding payload.".to_owned());
    };
    shared.update(|state| {
        if !state.token_matches(token) {
            return Handled::Close(AUTHENTICATION_FAILED, "Authentication failed.".to_owned());
        }
        if state.resume(session_id, sequence, Live { connection, sender: sender.clone() }) {
            Handled::Continue { attached: true }
        } else {
            // Not resumable: the client must identify again (Discord's op 9 with d = false).
            let _ = sender.send(Outbound::Frame(frame(9, json!(false))));
            Handled::Continue { attached: false }
        }
    })
}

/// Identify's `[shard_id, num_shards]` (absent: one shard).
fn shard_of(shard: &Value) -> Option<(u64, u64)> {
    if shard.is_null() {
        return Some((0, 1));
    }
    let pair = shard.as_array()?;
    let (id, count) = (pair.first()?.as_u64()?, pair.get(1)?.as_u64()?);
    (pair.len() == 2 && count > 0 && id < count).then_some((id, count))
}
