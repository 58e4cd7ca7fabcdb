//! The API's handlers, grouped by resource, and the two route sets: [`api`] (protected by the
//! token when one is configured) and [`open`] (health and readiness, always open).
//!
//! Handlers translate between HTTP and the gateway, the store, the ledger and the
//! [`crate::AgentControl`]; they hold no state of their own.

use std::collections::HashMap;

use kesoku_core::{MessageFilter, Session, SessionId, Status};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use sessions::COMPACTION_REQUEST_TEXT;

use crate::control::RuntimeState;
use crate::error::AppError;
use crate::server::AppState;
use crate::views::{Activity, SessionView};

mod activations;
mod events;
mod messages;
mod ops;
pub(crate) mod sessions;

/// The routes that need the token when one is configured.
pub(crate) fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(messages::post_message))
        .routes(routes!(sessions::list_sessions))
        .routes(routes!(sessions::get_session))
        .routes(routes!(sessions::session_messages))
        .routes(routes!(sessions::stop_session))
        .routes(routes!(sessions::compact_session))
        .routes(routes!(sessions::clear_session))
        .routes(routes!(sessions::session_state))
        .routes(routes!(sessions::export_session))
        .routes(routes!(events::events))
        .routes(routes!(activations::list_activations, activations::post_activation))
        .routes(routes!(activations::runtime))
        .routes(routes!(ops::metrics))
}

/// The routes open to anyone who can reach the server.
pub(crate) fn open() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(ops::healthz)).routes(routes!(ops::readyz))
}

/// A session by id, or 404.
pub(crate) async fn load_session(state: &AppState, id: &str) -> Result<Session, AppError> {
    let session_id = SessionId::from(id);
    state.gateway.store().get_session(&session_id).await?.ok_or_else(|| AppError::not_found("session", id))
}

/// What every session with open work is doing: one store read for all of them.
pub(crate) async fn activities(
    state: &AppState,
    runtime: &RuntimeState,
) -> Result<HashMap<SessionId, Activity>, AppError> {
    let filter = MessageFilter::default().with_statuses(&[Status::PendingAgent, Status::Processing]);
    let open = state.gateway.store().list_messages(&filter).await?;
    let mut activity: HashMap<SessionId, Activity> = HashMap::new();
    for message in open {
        let next = if message.status == Status::Processing { Activity::Running } else { Activity::Waiting };
        let entry = activity.entry(message.session_id).or_insert(next);
        if next == Activity::Running {
            *entry = Activity::Running;
        }
    }
    for turn in &runtime.running {
        activity.insert(turn.session_id.clone(), Activity::Running);
    }
    Ok(activity)
}

/// Views of `sessions`, with their active flag and activity.
pub(crate) async fn session_views(state: &AppState, sessions: Vec<Session>) -> Result<Vec<SessionView>, AppError> {
    let runtime = state.control.runtime_state().await;
    let activity = activities(state, &runtime).await?;
    let mut active: HashMap<(String, String), Option<SessionId>> = HashMap::new();
    let mut views = Vec::with_capacity(sessions.len());
    for session in sessions {
        let key = (session.chatbot_id.clone(), session.channel_id.clone());
        let current = match active.get(&key) {
            Some(current) => current.clone(),
            None => {
                let current = state.gateway.store().active_session(&key.0, &key.1).await?;
                active.insert(key, current.clone());
                current
            }
        };
        let is_active = current.as_ref() == Some(&session.id);
        let doing = activity.get(&session.id).copied().unwrap_or(Activity::Idle);
        views.push(SessionView::new(session, is_active, doing));
    }
    Ok(views)
}
