//! Secrets stay secret and tools stay in the workspace, checked on the real service
//! (`kesoku -vv start` with `KESOKU_LOG=debug`, the HTTP API behind a token, model logs on):
//! - the provider key and the API token never appear in the service's output, in any file of
//!   the workspace (staging files, model logs, the store), in what the model is sent (the key is
//!   only in the `Authorization` header), or in any API response;
//! - the shell tool does not see the service's environment (`env` shows neither the key, the
//!   token nor an unrelated secret of the service);
//! - file tools refuse `../`, absolute paths and a symlink leading out of the workspace, and
//!   write nothing outside it.
//!
//! Not covered: a tool process reading `/proc/<service pid>/environ` directly. On Linux that
//! file is readable by the same user (and by root, which runs these tests), so keeping secrets
//! out of it needs the service to run as another user or to make itself non-dumpable.

use std::path::Path;
use std::time::Duration;

use kesoku_bench::mock::MockHost;
use kesoku_core::{MessageType, SessionId, Status};
use kesoku_test_support::mock_llm::{MockAnswer, MockOptions, MockPart, MockReply, Vendor};
use serde_json::{Value, json};

use crate::support::{KEY_VAR, Service, Workspace};

const TOKEN_VAR: &str = "KESOKU_RELIABILITY_API_TOKEN";
const CANARY_VAR: &str = "KESOKU_RELIABILITY_OTHER_SECRET";
const OUTSIDE_CONTENT: &str = "outside-the-workspace-do-not-read";

fn secret(label: &str) -> String {
    format!("{label}-{}", ulid::Ulid::generate().to_string().to_lowercase())
}

fn calls(parts: Vec<MockPart>) -> MockReply {
    MockReply::Answer(MockAnswer::parts(parts))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_stay_out_of_logs_files_requests_responses_and_tools_stay_inside() {
    let key = secret("sk-provider-key");
    let token = secret("api-token");
    let canary = secret("unrelated-secret");
    let outside = tempfile::tempdir().expect("a folder outside the workspace");
    let outside_file = outside.path().join("outside.txt");
    std::fs::write(&outside_file, OUTSIDE_CONTENT).expect("write");
    let outside_path = outside_file.display().to_string();

    let options = MockOptions {
        api_key: Some(key.clone()),
        ..MockOptions::script(vec![
            calls(vec![MockPart::tool_call("call_env", "run_shell_command", json!({"command": "env; printenv"}))]),
            MockReply::text("That is the environment."),
            calls(vec![
                MockPart::tool_call("call_up", "read_file", json!({"path": "../../outside.txt"})),
                MockPart::tool_call("call_abs", "read_file", json!({"path": outside_path})),
                MockPart::tool_call("call_link", "read_file", json!({"path": "link.txt"})),
                MockPart::tool_call("call_write", "write_file", json!({"path": "../escaped.txt", "content": "x"})),
                MockPart::tool_call(
                    "call_write_abs",
                    "write_file",
                    json!({"path": outside.path().join("w.txt").display().to_string(), "content": "x"}),
                ),
            ]),
            MockReply::text("Those files are out of reach."),
        ])
    };
    let mock = MockHost::start(Vendor::OpenAi, options);
    let workspace = Workspace::new(
        &mock.base_url(),
        &format!("debug = true\n\n[http]\nlisten = \"127.0.0.1:0\"\ntoken_env = \"{TOKEN_VAR}\""),
    );
    workspace.init().await;
    let tools_dir = workspace.path().join(".kesoku");
    std::os::unix::fs::symlink(&outside_file, tools_dir.join("link.txt")).expect("symlink");

    let env =
        [(KEY_VAR, key.as_str()), (TOKEN_VAR, token.as_str()), (CANARY_VAR, canary.as_str()), ("KESOKU_LOG", "debug")];
    let service = Service::start(&workspace, &["-v"], &env).await;
    let http = reqwest::Client::new();
    let auth = format!("Bearer {token}");

    let mut sessions = Vec::new();
    for (channel, prompt) in [("env", "Show me your environment."), ("files", "Read the file next door.")] {
        let response = http
            .post(service.url("/v1/messages"))
            .header("authorization", &auth)
            .json(&json!({"channel_id": channel, "sender": "Tester", "content": prompt}))
            .send()
            .await
            .expect("post");
        assert_eq!(response.status(), 202);
        let accepted: Value = response.json().await.expect("json");
        let id = accepted["id"].as_str().expect("id").to_owned();
        sessions.push(SessionId::from(accepted["session_id"].as_str().expect("session")));
        wait_processed(&workspace, &id).await;
    }

    // Every API response, read with the token, holds no secret.
    let mut responses = Vec::new();
    let mut paths = vec!["/v1/sessions".to_owned(), "/v1/activations".to_owned(), "/v1/runtime".to_owned()];
    paths.extend(["/metrics", "/openapi.json", "/healthz", "/readyz"].map(str::to_owned));
    for session in &sessions {
        for suffix in ["", "/messages", "/state", "/export"] {
            paths.push(format!("/v1/sessions/{session}{suffix}"));
        }
    }
    for path in &paths {
        let response = http.get(service.url(path)).header("authorization", &auth).send().await.expect("get");
        assert!(response.status().is_success(), "{path}: {}", response.status());
        responses.push((path.clone(), response.text().await.expect("body")));
    }
    let refused = http.get(service.url("/v1/sessions")).header("authorization", format!("Bearer {key}")).send().await;
    let refused = refused.expect("get");
    assert_eq!(refused.status(), 401, "a wrong token is refused");
    responses.push(("/v1/sessions (wrong token)".to_owned(), refused.text().await.expect("body")));
    let log = service.stop().await;

    for (what, secret) in [("provider key", &key), ("API token", &token), ("service secret", &canary)] {
        assert!(!log.contains(secret.as_str()), "the {what} is in the service log");
        for (path, body) in &responses {
            assert!(!body.contains(secret.as_str()), "the {what} is in the response of {path}");
        }
        let leaked = files_containing(workspace.path(), secret);
        assert!(leaked.is_empty(), "the {what} is in {leaked:?}");
        for request in mock.server().requests() {
            assert!(!request.body.to_string().contains(secret.as_str()), "the {what} was sent to the model");
        }
    }
    let requests = mock.server().requests();
    assert_eq!(requests.len(), 4, "two turns of two model calls");
    assert!(requests.iter().all(|r| r.header("authorization") == Some(format!("Bearer {key}").as_str())));
    assert!(log.lines().count() > 20, "debug logging was on: {} lines", log.lines().count());

    // What the tools returned.
    let store = workspace.store().await;
    let env_history = store.store.session_history(&sessions[0]).await.expect("history");
    let env_result = env_history.iter().find(|m| m.message_type == MessageType::ToolResult).expect("env ran");
    assert!(env_result.content.contains("PATH="), "env printed something: {}", env_result.content);
    for secret in [&key, &token, &canary] {
        assert!(!env_result.content.contains(secret.as_str()), "the shell saw a secret: {}", env_result.content);
    }
    assert!(!env_result.content.contains(CANARY_VAR) && !env_result.content.contains(KEY_VAR));
    let files_history = store.store.session_history(&sessions[1]).await.expect("history");
    let results: Vec<_> = files_history.iter().filter(|m| m.message_type == MessageType::ToolResult).collect();
    assert_eq!(results.len(), 5);
    for result in &results {
        assert!(result.metadata.tool_error.is_some(), "refused: {}", result.content);
        assert!(!result.content.contains(OUTSIDE_CONTENT), "read outside: {}", result.content);
    }
    assert!(!workspace.path().join("escaped.txt").exists(), "nothing written outside");
    assert!(!outside.path().join("w.txt").exists(), "nothing written outside");
    assert_eq!(std::fs::read_to_string(&outside_file).expect("read"), OUTSIDE_CONTENT);
}

async fn wait_processed(workspace: &Workspace, id: &str) {
    let store = workspace.store().await;
    let id = kesoku_core::MessageId::from(id);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = store.store.get_message(&id).await.expect("get").map(|m| m.status);
        if status.is_some_and(crate::support::is_terminal) {
            assert_eq!(status, Some(Status::Processed), "{id}");
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Files under `root` whose bytes contain `needle`.
fn files_containing(root: &Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if kind.is_file()
            && let Ok(bytes) = std::fs::read(&path)
            && bytes.windows(needle.len()).any(|window| window == needle.as_bytes())
        {
            found.push(path);
        }
    }
    found
}
