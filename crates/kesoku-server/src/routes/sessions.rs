//! Session routes: list, read, history, stop, compact, clear, state ("why is it stuck?"), and
//! the shareable HTML export.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use http::{HeaderValue, StatusCode, header};
use kesoku_chatbots::control::TurnStop;
use kesoku_core::{MessageFilter, Status};
use kesoku_store::SessionFilter;

use super::{activities, load_session, session_views};
use crate::error::AppError;
use crate::extract::{ApiPath, ApiQuery};
use crate::openapi::{CommonErrors, QueryErrors, SessionErrors};
use crate::server::AppState;
use crate::views::{
    Activity, DEFAULT_LIMIT, LastEventView, MessagesResponse, PostMessageResponse, SessionListQuery,
    SessionListResponse, SessionStateResponse, SessionView, StopResponse, WaitingView, WorkerView,
};

/// Content of the Manual Compaction Trigger posted by `POST /v1/sessions/{id}/compact` (the
/// same as the chat command `/compact` posts).
pub const COMPACTION_REQUEST_TEXT: &str = kesoku_chatbots::control::COMPACTION_REQUEST;

/// List sessions, newest first.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    params(SessionListQuery),
    responses((status = 200, description = "Sessions, newest first.", body = SessionListResponse), QueryErrors, CommonErrors)
)]
pub(crate) async fn list_sessions(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<SessionListQuery>,
) -> Result<Json<SessionListResponse>, AppError> {
    let filter = SessionFilter {
        chatbot_id: query.chatbot_id,
        channel_id: query.channel_id,
        limit: Some(query.limit.unwrap_or(DEFAULT_LIMIT)),
    };
    let sessions = state.gateway.store().list_sessions(&filter).await?;
    Ok(Json(SessionListResponse { sessions: session_views(&state, sessions).await? }))
}

/// One session.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The session.", body = SessionView), SessionErrors, CommonErrors)
)]
pub(crate) async fn get_session(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SessionView>, AppError> {
    let session = load_session(&state, &id).await?;
    let mut views = session_views(&state, vec![session]).await?;
    views.pop().map(Json).ok_or_else(|| AppError::internal("a session view went missing"))
}

/// A session's whole history, in phased order (turn by turn; in each model step thoughts, tool
/// calls, tool results, then text).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/messages",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The history.", body = MessagesResponse), SessionErrors, CommonErrors)
)]
pub(crate) async fn session_messages(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<MessagesResponse>, AppError> {
    let session = load_session(&state, &id).await?;
    // The revision first: a stream opened after it replays whatever changes after this read.
    let rev = state.gateway.store().current_rev().await?;
    let messages = state.gateway.store().session_history(&session.id).await?;
    Ok(Json(MessagesResponse { session_id: session.id, rev, messages }))
}

/// Stop the session's running turn and interrupt its waiting messages.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/stop",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "Stopped.", body = StopResponse), SessionErrors, CommonErrors)
)]
pub(crate) async fn stop_session(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<StopResponse>, AppError> {
    let session = load_session(&state, &id).await?;
    let ack = state.control.stop_session(&session.id).await?;
    if let TurnStop::Unreachable(reason) = &ack.turn {
        tracing::warn!(session = %session.id, %reason, "the running turn could not be stopped from here");
    }
    let interrupted = u64::try_from(ack.interrupted_waiting).unwrap_or(u64::MAX);
    Ok(Json(StopResponse { session_id: session.id, interrupted }))
}

/// Ask the agent to compact the session's history (posts the Manual Compaction Trigger).
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/compact",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 202, description = "The trigger message was posted.", body = PostMessageResponse),
        SessionErrors,
        CommonErrors
    )
)]
pub(crate) async fn compact_session(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<(StatusCode, Json<PostMessageResponse>), AppError> {
    let session = load_session(&state, &id).await?;
    let trigger =
        state.control.compact_session(&state.gateway, &session.id, &session.chatbot_id, &session.channel_id).await?;
    Ok((StatusCode::ACCEPTED, Json(PostMessageResponse { id: trigger.id, session_id: session.id })))
}

/// Start a new session for this session's (chatbot, channel); the old one is kept.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/clear",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 201, description = "The new, now active, session.", body = SessionView),
        SessionErrors,
        CommonErrors
    )
)]
pub(crate) async fn clear_session(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<(StatusCode, Json<SessionView>), AppError> {
    let old = load_session(&state, &id).await?;
    let fresh = state.control.clear_session(&state.gateway, &old.chatbot_id, &old.channel_id).await?;
    // Read it back: the stored timestamps are what later reads return.
    let stored = state.gateway.store().get_session(&fresh.id).await?.unwrap_or(fresh);
    Ok((StatusCode::CREATED, Json(SessionView::new(stored, true, Activity::Idle))))
}

/// What the session is doing and, when it does not move, why: who holds its message and since
/// when, what waits, the newest change, queue depths and limits, unfinished ledger rows.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/state",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The session's state.", body = SessionStateResponse), SessionErrors, CommonErrors)
)]
pub(crate) async fn session_state(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SessionStateResponse>, AppError> {
    let session = load_session(&state, &id).await?;
    let store = state.gateway.store();
    let runtime = state.control.runtime_state().await;
    let now = Utc::now();

    let open_filter = MessageFilter::session(&session.id).with_statuses(&[Status::Processing, Status::PendingAgent]);
    let open = store.list_messages(&open_filter).await?;
    let worker = match open.iter().find(|m| m.status == Status::Processing) {
        Some(message) => {
            let claim = store.claim_of(&message.id).await?;
            Some(WorkerView {
                message_id: message.id.clone(),
                claimed_by: claim.as_ref().map(|c| c.claimed_by.clone()),
                claimed_at: claim.as_ref().map(|c| c.claimed_at),
                held_for_s: claim.as_ref().map(|c| (now - c.claimed_at).num_seconds()),
            })
        }
        None => None,
    };
    let waiting: Vec<WaitingView> = open
        .iter()
        .filter(|m| m.status == Status::PendingAgent)
        .map(|m| WaitingView { message_id: m.id.clone(), sender: m.sender.clone(), created_at: m.created_at })
        .collect();
    let history = store.session_history(&session.id).await?;
    let last_event =
        history.iter().enumerate().max_by_key(|(index, m)| (m.updated_at.or(m.created_at), *index)).map(|(_, m)| {
            LastEventView {
                message_id: m.id.clone(),
                role: m.role,
                message_type: m.message_type,
                status: m.status,
                sender: m.sender.clone(),
                updated_at: m.updated_at.or(m.created_at),
            }
        });
    let unfinished: Vec<_> =
        state.ledger.unfinished_activations().await?.into_iter().filter(|e| e.session_id == session.id).collect();
    let running_turn = runtime.turn_of(&session.id).cloned();
    let activity = activities(&state, &runtime).await?.get(&session.id).copied().unwrap_or(Activity::Idle);

    let summary = match (&worker, &running_turn) {
        (Some(worker), Some(turn)) => format!(
            "a turn is running: message {} is held by {} since {} ({} s)",
            worker.message_id,
            turn.worker,
            turn.since.to_rfc3339(),
            (now - turn.since).num_seconds()
        ),
        (Some(worker), None) => format!(
            "message {} is processing (claimed by {} {}) but no turn runs for it in this process: it runs in \
             another process, or its worker died and orphan recovery will hand it back",
            worker.message_id,
            worker.claimed_by.as_deref().unwrap_or("an unknown worker"),
            worker.claimed_at.map(|at| format!("at {}", at.to_rfc3339())).unwrap_or_default(),
        ),
        (None, Some(turn)) => format!(
            "a {} turn is running (activation {}) since {}",
            turn.lane,
            turn.activation_id,
            turn.since.to_rfc3339()
        ),
        (None, None) if !waiting.is_empty() => format!(
            "{} message(s) wait for a worker; queued activations: interactive {}, responsive {}, background {}",
            waiting.len(),
            runtime.queue.interactive,
            runtime.queue.responsive,
            runtime.queue.background
        ),
        (None, None) => "idle: nothing runs and nothing waits".to_owned(),
    };

    Ok(Json(SessionStateResponse {
        session_id: session.id,
        activity,
        summary,
        worker,
        running_turn,
        queue: runtime.queue,
        last_event,
        limits: runtime.limits,
        waiting,
        unfinished_activations: unfinished,
    }))
}

/// The session's trajectory as one self-contained HTML page, for sharing.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/export",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 200, description = "A self-contained HTML page.", content_type = "text/html", body = String),
        SessionErrors,
        CommonErrors
    )
)]
pub(crate) async fn export_session(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, AppError> {
    let session = load_session(&state, &id).await?;
    let messages = state.gateway.store().session_history(&session.id).await?;
    let page = crate::trajectory::render_trajectory_html(&session, &messages);
    let file_name: String = session
        .id
        .as_str()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect();
    let disposition = HeaderValue::from_str(&format!("attachment; filename=\"kesoku-{file_name}.html\""))
        .unwrap_or(HeaderValue::from_static("attachment"));
    let mut response = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response();
    response.headers_mut().insert(header::CONTENT_DISPOSITION, disposition);
    response
        .headers_mut()
        .insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(crate::trajectory::CONTENT_SECURITY_POLICY));
    Ok(response)
}
