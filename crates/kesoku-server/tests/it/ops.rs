//! Health, readiness, metrics, the ledger and the runtime snapshot.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use http::StatusCode;
use kesoku_broker::MemoryBroker;
use kesoku_broker::lease::{LeaseHolder, MemoryLeases, SessionLeases};
use kesoku_core::{
    Activation, ActivationId, ActivationPayload, ExpectedResponse, Lane, LedgerEntry, Outcome, SessionId, Usage,
};
use kesoku_gateway::Gateway;
use kesoku_server::{AgentControl, ServerState};
use kesoku_store::{Ledger, SqliteStore, Store};
use metrics_exporter_prometheus::PrometheusBuilder;

use crate::harness::{FakeControl, TestServer, assert_error, get, send};

#[tokio::test]
async fn health_is_always_ok_and_readiness_follows_the_store() {
    let (dir, path) = kesoku_test_support::db::temp_sqlite_path();
    let backend = Arc::new(SqliteStore::open(&path).await.expect("open"));
    let store: Arc<dyn Store> = backend.clone();
    let ledger: Arc<dyn Ledger> = backend.clone();
    let control: Arc<dyn AgentControl> = Arc::new(FakeControl::default());
    let gateway = Gateway::new(store, Arc::new(MemoryBroker::default()));
    let app = kesoku_server::app(ServerState::new(gateway, ledger, control, dir.path().to_path_buf()));

    let health = send(&app, get("/healthz")).await;
    assert_eq!((health.status, health.json["status"].as_str()), (StatusCode::OK, Some("ok")));
    let ready = send(&app, get("/readyz")).await;
    assert_eq!((ready.status, ready.json["status"].as_str()), (StatusCode::OK, Some("ready")));

    backend.close().await;
    let not_ready = send(&app, get("/readyz")).await;
    assert_error(&not_ready, StatusCode::SERVICE_UNAVAILABLE, "not_ready");
    assert!(not_ready.message().contains("store") && !not_ready.message().contains("broker"), "{not_ready:?}");
    assert_eq!(send(&app, get("/healthz")).await.status, StatusCode::OK, "liveness does not depend on the store");
}

fn activation(session: &SessionId, lane: Lane, created_at: chrono::DateTime<Utc>) -> Activation {
    Activation {
        id: ActivationId::generate(),
        session_id: session.clone(),
        chatbot_id: "api".into(),
        channel_id: "web".into(),
        triggered_by: "Chii".into(),
        delegation_user: None,
        depth: 0,
        agent: None,
        orchestration: None,
        lane,
        expected_response: ExpectedResponse::default(),
        locale: None,
        timezone: None,
        model: None,
        output_schema: None,
        created_at,
        payload: ActivationPayload::Maintenance { task: kesoku_core::activation::MaintenanceTask::Title },
    }
}

#[tokio::test]
async fn activations_are_listed_newest_first_and_filtered() {
    let server = TestServer::new().await;
    let a = SessionId::from("sess_a");
    let b = SessionId::from("sess_b");
    let mut ids = Vec::new();
    let base = Utc::now() - chrono::Duration::minutes(10);
    let rows = [
        (&a, Lane::Responsive, Outcome::Succeeded),
        (&a, Lane::Responsive, Outcome::Failed),
        (&b, Lane::Background, Outcome::Interrupted),
    ];
    for (minute, (session, lane, outcome)) in (0..).zip(rows) {
        let act = activation(session, lane, base + chrono::Duration::minutes(minute));
        server.ledger.record_enqueued(&LedgerEntry::enqueued(&act)).await.expect("enqueued");
        server.ledger.record_started(&act.id, Utc::now()).await.expect("started");
        let usage = Usage { model_calls: 3, tool_calls: 2, input_tokens: 100, output_tokens: 20 };
        let error = (outcome == Outcome::Failed).then_some("model unreachable");
        server.ledger.record_finished(&act.id, Utc::now(), outcome, error, &usage).await.expect("finished");
        ids.push(act.id);
    }
    let app = server.app();

    let all = send(&app, get("/v1/activations")).await;
    assert_eq!(all.status, StatusCode::OK);
    let rows = all.json["activations"].as_array().expect("rows");
    let got: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap_or("")).collect();
    assert_eq!(got, [ids[2].as_str(), ids[1].as_str(), ids[0].as_str()], "newest first");
    assert_eq!(rows[1]["error"], "model unreachable");
    assert_eq!(rows[1]["usage"]["model_calls"], 3);
    assert_eq!(rows[0]["lane"], "background");
    assert_eq!(rows[0]["kind"], "maintenance");

    let failed = send(&app, get("/v1/activations?failed=true")).await;
    let outcomes: Vec<&str> = failed.json["activations"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(outcomes, ["interrupted", "failed"]);

    let of_a = send(&app, get("/v1/activations?session_id=sess_a&limit=1")).await;
    let rows = of_a.json["activations"].as_array().expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["id"], ids[1].as_str());

    let listed = |reply: &crate::harness::Reply| -> Vec<String> {
        let rows = reply.json["activations"].as_array().cloned().unwrap_or_default();
        rows.iter().map(|r| r["id"].as_str().unwrap_or("").to_owned()).collect()
    };
    let background = send(&app, get("/v1/activations?lane=background")).await;
    assert_eq!(listed(&background), [ids[2].as_str()]);
    let responsive = send(&app, get("/v1/activations?kind=maintenance&lane=responsive")).await;
    assert_eq!(listed(&responsive), [ids[1].as_str(), ids[0].as_str()]);
    let messages = send(&app, get("/v1/activations?kind=message")).await;
    assert_eq!((messages.status, listed(&messages).len()), (StatusCode::OK, 0));

    for bad in [
        "/v1/activations?lane=fast",
        "/v1/activations?kind=chat",
        "/v1/activations?failed=yes",
        "/v1/activations?limit=0",
        "/v1/activations?limit=-1",
        "/v1/activations?session_id=",
    ] {
        assert_error(&send(&app, get(bad)).await, StatusCode::BAD_REQUEST, "bad_query");
    }
}

#[tokio::test]
async fn runtime_reports_the_agents_state_and_the_revision() {
    let server = TestServer::new().await;
    let reply = send(&server.app(), get("/v1/runtime")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json["queue"]["interactive"], 2);
    assert_eq!(reply.json["limits"]["background"]["tool_calls"], 0);
    assert_eq!(reply.json["running"], serde_json::json!([]));
    assert!(reply.json["rev"].is_i64());
}

#[tokio::test]
async fn metrics_render_the_recorder_and_scrape_time_gauges() {
    let server = TestServer::new().await;
    let session = server.session("api", "web").await;
    server.post(&crate::harness::user(&session, "waiting")).await;
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("kesoku_turns_total", "outcome" => "succeeded").increment(3);
    });
    let leases = Arc::new(MemoryLeases::new());
    let holder = LeaseHolder::generate();
    for session in [SessionId::generate(), SessionId::generate()] {
        let lease = leases.acquire(&session, &holder, Duration::from_secs(60)).await.expect("acquire answers");
        assert!(lease.is_some(), "a free session's lease is granted");
    }
    let app = kesoku_server::app(server.state().with_metrics(handle).with_leases(leases));
    let reply = send(&app, get("/metrics")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.content_type().starts_with("text/plain; version=0.0.4"), "{}", reply.content_type());
    for line in [
        "kesoku_turns_total{outcome=\"succeeded\"} 3",
        "kesoku_lane_depth{lane=\"interactive\",scope=\"cluster\"} 2",
        "kesoku_lane_depth{lane=\"responsive\",scope=\"cluster\"} 1",
        "kesoku_lane_depth{lane=\"background\",scope=\"cluster\"} 0",
        "kesoku_turns_running{scope=\"process\"} 0",
        "kesoku_messages_open{status=\"pending_agent\",scope=\"cluster\"} 1",
        "kesoku_session_leases_held{scope=\"cluster\"} 2",
        "# TYPE kesoku_lane_depth gauge",
    ] {
        assert!(reply.text.lines().any(|l| l == line), "missing `{line}` in:\n{}", reply.text);
    }
    // Without a recorder the gauges are still there; without leases, no lease gauge.
    let bare = send(&server.app(), get("/metrics")).await;
    assert!(bare.text.contains("kesoku_lane_depth{lane=\"interactive\",scope=\"cluster\"} 2"));
    assert!(!bare.text.contains("kesoku_session_leases_held"), "{}", bare.text);
}

/// While the queue cannot be read (its Redis is down) the lane depths are left out, not
/// reported as an empty queue; the rest of the scrape still answers.
#[tokio::test]
async fn metrics_leave_out_lane_depths_the_queue_could_not_report() {
    let server = TestServer::new().await;
    server.control.state.lock().expect("lock").queue_unreadable = true;
    let reply = send(&server.app(), get("/metrics")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(!reply.text.contains("kesoku_lane_depth"), "{}", reply.text);
    assert!(reply.text.lines().any(|l| l == "kesoku_turns_running{scope=\"process\"} 0"), "{}", reply.text);
}

/// The memory gauges render the report the binary's wiring gathers, under their names; a
/// figure the binary could not measure is left out, and without a report there are none.
#[tokio::test]
async fn metrics_report_the_memory_of_the_process_and_its_pools() {
    let server = TestServer::new().await;
    let report = kesoku_core::MemoryReport {
        resident_bytes: Some(41_000_000),
        resident_anon_bytes: Some(23_000_000),
        heap_live_bytes: Some(123_456_789),
        sqlite_bytes: 3_100_000,
        sqlite_highwater_bytes: 4_200_000,
        history_cache_bytes: 9_000_000,
        history_cache_sessions: 2,
        listener_dedup_ids: 6_000,
        listener_dedup_table_bytes: 229_376,
    };
    let app = kesoku_server::app(server.state().with_memory(move || report));
    let reply = send(&app, get("/metrics")).await;
    let value = |name: &str| -> Option<u64> {
        reply.text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    };
    for (name, expected) in [
        ("process_resident_memory_bytes", 41_000_000),
        ("kesoku_resident_anon_bytes", 23_000_000),
        ("kesoku_heap_live_bytes", 123_456_789),
        ("kesoku_sqlite_memory_bytes", 3_100_000),
        ("kesoku_sqlite_memory_highwater_bytes", 4_200_000),
        ("kesoku_history_cache_bytes", 9_000_000),
        ("kesoku_history_cache_sessions", 2),
        ("kesoku_listener_dedup_ids", 6_000),
        ("kesoku_listener_dedup_table_bytes", 229_376),
    ] {
        assert_eq!(value(name), Some(expected), "{name} in:\n{}", reply.text);
        assert!(reply.text.contains(&format!("# TYPE {name} gauge")), "{name} in:\n{}", reply.text);
    }
    // A binary that cannot tell its heap (or a system that cannot tell the resident set)
    // leaves those gauges out.
    let unmeasured = kesoku_core::MemoryReport { resident_bytes: None, heap_live_bytes: None, ..report };
    let partial = send(&kesoku_server::app(server.state().with_memory(move || unmeasured)), get("/metrics")).await;
    assert!(!partial.text.contains("kesoku_heap_live_bytes"), "{}", partial.text);
    assert!(!partial.text.contains("process_resident_memory_bytes"), "{}", partial.text);
    assert!(partial.text.contains("kesoku_sqlite_memory_bytes 3100000"), "{}", partial.text);
    let bare = send(&server.app(), get("/metrics")).await;
    assert!(!bare.text.contains("kesoku_sqlite_memory_bytes"), "{}", bare.text);
}
