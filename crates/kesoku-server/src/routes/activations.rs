//! The execution ledger (`GET /v1/activations`) and the runtime snapshot (`GET /v1/runtime`).

use axum::Json;
use axum::extract::State;
use kesoku_core::SessionId;
use kesoku_store::LedgerFilter;

use crate::error::AppError;
use crate::extract::ApiQuery;
use crate::openapi::{CommonErrors, QueryErrors};
use crate::server::AppState;
use crate::views::{ActivationListResponse, ActivationsQuery, DEFAULT_LIMIT, RuntimeResponse};

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
    Ok(Json(RuntimeResponse { state: state.control.runtime_state(), rev }))
}
