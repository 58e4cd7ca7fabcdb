//! Bad input never panics and always gets a clear error:
//! - random and mutated `kesoku.toml` files, through the real binary (`kesoku history list -c`);
//! - random message lists through the history transpiler (`history_to_conversation`);
//! - oversized and invalid UTF-8 bodies, and attachment names with `../`, through the real
//!   service's HTTP API; an invalid UTF-8 prompt on the command line; a tool printing invalid
//!   UTF-8 and megabytes of output.
//!
//! Platform event parsers (Discord, Google Chat, WeChat) do not exist yet; HTTP is the only
//! platform input, and it is covered here.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Duration;

use kesoku_bench::mock::{HttpPolicy, PolicyServer};
use kesoku_bench::models::{Policy, PolicyModel};
use kesoku_bench::system::{AgentSetup, Backend, Client, StoreSetup, System};
use kesoku_core::{Message, MessageId, MessageType, Metadata, Role, SessionId, Status};
use kesoku_llm::{HistoryOptions, Part, TurnRole, history_to_conversation};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::support::{KEY_VAR, Service, Workspace, text};

/// A valid config the mutations start from.
const BASE_CONFIG: &str = "[workspace]\ndir = \".kesoku\"\ndatabase = \"sqlite://.kesoku/kesoku.db\"\n\n\
[agent]\nname = \"Kesoku\"\nmodel = \"mock\"\nqueue_mode = \"interrupt\"\nmax_concurrent_turns = 4\n\n\
[limits.interactive]\nruntime_s = 60\nmodel_calls = 5\ntool_calls = 5\n\n\
[models.mock]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\n\
[models.mock.retry]\nmax_attempts = 2\n\n[tools]\ndisabled = [\"edit_file\"]\n";

/// Pieces of TOML (valid and not) that random configs are made of.
const TOML_PIECES: &[&str] = &[
    "[agent]",
    "[models.x]",
    "[[models]]",
    "[workspace]",
    "[tools.shell]",
    "[limits.interactive]",
    "[http]",
    "provider = \"openai\"",
    "provider = \"nonsense\"",
    "model = \"\"",
    "name = \"\"",
    "queue_mode = 7",
    "max_concurrent_turns = -1",
    "runtime_s = 99999999999999999999",
    "dir = \"../..\"",
    "database = \"mysql://root:pw@h/db\"",
    "database = \"sqlite://\"",
    "listen = \"not an address\"",
    "base_url = \"ftp://x\"",
    "=",
    "\"",
    "'''",
    "\n",
    "[",
    "]",
    "{",
    "}",
    "é",
    "\u{0}",
    "\u{feff}",
    "x = 1",
    "x = [1, \"a\"]",
    "x.y.z = true",
];

fn config_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // The valid config with a random stretch replaced by random bytes.
        (0..BASE_CONFIG.len(), 0..24usize, prop::collection::vec(any::<u8>(), 0..16)).prop_map(|(at, cut, insert)| {
            let mut bytes = BASE_CONFIG.as_bytes().to_vec();
            let end = (at + cut).min(bytes.len());
            bytes.splice(at..end, insert);
            bytes
        }),
        // The valid config with a random piece inserted.
        (0..BASE_CONFIG.len(), prop::sample::select(TOML_PIECES)).prop_map(|(at, piece)| {
            let mut bytes = BASE_CONFIG.as_bytes().to_vec();
            bytes.splice(at..at, format!("\n{piece}\n").into_bytes());
            bytes
        }),
        // A soup of pieces.
        prop::collection::vec(prop::sample::select(TOML_PIECES), 0..30)
            .prop_map(|pieces| pieces.join(" ").into_bytes()),
        // Random bytes (mostly not UTF-8).
        prop::collection::vec(any::<u8>(), 0..300),
    ]
}

#[test]
fn random_and_mutated_configs_fail_cleanly_naming_the_file() {
    let binary = kesoku_bench::binaries::kesoku_binary().unwrap_or_else(|error| panic!("{error}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("kesoku.toml");
    let config = ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(bytes in config_bytes())| {
        std::fs::write(&path, &bytes).expect("write the config");
        let output = std::process::Command::new(&binary)
            .arg("-c")
            .arg(&path)
            .args(["history", "list"])
            .current_dir(dir.path())
            .env_remove("KESOKU_CONFIG")
            .output()
            .expect("run kesoku");
        let stderr = text(&output.stderr);
        prop_assert!(!stderr.contains("panicked"), "a panic: {}", stderr);
        prop_assert_eq!(output.status.code(), Some(1), "exit code 1: {}", stderr);
        prop_assert!(stderr.contains("kesoku.toml"), "the error names the file: {}", stderr);
        prop_assert!(stderr.starts_with("error: "), "one clear error line: {}", stderr);
    });
}

/// A messy but plausible stored history: any roles, types and statuses, parents that exist or
/// not, calls with and without results, results without calls, shared and missing call ids.
fn messages() -> impl Strategy<Value = Vec<Message>> {
    let one = (0u8..9, 0usize..64, 0u32..4, 0usize..6, "[a-zé🙂 \n]{0,12}");
    prop::collection::vec(one, 0..40).prop_map(|specs| {
        let session = SessionId::from("s");
        let mut out: Vec<Message> = Vec::new();
        for (index, (kind, parent_pick, step, call_pick, content)) in specs.into_iter().enumerate() {
            let parent = if out.is_empty() || parent_pick % 5 == 0 {
                None
            } else {
                Some(out[parent_pick % out.len()].id.clone())
            };
            let (role, message_type, status) = match kind {
                0 => (Role::User, MessageType::Text, Status::Processed),
                1 => (Role::Assistant, MessageType::Thought, Status::Responded),
                2 | 3 => (Role::Tool, MessageType::ToolCall, Status::Responded),
                4 | 5 => (Role::Tool, MessageType::ToolResult, Status::Responded),
                6 => (Role::Assistant, MessageType::Text, Status::Delivered),
                7 => (Role::System, MessageType::Text, Status::Responded),
                _ => (Role::User, MessageType::Text, Status::PendingAgent),
            };
            let mut metadata = Metadata::default();
            if matches!(message_type, MessageType::ToolCall | MessageType::ToolResult) {
                metadata.tool_name = Some("run_shell_command".to_owned());
                if call_pick > 0 {
                    metadata.tool_call_id = Some(format!("call_{call_pick}"));
                }
                metadata.tool_arguments = Some(json!({"command": "ls"}));
            }
            let sender = if kind == 6 && call_pick == 0 { "Notification" } else { "Kesoku" };
            out.push(Message {
                id: MessageId::from(format!("m{index}")),
                session_id: session.clone(),
                parent_id: parent,
                chatbot_id: "cli".to_owned(),
                channel_id: "cli".to_owned(),
                sender: sender.to_owned(),
                role,
                message_type,
                content,
                status,
                metadata,
                step,
                created_at: None,
                updated_at: None,
            });
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_transpiler_always_alternates_and_pairs_results_with_calls(history in messages(), active in 0usize..50) {
        let active_root = history.get(active).map(|m| m.id.clone());
        let options = HistoryOptions { active_root: active_root.as_ref(), attachment_base: None };
        let conversation = history_to_conversation(&history, &options);
        let turns = &conversation.turns;
        if let Some(first) = turns.first() {
            prop_assert_eq!(first.role, TurnRole::User, "the first turn is the user's");
        }
        for pair in turns.windows(2) {
            prop_assert_ne!(pair[0].role, pair[1].role, "roles alternate");
        }
        for (index, turn) in turns.iter().enumerate() {
            prop_assert!(!turn.parts.is_empty(), "no empty turn");
            let calls: Vec<&str> = turn.parts.iter().filter_map(|p| if let Part::ToolCall(call) = p { Some(call.id.as_str()) } else { None }).collect();
            if !calls.is_empty() {
                prop_assert_eq!(turn.role, TurnRole::Model);
                let next = turns.get(index + 1);
                let answered: HashMap<&str, usize> = next.map(|t| t.parts.iter().filter_map(|p| if let Part::ToolResult(result) = p { Some((result.call_id.as_str(), 1)) } else { None }).collect()).unwrap_or_default();
                for call in &calls {
                    prop_assert!(answered.contains_key(call), "call {} is answered in the next turn", call);
                }
            }
            for part in &turn.parts {
                if let Part::ToolResult(result) = part {
                    prop_assert_eq!(turn.role, TurnRole::User);
                    let previous = index.checked_sub(1).map(|i| &turns[i]);
                    let called = previous.is_some_and(|t| t.parts.iter().any(|p| matches!(p, Part::ToolCall(c) if c.id == result.call_id)));
                    prop_assert!(called, "result {} follows its call", result.call_id);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_refuses_oversized_invalid_and_escaping_input_and_stays_up() {
    let model = PolicyServer::start(HttpPolicy::instant_text());
    let workspace = Workspace::new(&model.base_url(), "\n[http]\nlisten = \"127.0.0.1:0\"");
    workspace.init().await;
    let service = Service::start(&workspace, &[], &[(KEY_VAR, "k")]).await;
    let http = reqwest::Client::new();
    let post = |body: Vec<u8>| {
        http.post(service.url("/v1/messages")).header("content-type", "application/json").body(body).send()
    };

    // Larger than the body limit (10 MiB): refused from its Content-Length, before the body is
    // read (so this speaks raw HTTP; a client still writing the body sees the connection close).
    let (status, body) = raw_post(service.addr.expect("http"), "/v1/messages", 11 << 20).await;
    assert_eq!(status, 413, "{body}");
    let body: Value = serde_json::from_str(&body).expect("a JSON error body");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");

    // Invalid UTF-8 inside a JSON string.
    let mut invalid = b"{\"channel_id\": \"c\", \"sender\": \"s\", \"content\": \"bad ".to_vec();
    invalid.extend_from_slice(&[0xff, 0xfe, 0xc3]);
    invalid.extend_from_slice(b"\"}");
    let response = post(invalid).await.expect("send");
    assert!(matches!(response.status().as_u16(), 400 | 422), "invalid UTF-8: {}", response.status());
    let body: Value = response.json().await.expect("a JSON error body");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");

    // Attachment names that try to leave the session's folder.
    let marker = format!("escaped-{}", ulid::Ulid::generate());
    for filename in [
        format!("../../{marker}"),
        "..".to_owned(),
        format!("/tmp/{marker}"),
        format!("a/{marker}"),
        format!("..\\{marker}"),
    ] {
        let body = json!({
            "channel_id": "c", "sender": "s", "content": "see attached",
            "attachments": [{"filename": filename, "mime_type": "text/plain", "content_base64": "aGVsbG8="}]
        });
        let response = post(body.to_string().into_bytes()).await.expect("send");
        assert!(matches!(response.status().as_u16(), 400 | 422), "{filename} is refused: {}", response.status());
        let error: Value = response.json().await.expect("a JSON error body");
        let message = error["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert!(message.contains("file name") || message.contains("filename"), "{filename}: {message}");
    }
    let escaped = walk(workspace.path().parent().expect("parent"), &marker, 4);
    assert!(escaped.is_empty(), "nothing was written outside: {escaped:?}");
    assert!(!std::path::Path::new("/tmp").join(&marker).exists());

    // A large message (2 MB) within the limit is taken and answered.
    let large = json!({"channel_id": "big", "sender": "s", "content": "x".repeat(2 << 20)});
    let response = post(large.to_string().into_bytes()).await.expect("send");
    assert_eq!(response.status(), 202);
    let accepted: Value = response.json().await.expect("json");
    let id = MessageId::from(accepted["id"].as_str().expect("an id"));
    let store = workspace.store().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = store.store.get_message(&id).await.expect("get").map(|m| m.status);
        if status.is_some_and(crate::support::is_terminal) {
            let message = store.store.get_message(&id).await.expect("get").expect("stored");
            let history = store.store.session_history(&message.session_id).await.expect("history");
            let last = history.last().map(|m| m.content.clone()).unwrap_or_default();
            assert_eq!(status, Some(Status::Processed), "the large message is answered: {last}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the large message was not answered: {status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let health = http.get(service.url("/healthz")).send().await.expect("healthz");
    assert!(health.status().is_success(), "the service is still up");
    let log = service.stop().await;
    assert!(!log.contains("panicked"), "{log}");
}

/// Announce a JSON body of `length` bytes, send its first bytes, and read the answer (status,
/// body) the server sends without waiting for the rest.
async fn raw_post(addr: std::net::SocketAddr, path: &str, length: usize) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\
         connection: close\r\n\r\n{{\"content\": \""
    );
    stream.write_all(head.as_bytes()).await.expect("write the head");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

/// Paths under `root` (up to `depth` levels) whose name contains `needle`.
fn walk(root: &std::path::Path, needle: &str, depth: usize) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|name| name.to_string_lossy().contains(needle)) {
            found.push(path.clone());
        }
        if depth > 0 && entry.file_type().is_ok_and(|t| t.is_dir() && !t.is_symlink()) {
            found.extend(walk(&path, needle, depth - 1));
        }
    }
    found
}

#[tokio::test]
async fn an_invalid_utf8_prompt_is_refused_with_a_clear_error() {
    let workspace = Workspace::new("http://127.0.0.1:9/v1", "");
    let mut command = workspace.command(&["chat"], &[(KEY_VAR, "k")]);
    command.arg(std::ffi::OsStr::from_bytes(b"hello \xff\xfe world"));
    let output = command.output().await.expect("run kesoku");
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert_ne!(output.status.code(), Some(101), "not a panic: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.to_lowercase().contains("utf-8") || stderr.to_lowercase().contains("utf8"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_printing_invalid_utf8_and_megabytes_gives_a_bounded_readable_result() {
    let command = "printf 'start \\377\\376 end\\n'; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo tail-marker";
    let policy = Policy {
        tool: "run_shell_command".to_owned(),
        arguments: json!({ "command": command }),
        calls: 1,
        latency: Duration::ZERO,
    };
    let store = StoreSetup::open(&Backend::Sqlite).await.expect("store");
    let system = System::start(store, AgentSetup::with_model(Arc::new(PolicyModel::new("policy", policy))))
        .await
        .expect("agent");
    let client = Client::start(&system.gateway).await;
    let session = client.new_session("binary-output").await.expect("session");
    let answered = tokio::time::timeout(Duration::from_secs(60), client.ask(&session, "print junk"))
        .await
        .expect("the turn ends")
        .expect("ask");
    assert_eq!(answered.status, Status::Processed);
    let history = system.gateway.store().session_history(&session.id).await.expect("history");
    let result = history.iter().find(|m| m.message_type == MessageType::ToolResult).expect("a tool result");
    assert!(result.content.len() < 200_000, "the result is cut: {} bytes", result.content.len());
    assert!(result.content.contains("tail-marker"), "the tail is kept");
    system.stop().await;
}
