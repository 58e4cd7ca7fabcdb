//! Grants and delegation through the real binary: `kesoku grants set alice github` (secret on
//! stdin), `kesoku start` with `[tools.http]` and the mock model scripted to call
//! `http_request` with `connection = "github"` against a local echo server. A direct trigger for
//! `alice` sends her token to the echo server, and the token appears nowhere else: not in any
//! request the model received, not in any stored message or ledger row, not in the service log,
//! not in any API response. The same call for `bob` (no grant) is a tool error saying what to do.

use std::process::Stdio;

use kesoku_core::{MessageFilter, MessageType};
use kesoku_store::LedgerFilter;
use kesoku_test_support::echo::EchoServer;
use kesoku_test_support::mock_llm::{
    Behaviour, MOCK_API_KEY, MockAnswer, MockOptions, MockPart, MockReply, MockRule, MockServer, Vendor,
};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::support::{Service, Workspace, eventually, mock_model, stderr, stdout};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);
const SECRET: &str = "ghp_e2e_Secret_Token_4242";
const TASK: &str = "Fetch my GitHub profile.";

/// `kesoku grants ARGS` with `stdin` piped in.
async fn grants_with_stdin(workspace: &Workspace, args: &[&str], stdin: &str) -> std::process::Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_kesoku"));
    command
        .arg("-c")
        .arg(&workspace.config)
        .arg("grants")
        .args(args)
        .current_dir(workspace.path())
        .env_remove("KESOKU_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("run kesoku grants");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).await.expect("write the secret");
    drop(input);
    child.wait_with_output().await.expect("wait for kesoku grants")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_set_listed_and_removed_without_ever_printing_the_secret() {
    let workspace = Workspace::with_config("");
    assert!(workspace.run(&["init"], &[]).await.status.success());
    let set = grants_with_stdin(&workspace, &["set", "alice", "github"], &format!("{SECRET}\n")).await;
    assert!(set.status.success(), "{}", stderr(&set));
    assert_eq!(stdout(&set), "stored connection `github` for `alice`\n");
    let from_env = workspace
        .run(&["grants", "set", "discord:1234", "drive", "--from-env", "DRIVE_TOKEN"], &[("DRIVE_TOKEN", "ya29.env")])
        .await;
    assert!(from_env.status.success(), "{}", stderr(&from_env));
    let again = grants_with_stdin(&workspace, &["set", "alice", "github"], "ghp_newer\n").await;
    assert_eq!(stdout(&again), "replaced connection `github` for `alice`\n");

    let list = workspace.run(&["grants", "list"], &[]).await;
    let listed = stdout(&list);
    assert!(listed.contains("alice  github  set ") && listed.contains("discord:1234  drive  set "), "{listed}");
    assert!(!listed.contains("ghp_") && !listed.contains("ya29"), "{listed}");
    let json = workspace.run(&["grants", "list", "alice", "--json"], &[]).await;
    let line: Value = serde_json::from_str(stdout(&json).trim()).expect("one JSON line");
    assert_eq!((line["user_id"].as_str(), line["name"].as_str()), (Some("alice"), Some("github")));
    assert!(line.get("secret").is_none(), "{line}");

    let bad = grants_with_stdin(&workspace, &["set", "alice", "Git Hub"], "x\n").await;
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("a-z, 0-9"), "{}", stderr(&bad));
    let empty = grants_with_stdin(&workspace, &["set", "alice", "gitlab"], "\n").await;
    assert!(!empty.status.success() && stderr(&empty).contains("empty"), "{}", stderr(&empty));
    let unset = workspace.run(&["grants", "set", "alice", "gitlab", "--from-env", "NOT_SET_ANYWHERE"], &[]).await;
    assert!(!unset.status.success() && stderr(&unset).contains("NOT_SET_ANYWHERE"), "{}", stderr(&unset));

    let removed = workspace.run(&["grants", "remove", "alice", "github"], &[]).await;
    assert!(removed.status.success(), "{}", stderr(&removed));
    let missing = workspace.run(&["grants", "remove", "alice", "github"], &[]).await;
    assert!(
        !missing.status.success() && stderr(&missing).contains("has no connection `github`"),
        "{}",
        stderr(&missing)
    );
    let list = workspace.run(&["grants", "list", "alice"], &[]).await;
    assert!(stdout(&list).contains("`alice` has no connections"), "{}", stdout(&list));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegated_token_reaches_the_tool_but_not_the_model_the_store_the_log_or_the_api() {
    let echo = EchoServer::start().await;
    let call = json!({"method": "GET", "url": format!("{}/user", echo.base_url()), "connection": "github"});
    let turn = vec![
        MockReply::Answer(MockAnswer::parts(vec![MockPart::tool_call("call_gh", "http_request", call)])),
        MockReply::text("Here is your profile."),
    ];
    let server = MockServer::start_with(
        Vendor::OpenAi,
        MockOptions { behaviour: Behaviour::Rules(vec![MockRule::new(TASK, turn)]), ..MockOptions::script(Vec::new()) },
    )
    .await;
    let config = format!(
        "{}\n[service]\nshutdown_grace_s = 1\n\n[http]\nlisten = \"127.0.0.1:0\"\n\n[tools.http]\nallowed_hosts = [\"127.0.0.1\"]\n\n[tools.http.connection_hosts]\ngithub = [\"127.0.0.1\"]\n",
        mock_model(&server.base_url())
    );
    let workspace = Workspace::with_config(&config);
    let init = workspace.run(&["init"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let set = grants_with_stdin(&workspace, &["set", "alice", "github"], &format!("{SECRET}\n")).await;
    assert!(set.status.success(), "{}", stderr(&set));

    // Debug logging on: the strongest place for a secret to leak into the log.
    let service = Service::spawn(&workspace, "grants.log", &[KEY, ("KESOKU_LOG", "debug")]);
    let base = service.api_base().await;
    let client = reqwest::Client::new();
    let mut responses: Vec<String> = Vec::new();
    let mut sessions = Vec::new();
    for (user, channel) in [("alice", "work-1"), ("bob", "work-2")] {
        let body = json!({"task": TASK, "chatbot_id": "api", "channel_id": channel, "delegation_user": user});
        let response = client.post(format!("{base}/v1/activations")).json(&body).send().await.expect("post");
        assert_eq!(response.status(), 202);
        let text = response.text().await.expect("body");
        let posted: Value = serde_json::from_str(&text).expect("json");
        responses.push(text);
        let session = posted["session_id"].as_str().expect("session id").to_owned();
        let url = format!("{base}/v1/sessions/{session}/messages");
        eventually(&format!("{user}'s answer delivered"), || async {
            let Ok(response) = client.get(&url).send().await else { return false };
            let Ok(body) = response.json::<Value>().await else { return false };
            body["messages"].as_array().is_some_and(|messages| {
                messages.iter().any(|m| m["content"] == "Here is your profile." && m["status"] == "delivered")
            })
        })
        .await;
        sessions.push(session);
    }

    // Every read the API offers about this work.
    let mut reads = vec![format!("{base}/v1/activations"), format!("{base}/v1/sessions"), format!("{base}/v1/runtime")];
    for session in &sessions {
        for tail in ["", "/messages", "/state", "/export"] {
            reads.push(format!("{base}/v1/sessions/{session}{tail}"));
        }
    }
    for url in &reads {
        let response = client.get(url).send().await.expect("get");
        assert!(response.status().is_success(), "{url}: {}", response.status());
        responses.push(response.text().await.expect("body"));
    }
    let (status, service) = service.terminate().await;
    assert!(status.success());

    // The token reached the tool's request, once: alice's call; bob's never went out.
    let sent = echo.requests();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].header("authorization"), Some(format!("Bearer {SECRET}").as_str()));

    // Not the model: no request carries the token or the delegation user's id; the echoed
    // header came back to the model scrubbed.
    let model_requests: Vec<String> = server.requests().iter().map(|r| r.body.to_string()).collect();
    assert_eq!(model_requests.len(), 4, "two model calls per turn");
    for body in &model_requests {
        assert!(!body.contains(SECRET), "the model saw the secret: {body}");
        assert!(!body.contains("alice"), "the model saw the delegation user: {body}");
    }
    assert!(model_requests.iter().any(|b| b.contains("Bearer [redacted]")), "{model_requests:?}");
    let bob_error = "user `bob` has no connection `github`: an operator adds it with `kesoku grants set bob github`";
    assert!(model_requests.iter().any(|b| b.contains(bob_error)), "{model_requests:?}");

    // Not the log (at debug level).
    let log = service.log();
    assert!(log.contains("http_request"), "the log covers the tool calls: {log}");
    assert!(!log.contains(SECRET), "the log holds the secret");

    // Not the API: no response holds it; a read may show the user id.
    for response in &responses {
        assert!(!response.contains(SECRET), "an API response holds the secret: {response}");
    }
    assert!(responses.iter().any(|r| r.contains("\"delegation_user\":\"alice\"")), "the id is visible to operators");

    // Not the store: every stored message and ledger row, whole.
    let url = format!("sqlite://{}", workspace.path().join(".kesoku/kesoku.db").display());
    let store = kesoku_store::open_existing(&url).await.expect("open the store");
    let messages = store.store.list_messages(&MessageFilter::default()).await.expect("messages");
    let stored = serde_json::to_string(&messages).expect("serialise");
    assert!(!stored.contains(SECRET), "a stored message holds the secret");
    let tool_results: Vec<_> = messages.iter().filter(|m| m.message_type == MessageType::ToolResult).collect();
    assert_eq!(tool_results.len(), 2, "{tool_results:?}");
    assert!(tool_results.iter().any(|m| m.content.contains("Bearer [redacted]") && m.metadata.tool_error.is_none()));
    assert!(tool_results.iter().any(|m| m.metadata.tool_error.as_deref() == Some(bob_error)), "{tool_results:?}");
    let rows = store.ledger.list_activations(&LedgerFilter::default()).await.expect("ledger");
    assert!(!serde_json::to_string(&rows).expect("serialise").contains(SECRET));
    assert_eq!(store.store.grant_secret("alice", "github").await.expect("read").as_deref(), Some(SECRET));
}
