//! Brief outages of the real servers behind a running HTTP app: Redis or PostgreSQL cut off by
//! a TCP proxy and restored. `/healthz` stays up, `/readyz` names what is down and recovers,
//! and a message posted through the API while Redis is cut is stored (nothing is lost).
//! Run against `KESOKU_TEST_REDIS_URL` / `KESOKU_TEST_POSTGRES_URL`; skipped, saying so, when
//! unset (failed when `KESOKU_REQUIRE_SERVERS=1`).

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use kesoku_broker::{Broker, BrokerEvent, Interest, MemoryBroker, Received, RedisBroker, RedisOptions};
use kesoku_core::{MessageId, Status};
use kesoku_gateway::Gateway;
use kesoku_server::{AgentControl, ServerState};
use kesoku_store::{PgPoolSettings, PgStore, Store};
use kesoku_test_support::proxy::CuttableProxy;
use serde_json::json;

use crate::harness::{FakeControl, Reply, assert_error, get, post_json, send};

/// How long a change of state may take to show before a test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// Ask `/readyz` until `done` holds for the reply.
async fn wait_for_readiness(app: &axum::Router, what: &str, done: impl Fn(&Reply) -> bool) -> Reply {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let reply = send(app, get("/readyz")).await;
        if done(&reply) {
            return reply;
        }
        assert!(tokio::time::Instant::now() < deadline, "gave up waiting for {what}; last /readyz: {reply:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn app_over(store: Arc<dyn Store>, ledger: Arc<dyn kesoku_store::Ledger>, broker: Arc<dyn Broker>) -> axum::Router {
    let dir = std::env::temp_dir();
    let control: Arc<dyn AgentControl> = Arc::new(FakeControl::default());
    kesoku_server::app(ServerState::new(Gateway::new(store, broker), ledger, control, dir))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cut_under_a_running_app_keeps_it_alive_and_storing_and_readyz_names_the_broker() {
    let Some(url) = kesoku_test_support::db::redis_url() else { return };
    let proxy =
        CuttableProxy::start(kesoku_test_support::proxy::host_port(&url)).await.expect("a local port for the proxy");
    let mut options = RedisOptions::new(proxy.url_through(&url));
    options.prefix = format!("kesoku_test_{}", kesoku_core::SessionId::generate());
    options.operation_timeout = Duration::from_millis(500);
    let broker = Arc::new(RedisBroker::connect(&options).await.expect("redis through the proxy"));
    let (_dir, sqlite) = kesoku_test_support::db::temp_sqlite_url();
    let handle = kesoku_store::open(&sqlite).await.expect("open a sqlite store");
    let app = app_over(Arc::clone(&handle.store), handle.ledger, broker.clone());
    // This process's own listeners (its intake) hear what it posts, Redis or not.
    let mut heard = broker.subscribe(Interest::Everything).await.expect("subscribe");

    let ready = send(&app, get("/readyz")).await;
    assert_eq!((ready.status, ready.json["status"].as_str()), (StatusCode::OK, Some("ready")), "{ready:?}");

    proxy.cut();
    let down = wait_for_readiness(&app, "/readyz to see Redis down", |r| r.status != StatusCode::OK).await;
    assert_error(&down, StatusCode::SERVICE_UNAVAILABLE, "not_ready");
    assert!(down.message().contains("broker") && !down.message().contains("store"), "{}", down.message());
    assert_eq!(send(&app, get("/healthz")).await.status, StatusCode::OK, "liveness does not depend on redis");

    let body = json!({"channel_id": "web", "sender": "Chii", "content": "posted while redis is cut"});
    let posted = send(&app, post_json("/v1/messages", &body)).await;
    assert_eq!(posted.status, StatusCode::ACCEPTED, "{posted:?}");
    let id = MessageId::from(posted.json["id"].as_str().expect("an id"));
    let stored = handle.store.get_message(&id).await.expect("read").expect("stored while redis is cut");
    assert_eq!(stored.status, Status::PendingAgent);
    let notice = tokio::time::timeout(PATIENCE, async {
        loop {
            match heard.recv().await {
                Received::Event(BrokerEvent::Message(notice)) if notice.message.id == id => return notice,
                Received::Closed => panic!("the broker closed"),
                Received::Event(_) | Received::Lagged { .. } => {}
            }
        }
    })
    .await
    .expect("the process's own subscribers hear the message while redis is cut");
    assert_eq!(notice.message.content, stored.content);

    proxy.restore();
    let ready = wait_for_readiness(&app, "/readyz to see Redis back", |r| r.status == StatusCode::OK).await;
    assert_eq!(ready.json["status"], "ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cut_under_a_running_app_makes_readyz_name_the_store_until_it_is_back() {
    let Some(db) = kesoku_test_support::db::pg_schema().await else { return };
    let options = db.connect_options();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = CuttableProxy::start(upstream).await.expect("a local port for the proxy");
    let through = options.host("127.0.0.1").port(proxy.addr().port());
    let pool = PgPoolSettings { acquire_timeout: Duration::from_millis(500), ..PgPoolSettings::default() };
    let store = Arc::new(PgStore::connect_with_pool(through, pool).await.expect("postgres through the proxy"));
    let app = app_over(store.clone(), store.clone(), Arc::new(MemoryBroker::default()));
    let body = json!({"channel_id": "web", "sender": "Chii", "content": "hello"});
    assert_eq!(send(&app, post_json("/v1/messages", &body)).await.status, StatusCode::ACCEPTED);

    proxy.cut();
    let down = wait_for_readiness(&app, "/readyz to see PostgreSQL down", |r| r.status != StatusCode::OK).await;
    assert_error(&down, StatusCode::SERVICE_UNAVAILABLE, "not_ready");
    assert!(down.message().contains("store") && !down.message().contains("broker"), "{}", down.message());
    assert_eq!(send(&app, get("/healthz")).await.status, StatusCode::OK, "liveness does not depend on postgresql");
    // A write while the store is unreachable fails with a retryable answer, not a hang.
    let refused = send(&app, post_json("/v1/messages", &body)).await;
    assert!(refused.status.is_server_error(), "{refused:?}");

    proxy.restore();
    wait_for_readiness(&app, "/readyz to see PostgreSQL back", |r| r.status == StatusCode::OK).await;
    let again = send(&app, post_json("/v1/messages", &body)).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "the pool replaced its dead connections: {again:?}");
    let id = MessageId::from(again.json["id"].as_str().expect("an id"));
    assert!(store.get_message(&id).await.expect("read").is_some());
    store.close().await;
    db.cleanup().await;
}
