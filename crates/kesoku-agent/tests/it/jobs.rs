//! Background jobs against a real SQLite store and real processes: a job runs to its end and
//! wakes the session once; it outlives a restart of its keeper; it is reported lost when its
//! process was killed while nobody watched; cancel, the move at a timeout, the tools.
//!
//! Nothing here sleeps to assert timing: jobs wait for a `release` file the test creates, and
//! the test polls, within a bound, for what it expects.

use std::sync::Arc;
use std::time::Duration;

use kesoku_agent::jobs::job_tools;
use kesoku_agent::{Jobs, JobsConfig};
use kesoku_broker::MemoryBroker;
use kesoku_core::{
    ActivationKind, ActivationRequest, Job, JobFilter, JobId, JobState, Lane, Message, MessageType, Outcome, Role,
    Session, SessionId, Status,
};
use kesoku_gateway::Gateway;
use kesoku_llm::ScriptStep;
use kesoku_store::StoreHandle;
use kesoku_tools::{RUN_SHELL_COMMAND, Registry, ToolContext, ToolOrigin, ToolOutput, ToolsConfig};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::json;
use tempfile::TempDir;

use crate::harness::{BOT, CHANNEL, Harness, Options};

/// How long a test waits for something it expects before failing.
const PATIENCE: Duration = Duration::from_secs(20);

/// A job that prints `before`, waits for the file `release` in the workspace, prints `after`
/// and exits with `code`.
fn held_job(code: i32) -> String {
    format!("echo before; while [ ! -e release ]; do sleep 0.05; done; echo after; exit {code}")
}

/// A store, a session with one user message (the turn jobs are started from), a job keeper and
/// the tools over it.
struct Fixture {
    dir: TempDir,
    handle: StoreHandle,
    gateway: Gateway,
    session: Session,
    root: Message,
    jobs: Jobs,
    registry: Registry,
}

fn config() -> JobsConfig {
    JobsConfig { kill_grace: Duration::from_secs(1), poll_interval: Duration::from_millis(50), ..JobsConfig::default() }
}

fn registry_over(jobs: &Jobs) -> Registry {
    let mut registry = kesoku_tools::builtin_registry_with_background(&ToolsConfig::default(), Arc::new(jobs.clone()));
    for tool in job_tools(jobs) {
        registry.register_shared(tool).expect("register a job tool");
    }
    registry
}

impl Fixture {
    async fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("kesoku.db").display());
        let handle = kesoku_store::open(&url).await.expect("open store");
        let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
        let session = gateway.resolve_session(BOT, CHANNEL).await.expect("session");
        let root = Message::user_text(&session.id, BOT, CHANNEL, "Chii", "run it in the background");
        let root = gateway.post(&root).await.expect("post").message;
        std::fs::create_dir_all(dir.path().join("workspace")).expect("workspace");
        let jobs = Jobs::new(gateway.clone(), dir.path().join("workspace"), config());
        let registry = registry_over(&jobs);
        Fixture { dir, handle, gateway, session, root, jobs, registry }
    }

    fn workspace(&self) -> std::path::PathBuf {
        self.dir.path().join("workspace")
    }

    /// A tool context of the fixture's turn, in `session`.
    fn ctx_in(&self, session: &SessionId) -> ToolContext {
        let staging = self.workspace().join("sessions").join(session.as_str());
        ToolContext::new(self.workspace(), staging, session.clone(), "call_1").with_origin(ToolOrigin {
            message_id: self.root.id.clone(),
            chatbot_id: BOT.to_owned(),
            channel_id: CHANNEL.to_owned(),
            timezone: None,
            depth: 0,
            activation_id: None,
        })
    }

    fn ctx(&self) -> ToolContext {
        self.ctx_in(&self.session.id)
    }

    async fn call(&self, tool: &str, arguments: serde_json::Value) -> ToolOutput {
        self.registry.call(tool, &self.ctx(), arguments).await
    }

    /// Start `command` as a background job; the job's row.
    async fn start(&self, command: &str) -> Job {
        let output = self.call(RUN_SHELL_COMMAND, json!({ "command": command, "background": true })).await;
        assert_eq!(output.error, None, "{}", output.content);
        let job = self.newest_job().await;
        assert!(output.content.starts_with(&format!("Background job {} started (pid ", job.id)), "{}", output.content);
        job
    }

    async fn newest_job(&self) -> Job {
        let filter = JobFilter { session_id: Some(self.session.id.clone()), ..JobFilter::default() };
        let jobs = self.handle.store.list_jobs(&filter).await.expect("list jobs");
        jobs.into_iter().next().expect("a job was stored")
    }

    async fn job(&self, id: &JobId) -> Job {
        self.handle.store.get_job(id).await.expect("read job").expect("job exists")
    }

    /// Wait for the job's wakeup alert.
    async fn alert(&self, job: &Job) -> Message {
        let id = job.alert_message_id();
        wait_for(&format!("the alert of {}", job.id), || async {
            self.handle.store.get_message(&id).await.expect("read message")
        })
        .await
    }

    /// Wait until the job's row leaves `running`.
    async fn ended(&self, id: &JobId) -> Job {
        wait_for(&format!("{id} to end"), || async {
            let job = self.job(id).await;
            (job.state != JobState::Running).then_some(job)
        })
        .await
    }

    /// Wait until the job's stdout log holds `text`.
    async fn wait_output(&self, job: &Job, text: &str) {
        wait_for(&format!("`{text}` in {}", job.stdout_path), || async {
            std::fs::read_to_string(&job.stdout_path).ok().filter(|out| out.contains(text)).map(|_| ())
        })
        .await;
    }

    fn release(&self) {
        std::fs::write(self.workspace().join("release"), "").expect("release the held jobs");
    }

    /// The wakeup alerts stored for the session.
    async fn alerts(&self) -> Vec<Message> {
        let history = self.handle.store.session_history(&self.session.id).await.expect("history");
        history.into_iter().filter(|m| m.content.starts_with("[System Alert] Background Job")).collect()
    }
}

async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `pid` names a live process (not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(false)
}

fn expected_activation(job: &Job) -> ActivationRequest {
    ActivationRequest {
        kind: ActivationKind::BackgroundJobResult,
        job_id: Some(job.id.clone()),
        ..ActivationRequest::new(ActivationKind::BackgroundJobResult)
    }
}

#[tokio::test]
async fn a_background_job_runs_to_its_end_and_its_alert_is_posted_once() {
    let f = Fixture::new().await;
    let job = f.start("echo out; echo err >&2; exit 3").await;
    assert_eq!(job.state, JobState::Running);
    assert_eq!((job.session_id.clone(), job.message_id.clone()), (f.session.id.clone(), f.root.id.clone()));
    assert!(
        job.stdout_path.ends_with(&format!("sessions/{}/jobs/{}.out", f.session.id, job.id)),
        "{}",
        job.stdout_path
    );

    let alert = f.alert(&job).await;
    // The spec's Background Wakeup Alert row: system/text, sender System, pending_agent, routed
    // like the message that started the job, a root of its own, asking for a job-result turn.
    assert_eq!(
        (alert.role, alert.message_type, alert.sender.as_str(), alert.status),
        (Role::System, MessageType::Text, "System", Status::PendingAgent)
    );
    assert_eq!((alert.chatbot_id.as_str(), alert.channel_id.as_str()), (BOT, CHANNEL));
    assert_eq!((alert.session_id.clone(), alert.parent_id.clone()), (f.session.id.clone(), None));
    assert_eq!(alert.metadata.activation.as_deref(), Some(&expected_activation(&job)));
    let headline = format!("[System Alert] Background Job {} finished with exit code 3 after ", job.id);
    assert!(alert.content.starts_with(&headline), "{}", alert.content);
    assert!(alert.content.contains("s: `echo out; echo err >&2; exit 3`\n"), "{}", alert.content);
    assert!(alert.content.contains("=== STDOUT ===\nout\n=== STDERR ===\nerr\n"), "{}", alert.content);
    assert!(alert.content.contains(&format!("sessions/{}/jobs/{}.out (stdout)", f.session.id, job.id)));

    let ended = f.ended(&job.id).await;
    assert_eq!((ended.state, ended.exit_code, ended.detail.as_deref()), (JobState::Exited, Some(3), None));
    assert!(ended.finished_at.is_some_and(|at| at >= ended.started_at));

    // A keeper starting later finds nothing left to report.
    let later = Jobs::new(f.gateway.clone(), f.workspace(), config());
    assert_eq!(later.recover().await.expect("recover"), kesoku_agent::JobsRecovery::default());
    assert_eq!(f.alerts().await.len(), 1);
}

#[tokio::test]
async fn commands_are_run_verbatim_and_a_signal_shows_as_128_plus_its_number() {
    let f = Fixture::new().await;
    let quoted = f.start(r#"printf '%s\n' "a \"b\" \$HOME 'c'" ; echo "$STAGING_DIR" >&2"#).await;
    f.ended(&quoted.id).await;
    assert_eq!(std::fs::read_to_string(&quoted.stdout_path).expect("stdout"), "a \"b\" $HOME 'c'\n");
    let staging = std::fs::read_to_string(&quoted.stderr_path).expect("stderr");
    assert!(staging.trim_end().ends_with(&format!("sessions/{}", f.session.id)), "{staging}");

    let killed = f.start("kill -9 $$").await;
    let ended = f.ended(&killed.id).await;
    assert_eq!(ended.state, JobState::Exited);
    assert_eq!(ended.exit_code, Some(137));
    assert_eq!(ended.detail.as_deref(), Some("exit code 137: probably killed by signal 9 (SIGKILL)"));
    let alert = f.alert(&killed).await;
    assert!(alert.content.contains("finished with exit code 137 after"), "{}", alert.content);
}

#[tokio::test]
async fn the_wakeup_alert_starts_a_background_job_result_turn_on_the_responsive_lane() {
    let mut h = Harness::start(vec![
        ScriptStep::tool_call(RUN_SHELL_COMMAND, json!({ "command": "echo built", "background": true })),
        ScriptStep::text("It runs in the background."),
        ScriptStep::text("The build is done."),
    ])
    .await;
    h.shut_down().await;
    let jobs = Jobs::new(h.gateway.clone(), h.dir.path().join("workspace"), config());
    h.reboot(Options { tools: Some(Arc::new(registry_over(&jobs))), ..Options::default() }).await;

    let root = h.post_user("build it in the background").await;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);
    let filter = JobFilter { session_id: Some(h.session.id.clone()), ..JobFilter::default() };
    let job = h.handle.store.list_jobs(&filter).await.expect("jobs").into_iter().next().expect("a job");
    assert_eq!(job.message_id, root.id);

    let alert_id = job.alert_message_id();
    let alert = h.wait_for(|m| m.id == alert_id).await;
    assert_eq!(h.wait_terminal(&alert.id).await, Status::Processed);
    let ledger = h.finished_ledger_for(&alert.id).await;
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(
        (ledger[0].kind, ledger[0].lane, ledger[0].outcome, ledger[0].triggered_by.as_str()),
        (ActivationKind::BackgroundJobResult, Lane::Responsive, Some(Outcome::Succeeded), &*format!("job:{}", job.id))
    );
    let answer = h.wait_for(|m| m.parent_id.as_ref() == Some(&alert.id) && m.role == Role::Assistant).await;
    assert_eq!(answer.content, "The build is done.");
    // The model read the alert as the newest user turn.
    let requests = h.model.requests();
    let last = requests.last().expect("a request for the alert's turn");
    let shown = format!("{:?}", last.turns.last().expect("a last turn"));
    assert!(shown.contains("[System Alert] Background Job"), "{shown}");
    assert!(shown.contains("built"), "{shown}");
    jobs.shutdown().await;
}

#[tokio::test]
async fn a_job_that_outlives_a_restart_is_adopted_and_reported() {
    let f = Fixture::new().await;
    let job = f.start(&held_job(7)).await;
    f.wait_output(&job, "before").await;
    f.jobs.shutdown().await;
    assert_eq!(f.job(&job.id).await.state, JobState::Running, "stopping the keeper leaves the job running");

    let restarted = Jobs::new(f.gateway.clone(), f.workspace(), config());
    let recovery = restarted.recover().await.expect("recover");
    assert_eq!(recovery.adopted, vec![job.id.clone()]);
    assert!(recovery.ended.is_empty() && recovery.lost.is_empty(), "{recovery:?}");

    f.release();
    let alert = f.alert(&job).await;
    assert!(alert.content.contains("finished with exit code 7 after"), "{}", alert.content);
    assert!(alert.content.contains("=== STDOUT ===\nbefore\nafter\n"), "{}", alert.content);
    let ended = f.ended(&job.id).await;
    assert_eq!((ended.state, ended.exit_code), (JobState::Exited, Some(7)));
    restarted.shutdown().await;
    assert_eq!(f.alerts().await.len(), 1);
}

#[tokio::test]
async fn a_job_that_ended_while_nobody_watched_is_reported_from_its_exit_status() {
    let f = Fixture::new().await;
    let job = f.start(&held_job(5)).await;
    f.wait_output(&job, "before").await;
    f.jobs.shutdown().await;
    f.release();
    let pid = job.pid.expect("pid");
    wait_for("the job to end", || async { (!alive(pid)).then_some(()) }).await;

    let restarted = Jobs::new(f.gateway.clone(), f.workspace(), config());
    let recovery = restarted.recover().await.expect("recover");
    assert_eq!(recovery.ended, vec![job.id.clone()]);
    let ended = f.job(&job.id).await;
    assert_eq!((ended.state, ended.exit_code), (JobState::Exited, Some(5)));
    let alert = f.alert(&job).await;
    assert!(alert.content.contains("finished with exit code 5 after"), "{}", alert.content);
}

#[tokio::test]
async fn a_job_killed_while_nobody_watched_is_reported_lost_with_its_last_output() {
    let f = Fixture::new().await;
    let job = f.start("echo last words; echo oops >&2; while true; do sleep 0.05; done").await;
    f.wait_output(&job, "last words").await;
    f.jobs.shutdown().await;
    let pid = job.pid.expect("pid");
    killpg(Pid::from_raw(pid), Signal::SIGKILL).expect("kill the job's group");
    wait_for("the job to die", || async { (!alive(pid)).then_some(()) }).await;

    let restarted = Jobs::new(f.gateway.clone(), f.workspace(), config());
    let recovery = restarted.recover().await.expect("recover");
    assert_eq!(recovery.lost, vec![job.id.clone()]);

    let lost = f.job(&job.id).await;
    assert_eq!((lost.state, lost.exit_code), (JobState::Lost, None));
    assert_eq!(
        lost.detail.as_deref(),
        Some("the process was gone when the service restarted, and it left no exit status")
    );
    let alert = f.alert(&job).await;
    assert_eq!(alert.metadata.activation.as_deref(), Some(&expected_activation(&job)));
    assert_eq!(alert.status, Status::PendingAgent);
    let headline = format!("[System Alert] Background Job {} was lost after running at least ", job.id);
    assert!(alert.content.starts_with(&headline), "{}", alert.content);
    assert!(alert.content.contains("(the process was gone when the service restarted"), "{}", alert.content);
    assert!(alert.content.contains("=== STDOUT ===\nlast words\n=== STDERR ===\noops\n"), "{}", alert.content);
}

#[tokio::test]
async fn an_alert_posted_before_a_crash_is_not_posted_again() {
    let f = Fixture::new().await;
    let job = f.start(&held_job(0)).await;
    f.wait_output(&job, "before").await;
    f.jobs.shutdown().await;
    f.release();
    let pid = job.pid.expect("pid");
    wait_for("the job to end", || async { (!alive(pid)).then_some(()) }).await;
    // The state a crash between posting the alert and marking the row leaves: the alert is
    // stored, the row still says running.
    let mut posted =
        Message::wakeup_alert(&job.session_id, BOT, CHANNEL, "[System Alert] Background Job (before the crash)");
    posted.id = job.alert_message_id();
    f.gateway.post(&posted).await.expect("post the first alert");

    let restarted = Jobs::new(f.gateway.clone(), f.workspace(), config());
    assert_eq!(restarted.recover().await.expect("recover").ended, vec![job.id.clone()]);
    assert_eq!(f.job(&job.id).await.state, JobState::Exited);
    let alerts = f.alerts().await;
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].content, posted.content);
}

#[tokio::test]
async fn cancel_job_stops_the_whole_group_and_no_alert_follows() {
    let f = Fixture::new().await;
    // The shell ignores SIGTERM, so only the SIGKILL after the grace stops it; its child does not.
    let job = f.start("trap '' TERM; sleep 300 & echo $! > child.pid; echo waiting; wait; wait").await;
    f.wait_output(&job, "waiting").await;
    let child: i32 =
        std::fs::read_to_string(f.workspace().join("child.pid")).expect("child pid").trim().parse().expect("a pid");

    let output = f.call("cancel_job", json!({ "job_id": job.id })).await;
    assert_eq!(output.error, None, "{}", output.content);
    assert!(output.content.starts_with(&format!("Job {} cancelled after ", job.id)), "{}", output.content);
    let cancelled = f.job(&job.id).await;
    assert_eq!(
        (cancelled.state, cancelled.exit_code, cancelled.detail.as_deref()),
        (JobState::Cancelled, None, Some("cancelled by cancel_job"))
    );
    let shell = job.pid.expect("pid");
    wait_for("the job's processes to go", || async { (!alive(shell) && !alive(child)).then_some(()) }).await;
    wait_for("the monitor to see the end", || async { (!f.jobs.is_watching(&job.id)).then_some(()) }).await;
    assert!(f.alerts().await.is_empty(), "a cancelled job is not reported");

    let again = f.call("cancel_job", json!({ "job_id": job.id })).await;
    assert_eq!(
        again.error.as_deref(),
        Some(&*format!(
            "job {} is not running any more: it is cancelled (cancelled by cancel_job); nothing was stopped",
            job.id
        ))
    );
}

#[tokio::test]
async fn a_command_reaching_its_timeout_is_moved_to_the_background_when_asked() {
    let f = Fixture::new().await;
    let output =
        f.call(RUN_SHELL_COMMAND, json!({ "command": held_job(4), "timeout_s": 1, "on_timeout": "background" })).await;
    assert_eq!(output.error, None, "{}", output.content);
    let job = f.newest_job().await;
    assert!(output.content.starts_with("=== STDOUT ===\nbefore\n=== STDERR ===\n[The command reached its timeout and was moved to the background as job "), "{}", output.content);
    assert!(output.content.contains(&job.id.to_string()));
    assert_eq!(output.summary.as_deref(), Some("moved to the background"));
    assert_eq!(job.state, JobState::Running);
    assert_eq!(std::fs::read_to_string(&job.stdout_path).expect("stdout so far"), "before\n");

    f.release();
    let alert = f.alert(&job).await;
    assert!(alert.content.contains("finished with exit code 4 after"), "{}", alert.content);
    let ended = f.ended(&job.id).await;
    assert_eq!((ended.state, ended.exit_code), (JobState::Exited, Some(4)));
    assert_eq!(std::fs::read_to_string(&job.stdout_path).expect("stdout"), "before\nafter\n");
}

#[tokio::test]
async fn a_command_reaching_its_timeout_is_still_killed_by_default() {
    let f = Fixture::new().await;
    let output = f.call(RUN_SHELL_COMMAND, json!({ "command": held_job(0), "timeout_s": 1 })).await;
    assert!(output.error.as_deref().is_some_and(|e| e.starts_with("timed out after 1 s")), "{output:?}");
    let filter = JobFilter { session_id: Some(f.session.id.clone()), ..JobFilter::default() };
    assert!(f.handle.store.list_jobs(&filter).await.expect("jobs").is_empty());
}

#[tokio::test]
async fn job_output_shows_the_end_of_both_logs() {
    let f = Fixture::new().await;
    let job = f.start("i=1; while [ $i -le 100 ]; do echo line $i; i=$((i+1)); done; echo problem >&2").await;
    f.ended(&job.id).await;
    let output = f.call("job_output", json!({ "job_id": job.id, "tail_lines": 3 })).await;
    assert_eq!(output.error, None, "{}", output.content);
    let header = format!("Job {} (exit code 0 after ", job.id);
    assert!(output.content.starts_with(&header), "{}", output.content);
    assert!(
        output.content.ends_with("=== STDOUT (end) ===\nline 98\nline 99\nline 100\n=== STDERR ===\nproblem\n"),
        "{}",
        output.content
    );
}

#[tokio::test]
async fn the_job_tools_see_only_the_calling_sessions_jobs() {
    let f = Fixture::new().await;
    let job = f.start(&held_job(0)).await;
    let other = f.gateway.resolve_session(BOT, "another-channel").await.expect("another session");
    let elsewhere = f.ctx_in(&other.id);

    let unknown = format!(
        "there is no background job `{}` in this conversation; list_jobs shows this conversation's jobs",
        job.id
    );
    let output = f.registry.call("job_output", &elsewhere, json!({ "job_id": job.id })).await;
    assert_eq!(output.error.as_deref(), Some(&*unknown));
    let output = f.registry.call("cancel_job", &elsewhere, json!({ "job_id": job.id })).await;
    assert_eq!(output.error.as_deref(), Some(&*unknown));
    assert_eq!(f.job(&job.id).await.state, JobState::Running, "a refused cancel stops nothing");
    let output = f.registry.call("list_jobs", &elsewhere, json!({})).await;
    assert_eq!(output.content, "This conversation has no background jobs.");

    let output = f.call("list_jobs", json!({})).await;
    let lines: Vec<&str> = output.content.lines().collect();
    assert_eq!(lines[0], "Background jobs of this conversation, newest first (1 running):");
    assert!(lines[1].starts_with(&format!("- {}  running for ", job.id)), "{}", output.content);
    assert!(lines[1].ends_with(&format!("`{}`", held_job(0))), "{}", output.content);
    f.release();
    f.ended(&job.id).await;
}

#[tokio::test]
async fn without_a_turn_a_background_job_is_refused() {
    let f = Fixture::new().await;
    let no_turn = ToolContext::new(f.workspace(), f.workspace().join("sessions/x"), f.session.id.clone(), "call_1");
    let output = f.registry.call(RUN_SHELL_COMMAND, &no_turn, json!({ "command": "true", "background": true })).await;
    assert!(
        output.error.as_deref().is_some_and(|e| e.starts_with("background jobs need a conversation turn")),
        "{output:?}"
    );
}

#[tokio::test]
async fn more_background_jobs_than_the_cap_are_refused_until_one_ends() {
    let mut f = Fixture::new().await;
    f.jobs = Jobs::new(f.gateway.clone(), f.workspace(), JobsConfig { max_running: 2, ..config() });
    f.registry = registry_over(&f.jobs);
    let first = f.start(&held_job(0)).await;
    let second = f.start(&held_job(0)).await;
    let refused = f.call(RUN_SHELL_COMMAND, json!({ "command": "echo third", "background": true })).await;
    let error = refused.error.unwrap_or_default();
    assert!(
        error.starts_with("2 background jobs are running already") && error.contains("max_background_jobs"),
        "{error}"
    );
    let filter = JobFilter { session_id: Some(f.session.id.clone()), ..JobFilter::default() };
    assert_eq!(f.handle.store.list_jobs(&filter).await.expect("list").len(), 2, "the third was not started");
    f.release();
    f.ended(&first.id).await;
    f.ended(&second.id).await;
    let third = f.start("echo third").await;
    assert_eq!(f.ended(&third.id).await.exit_code, Some(0));
}

#[tokio::test]
async fn a_job_started_in_work_for_a_person_wakes_a_turn_for_the_same_person() {
    let mut f = Fixture::new().await;
    let mut root = Message::user_text(&f.session.id, BOT, CHANNEL, "Chii", "build my project in the background");
    root.metadata.activation = Some(Box::new(ActivationRequest {
        delegation_user: Some("alice".into()),
        ..ActivationRequest::new(ActivationKind::Message)
    }));
    f.root = f.gateway.post(&root).await.expect("post the delegated root").message;
    let job = f.start("exit 0").await;
    let alert = f.alert(&job).await;
    let expected = ActivationRequest { delegation_user: Some("alice".into()), ..expected_activation(&job) };
    assert_eq!(alert.metadata.activation.as_deref(), Some(&expected), "the job-result turn runs for alice too");
}
