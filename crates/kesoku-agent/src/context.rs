//! The ActivationContext: what the runtime derives from an activation and shares with the turn
//! loop, the tools and nested work. It carries limits, model choice, output schema, locale and
//! reply routing; it deliberately carries no queue or ledger internals.

use std::sync::Arc;
use std::time::Duration;

use kesoku_core::{Activation, ActivationId, ActivationKind, ExpectedResponse, Lane, SessionId};
use kesoku_llm::Model;
use serde_json::Value;
use tokio::time::Instant;

use crate::config::Limits;

/// Which limit a turn ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Runtime,
    ModelCalls,
    ToolCalls,
}

impl LimitKind {
    /// "runtime limit of 900 s", "model call limit of 40", …
    pub fn describe(self, limits: &Limits) -> String {
        match self {
            LimitKind::Runtime => format!("runtime limit of {} s", limits.runtime_s),
            LimitKind::ModelCalls => format!("model call limit of {}", limits.model_calls),
            LimitKind::ToolCalls => format!("tool call limit of {}", limits.tool_calls),
        }
    }
}

/// Runtime view of one activation.
#[derive(Clone)]
pub struct ActivationContext {
    pub activation_id: ActivationId,
    pub kind: ActivationKind,
    pub lane: Lane,
    pub session_id: SessionId,
    /// Reply routing.
    pub chatbot_id: String,
    pub channel_id: String,
    pub expected_response: ExpectedResponse,
    pub depth: u32,
    /// The person the work runs for (tools get their grants); never shown to the model.
    pub delegation_user: Option<String>,
    /// The configured agent (`[[agents]]`) that runs it; `None`: the default agent.
    pub agent: Option<String>,
    /// The multi-agent round it belongs to: the model is told its peers' names and how to pass,
    /// never the indices.
    pub orchestration: Option<kesoku_core::Orchestration>,
    pub locale: Option<String>,
    pub timezone: Option<String>,
    pub limits: Limits,
    /// JSON Schema the final answer must follow, when the work asks for structured output.
    pub output_schema: Option<Value>,
    pub model: Arc<dyn Model>,
    pub started_at: Instant,
}

impl std::fmt::Debug for ActivationContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActivationContext")
            .field("activation_id", &self.activation_id)
            .field("lane", &self.lane)
            .field("session_id", &self.session_id)
            .field("limits", &self.limits)
            .field("model", &self.model.name())
            .finish_non_exhaustive()
    }
}

impl ActivationContext {
    pub fn derive(activation: &Activation, limits: Limits, model: Arc<dyn Model>) -> Self {
        ActivationContext {
            activation_id: activation.id.clone(),
            kind: activation.kind(),
            lane: activation.lane,
            session_id: activation.session_id.clone(),
            chatbot_id: activation.chatbot_id.clone(),
            channel_id: activation.channel_id.clone(),
            expected_response: activation.expected_response,
            depth: activation.depth,
            delegation_user: activation.delegation_user.clone(),
            agent: activation.agent.clone(),
            orchestration: activation.orchestration.clone(),
            locale: activation.locale.clone(),
            timezone: activation.timezone.clone(),
            limits,
            output_schema: activation.output_schema.clone(),
            model,
            started_at: Instant::now(),
        }
    }

    pub fn deadline(&self) -> Instant {
        self.started_at + self.limits.runtime()
    }

    pub fn elapsed(&self) -> Duration {
        self.started_at.elapsed()
    }
}
