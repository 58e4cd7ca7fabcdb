//! Operations: liveness (`/healthz`), readiness (`/readyz`) and Prometheus metrics (`/metrics`).
//!
//! `/metrics` renders the process's Prometheus recorder (where the agent counts turns by outcome,
//! model latency and tokens, tool calls) and adds gauges read at scrape time: lane depths,
//! running turns, and messages in the open statuses.

use std::fmt::Write as _;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use kesoku_core::{Lane, MessageFilter, Status};

use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::openapi::CommonErrors;
use crate::server::AppState;
use crate::views::HealthResponse;

/// The process serves requests.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    security(()),
    responses((status = 200, description = "Always, while the process serves.", body = HealthResponse))
)]
pub(crate) async fn healthz() -> Json<HealthResponse> {
    Json(HealthResponse { status: "ok".to_owned() })
}

/// The store answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "The store answers.", body = HealthResponse),
        (status = 503, description = "The store does not answer.", body = ErrorBody)
    )
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> Result<Json<HealthResponse>, AppError> {
    match state.gateway.store().current_rev().await {
        Ok(_) => Ok(Json(HealthResponse { status: "ready".to_owned() })),
        Err(error) => {
            tracing::warn!(%error, "readiness check: the store does not answer");
            Err(AppError::new(ErrorCode::NotReady, "the store does not answer"))
        }
    }
}

/// Prometheus metrics, text exposition format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4.", content_type = "text/plain", body = String),
        CommonErrors
    )
)]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let mut text = state.metrics.as_ref().map(|handle| handle.render()).unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let runtime = state.control.runtime_state();
    let _ = writeln!(text, "# HELP kesoku_lane_depth Activations waiting in each queue lane.");
    let _ = writeln!(text, "# TYPE kesoku_lane_depth gauge");
    for lane in Lane::ALL {
        let _ = writeln!(text, "kesoku_lane_depth{{lane=\"{lane}\"}} {}", runtime.queue.depth(*lane));
    }
    let _ = writeln!(text, "# HELP kesoku_turns_running Turns running now in this process.");
    let _ = writeln!(text, "# TYPE kesoku_turns_running gauge");
    let _ = writeln!(text, "kesoku_turns_running {}", runtime.running.len());

    let open = [Status::PendingAgent, Status::Processing, Status::Pending];
    match state.gateway.store().list_messages(&MessageFilter::default().with_statuses(&open)).await {
        Ok(messages) => {
            let _ = writeln!(text, "# HELP kesoku_messages_open Messages in a status that still expects work.");
            let _ = writeln!(text, "# TYPE kesoku_messages_open gauge");
            for status in open {
                let count = messages.iter().filter(|m| m.status == status).count();
                let _ = writeln!(text, "kesoku_messages_open{{status=\"{status}\"}} {count}");
            }
        }
        Err(error) => tracing::warn!(%error, "metrics: counting open messages failed"),
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}
