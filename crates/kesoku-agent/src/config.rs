//! The agent's settings: who it is, how it schedules, and the limits of each lane.
//!
//! Embedded by the binary as `[agent]` and `[limits.<lane>]` in `kesoku.toml`; every field has
//! a default so an empty file works.

use std::collections::BTreeMap;
use std::time::Duration;

use kesoku_core::Lane;
use serde::{Deserialize, Serialize};

/// What a new message on a channel does to a turn already running there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueMode {
    /// Stop the running turn; the newest message wins (the spec's default).
    #[default]
    Interrupt,
    /// Let the running turn finish, then take the next message.
    Queue,
    /// The new message joins the running turn at its next model or tool boundary.
    Steer,
}

/// Per-activation resource limits. `None` means unlimited for that resource; the runtime limit
/// always applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock seconds a turn may run.
    pub runtime_s: u64,
    /// Model calls a turn may make.
    pub model_calls: u32,
    /// Tool calls a turn may make.
    pub tool_calls: u32,
}

impl Limits {
    pub fn runtime(&self) -> Duration {
        Duration::from_secs(self.runtime_s)
    }

    /// Defaults per lane: a person waiting gets a generous but bounded turn; maintenance is small.
    pub fn default_for(lane: Lane) -> Limits {
        match lane {
            Lane::Interactive => Limits { runtime_s: 900, model_calls: 40, tool_calls: 100 },
            Lane::Responsive => Limits { runtime_s: 1800, model_calls: 60, tool_calls: 200 },
            Lane::Background => Limits { runtime_s: 600, model_calls: 8, tool_calls: 0 },
        }
    }
}

/// `[limits.interactive]`, `[limits.responsive]`, `[limits.background]`.
///
/// In the file every key of a lane's table is optional: a key left out keeps that lane's
/// default ([`Limits::default_for`]), so `[limits.interactive]` with only `tool_calls = 2` is
/// the interactive defaults with two tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "LaneLimitsFile")]
pub struct LaneLimits {
    pub interactive: Option<Limits>,
    pub responsive: Option<Limits>,
    pub background: Option<Limits>,
}

/// `[limits]` as written in the file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LaneLimitsFile {
    #[serde(default)]
    interactive: Option<LimitsFile>,
    #[serde(default)]
    responsive: Option<LimitsFile>,
    #[serde(default)]
    background: Option<LimitsFile>,
}

/// One lane's table as written: the keys set, each replacing the lane's default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    #[serde(default)]
    runtime_s: Option<u64>,
    #[serde(default)]
    model_calls: Option<u32>,
    #[serde(default)]
    tool_calls: Option<u32>,
}

impl LimitsFile {
    fn over(self, lane: Lane) -> Limits {
        let default = Limits::default_for(lane);
        Limits {
            runtime_s: self.runtime_s.unwrap_or(default.runtime_s),
            model_calls: self.model_calls.unwrap_or(default.model_calls),
            tool_calls: self.tool_calls.unwrap_or(default.tool_calls),
        }
    }
}

impl From<LaneLimitsFile> for LaneLimits {
    fn from(file: LaneLimitsFile) -> Self {
        LaneLimits {
            interactive: file.interactive.map(|limits| limits.over(Lane::Interactive)),
            responsive: file.responsive.map(|limits| limits.over(Lane::Responsive)),
            background: file.background.map(|limits| limits.over(Lane::Background)),
        }
    }
}

impl LaneLimits {
    pub fn for_lane(&self, lane: Lane) -> Limits {
        let configured = match lane {
            Lane::Interactive => self.interactive,
            Lane::Responsive => self.responsive,
            Lane::Background => self.background,
        };
        configured.unwrap_or_else(|| Limits::default_for(lane))
    }
}

/// `[agent]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The agent's display name: the sender of its messages.
    #[serde(default = "default_name")]
    pub name: String,
    /// Which `[models.NAME]` entry answers. Optional: the binary picks a default.
    #[serde(default)]
    pub model: Option<String>,
    /// The system prompt. When unset, a built-in one is used.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// A file whose text is appended to the system prompt (the role's intro), relative to the config.
    #[serde(default)]
    pub system_prompt_file: Option<String>,
    /// What a new message does to a running turn, for channels without their own setting.
    #[serde(default)]
    pub queue_mode: QueueMode,
    /// Per-channel overrides: `"cli:cli" = "queue"` (key `chatbot:channel`).
    #[serde(default)]
    pub channel_queue_modes: BTreeMap<String, QueueMode>,
    /// Turns running at once, across all sessions.
    #[serde(default = "default_max_concurrent_turns")]
    pub max_concurrent_turns: usize,
    /// A `processing` message whose claim is older than this (seconds) is an orphan of a dead
    /// worker and is retried. Live workers renew their claim well within it.
    #[serde(default = "default_orphan_after_s")]
    pub orphan_after_s: u64,
    /// An activation recorded in the ledger but never started, whose message still waits
    /// (`pending_agent`) this many seconds later while the lane looks empty, was lost between
    /// the ledger and the queue (its intake process died in between): the intake's sweep
    /// queues it again.
    #[serde(default = "default_requeue_after_s")]
    pub requeue_after_s: u64,
    /// Deepest agent-to-agent chain allowed: a sub-agent may run at depth 1..=max_depth; a
    /// delegation beyond it is refused (issue #30: default 3).
    #[serde(default = "default_max_depth")]
    pub max_depth: u32,
    /// In a channel where two or more `[[agents]]` sit: how many recent channel messages the
    /// answering agent is shown beside its own view (the channel-context entry); 0 turns it off.
    #[serde(default = "default_channel_context_messages")]
    pub channel_context_messages: u32,
    /// For a message inside a thread: how many recent replies of the thread the model is shown
    /// with the thread's root (the thread-context entry); 0 shows the root only.
    #[serde(default = "default_thread_context_messages")]
    pub thread_context_messages: u32,
    /// Write every model request and response to the session's staging folder.
    #[serde(default)]
    pub debug: bool,
    /// `[agent.compaction]`: keeping long conversations inside the window.
    #[serde(default)]
    pub compaction: crate::compaction::CompactionConfig,
    /// Default locale and timezone shown to the model when a platform gives none.
    #[serde(default)]
    pub locale: Option<String>,
    #[serde(default)]
    pub timezone: Option<String>,
    /// Time zones of chatbots that configure their own (`[[chatbots.discord]] timezone`), by
    /// chatbot id: the activation context of their messages shows times there. Set by the
    /// binary from the chatbots' sections, not a key of `[agent]`.
    #[serde(skip)]
    pub chatbot_timezones: BTreeMap<String, String>,
    /// Give each new session a short title, written by the summarizing model after its first
    /// turn, on the background lane (one model call per session).
    #[serde(default)]
    pub titles: bool,
}

fn default_name() -> String {
    kesoku_core::message::DEFAULT_AGENT_NAME.to_owned()
}

fn default_max_concurrent_turns() -> usize {
    16
}

fn default_orphan_after_s() -> u64 {
    300
}

fn default_requeue_after_s() -> u64 {
    60
}

fn default_max_depth() -> u32 {
    3
}

fn default_channel_context_messages() -> u32 {
    20
}

fn default_thread_context_messages() -> u32 {
    10
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            name: default_name(),
            model: None,
            system_prompt: None,
            system_prompt_file: None,
            queue_mode: QueueMode::default(),
            channel_queue_modes: BTreeMap::new(),
            max_concurrent_turns: default_max_concurrent_turns(),
            orphan_after_s: default_orphan_after_s(),
            requeue_after_s: default_requeue_after_s(),
            max_depth: default_max_depth(),
            channel_context_messages: default_channel_context_messages(),
            thread_context_messages: default_thread_context_messages(),
            debug: false,
            compaction: crate::compaction::CompactionConfig::default(),
            locale: None,
            timezone: None,
            titles: false,
            chatbot_timezones: BTreeMap::new(),
        }
    }
}

impl AgentConfig {
    pub fn queue_mode_for(&self, chatbot_id: &str, channel_id: &str) -> QueueMode {
        self.channel_queue_modes.get(&format!("{chatbot_id}:{channel_id}")).copied().unwrap_or(self.queue_mode)
    }

    /// The time zone of work arriving through `chatbot_id`: the chatbot's own, else
    /// `[agent] timezone`.
    pub fn timezone_for(&self, chatbot_id: &str) -> Option<&str> {
        self.chatbot_timezones.get(chatbot_id).or(self.timezone.as_ref()).map(String::as_str)
    }

    pub fn orphan_after(&self) -> Duration {
        Duration::from_secs(self.orphan_after_s)
    }

    pub fn requeue_after(&self) -> Duration {
        Duration::from_secs(self.requeue_after_s)
    }
}
