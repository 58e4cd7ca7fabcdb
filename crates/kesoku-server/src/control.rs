//! The seam between the HTTP server and the agent runtime: [`AgentControl`].
//!
//! The server reads everything durable from the store and the ledger itself; what only the
//! running process knows (which turns run now, queue depths, the limits in force) and what only
//! it can do (stop a turn) comes through this trait. Stop, clear and compact are the
//! [`SessionControl`] every chatbot's chat commands use too, so `/stop` in a chat and
//! `POST /v1/sessions/{id}/stop` do the same thing. The binary implements it over the agent;
//! tests and the demo implement it with a fake. It deliberately knows nothing of how the
//! runtime schedules work.

use chrono::{DateTime, Utc};
use kesoku_broker::QueueDepths;
use kesoku_chatbots::control::SessionControl;
use kesoku_core::{ActivationId, Lane, MessageId, SessionId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::schema::LaneSchema;

/// What the server may ask of the agent runtime: the session controls chat commands use, and
/// what runs now.
#[async_trait::async_trait]
pub trait AgentControl: SessionControl + 'static {
    /// What runs now: the running turns, queue depths per lane, and the limits of each lane.
    /// Async: the queue may live on another server (Redis).
    async fn runtime_state(&self) -> RuntimeState;
}

/// A snapshot of the runtime.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RuntimeState {
    /// Turns running now, one per busy session.
    pub running: Vec<RunningTurn>,
    /// Activations waiting per lane.
    pub queue: LaneDepths,
    /// The queue could not be read (its Redis is unreachable): `queue` holds zeros that mean
    /// nothing, and `/metrics` leaves the lane depths out rather than report an empty queue.
    #[serde(skip)]
    pub queue_unreadable: bool,
    /// The limits a turn of each lane runs under.
    pub limits: LaneLimits,
}

impl RuntimeState {
    /// The running turn of `session_id`, if any.
    pub fn turn_of(&self, session_id: &SessionId) -> Option<&RunningTurn> {
        self.running.iter().find(|turn| turn.session_id == *session_id)
    }
}

/// One running turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunningTurn {
    #[schema(value_type = String)]
    pub session_id: SessionId,
    /// The message that opened the turn (its status is `processing`).
    #[schema(value_type = String)]
    pub root_message_id: MessageId,
    #[schema(value_type = String)]
    pub activation_id: ActivationId,
    #[schema(value_type = LaneSchema)]
    pub lane: Lane,
    /// Who runs it (the worker name recorded with the claim).
    pub worker: String,
    pub since: DateTime<Utc>,
}

/// Waiting activations per lane, and activations out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LaneDepths {
    pub interactive: u64,
    pub responsive: u64,
    pub background: u64,
    /// Activations handed to a worker and not yet finished.
    pub running: u64,
}

impl LaneDepths {
    pub fn depth(&self, lane: Lane) -> u64 {
        match lane {
            Lane::Interactive => self.interactive,
            Lane::Responsive => self.responsive,
            Lane::Background => self.background,
        }
    }
}

impl From<QueueDepths> for LaneDepths {
    fn from(depths: QueueDepths) -> Self {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        LaneDepths {
            interactive: count(depths.interactive),
            responsive: count(depths.responsive),
            background: count(depths.background),
            running: count(depths.running),
        }
    }
}

/// The limits of one turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TurnLimits {
    /// Wall-clock seconds a turn may run.
    pub runtime_s: u64,
    /// Model calls a turn may make.
    pub model_calls: u32,
    /// Tool calls a turn may make.
    pub tool_calls: u32,
}

/// The limits of each lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LaneLimits {
    pub interactive: TurnLimits,
    pub responsive: TurnLimits,
    pub background: TurnLimits,
}

impl LaneLimits {
    pub fn for_lane(&self, lane: Lane) -> TurnLimits {
        match lane {
            Lane::Interactive => self.interactive,
            Lane::Responsive => self.responsive,
            Lane::Background => self.background,
        }
    }
}
