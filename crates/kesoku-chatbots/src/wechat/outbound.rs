//! The WeChat chatbot's delivery side: what the shared [`crate::Deliverer`] calls.
//!
//! WeChat has no UI for a turn's steps: [`WeChatChatbot`] declares
//! `shows_intermediates: false`, so thoughts, tool calls and results are marked `delivered`
//! without being sent (spec §5.3, WeChat column). Final texts go out part by part: text chunks
//! normalized to plain text ([`super::text`]), files uploaded to the CDN and sent as media
//! items, questions as numbered lists. Every `sendmessage` names the peer's saved
//! `context_token` and a `client_id` derived from the part's key, so a part sent again after
//! a crash carries the same id (the server may use it to drop the repeat; the fake does).
//!
//! An expired session (errcode -14) is a transient failure with a long wait and an error log
//! saying to run `kesoku wechat pair`: the message stays pending, never lost, until the bot is
//! paired again. While a turn runs the peer sees "typing…" (`getconfig` for the typing ticket,
//! then `sendtyping`, renewed every [`super::PollOptions::typing_interval`] for at most
//! [`super::PollOptions::typing_cap`], cleared when the turn ends).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kesoku_core::{Message, MessageId, Status};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::api::{ApiError, MESSAGE_STATE_FINISH, MESSAGE_TYPE_BOT, MessageItem, TYPING_OFF, TYPING_ON, WeixinMessage};
use super::inbound::context_token_key;
use super::media::{item_for, upload_type_of};
use super::text::plain_text;
use crate::answer::{OutboundPart, Part};
use crate::{Capabilities, Chatbot, DeliveryError};

/// Longest text sent in one message (the reference client's chunk size).
pub const WECHAT_MAX_CHARS: usize = 4000;
/// How long to wait before trying again after an expired session.
const EXPIRED_RETRY: Duration = Duration::from_secs(300);

/// A text message to `to`.
pub fn text_message(to: &str, client_id: &str, text: &str, context_token: Option<&str>) -> WeixinMessage {
    message_with(to, client_id, MessageItem::text(text), context_token)
}

fn message_with(to: &str, client_id: &str, item: MessageItem, context_token: Option<&str>) -> WeixinMessage {
    WeixinMessage {
        to_user_id: to.to_owned(),
        client_id: Some(client_id.to_owned()),
        message_type: Some(MESSAGE_TYPE_BOT),
        message_state: Some(MESSAGE_STATE_FINISH),
        item_list: vec![item],
        context_token: context_token.map(str::to_owned),
        ..WeixinMessage::default()
    }
}

/// The `client_id` of a part: stable for its key.
pub fn part_client_id(key: &str) -> String {
    format!("kesoku-{key}")
}

/// A question as text to answer by typing.
pub fn numbered_question(prompt: &str, options: &[String]) -> String {
    let mut text = if prompt.is_empty() { "Choose one (reply with its number):".to_owned() } else { prompt.to_owned() };
    for (index, option) in options.iter().enumerate() {
        text.push_str(&format!("\n{}. {option}", index + 1));
    }
    text
}

fn delivery_error(chatbot_id: &str, error: ApiError) -> DeliveryError {
    match error {
        ApiError::Transient { .. } | ApiError::TimedOut { .. } => {
            DeliveryError::Transient { reason: error.to_string(), retry_after: None }
        }
        ApiError::SessionExpired { .. } => {
            tracing::error!(chatbot_id, %error, "a wechat message waits for the bot to be paired again");
            DeliveryError::Transient { reason: error.to_string(), retry_after: Some(EXPIRED_RETRY) }
        }
        ApiError::Permanent { .. } => DeliveryError::Permanent { reason: error.to_string() },
    }
}

/// The WeChat chatbot as the deliverer sees it.
pub struct WeChatChatbot {
    shared: Arc<Shared>,
    /// Typing tickets per peer (short sections, never held across an await).
    tickets: Arc<Mutex<HashMap<String, String>>>,
    /// The running turns' typing loops, by root message (short sections).
    typing_loops: Mutex<HashMap<MessageId, (CancellationToken, JoinHandle<()>)>>,
}

impl std::fmt::Debug for WeChatChatbot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeChatChatbot").field("id", &self.shared.config.id).finish_non_exhaustive()
    }
}

impl WeChatChatbot {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        WeChatChatbot {
            shared,
            tickets: Arc::new(Mutex::new(HashMap::new())),
            typing_loops: Mutex::new(HashMap::new()),
        }
    }

    async fn context_token(&self, channel_id: &str) -> Result<String, DeliveryError> {
        let stored = self
            .shared
            .gateway
            .store()
            .chatbot_state(&self.shared.config.id, &context_token_key(channel_id))
            .await
            .map_err(|error| DeliveryError::Transient { reason: error.to_string(), retry_after: None })?;
        stored.ok_or_else(|| DeliveryError::Permanent {
            reason: format!(
                "no wechat context_token for `{channel_id}`: a bot can only write to people and rooms that wrote to it first"
            ),
        })
    }

    /// Start renewing "typing…" for the turn of `root` until it ends (or the cap).
    fn start_typing(&self, root: &Message) {
        let stop = CancellationToken::new();
        let Ok(mut loops) = self.typing_loops.lock() else { return };
        if loops.contains_key(&root.id) {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let tickets = Arc::clone(&self.tickets);
        let peer = root.channel_id.clone();
        let cancelled = stop.clone();
        let task = tokio::spawn(async move {
            let options = shared.poll;
            let deadline = tokio::time::Instant::now() + options.typing_cap;
            loop {
                if let Err(error) = typing(&shared, &tickets, &peer, TYPING_ON).await {
                    tracing::debug!(%error, channel_id = %peer, "wechat typing indicator not shown");
                }
                tokio::select! {
                    () = cancelled.cancelled() => return,
                    () = tokio::time::sleep(options.typing_interval) => {}
                }
                if tokio::time::Instant::now() >= deadline {
                    return;
                }
            }
        });
        loops.insert(root.id.clone(), (stop, task));
    }

    /// Stop the turn's typing loop and clear "typing…".
    async fn stop_typing(&self, root: &Message) {
        let running = self.typing_loops.lock().ok().and_then(|mut loops| loops.remove(&root.id));
        if let Some((stop, task)) = running {
            stop.cancel();
            // A renewal in flight lands before the stop, never after it.
            let _ = task.await;
        }
        if let Err(error) = typing(&self.shared, &self.tickets, &root.channel_id, TYPING_OFF).await {
            tracing::debug!(%error, channel_id = %root.channel_id, "wechat typing indicator not cleared");
        }
    }
}

/// Send a typing status to `peer`, fetching (and caching) its ticket first.
async fn typing(
    shared: &Shared,
    tickets: &Mutex<HashMap<String, String>>,
    peer: &str,
    status: i64,
) -> Result<(), ApiError> {
    let cached = tickets.lock().ok().and_then(|tickets| tickets.get(peer).cloned());
    let ticket = match cached {
        Some(ticket) => ticket,
        None => {
            let token =
                shared.gateway.store().chatbot_state(&shared.config.id, &context_token_key(peer)).await.ok().flatten();
            let Some(ticket) = shared.client.typing_ticket(peer, token.as_deref()).await? else {
                return Ok(());
            };
            if let Ok(mut tickets) = tickets.lock() {
                tickets.insert(peer.to_owned(), ticket.clone());
            }
            ticket
        }
    };
    shared.client.send_typing(peer, &ticket, status).await
}

#[async_trait]
impl Chatbot for WeChatChatbot {
    fn chatbot_id(&self) -> &str {
        &self.shared.config.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            edits_in_place: false,
            threads: false,
            buttons: false,
            files: true,
            typing: true,
            max_message_chars: WECHAT_MAX_CHARS,
            max_file_bytes: self.shared.media_limit(),
            shows_intermediates: false,
        }
    }

    async fn show_step(&self, _step: &Message) -> Result<(), DeliveryError> {
        // Never called: the capabilities say steps are not shown.
        Ok(())
    }

    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        let to = message.channel_id.as_str();
        let token = self.context_token(to).await?;
        let client_id = part_client_id(&part.key);
        let item = match &part.part {
            Part::Text(text) => {
                let plain = plain_text(text);
                if plain.trim().is_empty() {
                    // Markup only (an empty code block): nothing a person would see.
                    return Ok(format!("empty:{}", part.key));
                }
                MessageItem::text(plain)
            }
            Part::Question { prompt, options } => MessageItem::text(plain_text(&numbered_question(prompt, options))),
            Part::File { path, name } => {
                let bytes = tokio::fs::read(path).await.map_err(|error| DeliveryError::Permanent {
                    reason: format!("reading `{}` to upload it failed: {error}", path.display()),
                })?;
                let media_type = upload_type_of(name);
                let uploaded =
                    self.shared.cdn.upload(&self.shared.client, to, &bytes, media_type).await.map_err(|error| {
                        if error.is_transient() {
                            DeliveryError::Transient {
                                reason: format!("uploading `{name}`: {error}"),
                                retry_after: None,
                            }
                        } else {
                            DeliveryError::Permanent { reason: format!("uploading `{name}`: {error}") }
                        }
                    })?;
                item_for(&uploaded, media_type, name)
            }
        };
        let outgoing = message_with(to, &client_id, item, Some(&token));
        self.shared.client.send_message(&outgoing).await.map_err(|error| delivery_error(&self.shared.config.id, error))
    }

    async fn on_turn(&self, root: &Message) -> Result<(), DeliveryError> {
        // Typing is a courtesy: failures are logged, never retried.
        match root.status {
            Status::Processing => self.start_typing(root),
            Status::Processed | Status::Interrupted | Status::Error => self.stop_typing(root).await,
            Status::PendingAgent | Status::Pending | Status::Delivered | Status::Responded => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_are_numbered_and_client_ids_stable() {
        assert_eq!(numbered_question("Which?", &["red".into(), "blue".into()]), "Which?\n1. red\n2. blue");
        assert_eq!(part_client_id("msg_a:1"), "kesoku-msg_a:1");
    }
}
