//! Work no person typed, through the real `kesoku start`: a direct trigger over the HTTP API
//! runs as a `direct_trigger` activation on the responsive lane and its answer is delivered.

use kesoku_core::{ActivationKind, Lane, Outcome};
use kesoku_store::LedgerFilter;
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockReply, MockServer, Vendor};

use crate::support::{Service, Workspace, eventually, mock_model, stderr};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_trigger_runs_and_its_answer_is_delivered() {
    let server = MockServer::start(Vendor::OpenAi, vec![MockReply::text("{\"deploy\": \"42\", \"ok\": true}")]).await;
    let config = format!(
        "{}\n[service]\nshutdown_grace_s = 1\n\n[http]\nlisten = \"127.0.0.1:0\"\n",
        mock_model(&server.base_url()).replacen("[agent]\n", "[agent]\ntimezone = \"Asia/Tokyo\"\n", 1)
    );
    let workspace = Workspace::with_config(&config);
    let init = workspace.run(&["init"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let service = Service::spawn(&workspace, "trigger.log", &[KEY]);
    let base = service.api_base().await;
    let client = reqwest::Client::new();
    let body = serde_json::json!({
        "task": "Deploy 42 finished: report it as JSON.",
        "chatbot_id": "api",
        "channel_id": "deploys",
        "name": "ci",
        "output_schema": {"type": "object", "required": ["deploy", "ok"]},
    });
    let response = client.post(format!("{base}/v1/activations")).json(&body).send().await.expect("post");
    assert_eq!(response.status(), 202);
    let posted: serde_json::Value = response.json().await.expect("json");
    let session = posted["session_id"].as_str().expect("session id").to_owned();
    let message_id = posted["message_id"].as_str().expect("message id").to_owned();
    let messages_url = format!("{base}/v1/sessions/{session}/messages");
    eventually("the answer delivered through the api chatbot", || async {
        let Ok(response) = client.get(&messages_url).send().await else { return false };
        let Ok(body) = response.json::<serde_json::Value>().await else { return false };
        body["messages"].as_array().is_some_and(|messages| {
            messages.iter().any(|m| m["content"] == "{\"deploy\": \"42\", \"ok\": true}" && m["status"] == "delivered")
        })
    })
    .await;
    let (status, _) = service.terminate().await;
    assert!(status.success());

    let url = format!("sqlite://{}", workspace.path().join(".kesoku/kesoku.db").display());
    let store = kesoku_store::open_existing(&url).await.expect("open the store");
    let rows = store.ledger.list_activations(&LedgerFilter::default()).await.expect("ledger");
    let row =
        rows.iter().find(|r| r.message_id.as_ref().map(|m| m.as_str()) == Some(message_id.as_str())).expect("a row");
    assert_eq!(
        (row.kind, row.lane, row.outcome),
        (ActivationKind::DirectTrigger, Lane::Responsive, Some(Outcome::Succeeded))
    );
    assert_eq!((row.triggered_by.as_str(), row.depth), ("api", 0));
    let requests = server.requests();
    let sent = requests[0].body.to_string();
    assert!(sent.contains("[Trigger context]") && sent.contains("workflow: ci (source: api)"), "{sent}");
    assert!(sent.contains("Asia/Tokyo (UTC+09:00)"), "{sent}");
}
