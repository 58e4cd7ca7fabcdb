//! The chat commands every chatbot shares: `/help`, `/status`, `/stop`, `/clear`, `/compact`,
//! `/sessions`.
//!
//! [`parse`] tells a command from a message; [`execute`] runs one over the gateway and returns
//! the reply text and what changed ([`CommandEffect`]) for the chatbot to act on (switch the
//! session it talks to, follow the compaction turn). Commands are never sent to the model: an
//! unknown one gets a reply listing the known ones, and a message that really starts with `/`
//! is written with two (`//etc/hosts is…`, see [`message_text`]).
//!
//! Stopping a turn needs whoever runs it; that is the [`SessionControl`] trait, implemented by
//! the binary over the agent. This module does not render: replies are short plain text with
//! backticks, which every platform shows well enough.

use std::borrow::Cow;

use kesoku_core::{Message, MessageFilter, MessageType, Role, Session, SessionId, Status};
use kesoku_gateway::Gateway;
use kesoku_store::SessionFilter;

use crate::ChatbotError;
pub use crate::control::{COMPACTION_REQUEST, SessionControl, StopAck, TurnStop};

/// Most sessions `/sessions` lists.
const SESSIONS_SHOWN: u32 = 20;

/// A chat command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatCommand {
    Help,
    Status,
    Stop,
    Clear,
    Compact,
    Sessions,
    /// `/name` that is no command (the name as typed, lowercased).
    Unknown(String),
}

impl ChatCommand {
    /// Every known command, in the order `/help` lists them.
    pub const ALL: [ChatCommand; 6] = [
        ChatCommand::Help,
        ChatCommand::Status,
        ChatCommand::Stop,
        ChatCommand::Clear,
        ChatCommand::Compact,
        ChatCommand::Sessions,
    ];

    /// The name typed after `/` (empty for an unknown command typed as a lone `/`).
    pub fn name(&self) -> &str {
        match self {
            ChatCommand::Help => "help",
            ChatCommand::Status => "status",
            ChatCommand::Stop => "stop",
            ChatCommand::Clear => "clear",
            ChatCommand::Compact => "compact",
            ChatCommand::Sessions => "sessions",
            ChatCommand::Unknown(name) => name,
        }
    }

    /// One line saying what the command does.
    pub fn summary(&self) -> &'static str {
        match self {
            ChatCommand::Help => "list the commands",
            ChatCommand::Status => "this session: turns, context size, the last turn's tool calls, tokens and time",
            ChatCommand::Stop => "stop the running turn and drop the messages waiting for it",
            ChatCommand::Clear => "start a new session for this channel (the old one is kept)",
            ChatCommand::Compact => "ask the agent to compact this session's history",
            ChatCommand::Sessions => "list this channel's sessions",
            ChatCommand::Unknown(_) => "not a command",
        }
    }
}

/// The command in `text`, or `None` when `text` is a message for the agent.
///
/// A command is `/name` at the start of the text (surrounding whitespace ignored), where the
/// name is letters, digits, `-` or `_`; anything after the name is ignored. `/` followed by
/// another `/` or by a path (`/usr/bin/env …`) is a message, as is text not starting with `/`.
pub fn parse(text: &str) -> Option<ChatCommand> {
    let rest = text.trim().strip_prefix('/')?;
    if rest.starts_with('/') {
        return None;
    }
    let word = rest.split_whitespace().next().unwrap_or("");
    if word.contains('/') {
        return None;
    }
    let name = word.to_lowercase();
    if !name.chars().all(|c| c.is_alphanumeric() || c == '-' || c == '_') {
        return Some(ChatCommand::Unknown(name));
    }
    Some(match name.as_str() {
        "help" => ChatCommand::Help,
        "status" => ChatCommand::Status,
        "stop" => ChatCommand::Stop,
        "clear" | "new" => ChatCommand::Clear,
        "compact" => ChatCommand::Compact,
        "sessions" => ChatCommand::Sessions,
        _ => ChatCommand::Unknown(name),
    })
}

/// The text to post for a message that is not a command: `//x` is sent as `/x`.
pub fn message_text(text: &str) -> Cow<'_, str> {
    let trimmed = text.trim_start();
    match trimmed.strip_prefix("//") {
        Some(rest) => Cow::Owned(format!("/{rest}")),
        None => Cow::Borrowed(text),
    }
}

/// Where a command runs: the channel it came from and the session that channel talks to.
#[derive(Clone, Copy)]
pub struct CommandContext<'a> {
    pub gateway: &'a Gateway,
    pub control: &'a dyn SessionControl,
    pub chatbot_id: &'a str,
    pub channel_id: &'a str,
    /// The channel's active session.
    pub session_id: &'a SessionId,
}

impl std::fmt::Debug for CommandContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandContext")
            .field("chatbot_id", &self.chatbot_id)
            .field("channel_id", &self.channel_id)
            .field("session_id", &self.session_id)
            .finish()
    }
}

/// What a command changed, for the chatbot to act on.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandEffect {
    None,
    /// The channel now talks to this (new) session.
    SessionSwitched(Session),
    /// This Manual Compaction Trigger was posted; the agent runs it like a turn.
    CompactionRequested(Box<Message>),
    /// The session's turn was asked to stop.
    Stopped(StopAck),
}

/// A command's answer to the user, and its effect.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandReply {
    pub text: String,
    pub effect: CommandEffect,
}

impl CommandReply {
    fn text(text: impl Into<String>) -> Self {
        CommandReply { text: text.into(), effect: CommandEffect::None }
    }
}

/// Run `command` for the channel and session of `context`.
/// Run `command` on the active session of (`chatbot_id`, `channel_id`), as chat platforms do for
/// a command typed in a channel: the reply text, or a line saying what failed.
pub async fn run_in_channel(
    gateway: &Gateway,
    control: &dyn SessionControl,
    chatbot_id: &str,
    channel_id: &str,
    command: &ChatCommand,
) -> String {
    let failed = |error: &dyn std::fmt::Display| format!("⚠️ `/{}` failed: {error}", command.name());
    let session = match gateway.resolve_session(chatbot_id, channel_id).await {
        Ok(session) => session,
        Err(error) => return failed(&error),
    };
    let context = CommandContext { gateway, control, chatbot_id, channel_id, session_id: &session.id };
    match execute(command, &context).await {
        Ok(reply) => reply.text,
        Err(error) => failed(&error),
    }
}

pub async fn execute(command: &ChatCommand, context: &CommandContext<'_>) -> Result<CommandReply, ChatbotError> {
    match command {
        ChatCommand::Help => Ok(CommandReply::text(help_text())),
        ChatCommand::Status => status(context).await,
        ChatCommand::Stop => stop(context).await,
        ChatCommand::Clear => clear(context).await,
        ChatCommand::Compact => compact(context).await,
        ChatCommand::Sessions => sessions(context).await,
        ChatCommand::Unknown(name) => Ok(CommandReply::text(format!(
            "Unknown command `/{name}`. Commands: {}. Commands are never sent to the agent; to send a \
             message that starts with `/`, begin it with `//`.",
            ChatCommand::ALL.iter().map(|c| format!("/{}", c.name())).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The `/help` text.
pub fn help_text() -> String {
    let mut text = String::from("Commands:\n");
    for command in &ChatCommand::ALL {
        text.push_str(&format!("  /{:<9} {}\n", command.name(), command.summary()));
    }
    text.push_str("Anything else is sent to the agent (start with `//` to send a text beginning with `/`).");
    text
}

async fn status(context: &CommandContext<'_>) -> Result<CommandReply, ChatbotError> {
    let store = context.gateway.store();
    let session_id = context.session_id;
    let Some(session) = store.get_session(session_id).await? else {
        return Ok(CommandReply::text(format!("Session `{session_id}` does not exist (yet).")));
    };
    let messages = store.list_messages(&MessageFilter::session(session_id)).await?;
    let mut lines = vec![format!(
        "Session `{}` ({}:{}), started {}, {} messages",
        session.id,
        session.chatbot_id,
        session.channel_id,
        session.created_at.format("%Y-%m-%d %H:%M UTC"),
        messages.len()
    )];
    let last_metrics = messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::Assistant && m.message_type == MessageType::Text)
        .find_map(|m| m.metadata.turn_metrics.as_ref());
    match last_metrics {
        Some(metrics) => {
            lines.push(format!(
                "Turns: {} · context: {} tokens",
                metrics.session_turns,
                thousands(metrics.context_tokens)
            ));
            lines.push(format!(
                "Last turn: {} tool call{} · {} tokens · {:.1} s",
                metrics.turn_tool_calls,
                if metrics.turn_tool_calls == 1 { "" } else { "s" },
                thousands(metrics.turn_tokens),
                metrics.turn_time
            ));
        }
        None => lines.push("No turn has finished in this session yet.".to_owned()),
    }
    let running = messages.iter().filter(|m| m.status == Status::Processing).count();
    let waiting = messages.iter().filter(|m| m.status == Status::PendingAgent).count();
    lines.push(match (running, waiting) {
        (0, 0) => "Now: idle.".to_owned(),
        (running, waiting) => format!("Now: {running} running, {waiting} waiting."),
    });
    Ok(CommandReply::text(lines.join("\n")))
}

async fn stop(context: &CommandContext<'_>) -> Result<CommandReply, ChatbotError> {
    let store = context.gateway.store();
    let running = store
        .list_messages(&MessageFilter::session(context.session_id).with_statuses(&[Status::Processing]))
        .await?
        .len();
    let ack = context.control.stop_session(context.session_id).await?;
    let mut text = match (&ack.turn, running) {
        (TurnStop::Requested, 0) => "Nothing was running.".to_owned(),
        (TurnStop::Requested, _) => "Stopping the running turn.".to_owned(),
        (TurnStop::Unreachable(reason), 0) => format!("Nothing was running. ({reason})"),
        (TurnStop::Unreachable(reason), _) => format!("The running turn cannot be stopped from here: {reason}"),
    };
    if ack.interrupted_waiting > 0 {
        text.push_str(&format!(
            " {} waiting message{} dropped.",
            ack.interrupted_waiting,
            if ack.interrupted_waiting == 1 { "" } else { "s" }
        ));
    }
    Ok(CommandReply { text, effect: CommandEffect::Stopped(ack) })
}

async fn clear(context: &CommandContext<'_>) -> Result<CommandReply, ChatbotError> {
    let session = context.control.clear_session(context.gateway, context.chatbot_id, context.channel_id).await?;
    Ok(CommandReply {
        text: format!(
            "Started a new session `{}`. The previous one, `{}`, is kept (see /sessions).",
            session.id, context.session_id
        ),
        effect: CommandEffect::SessionSwitched(session),
    })
}

async fn compact(context: &CommandContext<'_>) -> Result<CommandReply, ChatbotError> {
    let trigger = context
        .control
        .compact_session(context.gateway, context.session_id, context.chatbot_id, context.channel_id)
        .await?;
    Ok(CommandReply {
        text: "Compaction requested: the agent will summarise this session's history.".to_owned(),
        effect: CommandEffect::CompactionRequested(Box::new(trigger)),
    })
}

async fn sessions(context: &CommandContext<'_>) -> Result<CommandReply, ChatbotError> {
    let store = context.gateway.store();
    let filter = SessionFilter {
        chatbot_id: Some(context.chatbot_id.to_owned()),
        channel_id: Some(context.channel_id.to_owned()),
        limit: Some(SESSIONS_SHOWN),
    };
    let sessions = store.list_sessions(&filter).await?;
    if sessions.is_empty() {
        return Ok(CommandReply::text("No sessions yet."));
    }
    let mut lines = vec!["Sessions of this channel, newest first (* = this one):".to_owned()];
    for session in sessions {
        let first_prompt = store
            .list_messages(&MessageFilter::session(&session.id).with_roles(&[Role::User]).with_limit(1))
            .await?
            .into_iter()
            .next()
            .map(|m| one_line(&m.content, 50));
        lines.push(format!(
            "{} {}  {}  {}",
            if session.id == *context.session_id { "*" } else { " " },
            session.id,
            session.updated_at.format("%Y-%m-%d %H:%M"),
            session.title.or(first_prompt).unwrap_or_else(|| "(empty)".to_owned())
        ));
    }
    Ok(CommandReply::text(lines.join("\n")))
}

/// `text` on one line, cut to `max` characters with an ellipsis.
pub fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max { format!("{}…", flat.chars().take(max).collect::<String>()) } else { flat }
}

/// `1234567` as `1,234,567`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_messages_do_not() {
        assert_eq!(parse("/help"), Some(ChatCommand::Help));
        assert_eq!(parse("  /STATUS please "), Some(ChatCommand::Status));
        assert_eq!(parse("/new"), Some(ChatCommand::Clear));
        assert_eq!(parse("/frobnicate"), Some(ChatCommand::Unknown("frobnicate".into())));
        assert_eq!(parse("/"), Some(ChatCommand::Unknown(String::new())));
        assert_eq!(parse("/stop!"), Some(ChatCommand::Unknown("stop!".into())));
        assert_eq!(parse("hello /help"), None);
        assert_eq!(parse("//help"), None);
        assert_eq!(parse("/usr/bin/env is what?"), None);
        assert_eq!(message_text("//help me"), "/help me");
        assert_eq!(message_text("plain"), "plain");
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
