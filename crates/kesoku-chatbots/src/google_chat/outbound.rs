//! The Google Chat chatbot's delivery side: what the shared [`crate::Deliverer`] calls.
//!
//! Steps go to the turn's progress card ([`Progress`]); final texts go out part by part into
//! the conversation's thread: text converted to Chat's formatting ([`super::format`]) in chunks
//! within Chat's limits (4,096 characters, 32,000 bytes), a question as a card with one button
//! per option (a click comes back as `CARD_CLICKED` with function [`ANSWER_FUNCTION`]). Every
//! create is named `client-p-<hash of the part's key>` and carries the same `requestId`, so a
//! part sent again after a crash is answered with the first message instead of a second one.
//!
//! Files: Chat apps cannot upload attachments with app authentication (the upload answers
//! 403), so [`Capabilities::files`] is false and [`crate::answer::plan`] turns each file into a
//! note naming it.

use std::sync::Arc;

use async_trait::async_trait;
use kesoku_core::{DeliveryRecord, Message};
use kesoku_store::Store;
use serde_json::{Value, json};

use super::format::to_chat_text;
use super::progress::Progress;
use super::rest::{ChatRest, MAX_MESSAGE_BYTES, MAX_TEXT_CHARS, Place, client_message_id};
use crate::answer::{OutboundPart, Part};
use crate::{Capabilities, Chatbot, DeliveryError};

/// The button function of a question's options; its parameters are `option` and `prompt`.
pub const ANSWER_FUNCTION: &str = "kesoku_answer";
/// Text chunks are cut a little under Chat's 4,096 characters.
pub const CHUNK_CHARS: usize = 4000;
/// Chat allows a button text of this many characters (longer ones are cut with `…`).
const MAX_BUTTON_CHARS: usize = 100;
/// At most this many options become buttons.
const MAX_BUTTONS: usize = 20;

/// The Google Chat chatbot as the deliverer sees it.
pub struct GoogleChatChatbot {
    id: String,
    rest: ChatRest,
    progress: Progress,
}

impl std::fmt::Debug for GoogleChatChatbot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoogleChatChatbot").field("id", &self.id).finish_non_exhaustive()
    }
}

impl GoogleChatChatbot {
    pub fn new(id: &str, rest: ChatRest, store: Arc<dyn Store>) -> Self {
        GoogleChatChatbot { id: id.to_owned(), progress: Progress::new(rest.clone(), store), rest }
    }
}

/// `text` within Chat's limits: at most 4,096 characters and 32,000 bytes (cut with `…`,
/// leaving room for the rest of the message's JSON).
pub fn fit_text(text: &str) -> String {
    let byte_budget = MAX_MESSAGE_BYTES - 1000;
    if text.chars().count() <= MAX_TEXT_CHARS && text.len() <= byte_budget {
        return text.to_owned();
    }
    let mut out = String::new();
    for c in text.chars().take(MAX_TEXT_CHARS - 1) {
        if out.len() + c.len_utf8() + '…'.len_utf8() > byte_budget {
            break;
        }
        out.push(c);
    }
    out.push('…');
    out
}

fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    format!("{}…", text.chars().take(max - 1).collect::<String>())
}

/// A question as a card: the prompt, then a button per option.
pub fn question_body(prompt: &str, options: &[String]) -> Value {
    let prompt = if prompt.trim().is_empty() { "Choose:" } else { prompt };
    let buttons: Vec<Value> = options
        .iter()
        .take(MAX_BUTTONS)
        .map(|option| {
            json!({
                "text": cut(option, MAX_BUTTON_CHARS),
                "onClick": { "action": {
                    "function": ANSWER_FUNCTION,
                    "parameters": [
                        { "key": "option", "value": option },
                        { "key": "prompt", "value": cut(prompt, 500) },
                    ],
                } },
            })
        })
        .collect();
    json!({
        "text": fit_text(&to_chat_text(prompt)),
        "cardsV2": [{ "cardId": "kesoku-question", "card": { "sections": [{
            "widgets": [{ "buttonList": { "buttons": buttons } }],
        }] } }],
    })
}

#[async_trait]
impl Chatbot for GoogleChatChatbot {
    fn chatbot_id(&self) -> &str {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            edits_in_place: true,
            threads: true,
            buttons: true,
            files: false,
            typing: false,
            max_message_chars: CHUNK_CHARS,
            max_file_bytes: 0,
            shows_intermediates: true,
        }
    }

    async fn show_step(&self, step: &Message) -> Result<(), DeliveryError> {
        self.progress.show_step(step).await.map_err(DeliveryError::from)
    }

    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        let place = Place::of_channel(&message.channel_id).ok_or_else(|| DeliveryError::Permanent {
            reason: format!(
                "channel id `{}` is not a google chat space or thread (`spaces/S` or `spaces/S/threads/T`)",
                message.channel_id
            ),
        })?;
        let body = match &part.part {
            Part::Text(text) => json!({ "text": fit_text(&to_chat_text(text)) }),
            // Not planned while `files` is false; said rather than dropped if it ever is.
            Part::File { name, .. } => json!({
                "text": format!("📎 `{name}` (google chat apps cannot upload files; it is in the workspace)"),
            }),
            Part::Question { prompt, options } => question_body(prompt, options),
        };
        let id = client_message_id("p", &part.key);
        let created = self.rest.create_message(&place, body, &id, Some(&id)).await?;
        Ok(created.name)
    }

    async fn on_delivered(&self, message: &Message, _sent: &[DeliveryRecord]) -> Result<(), DeliveryError> {
        self.progress.on_delivered(message).await.map_err(DeliveryError::from)
    }

    async fn on_turn(&self, root: &Message) -> Result<(), DeliveryError> {
        self.progress.on_turn(root).await.map_err(DeliveryError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_fit_the_limits() {
        assert_eq!(fit_text("short"), "short");
        let long = "a".repeat(5000);
        assert_eq!(fit_text(&long).chars().count(), MAX_TEXT_CHARS);
        assert_eq!(fit_text(&long[..4096]), long[..4096]);
        let wide = "😀".repeat(4000);
        let fitted = fit_text(&wide);
        assert!(fitted.len() <= MAX_MESSAGE_BYTES && fitted.chars().count() < MAX_TEXT_CHARS, "{}", fitted.len());
    }

    #[test]
    fn questions_are_buttons_carrying_the_option() {
        let body = question_body("Which **colour**?", &["Red".to_owned(), "Blue".to_owned()]);
        assert_eq!(body["text"], "Which *colour*?");
        let buttons = &body["cardsV2"][0]["card"]["sections"][0]["widgets"][0]["buttonList"]["buttons"];
        assert_eq!(buttons[1]["text"], "Blue");
        assert_eq!(buttons[1]["onClick"]["action"]["function"], ANSWER_FUNCTION);
        assert_eq!(buttons[1]["onClick"]["action"]["parameters"][0], json!({"key": "option", "value": "Blue"}));
    }
}
