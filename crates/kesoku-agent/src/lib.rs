//! The agent runtime: activations become turns.
//!
//! [`Agent`] takes `pending_agent` messages from the gateway, turns each into an activation on a
//! priority lane, records it in the ledger, and runs it on a worker pool with one worker per
//! session at a time: claim the message, prepare the model's view (system prompt, activation
//! context entry, the session history), then the turn loop ([`turn`]) of model calls and tool
//! runs, every step posted as a message. How the turn ended decides the root's final status and
//! the ledger outcome.
//!
//! [`Followups`] is work the agent schedules for itself: its tools store follow-ups, its
//! scheduler posts each one's reminder when it comes due, which the intake turns into a
//! `follow_up` activation like any other root message.
//!
//! [`Subagents`] is work the agent hands to a child agent (`delegate`) one level deeper, in a
//! session of its own; the [`ResultKeeper`] (run by [`Agent::run`]) posts each child's result
//! back into its parent session and stops the children of a stopped parent.
//!
//! This crate talks to traits (`Store`, `Ledger`, `Queue`, `Model`, `Tool`) through the gateway
//! and never to SQL, HTTP or platforms directly.

pub mod compaction;
pub mod config;
pub mod context;
pub mod entries;
mod error;
pub mod followups;
pub mod grants;
pub mod jobs;
mod liveness;
pub mod orchestration;
pub mod personas;
pub mod runtime;
pub mod structured;
pub mod subagents;
pub mod turn;

pub use config::{AgentConfig, LaneLimits, Limits, QueueMode};
pub use context::{ActivationContext, LimitKind};
pub use error::AgentError;
pub use followups::Followups;
pub use grants::StoreGrants;
pub use jobs::{Jobs, JobsConfig, JobsError, JobsRecovery};
pub use personas::{AgentPersona, Personas};
pub use runtime::{
    Agent, AgentDeps, ModelSet, RecoveryReport, RunningTurn, SessionLeasing, SweepReport, Tasks, dispatch_id,
};
pub use subagents::{ResultKeeper, Subagents};
pub use turn::{StopSignal, TurnEnd};
