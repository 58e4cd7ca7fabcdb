//! Background jobs: shell commands that outlive the turn that started them (`run_shell_command`
//! with `background`, or a foreground command moved at its timeout), and the wakeup that
//! tells the session when one ends.
//!
//! [`Jobs`] is the keeper `run_shell_command` hands such commands to (it implements the
//! [`Background`] seam of `kesoku-tools`): it names the job, points its output at
//! `<staging>/jobs/<id>.out` and `.err`, stores a `running` row, and watches the process. When the
//! job ends it posts a Background Wakeup Alert (spec seed 000) whose `metadata.activation` asks
//! for a `background_job_result` activation, then records the end on the row.
//!
//! Invariants:
//! - Jobs outlive turns, the service and restarts: they run in their own process group, with
//!   their output in files and their exit status written to `<id>.exit` by a wrapper shell, so
//!   nothing of theirs depends on this process. Stopping the service stops the watching, never
//!   the jobs. A command moved at its timeout is the exception: its pipes are drained by this
//!   process, so if it still writes after the service stops it dies of SIGPIPE, and it has no
//!   exit-status file; either way it is then reported `lost`.
//! - Alert before row: the alert is posted first, then the row is marked ended. A crash in
//!   between leaves a `running` row whose process is gone; recovery reports it again, and the
//!   alert's id, derived from the job's, makes the second post a no-op ([`StoreError::Duplicate`]).
//! - One alert per job: a job is reported only while its row is `running`, which is re-read
//!   just before reporting. Cancelling marks the row first and signals the process after, so a
//!   cancelled job is never reported.
//! - A pid read back from the store is trusted only when its process started when the job did
//!   (see `process`), so a reused pid is never taken for a job, nor signalled.
//!
//! Not here: turning the alert into an activation (the runtime's intake does, from
//! `metadata.activation`), and the tools' wording of their arguments (`tools`).

mod process;
mod report;
mod tools;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use kesoku_core::{Job, JobEnd, JobFilter, JobId, JobState};
use kesoku_gateway::{Gateway, GatewayError};
use kesoku_store::StoreError;
use kesoku_tools::{Background, DetachedCommand, JobFiles, MovedCommand, ShellConfig, ToolContext};
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::process::Child;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use tools::{CANCEL_JOB, CancelJobTool, JOB_OUTPUT, JobOutputTool, LIST_JOBS, ListJobsTool, job_tools};

/// How a job ended, in words: `exit code 0`, `killed by signal 9 (SIGKILL)`, `cancelled by …`.
pub fn describe_end(job: &Job) -> String {
    report::ending(job)
}

/// Folder of a session's staging folder that holds its jobs' logs and exit statuses.
pub const JOBS_DIR: &str = "jobs";

/// How long to keep reading a moved job's pipes after its shell ended: what is in them arrives
/// at once; only a process that escaped the group can hold them open longer.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Longest wait between attempts to report a job's end while the store fails.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// Settings of the job keeper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsConfig {
    /// Between SIGTERM and SIGKILL when a job is cancelled (`[tools.shell] kill_grace_s`).
    pub kill_grace: Duration,
    /// How often a job adopted after a restart (not a child of this process) is looked at.
    pub poll_interval: Duration,
    /// Lines of each log, and characters of both, quoted in the wakeup alert.
    pub alert_tail_lines: usize,
    pub alert_tail_chars: usize,
    /// Most characters `job_output` returns (`[tools.shell] max_output_chars`).
    pub output_max_chars: usize,
    /// Jobs running at once (`[tools.shell] max_background_jobs`); one more is refused.
    pub max_running: usize,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig::from_shell(&ShellConfig::default())
    }
}

impl JobsConfig {
    /// The settings that follow `[tools.shell]`.
    pub fn from_shell(shell: &ShellConfig) -> Self {
        JobsConfig {
            kill_grace: Duration::from_secs(shell.kill_grace_s),
            poll_interval: Duration::from_secs(1),
            alert_tail_lines: 40,
            alert_tail_chars: 4_000,
            max_running: shell.max_background_jobs.max(1),
            output_max_chars: shell.max_output_chars.max(500),
        }
    }
}

/// What went wrong keeping jobs.
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error("no background job `{0}`: list them with `kesoku jobs` (or the list_jobs tool)")]
    NotFound(JobId),
    #[error("background job `{}` is not running: it is {} ({})", .0.id, .0.state, report::ending(.0))]
    NotRunning(Box<Job>),
}

/// What [`Jobs::recover`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobsRecovery {
    /// Still running: watched again.
    pub adopted: Vec<JobId>,
    /// Ended while nobody watched (an exit status was left): reported.
    pub ended: Vec<JobId>,
    /// Gone without an exit status: reported lost.
    pub lost: Vec<JobId>,
}

/// The job keeper of one service. Cheap to clone; clones share the monitors.
#[derive(Clone)]
pub struct Jobs {
    inner: Arc<Inner>,
}

struct Inner {
    gateway: Gateway,
    workspace: PathBuf,
    config: JobsConfig,
    /// Stops the monitors (never the jobs).
    shutdown: CancellationToken,
    monitors: TaskTracker,
    /// Jobs a monitor of this keeper watches, so that recovery does not watch one twice.
    /// A short critical section (insert, remove, lookup), never held across an await.
    watched: Mutex<HashSet<JobId>>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs").field("workspace", &self.inner.workspace).finish_non_exhaustive()
    }
}

/// How a watched process was seen to end.
#[derive(Debug, Clone, Copy)]
enum Ended {
    /// A child of this process, waited for: the wrapper shell of a job started here, or the
    /// shell of a moved command (`moved`, which has no exit-status file).
    Waited { status: std::process::ExitStatus, moved: bool },
    /// Found gone by looking (a job adopted after a restart); `at_restart` when it was gone
    /// already when the service came back.
    Gone { at_restart: bool },
}

/// How a monitor follows its job.
enum Watch {
    Child { child: Box<Child>, moved: bool, drains: Vec<JoinHandle<()>> },
    Poll,
}

impl Jobs {
    /// A keeper posting through `gateway`; `workspace` is the folder log paths are shown relative
    /// to. Nothing runs until a job is started or [`Jobs::recover`] is called.
    pub fn new(gateway: Gateway, workspace: impl Into<PathBuf>, config: JobsConfig) -> Self {
        Jobs {
            inner: Arc::new(Inner {
                gateway,
                workspace: workspace.into(),
                config,
                shutdown: CancellationToken::new(),
                monitors: TaskTracker::new(),
                watched: Mutex::new(HashSet::new()),
            }),
        }
    }

    pub fn config(&self) -> &JobsConfig {
        &self.inner.config
    }

    /// At start-up: every `running` job is either watched again (its process still runs) or
    /// reported now, through the same wakeup alert: as ended with the exit status it left, or
    /// as lost when it left none.
    pub async fn recover(&self) -> Result<JobsRecovery, JobsError> {
        let running =
            self.store().list_jobs(&JobFilter { state: Some(JobState::Running), ..JobFilter::default() }).await?;
        let mut recovery = JobsRecovery::default();
        for job in running {
            if self.is_watching(&job.id) {
                continue;
            }
            if process::is_running(&job) {
                recovery.adopted.push(job.id.clone());
                self.watch(job, Watch::Poll);
                continue;
            }
            match process::read_exit_status(&process::exit_status_path(&job)) {
                Some(_) => recovery.ended.push(job.id.clone()),
                None => recovery.lost.push(job.id.clone()),
            }
            self.report(&job, Ended::Gone { at_restart: true }).await?;
        }
        if !recovery.adopted.is_empty() || !recovery.ended.is_empty() || !recovery.lost.is_empty() {
            tracing::info!(
                adopted = recovery.adopted.len(),
                ended = recovery.ended.len(),
                lost = recovery.lost.len(),
                "background jobs recovered"
            );
        }
        Ok(recovery)
    }

    /// Stop watching (the jobs keep running) and wait for the monitors to end. Jobs ending
    /// from now on are reported by the next [`Jobs::recover`].
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.monitors.close();
        self.inner.monitors.wait().await;
    }

    /// Jobs matching `filter`, newest first.
    pub async fn list(&self, filter: &JobFilter) -> Result<Vec<Job>, JobsError> {
        Ok(self.store().list_jobs(filter).await?)
    }

    pub async fn get(&self, id: &JobId) -> Result<Job, JobsError> {
        self.store().get_job(id).await?.ok_or_else(|| JobsError::NotFound(id.clone()))
    }

    /// Cancel a running job: mark its row `cancelled` (so no alert is posted for it), then
    /// SIGTERM its process group and SIGKILL it after the kill grace. `by` says who asked
    /// (`cancel_job`, `kesoku jobs cancel`). Returns the row as it is now.
    pub async fn cancel(&self, id: &JobId, by: &str) -> Result<Job, JobsError> {
        let job = self.get(id).await?;
        if job.state != JobState::Running {
            return Err(JobsError::NotRunning(Box::new(job)));
        }
        let end = JobEnd {
            state: JobState::Cancelled,
            exit_code: None,
            detail: Some(format!("cancelled by {by}")),
            finished_at: Utc::now(),
        };
        if !self.store().finish_job(id, &end).await? {
            return Err(JobsError::NotRunning(Box::new(self.get(id).await?)));
        }
        let killed = if process::is_running(&job) {
            process::stop_group(&job, self.inner.config.kill_grace).await
        } else {
            false
        };
        tracing::info!(job_id = %id, by, killed, "background job cancelled");
        self.get(id).await
    }

    /// The end of a job's logs, labelled, at most `lines` lines of each.
    pub fn output(&self, job: &Job, lines: usize) -> String {
        report::logs_tail(job, report::Tail { lines, chars: self.inner.config.output_max_chars })
    }

    /// A path as the model should read it: relative to the workspace when inside it.
    fn shown_path(&self, path: &Path) -> String {
        match path.strip_prefix(&self.inner.workspace) {
            Ok(relative) if !relative.as_os_str().is_empty() => relative.display().to_string(),
            Ok(_) | Err(_) => path.display().to_string(),
        }
    }

    /// Both log paths in one phrase.
    fn shown_logs(&self, job: &Job) -> String {
        format!(
            "{} (stdout) and {} (stderr)",
            self.shown_path(Path::new(&job.stdout_path)),
            self.shown_path(Path::new(&job.stderr_path))
        )
    }

    fn store(&self) -> &Arc<dyn kesoku_store::Store> {
        self.inner.gateway.store()
    }

    /// Whether a monitor of this keeper watches `id` (until its end is reported, or shutdown).
    pub fn is_watching(&self, id: &JobId) -> bool {
        lock(&self.inner.watched).contains(id)
    }

    /// Watch `job` on a monitor task until it ends (then report it) or the keeper shuts down.
    fn watch(&self, job: Job, watch: Watch) {
        if !lock(&self.inner.watched).insert(job.id.clone()) {
            return;
        }
        let jobs = self.clone();
        self.inner.monitors.spawn(async move {
            let id = job.id.clone();
            if let Some(ended) = jobs.wait_for_end(&job, watch).await {
                jobs.report_until_done(&job, ended).await;
            }
            lock(&jobs.inner.watched).remove(&id);
        });
    }

    /// How the job ended; `None` when the keeper shut down first.
    async fn wait_for_end(&self, job: &Job, watch: Watch) -> Option<Ended> {
        let shutdown = &self.inner.shutdown;
        match watch {
            Watch::Child { mut child, moved, drains } => {
                let status = tokio::select! {
                    () = shutdown.cancelled() => return None,
                    status = child.wait() => status,
                };
                // Let the drains write the last output before the alert quotes it.
                let drained = futures::future::join_all(drains);
                if tokio::time::timeout(DRAIN_GRACE, drained).await.is_err() {
                    tracing::debug!(job_id = %job.id, "a moved job's pipes stayed open after it ended; its later output is not kept");
                }
                match status {
                    Ok(status) => Some(Ended::Waited { status, moved }),
                    // Waiting failed (it should not): look for the process instead.
                    Err(error) => {
                        tracing::warn!(job_id = %job.id, %error, "waiting for a background job failed; watching its pid instead");
                        self.poll_until_gone(job).await
                    }
                }
            }
            Watch::Poll => self.poll_until_gone(job).await,
        }
    }

    async fn poll_until_gone(&self, job: &Job) -> Option<Ended> {
        loop {
            if !process::is_running(job) {
                return Some(Ended::Gone { at_restart: false });
            }
            tokio::select! {
                () = self.inner.shutdown.cancelled() => return None,
                () = tokio::time::sleep(self.inner.config.poll_interval) => {}
            }
        }
    }

    /// Report the end, retrying while the store fails, until done or shut down (recovery then
    /// reports it at the next start).
    async fn report_until_done(&self, job: &Job, ended: Ended) {
        let mut delay = Duration::from_secs(1);
        loop {
            match self.report(job, ended).await {
                Ok(()) => return,
                Err(error) => {
                    tracing::warn!(job_id = %job.id, %error, retry_in_s = delay.as_secs(), "reporting a background job's end failed");
                }
            }
            tokio::select! {
                () = self.inner.shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(MAX_RETRY_DELAY);
        }
    }

    /// Post the wakeup alert for a job that ended, then mark its row. Nothing when the row is
    /// no longer `running` (cancelled, or reported by someone else).
    async fn report(&self, job: &Job, ended: Ended) -> Result<(), JobsError> {
        let Some(current) = self.store().get_job(&job.id).await? else {
            tracing::warn!(job_id = %job.id, "a watched background job has no row any more; not reported");
            return Ok(());
        };
        if current.state != JobState::Running {
            return Ok(());
        }
        let end = resolve_end(&current, &ended);
        let tail =
            report::Tail { lines: self.inner.config.alert_tail_lines, chars: self.inner.config.alert_tail_chars };
        let mut alert = report::wakeup_alert(&current, &end, tail, &self.shown_logs(&current));
        crate::grants::inherit_delegation_user(self.store().as_ref(), &current.message_id, &mut alert).await?;
        match self.inner.gateway.post(&alert).await {
            Ok(_) => {}
            // Posted before a crash or by another process: the alert exists once, as it should.
            Err(GatewayError::Store(StoreError::Duplicate { .. })) => {}
            Err(error) => return Err(error.into()),
        }
        self.store().finish_job(&current.id, &end).await?;
        tracing::info!(job_id = %current.id, state = %end.state, exit_code = ?end.exit_code, "background job ended");
        Ok(())
    }

    /// Files for a new job in the session's staging folder.
    fn job_files(ctx: &ToolContext, id: &JobId) -> Result<(PathBuf, PathBuf, PathBuf), String> {
        let folder = ctx.staging_path().join(JOBS_DIR);
        std::fs::create_dir_all(&folder)
            .map_err(|error| format!("could not create the jobs folder `{}`: {error}", folder.display()))?;
        Ok((folder.join(format!("{id}.out")), folder.join(format!("{id}.err")), folder.join(format!("{id}.exit"))))
    }

    fn new_row(&self, ctx: &ToolContext, id: JobId, command: &str, pid: i32, paths: (&Path, &Path)) -> Option<Job> {
        let origin = ctx.origin.as_ref()?;
        Some(Job {
            id,
            session_id: ctx.session_id.clone(),
            chatbot_id: origin.chatbot_id.clone(),
            channel_id: origin.channel_id.clone(),
            message_id: origin.message_id.clone(),
            command: command.to_owned(),
            pid: Some(pid),
            stdout_path: paths.0.display().to_string(),
            stderr_path: paths.1.display().to_string(),
            state: JobState::Running,
            exit_code: None,
            detail: None,
            started_at: Utc::now(),
            finished_at: None,
        })
    }

    /// What the model is told about a job it now has.
    fn started_text(&self, job: &Job) -> String {
        format!(
            "Background job {id} started (pid {pid}).\nIts output goes to {logs}. Read the end of it with \
             job_output(job_id=\"{id}\"); list_jobs lists this conversation's jobs and cancel_job stops one.\n\
             When it ends you will be woken by a system alert with its exit code and the end of its output, so \
             there is no need to poll it.",
            id = job.id,
            pid = job.pid.unwrap_or_default(),
            logs = self.shown_logs(job),
        )
    }
}

/// How `job` ended, from the exit-status file it left (which wins: it is the command's own
/// status), else from how its process was seen to end.
fn resolve_end(job: &Job, ended: &Ended) -> JobEnd {
    use std::os::unix::process::ExitStatusExt;

    let now = Utc::now();
    let exited = |code: i32, at: Option<chrono::DateTime<Utc>>| JobEnd {
        state: JobState::Exited,
        exit_code: Some(code),
        detail: report::exit_detail(code),
        finished_at: at.unwrap_or(now).max(job.started_at),
    };
    let moved = matches!(ended, Ended::Waited { moved: true, .. });
    if !moved && let Some((code, written_at)) = process::read_exit_status(&process::exit_status_path(job)) {
        return exited(code, written_at);
    }
    match ended {
        Ended::Waited { status, moved } => match (status.code(), status.signal()) {
            // A moved command's shell is the command: its status is the job's.
            (Some(code), _) if *moved => exited(code, None),
            (_, Some(signal)) => JobEnd {
                state: JobState::Exited,
                exit_code: None,
                detail: Some(format!("killed by {}", process::describe_signal(signal))),
                finished_at: now,
            },
            (Some(_), None) | (None, None) => JobEnd {
                state: JobState::Lost,
                exit_code: None,
                detail: Some("the job's shell ended without writing the command's exit status".to_owned()),
                finished_at: now,
            },
        },
        Ended::Gone { at_restart: true } => JobEnd {
            state: JobState::Lost,
            exit_code: None,
            detail: Some("the process was gone when the service restarted, and it left no exit status".to_owned()),
            finished_at: now,
        },
        Ended::Gone { at_restart: false } => JobEnd {
            state: JobState::Lost,
            exit_code: None,
            detail: Some(
                "the process ended without leaving an exit status (killed, or moved from a foreground call and \
                 cut off from its output when the service stopped)"
                    .to_owned(),
            ),
            finished_at: now,
        },
    }
}

#[async_trait]
impl Background for Jobs {
    async fn start(&self, ctx: &ToolContext, command: DetachedCommand) -> Result<String, String> {
        if ctx.origin.is_none() {
            return Err("background jobs need a conversation turn to report to; this call belongs to none".to_owned());
        }
        let running = self
            .store()
            .list_jobs(&JobFilter { state: Some(JobState::Running), ..JobFilter::default() })
            .await
            .map_err(|error| {
                format!("could not count the running background jobs ({error}); the command was not started")
            })?;
        if running.len() >= self.inner.config.max_running {
            return Err(format!(
                "{} background jobs are running already, the most `[tools.shell] max_background_jobs` allows; wait \
                 for one to end (list_jobs), cancel one (cancel_job), or run this command in the foreground",
                running.len()
            ));
        }
        let id = JobId::generate();
        let (stdout_path, stderr_path, exit_path) = Jobs::job_files(ctx, &id)?;
        let create = |path: &Path| {
            std::fs::File::create(path)
                .map_err(|error| format!("could not create the log `{}`: {error}", path.display()))
        };
        let files = JobFiles { stdout: create(&stdout_path)?, stderr: create(&stderr_path)?, exit_status: exit_path };
        let child = command.spawn(files).map_err(|error| format!("could not start the command: {error}"))?;
        let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) else {
            return Err("the command started but its process id could not be read; it is not watched".to_owned());
        };
        let Some(job) = self.new_row(ctx, id, command.command(), pid, (&stdout_path, &stderr_path)) else {
            return Err("background jobs need a conversation turn to report to; this call belongs to none".to_owned());
        };
        if let Err(error) = self.store().insert_job(&job).await {
            process::stop_group(&job, Duration::ZERO).await;
            return Err(format!("could not record the background job ({error}); the command was stopped"));
        }
        tracing::info!(job_id = %job.id, pid, session_id = %job.session_id, "background job started");
        let text = self.started_text(&job);
        self.watch(job, Watch::Child { child: Box::new(child), moved: false, drains: Vec::new() });
        Ok(text)
    }

    async fn adopt(&self, ctx: &ToolContext, moved: MovedCommand) -> Result<String, String> {
        let id = JobId::generate();
        let prepared = Jobs::job_files(ctx, &id).and_then(|(stdout_path, stderr_path, _)| {
            let write = |path: &Path, text: &str| {
                std::fs::write(path, text)
                    .map_err(|error| format!("could not write the log `{}`: {error}", path.display()))
            };
            write(&stdout_path, &moved.stdout_so_far)?;
            write(&stderr_path, &moved.stderr_so_far)?;
            Ok((stdout_path, stderr_path))
        });
        let (stdout_path, stderr_path) = match prepared {
            Ok(paths) => paths,
            Err(error) => {
                moved.kill();
                return Err(format!("{error}; the command was stopped"));
            }
        };
        let Some(mut job) = self.new_row(ctx, id, &moved.command, moved.pid, (&stdout_path, &stderr_path)) else {
            moved.kill();
            return Err("background jobs need a conversation turn to report to; the command was stopped".to_owned());
        };
        job.started_at = chrono::Duration::from_std(moved.running_for)
            .ok()
            .and_then(|running_for| job.started_at.checked_sub_signed(running_for))
            .unwrap_or(job.started_at);
        let MovedCommand { child, stdout, stderr, .. } = moved;
        // Drain from now on, so the command never blocks on a full pipe.
        let drains = vec![self.spawn_drain(stdout, stdout_path.clone()), self.spawn_drain(stderr, stderr_path.clone())];
        if let Err(error) = self.store().insert_job(&job).await {
            process::stop_group(&job, Duration::ZERO).await;
            return Err(format!("could not record the background job ({error}); the command was stopped"));
        }
        tracing::info!(job_id = %job.id, pid = ?job.pid, session_id = %job.session_id, "command moved to the background at its timeout");
        let text = format!(
            "The command reached its timeout and was moved to the background as job {id}, still running (as asked \
             with on_timeout). Its output so far and from now on goes to {logs}; read it with \
             job_output(job_id=\"{id}\"). When it ends you will be woken by a system alert. Its output passes \
             through the service: if the service restarts before the job ends, the job is reported lost.",
            id = job.id,
            logs = self.shown_logs(&job),
        );
        self.watch(job, Watch::Child { child: Box::new(child), moved: true, drains });
        Ok(text)
    }
}

impl Jobs {
    /// Copy a moved command's pipe into its log until the pipe ends or the keeper shuts down.
    fn spawn_drain(&self, pipe: Option<Box<dyn AsyncRead + Send + Unpin>>, path: PathBuf) -> JoinHandle<()> {
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            let Some(mut pipe) = pipe else { return };
            let mut log: Box<dyn tokio::io::AsyncWrite + Send + Unpin> = match tokio::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .await
            {
                Ok(file) => Box::new(file),
                Err(error) => {
                    // Still read the pipe: a command blocked on a full pipe would never end.
                    tracing::warn!(path = %path.display(), %error, "cannot append to a moved job's log; its output is dropped");
                    Box::new(tokio::io::sink())
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => {}
                result = tokio::io::copy(&mut pipe, &mut log) => {
                    if let Err(error) = result {
                        tracing::warn!(path = %path.display(), %error, "copying a moved job's output failed");
                    }
                }
            }
            let _ = log.flush().await;
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
