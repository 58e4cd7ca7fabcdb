//! Operations: liveness (`/healthz`), readiness (`/readyz`) and Prometheus metrics (`/metrics`).
//!
//! `/metrics` renders the process's Prometheus recorder (where the agent counts turns by outcome,
//! model latency and tokens, tool calls) and adds gauges read at scrape time: lane depths,
//! running turns, messages in the open statuses, and the memory report the binary's wiring
//! gathers ([`kesoku_core::MemoryReport`]: the resident set, live heap, SQLite's allocations, the
//! history cache, the listeners' duplicate filters). The memory parts let an operator tell a
//! bounded pool filling up from a leak. This module measures no memory itself.

use std::fmt::Write as _;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use kesoku_core::{Lane, MemoryGauge, MemoryReport, MessageFilter, Status};

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
    let runtime = state.control.runtime_state().await;
    let _ = writeln!(text, "# HELP kesoku_lane_depth Activations waiting in each queue lane.");
    let _ = writeln!(text, "# TYPE kesoku_lane_depth gauge");
    for lane in Lane::ALL {
        let _ = writeln!(text, "kesoku_lane_depth{{lane=\"{lane}\"}} {}", runtime.queue.depth(*lane));
    }
    gauge(&mut text, "kesoku_turns_running", "Turns running now in this process.", runtime.running.len() as u64);

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
    if let Some(probe) = &state.memory {
        write_memory(&mut text, &probe());
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// One gauge with its help and type lines.
fn gauge(text: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(text, "# HELP {name} {help}");
    let _ = writeln!(text, "# TYPE {name} gauge");
    let _ = writeln!(text, "{name} {value}");
}

/// Every measured figure of `report` as a gauge.
fn write_memory(text: &mut String, report: &MemoryReport) {
    for figure in MemoryGauge::ALL {
        if let Some(value) = report.get(figure) {
            gauge(text, figure.name(), figure.help(), value);
        }
    }
}
