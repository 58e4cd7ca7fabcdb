//! Direct triggers (`POST /v1/activations`), the execution ledger (`GET /v1/activations`) and
//! the runtime snapshot (`GET /v1/runtime`).
//!
//! A direct trigger enters like every message, through [`kesoku_chatbots::ingest`]: a Direct
//! Trigger Message (`user`/`text`, sender `Trigger`, `pending_agent`) whose
//! `metadata.activation` asks for a `direct_trigger` activation. What it becomes (the lane, the
//! run, the answer in the channel) is the runtime's business, not this handler's.

use axum::Json;
use axum::extract::State;
use chrono::Utc;
use http::StatusCode;
use kesoku_chatbots::staging::Staging;
use kesoku_chatbots::{Inbound, Ingested, ingest};
use kesoku_core::activation::{ActivationKind, ActivationRequest, TriggerContext};
use kesoku_core::message::SENDER_TRIGGER;
use kesoku_core::{Metadata, SessionId};
use kesoku_store::LedgerFilter;

use crate::error::AppError;
use crate::extract::{ApiJson, ApiQuery};
use crate::openapi::{BodyErrors, CommonErrors, QueryErrors};
use crate::server::AppState;
use crate::views::{
    ActivationListResponse, ActivationsQuery, DEFAULT_LIMIT, PostActivationParams, PostActivationResponse,
    RuntimeResponse,
};

/// The trigger name of a direct trigger that gives none.
pub(crate) const DEFAULT_TRIGGER_NAME: &str = "direct";
/// The trigger source (and `triggered_by`) of work posted through this API.
pub(crate) const API_TRIGGER_SOURCE: &str = "api";

/// Ask the agent to do something: a direct trigger, for automations and webhooks.
///
/// The task is stored as a Direct Trigger Message (role `user`, sender `Trigger`,
/// `pending_agent`) in the active session of (`chatbot_id`, `channel_id`), created when there is
/// none; the agent runs it as a `direct_trigger` activation on the responsive lane and answers
/// in that channel. The model sees the trigger context (`name`, source `api`, when it fired).
/// With a `client_request_id` the post is idempotent: the same id again (per chatbot) stores
/// nothing and answers `200` with the first message.
#[utoipa::path(
    post,
    path = "/v1/activations",
    tag = "activations",
    request_body = PostActivationParams,
    responses(
        (status = 202, description = "Accepted: the trigger message waits for the agent.", body = PostActivationResponse),
        (status = 200, description = "A request with this `client_request_id` was posted before; nothing new was \
                                      stored.", body = PostActivationResponse),
        BodyErrors,
        CommonErrors
    )
)]
pub(crate) async fn post_activation(
    State(state): State<AppState>,
    ApiJson(params): ApiJson<PostActivationParams>,
) -> Result<(StatusCode, Json<PostActivationResponse>), AppError> {
    if let Some(model) = &params.model
        && !state.models.iter().any(|name| name == model)
    {
        let known = if state.models.is_empty() {
            "none are configured".to_owned()
        } else {
            format!(
                "configured: {}",
                state.models.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ")
            )
        };
        return Err(AppError::invalid_field(format!(
            "`model`: no model `{}` is configured ({known}); name a [models.NAME] entry or leave it out",
            crate::error::shorten(model, 100)
        )));
    }
    if !state.chatbots.is_empty() && !state.chatbots.contains(&params.chatbot_id) {
        let known = state.chatbots.iter().map(|id| format!("`{id}`")).collect::<Vec<_>>().join(", ");
        return Err(AppError::invalid_field(format!(
            "`chatbot_id`: no chatbot `{}` runs in this service (running: {known}); nothing would deliver the answer",
            crate::error::shorten(&params.chatbot_id, 100)
        )));
    }
    let request = ActivationRequest {
        trigger: Some(TriggerContext {
            name: params.name.unwrap_or_else(|| DEFAULT_TRIGGER_NAME.to_owned()),
            source: API_TRIGGER_SOURCE.to_owned(),
            schedule: None,
            fired_at: Utc::now(),
        }),
        output_schema: params.output_schema,
        timezone: params.timezone,
        triggered_by: Some(API_TRIGGER_SOURCE.to_owned()),
        delegation_user: params.delegation_user,
        ..ActivationRequest::new(ActivationKind::DirectTrigger)
    };
    let mut inbound = Inbound::text(&params.chatbot_id, &params.channel_id, SENDER_TRIGGER, params.task);
    // Its own key space, so a request id never collides with a message id of the same chatbot.
    inbound.platform_key = params.client_request_id.map(|id| format!("activation-{id}"));
    inbound.metadata = Metadata { activation: Some(Box::new(request)), model: params.model, ..Metadata::default() };
    let staging = Staging::new(&state.workspace);
    let (code, message) = match ingest(&state.gateway, &staging, inbound).await? {
        Ingested::Posted(message) => {
            tracing::debug!(message = %message.id, session = %message.session_id, "direct trigger posted");
            (StatusCode::ACCEPTED, *message)
        }
        Ingested::Duplicate(id) => {
            let first = state.gateway.store().get_message(&id).await?.ok_or_else(|| {
                AppError::internal(format!("direct trigger {id} was posted before but cannot be read"))
            })?;
            tracing::debug!(message = %id, "direct trigger posted before; nothing stored");
            (StatusCode::OK, first)
        }
    };
    Ok((
        code,
        Json(PostActivationResponse { message_id: message.id, session_id: message.session_id, status: message.status }),
    ))
}

/// Ledger rows, newest first: who triggered what, lane, kind, timings, outcome, usage.
#[utoipa::path(
    get,
    path = "/v1/activations",
    tag = "activations",
    params(ActivationsQuery),
    responses((status = 200, description = "Ledger rows, newest first.", body = ActivationListResponse), QueryErrors, CommonErrors)
)]
pub(crate) async fn list_activations(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ActivationsQuery>,
) -> Result<Json<ActivationListResponse>, AppError> {
    let filter = LedgerFilter {
        session_id: query.session_id.map(SessionId::from),
        only_unsuccessful: query.failed.unwrap_or(false),
        kind: query.kind,
        lane: query.lane,
        limit: Some(query.limit.unwrap_or(DEFAULT_LIMIT)),
    };
    let activations = state.ledger.list_activations(&filter).await?;
    Ok(Json(ActivationListResponse { activations }))
}

/// What runs now: running turns, queue depth per lane, the limits of each lane.
#[utoipa::path(
    get,
    path = "/v1/runtime",
    tag = "activations",
    responses((status = 200, description = "The runtime snapshot.", body = RuntimeResponse), CommonErrors)
)]
pub(crate) async fn runtime(State(state): State<AppState>) -> Result<Json<RuntimeResponse>, AppError> {
    let rev = state.gateway.store().current_rev().await?;
    Ok(Json(RuntimeResponse { state: state.control.runtime_state().await, rev }))
}
