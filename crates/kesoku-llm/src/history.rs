//! History → turns: the one place stored messages become a model conversation (spec §5.2, §5.4).
//!
//! Input: a session's messages in phased order, as the store returns them, and the root of the
//! active turn. Output: a system instruction and strictly alternating user / model turns.
//! The rules, in the order they apply:
//!
//! - The System Prompt message (`chatbot_id = "system"`, role system) becomes the system
//!   instruction, never a turn (several are joined with a blank line).
//! - Notifications (`sender = "Notification"`, role assistant) are left out.
//! - Thoughts are kept only in the active turn (the turn whose root is `active_root`).
//! - Attachments of the active turn's user messages become attachment parts; those of past turns
//!   are replaced by `[Attachments stripped from history: a.png, b.csv]` appended to the text.
//! - Other system messages (nudges, background wakeup alerts) become user text prefixed with
//!   `[System Notification]\n`.
//! - A model step's parts are grouped as thoughts, text, then tool calls; the results of those
//!   calls follow right after in a user turn, in the calls' order. A call whose result is missing
//!   gets a synthetic error result ([`INTERRUPTED_TOOL_CALL_ERROR`]). A result whose call is not
//!   in the history is dropped, so the provider never sees a dangling result.
//! - Consecutive parts of one role merge into one turn, so user and model strictly alternate.
//! - If the conversation would start with a model turn, a minimal user turn
//!   ([`HISTORY_START_PLACEHOLDER`]) is put first: every provider wants a user turn first, and
//!   dropping the model turn would lose what the model said.
//!
//! This module does no I/O: attachment parts point at files, read when the request is sent.
//! It does not window or compact the history either; the agent does, before calling it.

use std::borrow::Borrow;
use std::path::{Path, PathBuf};

use kesoku_core::message::{SYSTEM_NOTIFICATION_PREFIX, SYSTEM_SCOPE};
use kesoku_core::{Message, MessageId, MessageType, Role};
use rustc_hash::FxHashMap as HashMap;
use serde_json::{Value, json};

use crate::conversation::{Attachment, AttachmentSource, Part, ToolCall, ToolResult, Turn, TurnRole};

/// Error of the synthetic result given to a call that never got one.
pub const INTERRUPTED_TOOL_CALL_ERROR: &str = "tool call was interrupted before it returned a result";

/// Text of the user turn put first when the history would start with a model turn.
pub const HISTORY_START_PLACEHOLDER: &str = "[Earlier conversation not shown]";

/// Opening of the placeholder appended to past messages that had attachments.
pub const ATTACHMENTS_STRIPPED_PREFIX: &str = "[Attachments stripped from history: ";

/// What the transpiler needs besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct HistoryOptions<'a> {
    /// Root message of the turn being answered: its thoughts are kept and its attachments sent.
    /// `None`: no turn is active (all thoughts and attachments are stripped).
    pub active_root: Option<&'a MessageId>,
    /// Directory that relative attachment paths are relative to (the workspace).
    pub attachment_base: Option<&'a Path>,
}

/// A system instruction and the turns: what a [`crate::Request`] is made from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    pub system: Option<String>,
    pub turns: Vec<Turn>,
}

impl Conversation {
    /// A request holding this conversation (no tools, default settings).
    pub fn into_request(self) -> crate::Request {
        crate::Request { system: self.system, turns: self.turns, ..crate::Request::default() }
    }
}

/// Builds turns, merging consecutive parts of one role.
#[derive(Default)]
struct TurnBuilder {
    turns: Vec<Turn>,
}

impl TurnBuilder {
    fn push(&mut self, role: TurnRole, part: Part) {
        match self.turns.last_mut() {
            Some(turn) if turn.role == role => turn.parts.push(part),
            Some(_) | None => self.turns.push(Turn { role, parts: vec![part] }),
        }
    }
}

fn is_system_prompt(message: &Message) -> bool {
    message.role == Role::System && message.chatbot_id == SYSTEM_SCOPE
}

/// The id the provider knows a call by: its own id, or the message id for calls stored without one.
fn call_id(call: &Message) -> String {
    call.metadata.tool_call_id.clone().filter(|id| !id.is_empty()).unwrap_or_else(|| call.id.to_string())
}

/// Turn `messages` (phased order) into a conversation; see the module documentation for the rules.
///
/// Takes owned messages or references (`&[Message]`, `&[&Message]`), so a caller that adds a
/// few messages of its own to a stored history need not copy the history.
pub fn history_to_conversation<M: Borrow<Message>>(messages: &[M], options: &HistoryOptions<'_>) -> Conversation {
    let mut by_id: HashMap<&MessageId, &Message> = HashMap::default();
    by_id.reserve(messages.len());
    by_id.extend(messages.iter().map(|message| (&message.borrow().id, message.borrow())));

    let mut system_parts = Vec::new();
    let mut kept: Vec<(&Message, &MessageId)> = Vec::with_capacity(messages.len());
    for message in messages {
        let message = message.borrow();
        if is_system_prompt(message) {
            if !message.content.trim().is_empty() {
                system_parts.push(message.content.clone());
            }
        } else if !message.is_notification() {
            kept.push((message, kesoku_core::history::turn_root(message, &by_id)));
        }
    }

    // Results are placed after their calls, wherever they were stored: find them by the call's
    // message id (their parent), or by the provider's call id.
    let mut result_by_call_message: HashMap<&MessageId, &Message> = HashMap::default();
    let mut result_by_call_id: HashMap<&str, &Message> = HashMap::default();
    for (message, _) in &kept {
        if message.message_type == MessageType::ToolResult {
            if let Some(parent) = &message.parent_id {
                result_by_call_message.entry(parent).or_insert(message);
            }
            if let Some(id) = &message.metadata.tool_call_id {
                result_by_call_id.entry(id.as_str()).or_insert(message);
            }
        }
    }
    let results = Results { by_call_message: &result_by_call_message, by_call_id: &result_by_call_id };

    let mut builder = TurnBuilder::default();
    let mut index = 0;
    while index < kept.len() {
        // A group: one root message alone, or the consecutive messages of one model step.
        let (first, first_root) = kept[index];
        let mut end = index + 1;
        if first.parent_id.is_some() {
            while end < kept.len() && {
                let (next, next_root) = kept[end];
                next.parent_id.is_some() && next.step == first.step && next_root == first_root
            } {
                end += 1;
            }
        }
        let active = options.active_root == Some(first_root);
        emit_group(&kept[index..end], active, options, &results, &mut builder);
        index = end;
    }

    let mut turns = builder.turns;
    if turns.first().is_some_and(|turn| turn.role == TurnRole::Model) {
        turns.insert(0, Turn::user(vec![Part::text(HISTORY_START_PLACEHOLDER)]));
    }
    Conversation { system: (!system_parts.is_empty()).then(|| system_parts.join("\n\n")), turns }
}

/// Tool results by the message id of their call and by the provider's call id.
struct Results<'h> {
    by_call_message: &'h HashMap<&'h MessageId, &'h Message>,
    by_call_id: &'h HashMap<&'h str, &'h Message>,
}

impl<'h> Results<'h> {
    fn of(&self, call: &Message) -> Option<&'h Message> {
        self.by_call_message
            .get(&call.id)
            .copied()
            .or_else(|| call.metadata.tool_call_id.as_deref().and_then(|call_id| self.by_call_id.get(call_id).copied()))
    }
}

fn emit_group(
    group: &[(&Message, &MessageId)],
    active: bool,
    options: &HistoryOptions<'_>,
    results: &Results<'_>,
    builder: &mut TurnBuilder,
) {
    let mut thoughts = Vec::new();
    let mut texts = Vec::new();
    let mut calls: Vec<&Message> = Vec::new();
    let mut user_parts = Vec::new();
    for (message, _) in group {
        match (message.message_type, message.role) {
            (MessageType::Thought, _) => {
                let signature = message.metadata.thought_signature.clone();
                if active && (!message.content.is_empty() || signature.is_some()) {
                    thoughts.push(Part::Thought { text: message.content.clone(), signature });
                }
            }
            (MessageType::ToolCall, _) => calls.push(message),
            // Placed after their calls below; those without a call are dropped.
            (MessageType::ToolResult, _) => {}
            (MessageType::Text, Role::Assistant | Role::Tool) => {
                let signature = message.metadata.thought_signature.clone();
                if !message.content.is_empty() || signature.is_some() {
                    texts.push(Part::Text { text: message.content.clone(), signature });
                }
            }
            (MessageType::Text, Role::System) => {
                let text = if message.content.starts_with(SYSTEM_NOTIFICATION_PREFIX.trim_end()) {
                    message.content.clone()
                } else {
                    format!("{SYSTEM_NOTIFICATION_PREFIX}{}", message.content)
                };
                user_parts.push(Part::text(text));
            }
            (MessageType::Text, Role::User) => user_message_parts(message, active, options, &mut user_parts),
        }
    }

    for part in thoughts.into_iter().chain(texts) {
        builder.push(TurnRole::Model, part);
    }
    let mut tool_results = Vec::with_capacity(calls.len());
    for call in &calls {
        let id = call_id(call);
        let name = call.metadata.tool_name.clone().unwrap_or_else(|| "unknown_tool".to_owned());
        let arguments = match &call.metadata.tool_arguments {
            Some(Value::Null) | None => json!({}),
            Some(arguments) => arguments.clone(),
        };
        builder.push(
            TurnRole::Model,
            Part::ToolCall(ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments,
                signature: call.metadata.thought_signature.clone(),
            }),
        );
        tool_results.push(match results.of(call) {
            Some(result) => ToolResult {
                call_id: id,
                name,
                output: result.content.clone(),
                error: result.metadata.tool_error.clone(),
            },
            None => ToolResult {
                call_id: id,
                name,
                output: String::new(),
                error: Some(INTERRUPTED_TOOL_CALL_ERROR.to_owned()),
            },
        });
    }
    for result in tool_results {
        builder.push(TurnRole::User, Part::ToolResult(result));
    }
    for part in user_parts {
        builder.push(TurnRole::User, part);
    }
}

fn user_message_parts(message: &Message, active: bool, options: &HistoryOptions<'_>, parts: &mut Vec<Part>) {
    let attachments = message.attachments();
    if attachments.is_empty() || active {
        if !message.content.is_empty() {
            parts.push(Part::text(message.content.clone()));
        }
        for attachment in attachments {
            let path = PathBuf::from(&attachment.path);
            let path = match options.attachment_base {
                Some(base) if path.is_relative() => base.join(path),
                Some(_) | None => path,
            };
            parts.push(Part::Attachment(Attachment {
                filename: attachment.filename.clone(),
                mime_type: attachment.mime_type.clone(),
                source: AttachmentSource::File(path),
            }));
        }
        return;
    }
    let names: Vec<&str> = attachments.iter().map(|attachment| attachment.filename.as_str()).collect();
    let placeholder = format!("{ATTACHMENTS_STRIPPED_PREFIX}{}]", names.join(", "));
    let text = if message.content.is_empty() { placeholder } else { format!("{}\n{placeholder}", message.content) };
    parts.push(Part::text(text));
}
