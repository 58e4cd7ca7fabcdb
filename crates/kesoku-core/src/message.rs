//! The `Message` record and one constructor per message category of the spec's field table (§3).
//!
//! Constructors fill role, type, sender, initial status, parent and metadata exactly as the table
//! says, so no other code has to remember the table. They do not stamp times: the store does,
//! when it writes the message.
//!
//! Kesoku adds one row to the spec's table, in the spec's columns (tested with the others in
//! `tests/it/categories.rs`):
//!
//! | column | Compaction Summary ([`Message::compaction_summary`]) |
//! |---|---|
//! | explanation | a model-written summary standing in for a range of older, whole turns; nothing is deleted |
//! | `role` / `type` | `system` / `text` |
//! | `chatbot_id` / `channel_id` | those of the session being compacted |
//! | `sender` | `"System"` |
//! | `parent_id` | none: it belongs to no turn |
//! | initial / final `status` | `responded` / `responded` (never claimed by a worker, never delivered) |
//! | user visibility | no chat window shows it (like a nudge); `kesoku history show` and the console's trajectory list it |
//! | LLM (active turn) | never part of one |
//! | LLM (past history) | yes, the newest one in place of the turns it replaces, as a user turn prefixed `[System Notification]` (spec §5.4); once undone (`kesoku history uncompact`) it is left out and the turns show in full |
//! | `metadata` | `{"compaction_summary": {"first_turn", "last_turn", "turns", "messages", "undone"}}`, set by the compacting code |
//! | example content | `"[Summary of earlier conversation] (3 turns)\nThe user asked …"` |

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{MessageId, SessionId};
use crate::metadata::{Attachment, Metadata, TurnMetrics, null_as_empty};
use crate::status::{MessageType, Role, Status};

/// The agent's default display name (the spec's `"Kesoku"`).
pub const DEFAULT_AGENT_NAME: &str = "Kesoku";
/// Sender of system-made messages (prompt, wakeups, nudges, compaction triggers).
pub const SENDER_SYSTEM: &str = "System";
/// Sender of cron-made user messages.
pub const SENDER_CRONJOB: &str = "Cronjob";
/// Sender of the message a direct trigger (`POST /v1/activations`) posts.
pub const SENDER_TRIGGER: &str = "Trigger";
/// Sender of user-facing notifications, which the model never sees.
pub const SENDER_NOTIFICATION: &str = "Notification";
/// Chatbot and channel id of the virtual system prompt message.
pub const SYSTEM_SCOPE: &str = "system";
/// Prefix of system messages when shown to the model as a user turn (spec §5.4).
pub const SYSTEM_NOTIFICATION_PREFIX: &str = "[System Notification]\n";
/// Prefix of the System Error Notification.
pub const ERROR_NOTIFICATION_PREFIX: &str = "⚠️ An error occurred while processing your request: ";
/// Longest System Error Notification, in characters; the full error goes to the staging folder.
pub const ERROR_NOTIFICATION_MAX_CHARS: usize = 500;

fn is_zero(step: &u32) -> bool {
    *step == 0
}

/// One message: the unit everything in Kesoku is made of (spec §2, §3).
///
/// The JSON form uses exactly the spec's field names; `step`, `created_at` and `updated_at` are
/// omitted when unset so the spec's examples round-trip unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub id: MessageId,
    pub session_id: SessionId,
    /// The message this one answers: a turn's root for its steps, the call for a tool result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<MessageId>,
    pub chatbot_id: String,
    pub channel_id: String,
    pub sender: String,
    pub role: Role,
    #[serde(rename = "type")]
    pub message_type: MessageType,
    pub content: String,
    pub status: Status,
    #[serde(default, skip_serializing_if = "Metadata::is_empty", deserialize_with = "null_as_empty")]
    pub metadata: Metadata,
    /// Which model response of its turn produced (or, for a nudge, followed) this message: 1 for
    /// the first. 0 for messages no model step made (user input, notifications, roots).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub step: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<DateTime<Utc>>,
}

/// Order of a message inside one model step of a turn (spec §5.1 phased sorting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// The message that opened the turn.
    Root = 0,
    Thought = 1,
    ToolCall = 2,
    ToolResult = 3,
    /// Assistant text: the final answer or a notification.
    Answer = 4,
    /// System or user text injected into a running turn (nudges, steering messages): it is the
    /// input of the next step, so it sorts after everything of the step it follows.
    Injected = 5,
}

impl Message {
    /// Where this message sorts inside its turn's step.
    pub fn phase(&self) -> Phase {
        if self.parent_id.is_none() {
            return Phase::Root;
        }
        match (self.message_type, self.role) {
            (MessageType::Thought, _) => Phase::Thought,
            (MessageType::ToolCall, _) => Phase::ToolCall,
            (MessageType::ToolResult, _) => Phase::ToolResult,
            (MessageType::Text, Role::Assistant | Role::Tool) => Phase::Answer,
            (MessageType::Text, Role::User | Role::System) => Phase::Injected,
        }
    }

    /// A user-facing notification the model must never see (spec §5.2).
    pub fn is_notification(&self) -> bool {
        self.role == Role::Assistant && self.sender == SENDER_NOTIFICATION
    }

    /// Whether a scheduled job posted this (a Cronjob Trigger Message). The one test of that:
    /// the spec's `metadata.is_cronjob`, or the `Cronjob` sender of a message that lost it.
    pub fn is_cron_trigger(&self) -> bool {
        self.metadata.is_cronjob == Some(true) || self.sender == SENDER_CRONJOB
    }

    /// Whether the chatbot of this message still has to deliver it: an answer or notification
    /// waiting (`pending`), or an intermediate step of the agent not yet rendered (a `responded`
    /// thought, tool call or tool result). System-role messages (nudges, compaction summaries)
    /// are shown to nobody (spec §3: "User Visibility: No"), so a `responded` one never is.
    pub fn awaits_delivery(&self) -> bool {
        match self.status {
            Status::Pending => true,
            Status::Responded => match self.message_type {
                MessageType::Thought | MessageType::ToolCall | MessageType::ToolResult => true,
                MessageType::Text => self.role == Role::Assistant,
            },
            Status::PendingAgent
            | Status::Processing
            | Status::Processed
            | Status::Delivered
            | Status::Interrupted
            | Status::Error => false,
        }
    }

    /// Attachments listed in the metadata (empty when none).
    pub fn attachments(&self) -> &[Attachment] {
        self.metadata.attachments.as_deref().unwrap_or(&[])
    }

    /// Set the status after checking the transition table.
    pub fn transition(&mut self, to: Status) -> Result<(), crate::status::IllegalTransition> {
        self.status.check_transition(to)?;
        self.status = to;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        session_id: &SessionId,
        parent_id: Option<&MessageId>,
        chatbot_id: &str,
        channel_id: &str,
        sender: &str,
        role: Role,
        message_type: MessageType,
        content: String,
        status: Status,
    ) -> Self {
        Message {
            id: MessageId::generate(),
            session_id: session_id.clone(),
            parent_id: parent_id.cloned(),
            chatbot_id: chatbot_id.to_owned(),
            channel_id: channel_id.to_owned(),
            sender: sender.to_owned(),
            role,
            message_type,
            content,
            status,
            metadata: Metadata::default(),
            step: 0,
            created_at: None,
            updated_at: None,
        }
    }

    /// Standard User Message: a person's prompt from a chat client.
    pub fn user_text(
        session_id: &SessionId,
        chatbot_id: &str,
        channel_id: &str,
        sender: &str,
        content: impl Into<String>,
    ) -> Self {
        Self::build(
            session_id,
            None,
            chatbot_id,
            channel_id,
            sender,
            Role::User,
            MessageType::Text,
            content.into(),
            Status::PendingAgent,
        )
    }

    /// Cronjob Trigger Message: a scheduled prompt.
    pub fn cronjob_trigger(
        session_id: &SessionId,
        chatbot_id: &str,
        channel_id: &str,
        content: impl Into<String>,
    ) -> Self {
        let mut message = Self::build(
            session_id,
            None,
            chatbot_id,
            channel_id,
            SENDER_CRONJOB,
            Role::User,
            MessageType::Text,
            content.into(),
            Status::PendingAgent,
        );
        message.metadata.is_cronjob = Some(true);
        message
    }

    /// Manual Compaction Trigger: posted when the user runs `/compact`.
    pub fn compaction_trigger(
        session_id: &SessionId,
        chatbot_id: &str,
        channel_id: &str,
        content: impl Into<String>,
    ) -> Self {
        let mut message = Self::build(
            session_id,
            None,
            chatbot_id,
            channel_id,
            SENDER_SYSTEM,
            Role::User,
            MessageType::Text,
            content.into(),
            Status::PendingAgent,
        );
        message.metadata.is_compaction = Some(true);
        message
    }

    /// System Prompt Message: the virtual message holding the system instruction.
    pub fn system_prompt(session_id: &SessionId, content: impl Into<String>) -> Self {
        Self::build(
            session_id,
            None,
            SYSTEM_SCOPE,
            SYSTEM_SCOPE,
            SENDER_SYSTEM,
            Role::System,
            MessageType::Text,
            content.into(),
            Status::Responded,
        )
    }

    /// Background Wakeup Alert: a finished background job wakes the session's worker. Chatbot
    /// and channel are those of the message that started the job.
    pub fn wakeup_alert(
        session_id: &SessionId,
        chatbot_id: &str,
        channel_id: &str,
        content: impl Into<String>,
    ) -> Self {
        Self::build(
            session_id,
            None,
            chatbot_id,
            channel_id,
            SENDER_SYSTEM,
            Role::System,
            MessageType::Text,
            content.into(),
            Status::PendingAgent,
        )
    }

    /// Direct Trigger Message (a Kesoku row, like the Cronjob Trigger Message): the task an
    /// automation sent with `POST /v1/activations`; `user`/`text`, sender `Trigger`,
    /// `pending_agent`, shown in the channel like a scheduled prompt. The caller adds
    /// `metadata.activation` (kind `direct_trigger`).
    pub fn direct_trigger(
        session_id: &SessionId,
        chatbot_id: &str,
        channel_id: &str,
        content: impl Into<String>,
    ) -> Self {
        Self::build(
            session_id,
            None,
            chatbot_id,
            channel_id,
            SENDER_TRIGGER,
            Role::User,
            MessageType::Text,
            content.into(),
            Status::PendingAgent,
        )
    }

    /// Follow-up Reminder (a Kesoku row, the spec's "background followups" of the `system`
    /// role): a follow-up the agent scheduled has come due. Like a Background Wakeup Alert:
    /// `system`/`text`, sender `System`, `pending_agent`, invisible to users, shown to the model
    /// as a user turn. The caller adds `metadata.activation` (kind `follow_up`).
    pub fn followup_reminder(
        session_id: &SessionId,
        chatbot_id: &str,
        channel_id: &str,
        content: impl Into<String>,
    ) -> Self {
        Self::wakeup_alert(session_id, chatbot_id, channel_id, content)
    }

    /// Compaction Summary: stands in, for the model, for the older turns it summarizes (see the
    /// row in the module documentation). The compacting code adds `metadata.compaction_summary`,
    /// the range of turns it replaces.
    pub fn compaction_summary(
        session_id: &SessionId,
        chatbot_id: &str,
        channel_id: &str,
        content: impl Into<String>,
    ) -> Self {
        Self::build(
            session_id,
            None,
            chatbot_id,
            channel_id,
            SENDER_SYSTEM,
            Role::System,
            MessageType::Text,
            content.into(),
            Status::Responded,
        )
    }

    /// User-Facing Notification (for example a compaction alert): delivered, never shown to the model.
    pub fn notification(
        session_id: &SessionId,
        parent_id: Option<&MessageId>,
        chatbot_id: &str,
        channel_id: &str,
        content: impl Into<String>,
    ) -> Self {
        Self::build(
            session_id,
            parent_id,
            chatbot_id,
            channel_id,
            SENDER_NOTIFICATION,
            Role::Assistant,
            MessageType::Text,
            content.into(),
            Status::Pending,
        )
    }
}

/// The turn a step message belongs to: where it goes and what it answers.
///
/// Built once when a worker takes a root message, then used for every message of the turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnOrigin {
    pub session_id: SessionId,
    pub chatbot_id: String,
    pub channel_id: String,
    /// The root message of the turn (user message, cron trigger, wakeup alert, …).
    pub root_id: MessageId,
    /// The sender of the agent's own messages (`Kesoku`, or the configured agent name).
    pub agent_name: String,
}

impl TurnOrigin {
    /// The origin of a turn opened by `root`, answered by `agent_name`.
    pub fn of(root: &Message, agent_name: &str) -> Self {
        TurnOrigin {
            session_id: root.session_id.clone(),
            chatbot_id: root.chatbot_id.clone(),
            channel_id: root.channel_id.clone(),
            root_id: root.id.clone(),
            agent_name: agent_name.to_owned(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn step_message(
        &self,
        step: u32,
        parent_id: &MessageId,
        sender: &str,
        role: Role,
        message_type: MessageType,
        content: String,
        status: Status,
    ) -> Message {
        let mut message = Message::build(
            &self.session_id,
            Some(parent_id),
            &self.chatbot_id,
            &self.channel_id,
            sender,
            role,
            message_type,
            content,
            status,
        );
        message.step = step;
        message
    }

    /// Assistant Thought of model step `step`, with the provider's signature if it gave one.
    pub fn thought(&self, step: u32, content: impl Into<String>, signature: Option<String>) -> Message {
        let mut message = self.step_message(
            step,
            &self.root_id,
            &self.agent_name,
            Role::Assistant,
            MessageType::Thought,
            content.into(),
            Status::Responded,
        );
        message.metadata.thought_signature = signature;
        message
    }

    /// Assistant Final Text, queued for delivery, with the turn's figures.
    pub fn final_text(&self, step: u32, content: impl Into<String>, metrics: Option<TurnMetrics>) -> Message {
        let mut message = self.step_message(
            step,
            &self.root_id,
            &self.agent_name,
            Role::Assistant,
            MessageType::Text,
            content.into(),
            Status::Pending,
        );
        message.metadata.turn_metrics = metrics;
        message
    }

    /// Tool Call Message. `call_id` is the provider's id for the call.
    pub fn tool_call(&self, step: u32, call_id: &str, tool_name: &str, arguments: Value) -> Message {
        let content = tool_call_content(tool_name, &arguments);
        let mut message = self.step_message(
            step,
            &self.root_id,
            &self.agent_name,
            Role::Tool,
            MessageType::ToolCall,
            content,
            Status::Responded,
        );
        message.metadata.tool_name = Some(tool_name.to_owned());
        message.metadata.tool_arguments = Some(arguments);
        message.metadata.tool_call_id = Some(call_id.to_owned());
        message
    }

    /// Tool Result Message answering `call` (its parent), sent by the tool.
    ///
    /// `summary` goes to `metadata.tool_result`; `error` (when the tool failed) to `metadata.tool_error`.
    pub fn tool_result(
        &self,
        call: &Message,
        content: impl Into<String>,
        summary: Option<String>,
        error: Option<String>,
    ) -> Message {
        let tool_name = call.metadata.tool_name.clone().unwrap_or_default();
        let mut message = self.step_message(
            call.step,
            &call.id,
            &tool_name,
            Role::Tool,
            MessageType::ToolResult,
            content.into(),
            Status::Responded,
        );
        message.metadata.tool_name = Some(tool_name);
        message.metadata.tool_result = summary;
        message.metadata.tool_error = error;
        message.metadata.tool_call_id = call.metadata.tool_call_id.clone();
        message
    }

    /// Nudge Message: posted after model step `step` answered with nothing.
    pub fn nudge(&self, step: u32, content: impl Into<String>) -> Message {
        self.step_message(
            step,
            &self.root_id,
            SENDER_SYSTEM,
            Role::System,
            MessageType::Text,
            content.into(),
            Status::Responded,
        )
    }

    /// System Error Notification: tells the user the turn failed. `detail` is cut to keep the
    /// message short; callers keep the full error elsewhere (the session's staging folder).
    pub fn error_notification(&self, step: u32, detail: &str) -> Message {
        self.step_message(
            step,
            &self.root_id,
            &self.agent_name,
            Role::Assistant,
            MessageType::Text,
            error_notification_content(detail),
            Status::Pending,
        )
    }

    /// A User-Facing Notification inside this turn.
    pub fn notification(&self, content: impl Into<String>) -> Message {
        Message::notification(&self.session_id, Some(&self.root_id), &self.chatbot_id, &self.channel_id, content)
    }
}

/// Content of a Tool Call Message: ``Calling tool `NAME` with arguments:`` and the JSON, fenced.
pub fn tool_call_content(tool_name: &str, arguments: &Value) -> String {
    let json = serde_json::to_string_pretty(arguments).unwrap_or_else(|_| arguments.to_string());
    format!("Calling tool `{tool_name}` with arguments:\n```json\n{json}\n```")
}

/// Content of a System Error Notification, at most [`ERROR_NOTIFICATION_MAX_CHARS`] characters.
pub fn error_notification_content(detail: &str) -> String {
    let budget = ERROR_NOTIFICATION_MAX_CHARS.saturating_sub(ERROR_NOTIFICATION_PREFIX.chars().count());
    let detail = detail.trim();
    if detail.chars().count() <= budget {
        format!("{ERROR_NOTIFICATION_PREFIX}{detail}")
    } else {
        let cut: String = detail.chars().take(budget.saturating_sub(1)).collect();
        format!("{ERROR_NOTIFICATION_PREFIX}{cut}…")
    }
}
