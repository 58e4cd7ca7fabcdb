//! The Discord chatbot's delivery side: what the shared [`crate::Deliverer`] calls.
//!
//! [`DiscordChatbot`] implements [`Chatbot`]: steps go to the live status message
//! ([`Progress`]); final texts go out part by part through [`DiscordApi`]: text chunks of at
//! most 2,000 characters, files as attachments, a question as buttons whose `custom_id`
//! ([`super::custom_id`]) carries everything a click needs, so buttons keep
//! working after a restart ([`super::commands`] handles the click). Every create carries a
//! `nonce` derived from the part's key with `enforce_nonce`, so a part sent again after a crash
//! is answered with the first message instead of a second one.
//!
//! The status message of a turn is remembered in the store's delivery records (part 0 of the
//! turn's root message, as `channel/message`), so a restarted process still edits or deletes
//! it ([`StoreStatusMemory`]).
//!
//! Not here: the gateway, inbound messages, interactions.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use kesoku_core::{DeliveryRecord, Message, MessageId};
use kesoku_store::Store;
use serde_json::{Value, json};

use super::custom_id::answer_custom_id;
use super::progress::{Progress, ProgressError, ProgressOptions, StatusMemory};
use super::rest::{DiscordApi, DiscordApiError, create_nonce};
use super::status::DISCORD_MAX_CHARS;
use crate::answer::{OutboundPart, Part};
use crate::{Capabilities, Chatbot, DeliveryError};

/// Largest upload sent (Discord's limit for bots on servers without boosts).
pub const MAX_UPLOAD_BYTES: u64 = 10 * 1024 * 1024;
/// Discord allows 5 rows of 5 buttons; labels of at most 80 characters.
const MAX_BUTTONS: usize = 25;
const MAX_LABEL_CHARS: usize = 80;

/// The Discord chatbot as the deliverer sees it.
pub struct DiscordChatbot {
    id: String,
    api: Arc<dyn DiscordApi>,
    progress: Progress,
}

impl std::fmt::Debug for DiscordChatbot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordChatbot").field("id", &self.id).finish_non_exhaustive()
    }
}

impl DiscordChatbot {
    /// The chatbot `id` sending through `api`, remembering status messages in `store`.
    pub fn new(id: &str, api: Arc<dyn DiscordApi>, store: Arc<dyn Store>, options: ProgressOptions) -> Self {
        let memory = Arc::new(StoreStatusMemory { store });
        DiscordChatbot { id: id.to_owned(), progress: Progress::new(Arc::clone(&api), memory, options), api }
    }
}

/// The nonce of a part: stable for its key.
pub fn part_nonce(key: &str) -> String {
    create_nonce("kp", key.as_bytes())
}

/// The buttons of a question: rows of up to five, at most 25.
fn question_components(message: &MessageId, options: &[String]) -> Value {
    let buttons: Vec<Value> = options
        .iter()
        .take(MAX_BUTTONS)
        .enumerate()
        .map(|(index, option)| {
            let label: String = if option.chars().count() > MAX_LABEL_CHARS {
                format!("{}…", option.chars().take(MAX_LABEL_CHARS - 1).collect::<String>())
            } else {
                option.clone()
            };
            json!({ "type": 2, "style": 1, "label": label, "custom_id": answer_custom_id(message, index) })
        })
        .collect();
    Value::Array(buttons.chunks(5).map(|row| json!({ "type": 1, "components": row })).collect())
}

fn delivery_error(error: DiscordApiError) -> DeliveryError {
    match error {
        DiscordApiError::Transient { reason, retry_after } => DeliveryError::Transient { reason, retry_after },
        permanent @ DiscordApiError::Permanent { .. } => DeliveryError::Permanent { reason: permanent.to_string() },
    }
}

fn progress_error(error: ProgressError) -> DeliveryError {
    match error {
        ProgressError::Transient { reason, retry_after } => DeliveryError::Transient { reason, retry_after },
        invalid @ ProgressError::InvalidChannel { .. } => DeliveryError::Permanent { reason: invalid.to_string() },
    }
}

#[async_trait]
impl Chatbot for DiscordChatbot {
    fn chatbot_id(&self) -> &str {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            edits_in_place: true,
            threads: true,
            buttons: true,
            files: true,
            typing: true,
            max_message_chars: DISCORD_MAX_CHARS,
            max_file_bytes: MAX_UPLOAD_BYTES,
            shows_intermediates: true,
        }
    }

    async fn show_step(&self, step: &Message) -> Result<(), DeliveryError> {
        self.progress.show_step(step).await.map_err(progress_error)
    }

    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        let channel: u64 = message.channel_id.parse().map_err(|_| DeliveryError::Permanent {
            reason: format!("channel id `{}` is not a discord channel id (a number)", message.channel_id),
        })?;
        let mut body = json!({
            "nonce": part_nonce(&part.key),
            "enforce_nonce": true,
            // Answers may mention people by id, never @everyone or roles.
            "allowed_mentions": { "parse": ["users"] },
        });
        let sent = match &part.part {
            Part::Text(text) => {
                body["content"] = Value::String(text.clone());
                self.api.create_message(channel, body).await
            }
            Part::File { path, name } => {
                let bytes = tokio::fs::read(path).await.map_err(|error| DeliveryError::Permanent {
                    reason: format!("reading `{}` to upload it failed: {error}", path.display()),
                })?;
                self.api.create_message_with_files(channel, body, vec![(name.clone(), bytes)]).await
            }
            Part::Question { prompt, options } => {
                body["content"] = Value::String(if prompt.is_empty() { "Choose:".to_owned() } else { prompt.clone() });
                body["components"] = question_components(&message.id, options);
                self.api.create_message(channel, body).await
            }
        };
        sent.map(|id| id.to_string()).map_err(delivery_error)
    }

    async fn on_delivered(&self, message: &Message, _sent: &[DeliveryRecord]) -> Result<(), DeliveryError> {
        self.progress.on_delivered(message).await.map_err(progress_error)
    }

    async fn on_turn(&self, root: &Message) -> Result<(), DeliveryError> {
        self.progress.on_turn(root).await.map_err(progress_error)
    }
}

/// Status message ids kept as delivery records: part 0 of the turn's root message.
pub struct StoreStatusMemory {
    store: Arc<dyn Store>,
}

#[async_trait]
impl StatusMemory for StoreStatusMemory {
    async fn remember(&self, root: &MessageId, channel: u64, status_message: u64) {
        let record = DeliveryRecord {
            message_id: root.clone(),
            part: 0,
            platform_message_id: format!("{channel}/{status_message}"),
            recorded_at: Utc::now(),
        };
        if let Err(error) = self.store.record_delivery(&record).await {
            tracing::warn!(%error, root = %root, "remembering a discord status message failed; it is forgotten at restart");
        }
    }

    async fn recall(&self, root: &MessageId) -> Option<(u64, u64)> {
        let records = match self.store.delivery_records(root).await {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(%error, root = %root, "reading a discord status message's id failed");
                return None;
            }
        };
        let record = records.into_iter().find(|record| record.part == 0)?;
        let (channel, message) = record.platform_message_id.split_once('/')?;
        Some((channel.parse().ok()?, message.parse().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_nonces_are_short_and_stable() {
        // Fixed: a nonce that changed between versions would post a part again after an upgrade.
        assert_eq!(part_nonce("msg_a:0"), "kpc1ac60c5fac31c98");
        assert_eq!(part_nonce("msg_a:0"), part_nonce("msg_a:0"));
        assert_ne!(part_nonce("msg_a:0"), part_nonce("msg_a:1"));
        assert!(part_nonce("msg_a:0").len() <= super::super::rest::MAX_NONCE_CHARS);
    }

    #[test]
    fn questions_become_rows_of_at_most_five_buttons() {
        let options: Vec<String> = (0..12).map(|i| format!("option {i}")).collect();
        let rows = question_components(&MessageId::from("msg_q"), &options);
        let rows = rows.as_array().cloned().unwrap_or_default();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0]["components"].as_array().map(Vec::len), Some(5));
        assert_eq!(rows[2]["components"][1]["custom_id"], "kesoku:answer:msg_q:11");
        assert_eq!(rows[0]["components"][0]["label"], "option 0");
    }
}
