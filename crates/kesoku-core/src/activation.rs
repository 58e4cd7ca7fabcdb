//! Activations: the typed execution contract for one piece of agent work (seed 003).
//!
//! An activation is what the queue carries. Its envelope (who, where, how deep, which lane, what
//! reply is expected) is common to every kind; its payload differs by kind. *Reference* kinds
//! (a message) carry an id and load content at preparation time, so access checks and windowing
//! happen when the work runs; *content* kinds (workflows, sub-agent results, …) carry their text
//! because no stored message exists for them.
//!
//! The ledger keeps only the audit facts of an activation ([`LedgerEntry`]); the model sees only
//! formatted entries derived from it, never this struct.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{ActivationId, MessageId, SessionId};
use crate::status::UnknownValue;

/// Priority lane of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// A human is waiting.
    Interactive,
    /// Workflows, follow-ups, sub-agent and job results.
    Responsive,
    /// Maintenance: compaction, titles.
    Background,
}

/// The kind of an activation, without its payload (what the ledger records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivationKind {
    Message,
    Workflow,
    FollowUp,
    SubAgentResult,
    BackgroundJobResult,
    VoiceTranscript,
    Maintenance,
}

/// How an activation ended (the ledger's outcome column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    Failed,
    Interrupted,
    Cancelled,
    LimitExceeded,
}

macro_rules! wire_enum {
    ($ty:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($ty::$variant),)+
                    _ => Err(UnknownValue {
                        what: stringify!($ty),
                        value: s.chars().take(64).collect(),
                        expected: &[$($text),+],
                    }),
                }
            }
        }
    };
}

wire_enum!(Lane { Interactive => "interactive", Responsive => "responsive", Background => "background" });
wire_enum!(ActivationKind {
    Message => "message",
    Workflow => "workflow",
    FollowUp => "follow_up",
    SubAgentResult => "sub_agent_result",
    BackgroundJobResult => "background_job_result",
    VoiceTranscript => "voice_transcript",
    Maintenance => "maintenance",
});
wire_enum!(Outcome {
    Succeeded => "succeeded",
    Failed => "failed",
    Interrupted => "interrupted",
    Cancelled => "cancelled",
    LimitExceeded => "limit_exceeded",
});

/// What kind of conversation a session is; part of how the lane is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    /// A person talks in it.
    Interactive,
    /// Only automation (cron, workflows, sub-agents) writes to it.
    Automated,
}

/// Where and how the answer should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReplyMode {
    /// Answer in the channel the work came from.
    #[default]
    Channel,
    /// Answer in a thread under the triggering message.
    Thread,
    /// Do the work; post nothing for users.
    InternalOnly,
}

/// Whether the reply should mention the person who triggered the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MentionBehaviour {
    #[default]
    None,
    MentionTrigger,
}

/// The expected response of an activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct ExpectedResponse {
    pub mode: ReplyMode,
    pub mention: MentionBehaviour,
}

/// What started a workflow: a cron schedule, a webhook, a manual run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerContext {
    /// The job or workflow name.
    pub name: String,
    /// `cron`, `webhook`, `manual`, …
    pub source: String,
    /// The schedule expression when the source is a schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    pub fired_at: DateTime<Utc>,
}

/// A maintenance job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaintenanceTask {
    Compaction,
    Title,
}

/// The kind-specific payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ActivationPayload {
    /// A stored message (user text, cron trigger, wakeup alert, compaction trigger), by reference.
    Message { message_id: MessageId },
    /// A workflow run, carrying its task.
    Workflow { task: String, trigger: TriggerContext },
    /// A reminder the agent set for itself.
    FollowUp { note: String },
    /// A sub-agent finished; its summary comes back to the parent session.
    SubAgentResult { child_session_id: SessionId, summary: String },
    /// A background job finished; its wakeup alert message is referenced.
    BackgroundJobResult { job_id: String, message_id: MessageId },
    /// A transcribed voice message.
    VoiceTranscript { transcript: String },
    /// Maintenance on the session.
    Maintenance { task: MaintenanceTask },
}

impl ActivationPayload {
    pub fn kind(&self) -> ActivationKind {
        match self {
            ActivationPayload::Message { .. } => ActivationKind::Message,
            ActivationPayload::Workflow { .. } => ActivationKind::Workflow,
            ActivationPayload::FollowUp { .. } => ActivationKind::FollowUp,
            ActivationPayload::SubAgentResult { .. } => ActivationKind::SubAgentResult,
            ActivationPayload::BackgroundJobResult { .. } => ActivationKind::BackgroundJobResult,
            ActivationPayload::VoiceTranscript { .. } => ActivationKind::VoiceTranscript,
            ActivationPayload::Maintenance { .. } => ActivationKind::Maintenance,
        }
    }

    /// The stored message this payload points at, for reference kinds.
    pub fn message_reference(&self) -> Option<&MessageId> {
        match self {
            ActivationPayload::Message { message_id } | ActivationPayload::BackgroundJobResult { message_id, .. } => {
                Some(message_id)
            }
            ActivationPayload::Workflow { .. }
            | ActivationPayload::FollowUp { .. }
            | ActivationPayload::SubAgentResult { .. }
            | ActivationPayload::VoiceTranscript { .. }
            | ActivationPayload::Maintenance { .. } => None,
        }
    }
}

/// Who or what triggered a message activation, as far as lane choice cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Human,
    Schedule,
    System,
}

impl Lane {
    /// The lane for a kind of work in a kind of session: a waiting human gets the fast lane,
    /// automation the responsive lane, maintenance the background lane.
    pub fn derive(kind: ActivationKind, trigger: Trigger, session: SessionKind) -> Lane {
        match kind {
            ActivationKind::Maintenance => Lane::Background,
            ActivationKind::Message | ActivationKind::VoiceTranscript => match (trigger, session) {
                (Trigger::Human, SessionKind::Interactive) => Lane::Interactive,
                (Trigger::Human, SessionKind::Automated)
                | (Trigger::Schedule | Trigger::System, SessionKind::Interactive | SessionKind::Automated) => {
                    Lane::Responsive
                }
            },
            ActivationKind::Workflow
            | ActivationKind::FollowUp
            | ActivationKind::SubAgentResult
            | ActivationKind::BackgroundJobResult => Lane::Responsive,
        }
    }
}

/// A queued piece of work: the common envelope plus the kind payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activation {
    pub id: ActivationId,
    pub session_id: SessionId,
    /// Reply routing: where answers go.
    pub chatbot_id: String,
    pub channel_id: String,
    /// Who triggered the work (a user's name or id, `cron:<job>`, `system`, `agent:<session>`).
    pub triggered_by: String,
    /// The user whose grants the work may use, when it differs from the trigger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation_user: Option<String>,
    /// How many agent hops led here: 0 for work a person or a schedule started.
    pub depth: u32,
    pub lane: Lane,
    #[serde(default)]
    pub expected_response: ExpectedResponse,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    pub created_at: DateTime<Utc>,
    #[serde(flatten)]
    pub payload: ActivationPayload,
}

impl Activation {
    pub fn kind(&self) -> ActivationKind {
        self.payload.kind()
    }
}

/// Resource use of one activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub model_calls: u64,
    pub tool_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// One row of the execution ledger: the audit facts of an activation, nothing transient.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub id: ActivationId,
    pub kind: ActivationKind,
    pub lane: Lane,
    pub session_id: SessionId,
    /// The referenced message, for reference kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<MessageId>,
    pub triggered_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation_user: Option<String>,
    pub depth: u32,
    pub enqueued_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub usage: Usage,
}

impl LedgerEntry {
    /// The ledger row written when `activation` is enqueued.
    pub fn enqueued(activation: &Activation) -> Self {
        LedgerEntry {
            id: activation.id.clone(),
            kind: activation.kind(),
            lane: activation.lane,
            session_id: activation.session_id.clone(),
            message_id: activation.payload.message_reference().cloned(),
            triggered_by: activation.triggered_by.clone(),
            delegation_user: activation.delegation_user.clone(),
            depth: activation.depth,
            enqueued_at: activation.created_at,
            started_at: None,
            finished_at: None,
            outcome: None,
            error: None,
            usage: Usage::default(),
        }
    }
}
