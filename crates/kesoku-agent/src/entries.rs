//! Model-facing entries: what the model sees besides the history, formatted for reading.
//!
//! The system prompt becomes the virtual System Prompt Message; the activation context entry
//! (source platform, locale, timezone, reply routing) and, for workflows, the trigger context
//! entry are virtual user-side messages placed right before the turn's root. None of them is
//! stored, and none carries lanes, delegation ids, ledger ids or credentials.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use kesoku_core::activation::{MentionBehaviour, ReplyMode, TriggerContext};
use kesoku_core::{Message, MessageId, Role, SessionId};

use crate::context::ActivationContext;

/// The built-in system prompt, used when the config gives none.
pub const DEFAULT_SYSTEM_PROMPT: &str = "# System Instructions\n\
You are {name}, a helpful assistant that lives in the user's chat apps and can use tools.\n\
- Answer concisely and accurately. Use the tools when they help; do not invent tool results.\n\
- When a task needs several steps, do them, then give one final answer that summarizes what you did.\n\
- Files you create belong in the workspace; never try to read credentials or environment secrets.\n\
- Run long commands (builds, test suites, downloads) as background jobs when run_shell_command offers \
`background`; a `[System Alert]` wakes you when one ends: then tell the user how it went.\n\
- To send a workspace file with your answer, write `[file: path/in/workspace]` on its own line. To offer \
choices, write `[question: Your question? | First option | Second option]`; the user's pick comes back as \
their next message.";

/// The system prompt text: configured (or built-in) prompt, then the role's intro file.
pub fn system_prompt(agent_name: &str, configured: Option<&str>, intro: Option<&str>) -> String {
    let mut prompt = configured.unwrap_or(DEFAULT_SYSTEM_PROMPT).replace("{name}", agent_name);
    if let Some(intro) = intro.map(str::trim).filter(|t| !t.is_empty()) {
        prompt.push_str("\n\n");
        prompt.push_str(intro);
    }
    prompt
}

pub(crate) fn virtual_message(session_id: &SessionId, role: Role, sender: &str, content: String) -> Message {
    let mut message = Message::user_text(session_id, "system", "system", sender, content);
    message.role = role;
    message.status = kesoku_core::Status::Responded;
    message.id = MessageId::from(format!("virtual_{}", message.id));
    message
}

/// The time zone the model reads times in: the activation's (a cron job's, a trigger's, the
/// user's or channel's), else `[agent] timezone`, else UTC. An unknown name counts as UTC (the
/// config check refuses it before the service starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zone(Tz);

impl Zone {
    pub fn named(name: Option<&str>) -> Zone {
        Zone(name.and_then(|n| n.parse::<Tz>().ok()).unwrap_or(Tz::UTC))
    }

    /// The zone itself.
    pub fn tz(&self) -> Tz {
        self.0
    }

    /// `2026-03-29 09:00:00 Europe/Paris (UTC+02:00)`: local time, zone, and offset, so the model
    /// can reason across a DST change.
    pub fn format(&self, at: DateTime<Utc>) -> String {
        let local = at.with_timezone(&self.0);
        if self.0 == Tz::UTC {
            return format!("{} UTC", local.format("%Y-%m-%d %H:%M:%S"));
        }
        format!("{} {} (UTC{})", local.format("%Y-%m-%d %H:%M:%S"), self.0.name(), local.format("%:z"))
    }

    pub fn now(&self) -> String {
        self.format(Utc::now())
    }
}

/// The activation context entry: where the work came from and how to answer.
pub fn activation_context_entry(context: &ActivationContext, now_local: &str) -> Message {
    let reply = match context.expected_response.mode {
        ReplyMode::Channel => "reply in the channel",
        ReplyMode::Thread => "reply in the thread",
        ReplyMode::InternalOnly => "internal work: nothing you write is shown to users",
    };
    let mut lines = vec![
        "[Activation context]".to_owned(),
        format!("source: {} (channel {})", context.chatbot_id, context.channel_id),
        format!("time: {now_local}"),
    ];
    if let Some(locale) = &context.locale {
        lines.push(format!("locale: {locale}"));
    }
    lines.push(format!("response: {reply}"));
    if context.expected_response.mention == MentionBehaviour::MentionTrigger {
        lines.push("mention: address the person who asked".to_owned());
    }
    if let (Some(agent), Some(round)) = (&context.agent, &context.orchestration) {
        lines.extend(crate::orchestration::round_lines(agent, round));
    }
    virtual_message(&context.session_id, Role::User, "System", lines.join("\n"))
}

/// The trigger context entry of a workflow run or a direct trigger.
pub fn trigger_context_entry(session_id: &SessionId, trigger: &TriggerContext, task: &str, zone: &Zone) -> Message {
    let mut lines = vec![
        "[Trigger context]".to_owned(),
        format!("workflow: {} (source: {})", trigger.name, trigger.source),
        format!("fired at: {}", zone.format(trigger.fired_at)),
    ];
    if let Some(schedule) = &trigger.schedule {
        lines.push(format!("schedule: {schedule}"));
    }
    lines.push(format!("task: {task}"));
    virtual_message(session_id, Role::User, "System", lines.join("\n"))
}
