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

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{ActivationId, FollowUpId, JobId, MessageId, SessionId};

/// Priority lane of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// A human is waiting.
    Interactive,
    /// Workflows, direct triggers, follow-ups, sub-agent and job results.
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
    DirectTrigger,
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
    /// Never run: the contract forbade it (a delegation beyond `[agent] max_depth`).
    Refused,
}

macro_rules! wire_enum_impl {
    ($ty:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $text),+
                }
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $crate::status::UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($ty::$variant),)+
                    _ => Err($crate::status::UnknownValue {
                        what: stringify!($ty),
                        value: s.chars().take(64).collect(),
                        expected: &[$($text),+],
                    }),
                }
            }
        }
    };
}

pub(crate) use wire_enum_impl as wire_enum;

wire_enum_impl!(Lane { Interactive => "interactive", Responsive => "responsive", Background => "background" });
wire_enum_impl!(ActivationKind {
    Message => "message",
    Workflow => "workflow",
    DirectTrigger => "direct_trigger",
    FollowUp => "follow_up",
    SubAgentResult => "sub_agent_result",
    BackgroundJobResult => "background_job_result",
    VoiceTranscript => "voice_transcript",
    Maintenance => "maintenance",
});
wire_enum_impl!(Outcome {
    Succeeded => "succeeded",
    Failed => "failed",
    Interrupted => "interrupted",
    Cancelled => "cancelled",
    LimitExceeded => "limit_exceeded",
    Refused => "refused",
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
///
/// Every kind that runs a turn is anchored on a stored root message (`message_id`): the message
/// a person wrote, the Cronjob Trigger Message, the trigger message of a direct trigger, the
/// follow-up's reminder, the Background Wakeup Alert. The root carries the turn's status
/// (`pending_agent` → `processing` → `processed`), so a crash never loses the work and the
/// answer has a parent. Content kinds carry their task besides: the trigger context the model
/// sees is built from the contract, not parsed back out of a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ActivationPayload {
    /// A stored message (user text, manual compaction trigger), by reference.
    Message { message_id: MessageId },
    /// A workflow run (a `[[cron]]` job), carrying its task; its root is the Cronjob Trigger
    /// Message.
    Workflow { message_id: MessageId, task: String, trigger: TriggerContext },
    /// Work an automation asked for (`POST /v1/activations`), carrying its task.
    DirectTrigger { message_id: MessageId, task: String, trigger: TriggerContext },
    /// A follow-up the agent scheduled for itself, come due.
    FollowUp { message_id: MessageId, followup_id: FollowUpId, task: String },
    /// A sub-agent finished; its summary comes back to the parent session. The root is the
    /// result message posted into the parent session.
    SubAgentResult { message_id: MessageId, child_session_id: SessionId, summary: String },
    /// A background job ended; its wakeup alert message is the root.
    BackgroundJobResult { job_id: JobId, message_id: MessageId },
    /// A transcribed voice message.
    VoiceTranscript { transcript: String },
    /// Maintenance on the session (no root message: it answers nobody).
    Maintenance { task: MaintenanceTask },
}

impl ActivationPayload {
    pub fn kind(&self) -> ActivationKind {
        match self {
            ActivationPayload::Message { .. } => ActivationKind::Message,
            ActivationPayload::Workflow { .. } => ActivationKind::Workflow,
            ActivationPayload::DirectTrigger { .. } => ActivationKind::DirectTrigger,
            ActivationPayload::FollowUp { .. } => ActivationKind::FollowUp,
            ActivationPayload::SubAgentResult { .. } => ActivationKind::SubAgentResult,
            ActivationPayload::BackgroundJobResult { .. } => ActivationKind::BackgroundJobResult,
            ActivationPayload::VoiceTranscript { .. } => ActivationKind::VoiceTranscript,
            ActivationPayload::Maintenance { .. } => ActivationKind::Maintenance,
        }
    }

    /// The stored root message this payload's turn runs on.
    pub fn message_reference(&self) -> Option<&MessageId> {
        match self {
            ActivationPayload::Message { message_id }
            | ActivationPayload::Workflow { message_id, .. }
            | ActivationPayload::DirectTrigger { message_id, .. }
            | ActivationPayload::FollowUp { message_id, .. }
            | ActivationPayload::SubAgentResult { message_id, .. }
            | ActivationPayload::BackgroundJobResult { message_id, .. } => Some(message_id),
            ActivationPayload::VoiceTranscript { .. } | ActivationPayload::Maintenance { .. } => None,
        }
    }

    /// The trigger context the model is shown (workflows and direct triggers).
    pub fn trigger(&self) -> Option<(&TriggerContext, &str)> {
        match self {
            ActivationPayload::Workflow { trigger, task, .. }
            | ActivationPayload::DirectTrigger { trigger, task, .. } => Some((trigger, task)),
            ActivationPayload::Message { .. }
            | ActivationPayload::FollowUp { .. }
            | ActivationPayload::SubAgentResult { .. }
            | ActivationPayload::BackgroundJobResult { .. }
            | ActivationPayload::VoiceTranscript { .. }
            | ActivationPayload::Maintenance { .. } => None,
        }
    }
}

/// What a producer other than a person asks of the activation made for its root message:
/// stored as the root's `metadata.activation`, read by the intake. A message without it is a
/// `message` activation (or a `workflow` when it is a Cronjob Trigger Message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivationRequest {
    pub kind: ActivationKind,
    /// The task, when the message's content is not the bare task (a follow-up's reminder text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<TriggerContext>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub followup_id: Option<FollowUpId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<JobId>,
    /// JSON Schema the final answer must follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// IANA time zone the model's times are shown in (else the channel's, else `[agent]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Who asked (`cron:<job>`, `api`, `agent:<activation>`, …); default: the kind's producer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triggered_by: Option<String>,
    /// How deep in an agent-to-agent chain this work is: 0 for work a person or a schedule
    /// asked for, the parent's depth + 1 for a delegated task. Enforced against
    /// `[agent] max_depth` from here, never from a prompt.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub depth: u32,
    /// The turn that delegated this work (a sub-agent's task), where its result goes back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRef>,
    /// The sub-agent session whose result this is (a `sub_agent_result`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_session_id: Option<SessionId>,
    /// The person on whose behalf the work runs: tools that need a connection get that
    /// person's grant at call time. Never shown to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation_user: Option<String>,
    /// The configured agent (`[[agents]]` name) that must answer: a person's mention, another
    /// agent's mention, a delegation to a named agent, or the agent the orchestration dispatches.
    /// `None`: the channel's agents decide (orchestration), or the default agent answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Where a multi-agent round stands, carried from one agent's pass to the next dispatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestration: Option<Orchestration>,
}

/// Several agents sharing a channel (seed 003, "Orchestration"): the system, not the agents,
/// decides whose turn it is. One agent is dispatched at a time in the order fixed when the
/// message arrived; each replies or passes; the round halts when one replies or all have passed.
/// Lives in the activation (and on the root's `metadata.activation` between dispatches), never
/// in an agent's memory, and never in what the model sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orchestration {
    /// The channel's agents in dispatch order.
    pub agents: Vec<String>,
    /// Whose turn it is: an index into `agents`.
    pub index: usize,
    /// How many agents passed in a row before this dispatch.
    pub no_reply_streak: u32,
}

/// What follows a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterPass {
    /// The next agent in order is dispatched.
    Dispatch(Orchestration),
    /// Every agent passed: the round halts with no reply.
    AllPassed,
}

impl Orchestration {
    /// A round over `agents` (in order), starting with the first; `None` when there are none.
    pub fn start(agents: Vec<String>) -> Option<Orchestration> {
        (!agents.is_empty()).then_some(Orchestration { agents, index: 0, no_reply_streak: 0 })
    }

    /// The agent dispatched now.
    pub fn current(&self) -> Option<&str> {
        self.agents.get(self.index).map(String::as_str)
    }

    /// The others in the round (what an agent is told about its peers, by name only).
    pub fn others(&self) -> impl Iterator<Item = &str> {
        let current = self.index;
        self.agents.iter().enumerate().filter(move |(i, _)| *i != current).map(|(_, name)| name.as_str())
    }

    /// The current agent passed: the next one in order, or the end of the round when every
    /// agent has now passed.
    pub fn after_pass(&self) -> AfterPass {
        let streak = self.no_reply_streak.saturating_add(1);
        if self.agents.is_empty() || streak as usize >= self.agents.len() {
            return AfterPass::AllPassed;
        }
        AfterPass::Dispatch(Orchestration {
            agents: self.agents.clone(),
            index: (self.index + 1) % self.agents.len(),
            no_reply_streak: streak,
        })
    }
}

fn is_zero(depth: &u32) -> bool {
    *depth == 0
}

/// The turn that delegated a task to a sub-agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    /// The parent's session: the sub-agent's result is posted there.
    pub session_id: SessionId,
    /// The root message of the parent's turn that delegated.
    pub message_id: MessageId,
    /// The parent's activation, for the ledger's correlation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_id: Option<ActivationId>,
    /// The configured agent whose turn delegated (`None`: the default agent): the result goes
    /// back to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

impl ActivationRequest {
    pub fn new(kind: ActivationKind) -> Self {
        ActivationRequest {
            kind,
            task: None,
            trigger: None,
            followup_id: None,
            job_id: None,
            output_schema: None,
            timezone: None,
            triggered_by: None,
            depth: 0,
            parent: None,
            child_session_id: None,
            delegation_user: None,
            agent: None,
            orchestration: None,
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
            | ActivationKind::DirectTrigger
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
    /// The configured agent (`[[agents]]` name) that runs this work; `None`: the default agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The multi-agent round this dispatch belongs to (never shown to the model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestration: Option<Orchestration>,
    pub lane: Lane,
    #[serde(default)]
    pub expected_response: ExpectedResponse,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The configured model that answers, when the work names one (`[[cron]] model`, a direct
    /// trigger's `model`, a channel's model); else the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// JSON Schema the final answer must follow (structured output); the answer is validated and
    /// the model asked once more with the error when it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
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
    /// The configured agent that ran it (`None`: the default agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
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
            agent: activation.agent.clone(),
            enqueued_at: activation.created_at,
            started_at: None,
            finished_at: None,
            outcome: None,
            error: None,
            usage: Usage::default(),
        }
    }
}
