//! The in-process agent behind the seams other crates define: the HTTP server's
//! [`AgentControl`] (stop a session, report what runs) and the chat commands' `SessionControl`.

use async_trait::async_trait;
use kesoku_agent::Agent;
use kesoku_broker::StopReason;
use kesoku_core::{Lane, SessionId};
use kesoku_server::{AgentControl, LaneDepths, LaneLimits, RunningTurn, RuntimeState, TurnLimits};

#[derive(Debug, Clone)]
pub struct AgentHandle(pub Agent);

#[async_trait]
impl AgentControl for AgentHandle {
    async fn stop_session(&self, session_id: &SessionId) -> Result<usize, String> {
        self.0.stop_session(session_id, StopReason::UserRequest).await.map_err(|e| e.to_string())
    }

    fn runtime_state(&self) -> RuntimeState {
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
            queue: LaneDepths::from(self.0.queue_depths()),
            limits: LaneLimits {
                interactive: limits(Lane::Interactive),
                responsive: limits(Lane::Responsive),
                background: limits(Lane::Background),
            },
        }
    }
}

#[async_trait]
impl kesoku_chatbots::commands::SessionControl for AgentHandle {
    async fn stop_session(
        &self,
        session_id: &SessionId,
    ) -> Result<kesoku_chatbots::commands::StopAck, kesoku_chatbots::ChatbotError> {
        let interrupted_waiting = self
            .0
            .stop_session(session_id, StopReason::UserRequest)
            .await
            .map_err(|error| kesoku_chatbots::ChatbotError::Stop(error.to_string()))?;
        Ok(kesoku_chatbots::commands::StopAck {
            turn: kesoku_chatbots::commands::TurnStop::Requested,
            interrupted_waiting,
        })
    }
}
