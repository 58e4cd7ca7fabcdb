//! The agent's errors: what can stop the runtime from queueing, running or recovering work.
//!
//! A failure inside a turn (a model error, a tool error, a limit) is not an `AgentError`: it
//! ends that turn with a status and a notification, and the runtime goes on.

use kesoku_broker::BrokerError;
use kesoku_gateway::GatewayError;
use kesoku_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The lane queue refused an activation.
    #[error("the activation queue failed: {0}")]
    Queue(#[from] BrokerError),
    #[error("no model named `{0}` is configured")]
    UnknownModel(String),
}
