//! Kesoku's HTTP face: the API (axum), live message events over Server-Sent Events, the
//! OpenAPI document, Prometheus metrics, and the embedded web console; plus the `api`
//! chatbot ([`ApiChatbot`], delivered by the shared [`kesoku_chatbots::Deliverer`]) and the
//! shareable HTML export of a trajectory.
//!
//! This is the only crate that knows HTTP routes. It talks to the system through the
//! [`kesoku_gateway::Gateway`] (writes and live events), the store and the ledger (reads), and
//! the [`AgentControl`] trait (what only the running agent knows or can do); it does not depend
//! on the agent, reads no environment and no config file: the binary hands everything over.
//!
//! Wiring, in the binary:
//! ```text
//! let token = config.http.token_env.map(|var| Token::new(std::env::var(var)?)).transpose()?;
//! kesoku_server::check_bind(addr, token.as_ref())?;
//! let state = ServerState::new(gateway.clone(), ledger, Arc::new(AgentHandle(agent)), workspace)
//!     .with_metrics(prometheus_handle);          // + .with_token(token) when set
//! let deliverer = Deliverer::new(gateway.clone(), workspace).with_ledger(ledger);
//! tokio::spawn(kesoku_server::run_api_delivery(deliverer, shutdown.clone()));
//! kesoku_server::serve(TcpListener::bind(addr).await?, state, shutdown).await?;
//! ```

mod attachments;
mod auth;
mod console;
mod control;
mod delivery;
mod error;
mod extract;
mod openapi;
mod routes;
mod schema;
mod server;
mod trajectory;
mod views;

pub use auth::{ACCESS_TOKEN_PARAM, Token, check_bind};
pub use console::CONSOLE_CSP;
pub use control::{AgentControl, LaneDepths, LaneLimits, RunningTurn, RuntimeState, TurnLimits};
pub use delivery::{ApiChatbot, run_api_delivery};
pub use error::{AppError, ErrorBody, ErrorCode, ErrorDetail, ServerError};
pub use routes::COMPACTION_REQUEST_TEXT;
pub use server::{DEFAULT_BODY_LIMIT, MemoryProbe, ServerState, app, openapi_document, serve};
pub use trajectory::{CONTENT_SECURITY_POLICY as TRAJECTORY_CSP, escape_html, render_trajectory_html};
pub use views::{
    API_CHATBOT, ActivationListResponse, Activity, AttachmentParams, HealthResponse, MessageEventView,
    MessagesResponse, PostActivationParams, PostActivationResponse, PostMessageParams, PostMessageResponse,
    SessionListResponse, SessionStateResponse, SessionView, StopResponse,
};
