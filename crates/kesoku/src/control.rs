//! The in-process agent behind the seams other crates define: the [`SessionControl`] the chat
//! commands and the HTTP API share (stop a session), and the server's [`AgentControl`] (what
//! runs now).

use async_trait::async_trait;
use kesoku_agent::Agent;
use kesoku_broker::StopReason;
use kesoku_chatbots::ChatbotError;
use kesoku_chatbots::control::{SessionControl, StopAck, TurnStop};
use kesoku_core::{Lane, SessionId};
use kesoku_server::{AgentControl, LaneDepths, LaneLimits, RunningTurn, RuntimeState, TurnLimits};

#[derive(Debug, Clone)]
pub struct AgentHandle(pub Agent);

#[async_trait]
impl AgentControl for AgentHandle {
    async fn runtime_state(&self) -> RuntimeState {
        let (queue, queue_unreadable) = match self.0.queue_depths().await {
            Ok(depths) => (LaneDepths::from(depths), false),
            Err(error) => {
                tracing::warn!(%error, "reading the queue depths failed");
                (LaneDepths::default(), true)
            }
        };
        let limits = |lane: Lane| {
            let l = self.0.limits().for_lane(lane);
            TurnLimits { runtime_s: l.runtime_s, model_calls: l.model_calls, tool_calls: l.tool_calls }
        };
        RuntimeState {
            running: self
                .0
                .running_turns()
                .into_iter()
                .map(|(session_id, turn)| RunningTurn {
                    session_id,
                    root_message_id: turn.root_id,
                    activation_id: turn.activation_id,
                    lane: turn.lane,
                    worker: self.0.worker_id().to_owned(),
                    since: turn.since,
                })
                .collect(),
            queue,
            queue_unreadable,
            limits: LaneLimits {
                interactive: limits(Lane::Interactive),
                responsive: limits(Lane::Responsive),
                background: limits(Lane::Background),
            },
        }
    }
}

#[async_trait]
impl SessionControl for AgentHandle {
    async fn stop_session(&self, session_id: &SessionId) -> Result<StopAck, ChatbotError> {
        let interrupted_waiting = self
            .0
            .stop_session(session_id, StopReason::UserRequest)
            .await
            .map_err(|error| ChatbotError::Stop(error.to_string()))?;
        Ok(StopAck { turn: TurnStop::Requested, interrupted_waiting })
    }
}
