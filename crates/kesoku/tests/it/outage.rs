//! `kesoku start` on PostgreSQL and Redis riding out an outage of each: the real binary, a mock
//! model, and the real server behind a TCP proxy the test cuts and restores. While cut the
//! process stays up (`/healthz`) and says it is not ready naming the dependency (`/readyz`).
//! Redis cut: messages posted through the API are still taken, and answered once Redis is back.
//! PostgreSQL cut: a post is refused with a 5xx (nothing can be stored); once it is back the
//! process is ready again and answers. Needs `KESOKU_TEST_REDIS_URL` (and
//! `KESOKU_TEST_POSTGRES_URL`); skipped, saying so, when unset; failed when
//! `KESOKU_REQUIRE_SERVERS=1`.

use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockReply, MockServer, Vendor};
use kesoku_test_support::proxy::CuttableProxy;
use serde_json::{Value, json};

use crate::support::{Service, Workspace, eventually, mock_model, stderr};

/// How long the answer to the message taken during the outage may take once Redis is back.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);

/// Post a message through the API; its session's id.
async fn post(client: &reqwest::Client, base: &str, channel: &str, content: &str) -> String {
    let response = client
        .post(format!("{base}/v1/messages"))
        .json(&json!({"channel_id": channel, "sender": "tester", "content": content}))
        .send()
        .await
        .expect("the api answers");
    assert_eq!(response.status(), 202, "the message is taken");
    let posted: Value = response.json().await.expect("json");
    posted["session_id"].as_str().expect("a session id").to_owned()
}

/// Whether the session holds a delivered answer.
async fn answered(client: &reqwest::Client, base: &str, session: &str) -> bool {
    let Ok(response) = client.get(format!("{base}/v1/sessions/{session}/messages")).send().await else { return false };
    let Ok(body) = response.json::<Value>().await else { return false };
    body["messages"]
        .as_array()
        .is_some_and(|messages| messages.iter().any(|m| m["role"] == "assistant" && m["status"] == "delivered"))
}

/// `/readyz`'s status and error message.
async fn readiness(client: &reqwest::Client, base: &str) -> (u16, String) {
    let Ok(response) = client.get(format!("{base}/readyz")).send().await else { return (0, String::new()) };
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    (status, body["error"]["message"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_on_redis_rides_out_a_redis_outage_and_answers_what_came_in_meanwhile() {
    let Some(url) = kesoku_test_support::db::redis_url() else { return };
    let proxy =
        CuttableProxy::start(kesoku_test_support::proxy::host_port(&url)).await.expect("a local port for the proxy");
    let model = MockServer::start(Vendor::OpenAi, vec![MockReply::text("before"), MockReply::text("after")]).await;
    let prefix = format!("kesoku_test_{}", kesoku_core::SessionId::generate());
    let config = format!(
        "{}\n[service]\nshutdown_grace_s = 1\n\n[http]\nlisten = \"127.0.0.1:0\"\n\n[broker]\nurl = \"{}\"\n\
         prefix = \"{prefix}\"\noperation_timeout_ms = 500\n",
        mock_model(&model.base_url()),
        proxy.url_through(&url),
    );
    let workspace = Workspace::with_config(&config);
    let init = workspace.run(&["init"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let service = Service::spawn(&workspace, "outage.log", &[KEY]);
    let base = service.api_base().await;
    let client = reqwest::Client::new();

    let first = post(&client, &base, "c1", "before the outage").await;
    eventually("the first answer", || answered(&client, &base, &first)).await;
    assert_eq!(readiness(&client, &base).await.0, 200);

    proxy.cut();
    eventually("/readyz to name the broker", || async {
        let (status, message) = readiness(&client, &base).await;
        status == 503 && message.contains("broker") && !message.contains("store")
    })
    .await;
    let health = client.get(format!("{base}/healthz")).send().await.expect("the process is alive");
    assert_eq!(health.status(), 200);
    let second = post(&client, &base, "c2", "during the outage").await;

    proxy.restore();
    eventually("/readyz to be ready again", || async { readiness(&client, &base).await.0 == 200 }).await;
    let deadline = std::time::Instant::now() + ANSWER_WAIT;
    while !answered(&client, &base, &second).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the message taken during the outage was not answered; the service's log:\n{}",
            service.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (status, service) = service.terminate().await;
    assert!(status.success(), "{}", service.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_on_postgres_rides_out_a_postgres_outage_and_answers_again_after_it() {
    let Some(db) = kesoku_test_support::db::pg_schema().await else { return };
    let Some(redis) = kesoku_test_support::db::redis_url() else { return };
    let proxy = CuttableProxy::start(kesoku_test_support::proxy::host_port(db.url()))
        .await
        .expect("a local port for the proxy");
    let model = MockServer::start(Vendor::OpenAi, vec![MockReply::text("before"), MockReply::text("after")]).await;
    let prefix = format!("kesoku_test_{}", kesoku_core::SessionId::generate());
    let config = format!(
        "[workspace]\ndir = \".kesoku\"\ndatabase = \"{}\"\n\n[database]\nacquire_timeout_ms = 500\n\n{}\n\
         [service]\nshutdown_grace_s = 1\n\n[http]\nlisten = \"127.0.0.1:0\"\n\n[broker]\nurl = \"{redis}\"\n\
         prefix = \"{prefix}\"\n",
        proxy.url_through(db.url()),
        mock_model(&model.base_url()),
    );
    let workspace = Workspace::with_config(&config);
    let init = workspace.run(&["init", "--no-model"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let service = Service::spawn(&workspace, "outage.log", &[KEY]);
    let base = service.api_base().await;
    let client = reqwest::Client::new();

    let first = post(&client, &base, "c1", "before the outage").await;
    eventually("the first answer", || answered(&client, &base, &first)).await;

    proxy.cut();
    eventually("/readyz to name the store", || async {
        let (status, message) = readiness(&client, &base).await;
        status == 503 && message.contains("store") && !message.contains("broker")
    })
    .await;
    let health = client.get(format!("{base}/healthz")).send().await.expect("the process is alive");
    assert_eq!(health.status(), 200);
    let refused = client
        .post(format!("{base}/v1/messages"))
        .json(&json!({"channel_id": "c2", "sender": "tester", "content": "during the outage"}))
        .send()
        .await
        .expect("the api answers while the store is down");
    assert!(refused.status().is_server_error(), "a post that cannot be stored is refused: {}", refused.status());

    proxy.restore();
    eventually("/readyz to be ready again", || async { readiness(&client, &base).await.0 == 200 }).await;
    let second = post(&client, &base, "c2", "after the outage").await;
    let deadline = std::time::Instant::now() + ANSWER_WAIT;
    while !answered(&client, &base, &second).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the message posted after the outage was not answered; the service's log:\n{}",
            service.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (status, service) = service.terminate().await;
    assert!(status.success(), "{}", service.log());
    db.cleanup().await;
}
