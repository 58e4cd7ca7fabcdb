//! `kesoku start` (the real binary against a mock model) and `kesoku service install --dry-run`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use kesoku_core::{Message, MessageFilter, MessageId, MessageType, Outcome, Role, Session, Status};
use kesoku_store::{LedgerFilter, StoreHandle};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockReply, MockServer, Vendor};

use crate::support::{Service, Workspace, eventually, mock_model, stderr, stdout};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);
const WAIT: Duration = Duration::from_secs(20);

async fn init(workspace: &Workspace) {
    let output = workspace.run(&["init"], &[]).await;
    assert!(output.status.success(), "init failed: {}", stderr(&output));
}

async fn open_store(workspace: &Workspace) -> StoreHandle {
    let url = format!("sqlite://{}", workspace.path().join(".kesoku/kesoku.db").display());
    kesoku_store::open_existing(&url).await.expect("open the workspace's store")
}

/// Post a user message of the `cli` chatbot, as a client process would.
async fn post_prompt(store: &StoreHandle, text: &str) -> MessageId {
    let session = Session::new("cli", "cli", Utc::now());
    store.store.create_session(&session).await.expect("create a session");
    store.store.set_active_session("cli", "cli", &session.id).await.expect("activate it");
    let message = Message::user_text(&session.id, "cli", "cli", "User", text);
    store.store.insert_message(&message).await.expect("insert the prompt");
    message.id
}

async fn status_of(store: &StoreHandle, id: &MessageId) -> Status {
    store.store.get_message(id).await.expect("read the message").expect("the message exists").status
}

/// Poll until `condition` holds (bounded).
async fn wait_logged(service: &Service, message: &str) {
    service.wait_logged(message).await;
}

fn config_with_grace(base_url: &str) -> String {
    format!("{}\n[service]\nshutdown_grace_s = 1\n", mock_model(base_url))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_survives_sigterm_mid_turn_and_the_next_start_finishes_the_turn() {
    let server = MockServer::start(
        Vendor::OpenAi,
        vec![MockReply::HangAfter { answer: MockAnswer::text("Working on it, slowly"), events: 1 }],
    )
    .await;
    let workspace = Workspace::with_config(&config_with_grace(&server.base_url()));
    init(&workspace).await;
    let store = open_store(&workspace).await;
    let prompt = post_prompt(&store, "Summarise the logs").await;

    let service = Service::spawn(&workspace, "first.log", &[KEY]);
    eventually("the turn to reach the model", || async { !server.requests().is_empty() }).await;
    assert_eq!(status_of(&store, &prompt).await, Status::Processing);

    // One service per workspace.
    let second = workspace.run(&["start"], &[KEY]).await;
    assert!(!second.status.success());
    assert!(
        stderr(&second).contains(&format!("already running for this workspace (pid {}", service.pid())),
        "{}",
        stderr(&second)
    );

    let (status, service) = service.terminate().await;
    assert_eq!(status.code(), Some(0), "a clean stop exits 0; log:\n{:?}", service.log_lines());
    assert!(server.wait_for_disconnects(1, WAIT).await, "the model stream was dropped");
    let shutdown = service.logged("shutting down").expect("the shutdown is logged");
    assert_eq!(
        (shutdown["fields"]["signal"].as_str(), shutdown["fields"]["running_turns"].as_u64()),
        (Some("SIGTERM"), Some(1))
    );
    assert!(service.logged("kesoku service stopped").is_some());

    // Nothing lost: the message waits again, its activation is recorded as cancelled.
    assert_eq!(status_of(&store, &prompt).await, Status::PendingAgent);
    let ledger = store.ledger.list_activations(&LedgerFilter::default()).await.expect("ledger");
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!((ledger[0].message_id.as_ref(), ledger[0].outcome), (Some(&prompt), Some(Outcome::Cancelled)));

    server.push(MockReply::text("Finished after the restart."));
    let service = Service::spawn(&workspace, "second.log", &[KEY]);
    eventually("the retried turn to finish", || async { status_of(&store, &prompt).await == Status::Processed }).await;
    let (status, _service) = service.terminate().await;
    assert_eq!(status.code(), Some(0));

    let session = store.store.get_message(&prompt).await.expect("read").expect("exists").session_id;
    let messages = store.store.session_history(&session).await.expect("history");
    let answer =
        messages.iter().find(|m| m.role == Role::Assistant && m.message_type == MessageType::Text).expect("the answer");
    assert_eq!((answer.content.as_str(), answer.parent_id.as_ref()), ("Finished after the restart.", Some(&prompt)));
    assert_eq!(answer.status, Status::Pending, "no CLI was attached: the answer waits for delivery");
    let waiting = store.store.list_messages(&MessageFilter::status(Status::PendingAgent)).await.expect("list");
    assert!(waiting.is_empty(), "{waiting:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_acts_as_a_client_of_a_running_service() {
    let server = MockServer::start(Vendor::OpenAi, vec![MockReply::text("Answered by the service.")]).await;
    let workspace = Workspace::with_config(&config_with_grace(&server.base_url()));
    init(&workspace).await;
    let service = Service::spawn(&workspace, "service.log", &[KEY]);
    wait_logged(&service, "kesoku service started").await;

    // No API key here: only the service talks to the model.
    let output = workspace.run(&["chat", "Who answers?"], &[]).await;
    let out = stdout(&output);
    assert!(output.status.success(), "chat failed: {}\n{out}", stderr(&output));
    assert!(out.contains(&format!("Connected to the running kesoku service (pid {})", service.pid())), "{out}");
    assert!(out.contains("Answered by the service."), "{out}");

    let (status, _service) = service.terminate().await;
    assert_eq!(status.code(), Some(0));
    let store = open_store(&workspace).await;
    let answers = store
        .store
        .list_messages(&MessageFilter::default().with_roles(&[Role::Assistant]))
        .await
        .expect("list answers");
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].status, Status::Delivered, "the chat client delivered the answer");
}

#[tokio::test]
async fn start_refuses_to_run_without_a_model() {
    let workspace = Workspace::with_config("");
    init(&workspace).await;
    let output = workspace.run(&["start"], &[]).await;
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("cannot start the service") && err.contains("[models.NAME]"), "{err}");
}

fn unit_file(home: &Path) -> PathBuf {
    home.join(".config/systemd/user/kesoku.service")
}

#[tokio::test]
async fn service_install_dry_run_prints_a_unit_that_reads_secrets_from_an_env_file() {
    let workspace = Workspace::with_config(&mock_model("http://127.0.0.1:9/v1"));
    let home = workspace.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let home_text = home.display().to_string();
    let secret = "sk-very-secret-value-4242";
    let env = [("HOME", home_text.as_str()), ("XDG_CONFIG_HOME", ""), ("KESOKU_TEST_MOCK_KEY", secret)];

    let output = workspace.run(&["service", "install", "--dry-run"], &env).await;
    let out = stdout(&output);
    assert!(output.status.success(), "{}\n{out}", stderr(&output));
    let config = workspace.config.canonicalize().expect("config path");
    let folder = config.parent().expect("config folder");
    for expected in [
        format!("# unit file: {}", unit_file(&home).display()),
        "[Service]".to_owned(),
        format!(
            "ExecStart={} --config {} --log-format json start",
            Path::new(env!("CARGO_BIN_EXE_kesoku")).canonicalize().expect("binary").display(),
            config.display()
        ),
        format!("WorkingDirectory={}", folder.display()),
        format!("EnvironmentFile={}", folder.join("kesoku.env").display()),
        "KillSignal=SIGTERM".to_owned(),
        "KillMode=mixed".to_owned(),
        "TimeoutStopSec=30".to_owned(),
        "WantedBy=default.target".to_owned(),
        "#   variables the config names: KESOKU_TEST_MOCK_KEY".to_owned(),
        "#   would be created with mode 0600".to_owned(),
        "# would run: systemctl --user daemon-reload".to_owned(),
        "# would run: systemctl --user enable kesoku.service".to_owned(),
    ] {
        assert!(
            out.lines().any(|line| line == expected || line.starts_with(&expected)),
            "missing {expected:?} in:\n{out}"
        );
    }
    assert!(!out.contains(secret) && !out.contains(MOCK_API_KEY), "no secret in the unit:\n{out}");
    assert!(!out.contains("User="), "a user unit runs as its user:\n{out}");
    assert!(!unit_file(&home).exists() && !folder.join("kesoku.env").exists(), "a dry run writes nothing");

    let system = workspace
        .run(&["service", "install", "--dry-run", "--system", "--user", "kesoku-svc", "--name", "agent"], &env)
        .await;
    let out = stdout(&system);
    assert!(system.status.success(), "{}", stderr(&system));
    assert!(out.contains("# unit file: /etc/systemd/system/agent.service"), "{out}");
    assert!(out.contains("\nUser=kesoku-svc\n") && out.contains("WantedBy=multi-user.target"), "{out}");
    assert!(out.contains("# would run: systemctl enable agent.service"), "{out}");

    let misuse = workspace.run(&["service", "install", "--dry-run", "--user", "bob"], &env).await;
    assert!(!misuse.status.success());
    assert!(stderr(&misuse).contains("--user only applies to system units"), "{}", stderr(&misuse));
}

fn config_with_http(base_url: &str, listen: &str) -> String {
    format!("{}\n[service]\nshutdown_grace_s = 1\n\n[http]\nlisten = \"{listen}\"\n", mock_model(base_url))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_serves_the_http_api_and_a_posted_message_is_answered_and_delivered() {
    let server = MockServer::start(Vendor::OpenAi, vec![MockReply::text("hello from the api")]).await;
    let workspace = Workspace::with_config(&config_with_http(&server.base_url(), "127.0.0.1:0"));
    init(&workspace).await;
    let service = Service::spawn(&workspace, "http.log", &[KEY]);
    let base = service.api_base().await;
    let client = reqwest::Client::new();
    let posted: serde_json::Value = client
        .post(format!("{base}/v1/messages"))
        .json(&serde_json::json!({"channel_id": "c1", "sender": "tester", "content": "hi there"}))
        .send()
        .await
        .expect("post")
        .error_for_status()
        .expect("202")
        .json()
        .await
        .expect("json");
    let session = posted["session_id"].as_str().expect("session id").to_owned();
    let messages_url = format!("{base}/v1/sessions/{session}/messages");
    eventually("the answer delivered through the api chatbot", || async {
        let Ok(response) = client.get(&messages_url).send().await else { return false };
        let Ok(body) = response.json::<serde_json::Value>().await else { return false };
        body["messages"].as_array().is_some_and(|messages| {
            messages.iter().any(|m| m["content"] == "hello from the api" && m["status"] == "delivered")
        })
    })
    .await;
    let metrics = client.get(format!("{base}/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("kesoku_turns_total"), "{metrics}");
    let state = client.get(format!("{base}/v1/sessions/{session}/state")).send().await.expect("state");
    assert_eq!(state.status(), 200);
    let (status, _) = service.terminate().await;
    assert!(status.success());
}

/// What `triggers.rs` leaves out: the service tells the API its configured models, a retried
/// trigger posts once, and the API's ledger filter finds the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_trigger_names_a_configured_model_and_posts_once() {
    let server = MockServer::start(Vendor::OpenAi, vec![MockReply::text("disk usage is fine")]).await;
    let workspace = Workspace::with_config(&config_with_http(&server.base_url(), "127.0.0.1:0"));
    init(&workspace).await;
    let service = Service::spawn(&workspace, "trigger.log", &[KEY]);
    let base = service.api_base().await;
    let client = reqwest::Client::new();
    let post = |body: serde_json::Value| {
        let request = client.post(format!("{base}/v1/activations")).json(&body);
        async move {
            let response = request.send().await.expect("post");
            (response.status().as_u16(), response.json::<serde_json::Value>().await.expect("json"))
        }
    };

    let (status, refused) =
        post(serde_json::json!({"task": "t", "chatbot_id": "api", "channel_id": "ops", "model": "huge"})).await;
    assert_eq!(status, 422, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no model `huge` is configured (configured: `mock`)"), "{refused}");

    let body = serde_json::json!({
        "task": "Check the disk usage", "chatbot_id": "api", "channel_id": "ops", "model": "mock",
        "client_request_id": "disk-1"
    });
    let (status, posted) = post(body.clone()).await;
    assert_eq!(status, 202, "{posted}");
    let (status, again) = post(body).await;
    assert_eq!((status, &again["message_id"]), (200, &posted["message_id"]), "{again}");

    let ledger_url = format!("{base}/v1/activations?kind=direct_trigger");
    eventually("the trigger's activation succeeded", || async {
        let Ok(response) = client.get(&ledger_url).send().await else { return false };
        let Ok(ledger) = response.json::<serde_json::Value>().await else { return false };
        ledger["activations"].as_array().is_some_and(|rows| {
            rows.len() == 1 && rows[0]["message_id"] == posted["message_id"] && rows[0]["outcome"] == "succeeded"
        })
    })
    .await;
    assert_eq!(server.requests().len(), 1, "the retried trigger ran once");
    let (status, _) = service.terminate().await;
    assert!(status.success());
}

#[tokio::test]
async fn start_refuses_to_serve_off_loopback_without_a_token() {
    let workspace = Workspace::with_config(&config_with_http("http://127.0.0.1:9/v1", "0.0.0.0:0"));
    init(&workspace).await;
    let output = workspace.run(&["start"], &[KEY]).await;
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("token_env"), "{err}");
}
