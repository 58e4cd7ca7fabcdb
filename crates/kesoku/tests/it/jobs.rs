//! Background jobs through the real binary: the service starts one for the model, `kesoku jobs`
//! lists it, the job outlives a restart of the service and its end wakes the session.

use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use kesoku_core::{Job, JobState, Message, MessageId, Role, Session, Status};
use kesoku_store::StoreHandle;
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockPart, MockReply, MockServer, Vendor};
use serde_json::json;

use crate::support::{Service, Workspace, mock_model, stderr, stdout};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);
const WAIT: Duration = Duration::from_secs(30);

async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn status_of(store: &StoreHandle, id: &MessageId) -> Status {
    store.store.get_message(id).await.expect("read the message").expect("the message exists").status
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(false)
}

/// `kesoku jobs --json`, parsed.
async fn listed(workspace: &Workspace) -> Vec<Job> {
    let output = workspace.run(&["jobs", "--json"], &[]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    stdout(&output).lines().map(|line| serde_json::from_str(line).expect("a job as JSON")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_job_outlives_a_service_restart_and_wakes_its_session() {
    let command = "echo before; while [ ! -e \"$STAGING_DIR/release\" ]; do sleep 0.05; done; echo after";
    let server = MockServer::start(
        Vendor::OpenAi,
        vec![
            MockReply::Answer(MockAnswer::parts(vec![MockPart::tool_call(
                "call_1",
                "run_shell_command",
                json!({ "command": command, "background": true }),
            )])),
            MockReply::text("It runs in the background."),
            MockReply::text("The job printed before and after."),
        ],
    )
    .await;
    let workspace =
        Workspace::with_config(&format!("{}\n[service]\nshutdown_grace_s = 1\n", mock_model(&server.base_url())));
    let init = workspace.run(&["init", "--no-model"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let url = format!("sqlite://{}", workspace.path().join(".kesoku/kesoku.db").display());
    let store = kesoku_store::open_existing(&url).await.expect("open the workspace's store");
    let session = Session::new("cli", "cli", Utc::now());
    store.store.create_session(&session).await.expect("create a session");
    store.store.set_active_session("cli", "cli", &session.id).await.expect("activate it");
    let prompt = Message::user_text(&session.id, "cli", "cli", "User", "run it in the background");
    store.store.insert_message(&prompt).await.expect("insert the prompt");

    let service = Service::spawn(&workspace, "first.log", &[KEY]);
    eventually("the prompt's turn", || async {
        (status_of(&store, &prompt.id).await == Status::Processed).then_some(())
    })
    .await;
    let jobs = listed(&workspace).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job = jobs[0].clone();
    assert_eq!((job.state, job.command.as_str(), &job.message_id), (JobState::Running, command, &prompt.id));
    let table = stdout(&workspace.run(&["jobs"], &[]).await);
    assert!(table.starts_with(&format!("{}  running       -  ", job.id)), "{table}");
    assert!(table.trim_end().ends_with(&format!("{}  {command}", session.id)), "{table}");

    let (status, service) = service.terminate().await;
    assert_eq!(status.code(), Some(0), "log:\n{}", service.log());
    let pid = job.pid.expect("a pid");
    assert!(alive(pid), "the job outlives the service");
    assert_eq!(listed(&workspace).await[0].state, JobState::Running);

    let service = Service::spawn(&workspace, "second.log", &[KEY]);
    let recovered = eventually("the job's recovery", || async { service.logged("background jobs recovered") }).await;
    assert_eq!(recovered["fields"]["adopted"].as_u64(), Some(1), "{recovered}");
    let staging = Path::new(&job.stdout_path).parent().and_then(Path::parent).expect("the staging folder");
    std::fs::write(staging.join("release"), "").expect("release the job");

    let alert_id = job.alert_message_id();
    eventually("the alert's turn", || async {
        let alert = store.store.get_message(&alert_id).await.expect("read")?;
        (alert.status == Status::Processed).then_some(())
    })
    .await;
    let ended = listed(&workspace).await.remove(0);
    assert_eq!((ended.state, ended.exit_code), (JobState::Exited, Some(0)));
    let history = store.store.session_history(&session.id).await.expect("history");
    let answer = history
        .iter()
        .find(|m| m.parent_id.as_ref() == Some(&alert_id) && m.role == Role::Assistant)
        .expect("an answer to the alert");
    assert_eq!(answer.content, "The job printed before and after.");
    let last_request = server.requests().pop().expect("the alert's request").body.to_string();
    assert!(last_request.contains(&format!("[System Alert] Background Job {} finished with exit code 0", job.id)));
    assert!(last_request.contains("before\\nafter"), "{last_request}");

    let refused = workspace.run(&["jobs", "cancel", job.id.as_str()], &[]).await;
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains(&format!("job {} is not running: it is exited (exit code 0)", job.id)),
        "{}",
        stderr(&refused)
    );
    let (status, service) = service.terminate().await;
    assert_eq!(status.code(), Some(0), "log:\n{}", service.log());
}

#[tokio::test]
async fn kesoku_jobs_cancel_stops_a_running_job() {
    let workspace = Workspace::with_config("");
    let init = workspace.run(&["init", "--no-model"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let url = format!("sqlite://{}", workspace.path().join(".kesoku/kesoku.db").display());
    let store = kesoku_store::open_existing(&url).await.expect("open the workspace's store");
    let session = Session::new("cli", "cli", Utc::now());
    store.store.create_session(&session).await.expect("create a session");

    // A job as the service leaves it: a process group of its own, and its row.
    let mut sleeper = tokio::process::Command::new("/bin/sh")
        .args(["-c", "sleep 300"])
        .process_group(0)
        .spawn()
        .expect("start a job process");
    let pid = i32::try_from(sleeper.id().expect("pid")).expect("pid");
    let logs = workspace.path().join("job");
    let job = Job {
        id: kesoku_core::JobId::generate(),
        session_id: session.id.clone(),
        chatbot_id: "cli".to_owned(),
        channel_id: "cli".to_owned(),
        message_id: MessageId::generate(),
        command: "sleep 300".to_owned(),
        pid: Some(pid),
        stdout_path: format!("{}.out", logs.display()),
        stderr_path: format!("{}.err", logs.display()),
        state: JobState::Running,
        exit_code: None,
        detail: None,
        started_at: Utc::now(),
        finished_at: None,
    };
    store.store.insert_job(&job).await.expect("insert the job");

    let output = workspace.run(&["jobs", "cancel", job.id.as_str()], &[]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output), format!("cancelled {} (`sleep 300`)\n", job.id));
    let status = tokio::time::timeout(WAIT, sleeper.wait()).await.expect("the job ends").expect("wait");
    assert!(!status.success(), "stopped by a signal: {status:?}");
    let cancelled = store.store.get_job(&job.id).await.expect("read").expect("exists");
    assert_eq!(
        (cancelled.state, cancelled.detail.as_deref()),
        (JobState::Cancelled, Some("cancelled by kesoku jobs cancel"))
    );
    let unknown = workspace.run(&["jobs", "cancel", "job_nope"], &[]).await;
    assert!(stderr(&unknown).contains("no background job `job_nope`"), "{}", stderr(&unknown));
}
