//! Operations: liveness (`/healthz`), readiness (`/readyz`) and Prometheus metrics (`/metrics`).
//!
//! `/healthz` answers while the process serves, whatever its dependencies do: a process rides
//! out a brief outage of PostgreSQL or Redis (retrying) rather than being restarted. `/readyz`
//! asks each dependency (the store, the broker) within [`PROBE_TIMEOUT`] and names those that
//! do not answer.
//!
//! `/metrics` renders the process's Prometheus recorder (where the agent counts turns by outcome,
//! model latency and tokens, tool calls) and adds gauges read at scrape time, each labelled with
//! its `scope`: `cluster` figures come from what every process shares (the store, the lane
//! queue, the session leases), so one scrape of any process shows them; `process` figures are
//! this process's own (its running turns, its memory report: the resident set, live heap,
//! SQLite's allocations, the history cache, the listeners' duplicate filters). The memory parts
//! let an operator tell a bounded pool filling up from a leak. This module measures no memory
//! itself.

use std::time::Duration;

use std::fmt::Write as _;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use kesoku_core::{Lane, MemoryGauge, MemoryReport, MessageFilter, Status};

use crate::control::LaneDepths;
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

/// How long a readiness check or a scrape waits for one dependency.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Every dependency answers: the store and the broker (Redis, when configured).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "The store and the broker answer.", body = HealthResponse),
        (status = 503, description = "A dependency does not answer; the message names which \
                                      (`store`, `broker`).", body = ErrorBody)
    )
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> Result<Json<HealthResponse>, AppError> {
    let (store, broker) = tokio::join!(
        within(PROBE_TIMEOUT, async { state.gateway.store().current_rev().await.map(drop).map_err(|e| e.to_string()) }),
        within(PROBE_TIMEOUT, async { state.gateway.broker().check_ready().await.map_err(|e| e.to_string()) }),
    );
    let mut down = Vec::new();
    for (name, result) in [("store", store), ("broker", broker)] {
        if let Err(error) = result {
            // The reason stays in the log: this route is open, and reasons name hosts.
            tracing::warn!(dependency = name, %error, "readiness check: a dependency does not answer");
            down.push(name);
        }
    }
    if down.is_empty() {
        Ok(Json(HealthResponse { status: "ready".to_owned() }))
    } else {
        Err(AppError::new(
            ErrorCode::NotReady,
            format!("not ready: {} not answering (the process keeps retrying)", down.join(" and ")),
        ))
    }
}

/// `check`, given up after `timeout`.
async fn within<T>(timeout: Duration, check: impl Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(timeout, check)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} ms", timeout.as_millis())))
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
    if !runtime.queue_unreadable {
        write_lane_depths(&mut text, &runtime.queue);
    }
    let running = runtime.running.len() as u64;
    scoped_gauge(&mut text, "kesoku_turns_running", "Turns running now in this process.", "process", running);

    let open = [Status::PendingAgent, Status::Processing, Status::Pending];
    let listed = within(PROBE_TIMEOUT, async {
        let filter = MessageFilter::default().with_statuses(&open);
        state.gateway.store().list_messages(&filter).await.map_err(|e| e.to_string())
    });
    match listed.await {
        Ok(messages) => {
            let _ = writeln!(
                text,
                "# HELP kesoku_messages_open Messages in a status that still expects work, in the store \
                 (all processes; `processing`: turns running in the cluster)."
            );
            let _ = writeln!(text, "# TYPE kesoku_messages_open gauge");
            for status in open {
                let count = messages.iter().filter(|m| m.status == status).count();
                let _ = writeln!(text, "kesoku_messages_open{{status=\"{status}\",scope=\"cluster\"}} {count}");
            }
        }
        Err(error) => tracing::warn!(%error, "metrics: counting open messages failed"),
    }
    if let Some(leases) = &state.leases {
        let held = within(PROBE_TIMEOUT, async { leases.held_count().await.map_err(|e| e.to_string()) });
        match held.await {
            Ok(held) => scoped_gauge(
                &mut text,
                "kesoku_session_leases_held",
                "Session leases held by workers (all processes sharing the leases).",
                "cluster",
                held,
            ),
            Err(error) => tracing::warn!(%error, "metrics: counting held session leases failed"),
        }
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

/// The lane depths, cluster-wide (the shared queue).
fn write_lane_depths(text: &mut String, queue: &LaneDepths) {
    let _ = writeln!(
        text,
        "# HELP kesoku_lane_depth Activations waiting in each queue lane: in the shared queue (all \
         processes), except what another process has read and holds waiting."
    );
    let _ = writeln!(text, "# TYPE kesoku_lane_depth gauge");
    for lane in Lane::ALL {
        let _ = writeln!(text, "kesoku_lane_depth{{lane=\"{lane}\",scope=\"cluster\"}} {}", queue.depth(*lane));
    }
}

/// One gauge labelled with its scope (`cluster` or `process`).
fn scoped_gauge(text: &mut String, name: &str, help: &str, scope: &str, value: u64) {
    let _ = writeln!(text, "# HELP {name} {help}");
    let _ = writeln!(text, "# TYPE {name} gauge");
    let _ = writeln!(text, "{name}{{scope=\"{scope}\"}} {value}");
}

/// Every measured figure of `report` as a gauge.
fn write_memory(text: &mut String, report: &MemoryReport) {
    for figure in MemoryGauge::ALL {
        if let Some(value) = report.get(figure) {
            gauge(text, figure.name(), figure.help(), value);
        }
    }
}
