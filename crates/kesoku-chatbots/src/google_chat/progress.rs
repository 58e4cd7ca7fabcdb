//! A turn's progress card: one Cards v2 message per turn, in the turn's thread, with a
//! collapsible "Thoughts & Tools" section that is updated in place as the agent works (a tool
//! call shows ⏳ until its result turns it ✅ or ❌), finished with the turn's metrics when the
//! answer was delivered, marked ❌ when the turn failed, and emptied when it was interrupted
//! (so no step of an interrupted turn stays showing).
//!
//! The card is named from its turn's root message (`client-card-…`), so a restarted process
//! finds and edits the same card; its lines are rebuilt from the store each time, so they
//! survive a restart too.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use kesoku_core::{Message, MessageFilter, MessageId, MessageType, SessionId, Status, TurnMetrics};
use kesoku_store::Store;
use serde_json::{Value, json};

use super::api::ApiError;
use super::rest::{ChatRest, Place, client_message_id};
use crate::discord::status::{argument_summary, metrics_header};

/// Longest step line, in characters.
const MAX_LINE_CHARS: usize = 200;
/// Most step lines shown (the latest ones); 30 × 200 characters stays far below 32,000 bytes.
const MAX_LINES: usize = 30;
pub const SECTION_TITLE: &str = "Thoughts & Tools";

/// How the turn stands, as the card's title says it.
#[derive(Debug, Clone, PartialEq)]
pub enum CardState {
    Working,
    Done(Option<TurnMetrics>),
    Failed,
    Interrupted,
}

/// The card's message body (`cardsV2`) for `state` and step `lines`.
pub fn card_body(state: &CardState, lines: &[String]) -> Value {
    let (title, subtitle) = match state {
        CardState::Working => ("⏳ Working…".to_owned(), None),
        CardState::Done(metrics) => ("✅ Done".to_owned(), metrics.as_ref().map(metrics_header)),
        CardState::Failed => ("❌ The turn failed".to_owned(), None),
        CardState::Interrupted => ("⏹ Interrupted".to_owned(), None),
    };
    let mut header = json!({ "title": title });
    if let Some(subtitle) = subtitle {
        header["subtitle"] = Value::String(subtitle);
    }
    let mut card = json!({ "header": header });
    let shown: &[String] = if matches!(state, CardState::Interrupted) { &[] } else { lines };
    if !shown.is_empty() {
        let skipped = shown.len().saturating_sub(MAX_LINES);
        let mut widgets: Vec<Value> = Vec::new();
        if skipped > 0 {
            widgets.push(json!({ "textParagraph": { "text": format!("… {skipped} earlier steps") } }));
        }
        widgets.extend(shown[skipped..].iter().map(|line| json!({ "textParagraph": { "text": line } })));
        card["sections"] = json!([{
            "header": SECTION_TITLE,
            "collapsible": true,
            "uncollapsibleWidgetsCount": 1,
            "widgets": widgets,
        }]);
    }
    json!({ "cardsV2": [{ "cardId": "kesoku-progress", "card": card }] })
}

/// `text` on one line, cut to [`MAX_LINE_CHARS`], with the characters card text treats as
/// markup escaped.
fn one_line(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let cut: String = if flat.chars().count() > MAX_LINE_CHARS {
        format!("{}…", flat.chars().take(MAX_LINE_CHARS - 1).collect::<String>())
    } else {
        flat
    };
    cut.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The card lines of a turn's steps (thoughts, calls with their results), in order.
pub fn step_lines(root: &MessageId, messages: &[Message]) -> Vec<String> {
    let mut lines = Vec::new();
    for message in messages.iter().filter(|m| m.parent_id.as_ref() == Some(root)) {
        match message.message_type {
            MessageType::Thought => lines.push(one_line(&format!("💭 {}", message.content))),
            MessageType::ToolCall => {
                let name = message.metadata.tool_name.clone().unwrap_or_else(|| "tool".to_owned());
                let arguments = message.metadata.tool_arguments.as_ref().map(argument_summary).unwrap_or_default();
                let result = messages
                    .iter()
                    .find(|m| m.message_type == MessageType::ToolResult && m.parent_id.as_ref() == Some(&message.id));
                let line = match result {
                    None => format!("⏳ {name} {arguments}"),
                    Some(result) => match &result.metadata.tool_error {
                        Some(error) => format!("❌ {name} {arguments}: {error}"),
                        None => format!("✅ {name} {arguments}"),
                    },
                };
                lines.push(one_line(line.trim_end()));
            }
            MessageType::ToolResult | MessageType::Text => {}
        }
    }
    lines
}

/// The progress cards of one chatbot.
pub struct Progress {
    rest: ChatRest,
    store: Arc<dyn Store>,
    /// Roots of running turns whose card this process created or found (short sections, never
    /// held across awaits); a finished turn's root is removed.
    created: Mutex<HashSet<MessageId>>,
}

impl Progress {
    pub fn new(rest: ChatRest, store: Arc<dyn Store>) -> Self {
        Progress { rest, store, created: Mutex::new(HashSet::new()) }
    }

    fn created(&self) -> std::sync::MutexGuard<'_, HashSet<MessageId>> {
        self.created.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The card's message id for a turn.
    pub fn card_id(root: &MessageId) -> String {
        client_message_id("card", root.as_str())
    }

    /// A step of a running turn: the card shows it.
    pub async fn show_step(&self, step: &Message) -> Result<(), ApiError> {
        let Some(root) = self.root_of(step).await? else {
            return Ok(());
        };
        self.upsert(&root, &step.session_id, &step.channel_id, &CardState::Working).await
    }

    /// A turn started or ended.
    pub async fn on_turn(&self, root: &Message) -> Result<(), ApiError> {
        match root.status {
            Status::Processing => self.upsert(&root.id, &root.session_id, &root.channel_id, &CardState::Working).await,
            Status::Interrupted => {
                self.finish(&root.id, &root.session_id, &root.channel_id, &CardState::Interrupted).await
            }
            Status::Error => self.finish(&root.id, &root.session_id, &root.channel_id, &CardState::Failed).await,
            // A finished turn's card is completed by `on_delivered` (with its metrics).
            Status::Processed | Status::PendingAgent | Status::Pending | Status::Delivered | Status::Responded => {
                Ok(())
            }
        }
    }

    /// A final answer was delivered: the card shows the turn's metrics.
    pub async fn on_delivered(&self, message: &Message) -> Result<(), ApiError> {
        let Some(root) = &message.parent_id else {
            return Ok(());
        };
        if message.message_type != MessageType::Text {
            return Ok(());
        }
        let state = CardState::Done(message.metadata.turn_metrics.clone());
        self.finish(root, &message.session_id, &message.channel_id, &state).await
    }

    async fn root_of(&self, step: &Message) -> Result<Option<MessageId>, ApiError> {
        let Some(parent) = &step.parent_id else {
            return Ok(None);
        };
        if step.message_type != MessageType::ToolResult {
            return Ok(Some(parent.clone()));
        }
        let call = self.store.get_message(parent).await.map_err(store_error)?;
        Ok(call.and_then(|call| call.parent_id))
    }

    async fn lines(&self, root: &MessageId, session: &SessionId) -> Result<Vec<String>, ApiError> {
        let filter = MessageFilter::session(session).with_types(&[
            MessageType::Thought,
            MessageType::ToolCall,
            MessageType::ToolResult,
        ]);
        let messages = self.store.list_messages(&filter).await.map_err(store_error)?;
        Ok(step_lines(root, &messages))
    }

    /// Create the card, or update it when it exists.
    async fn upsert(
        &self,
        root: &MessageId,
        session: &SessionId,
        channel: &str,
        state: &CardState,
    ) -> Result<(), ApiError> {
        let Some(place) = Place::of_channel(channel) else {
            return Ok(());
        };
        let body = card_body(state, &self.lines(root, session).await?);
        let id = Self::card_id(root);
        let name = format!("{}/messages/{id}", place.space);
        if self.created().contains(root) {
            return self.rest.patch_message(&name, &body, "cardsV2").await;
        }
        // Created already (by this process before a restart, or a create whose answer was lost):
        // the id is taken, and that card is brought up to date.
        let created = self.rest.create_message(&place, body.clone(), &id, None).await?;
        self.created().insert(root.clone());
        if created.existed {
            self.rest.patch_message(&name, &body, "cardsV2").await?;
        }
        Ok(())
    }

    /// Update the card if there is one (a turn that never showed a card gets none).
    async fn finish(
        &self,
        root: &MessageId,
        session: &SessionId,
        channel: &str,
        state: &CardState,
    ) -> Result<(), ApiError> {
        let Some(place) = Place::of_channel(channel) else {
            return Ok(());
        };
        let body = card_body(state, &self.lines(root, session).await?);
        let name = format!("{}/messages/{}", place.space, Self::card_id(root));
        match self.rest.patch_message(&name, &body, "cardsV2").await {
            Ok(()) | Err(ApiError::Permanent { status: 404, .. }) => {
                // The turn is over: forget its card (a late update finds it again by its id).
                self.created().remove(root);
                Ok(())
            }
            Err(error) => Err(error),
        }
    }
}

fn store_error(error: kesoku_store::StoreError) -> ApiError {
    ApiError::Transient { status: None, reason: format!("reading the turn's steps failed: {error}"), retry_after: None }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use kesoku_core::TurnOrigin;
    use serde_json::json;

    use super::*;

    #[test]
    fn calls_turn_from_hourglass_to_check_or_cross() {
        let root = Message::user_text(&SessionId::from("s"), "google_chat", "spaces/A", "Chii", "hi");
        let origin = TurnOrigin::of(&root, "Kesoku");
        let thought = origin.thought(1, "Let me <look> it up", None);
        let call = origin.tool_call(1, "c1", "run_shell_command", json!({"command": "echo 40"}));
        let failing = origin.tool_call(1, "c2", "read_file", json!({"path": "x"}));
        let mut messages = vec![thought, call.clone(), failing.clone()];
        let running = step_lines(&root.id, &messages);
        assert_eq!(running, ["💭 Let me &lt;look&gt; it up", "⏳ run_shell_command echo 40", "⏳ read_file x"]);
        messages.push(origin.tool_result(&call, "40", None, None));
        messages.push(origin.tool_result(&failing, "", None, Some("no such file".into())));
        let done = step_lines(&root.id, &messages);
        assert_eq!(done[1], "✅ run_shell_command echo 40");
        assert_eq!(done[2], "❌ read_file x: no such file");
    }

    #[test]
    fn the_card_is_collapsible_and_finished_with_metrics() {
        let lines = vec!["💭 a".to_owned()];
        let working = card_body(&CardState::Working, &lines);
        let card = &working["cardsV2"][0]["card"];
        assert_eq!(card["header"]["title"], "⏳ Working…");
        assert_eq!(card["sections"][0]["header"], SECTION_TITLE);
        assert_eq!(card["sections"][0]["collapsible"], true);
        assert_eq!(card["sections"][0]["widgets"][0]["textParagraph"]["text"], "💭 a");
        let metrics = TurnMetrics {
            session_turns: 1,
            context_tokens: 1234,
            turn_tool_calls: 1,
            turn_tokens: 56,
            turn_time: 1.25,
        };
        let done = card_body(&CardState::Done(Some(metrics)), &lines);
        assert_eq!(done["cardsV2"][0]["card"]["header"]["title"], "✅ Done");
        assert!(done["cardsV2"][0]["card"]["header"]["subtitle"].as_str().is_some_and(|s| s.contains("1,234")));
        let interrupted = card_body(&CardState::Interrupted, &lines);
        assert!(interrupted["cardsV2"][0]["card"].get("sections").is_none(), "no step stays showing");
        let many: Vec<String> = (0..45).map(|i| format!("line {i}")).collect();
        let capped = card_body(&CardState::Working, &many);
        let widgets = capped["cardsV2"][0]["card"]["sections"][0]["widgets"].as_array().cloned().unwrap_or_default();
        assert_eq!(widgets.len(), MAX_LINES + 1);
        assert_eq!(widgets[0]["textParagraph"]["text"], "… 15 earlier steps");
    }
}
