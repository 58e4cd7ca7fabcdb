//! The job tools the model calls: `list_jobs`, `job_output`, `cancel_job`. Each sees only the
//! jobs of the calling session; a job of another session is answered as unknown.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use kesoku_core::{Job, JobFilter, JobId, JobState};
use kesoku_tools::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::report::{duration, ending, local_time, shown_command};
use super::{Jobs, JobsError};

pub const LIST_JOBS: &str = "list_jobs";
pub const JOB_OUTPUT: &str = "job_output";
pub const CANCEL_JOB: &str = "cancel_job";

/// Most jobs `list_jobs` shows.
const LIST_LIMIT: u32 = 50;
/// `job_output`'s default and largest `tail_lines`.
const DEFAULT_TAIL_LINES: usize = 50;
const MAX_TAIL_LINES: usize = 1_000;

/// The three job tools over `jobs`.
pub fn job_tools(jobs: &Jobs) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ListJobsTool::new(jobs.clone())),
        Arc::new(JobOutputTool::new(jobs.clone())),
        Arc::new(CancelJobTool::new(jobs.clone())),
    ]
}

/// `list_jobs`: this session's background jobs, newest first.
pub struct ListJobsTool {
    jobs: Jobs,
    spec: ToolSpec,
}

/// `job_output`: the end of a job's logs.
pub struct JobOutputTool {
    jobs: Jobs,
    spec: ToolSpec,
}

/// `cancel_job`: stop a running job.
pub struct CancelJobTool {
    jobs: Jobs,
    spec: ToolSpec,
}

impl ListJobsTool {
    pub fn new(jobs: Jobs) -> Self {
        let spec = ToolSpec {
            name: LIST_JOBS.to_owned(),
            description: format!(
                "List the background jobs of this conversation (started with run_shell_command and \
                 `background: true`), newest first, at most {LIST_LIMIT}: id, state (running, exited, lost, \
                 cancelled), when it started, how it ended, and the command."
            ),
            parameters: json!({ "type": "object", "properties": {} }),
        };
        ListJobsTool { jobs, spec }
    }
}

impl JobOutputTool {
    pub fn new(jobs: Jobs) -> Self {
        let spec = ToolSpec {
            name: JOB_OUTPUT.to_owned(),
            description: format!(
                "Show the end of a background job's output (stdout and stderr, labelled) and its state; works \
                 while it runs and after it ended. At most {} characters; read the log files named in the \
                 result with read_file for more.",
                jobs.config().output_max_chars
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "job_id": { "type": "string", "description": "The job's id, e.g. `job_01j…` (see list_jobs)." },
                    "tail_lines": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_TAIL_LINES,
                        "description": format!("Lines from the end of each stream (default {DEFAULT_TAIL_LINES}).")
                    }
                },
                "required": ["job_id"]
            }),
        };
        JobOutputTool { jobs, spec }
    }
}

impl CancelJobTool {
    pub fn new(jobs: Jobs) -> Self {
        let spec = ToolSpec {
            name: CANCEL_JOB.to_owned(),
            description: format!(
                "Stop a running background job of this conversation: its processes get SIGTERM, then SIGKILL \
                 after {} s if still running. No wakeup alert follows for a cancelled job.",
                jobs.config().kill_grace.as_secs()
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "job_id": { "type": "string", "description": "The job's id (see list_jobs)." }
                },
                "required": ["job_id"]
            }),
        };
        CancelJobTool { jobs, spec }
    }
}

#[derive(Deserialize)]
struct JobOutputParams {
    job_id: String,
    #[serde(default)]
    tail_lines: Option<usize>,
}

#[derive(Deserialize)]
struct CancelJobParams {
    job_id: String,
}

fn parse<T: DeserializeOwned>(tool: &str, arguments: Value) -> Result<T, ToolOutput> {
    serde_json::from_value(arguments)
        .map_err(|error| ToolOutput::failure(format!("invalid arguments for tool `{tool}`: {error}")))
}

/// The job, when it exists and belongs to the calling session; otherwise the error the model gets.
async fn session_job(jobs: &Jobs, ctx: &ToolContext, id: &str) -> Result<Job, ToolOutput> {
    let unknown = || {
        ToolOutput::failure(format!(
            "there is no background job `{id}` in this conversation; list_jobs shows this conversation's jobs"
        ))
    };
    match jobs.get(&JobId::from(id.trim())).await {
        Ok(job) if job.session_id == ctx.session_id => Ok(job),
        Ok(_) | Err(JobsError::NotFound(_)) => Err(unknown()),
        Err(error) => Err(ToolOutput::failure(format!("could not read the job `{id}`: {error}"))),
    }
}

/// `running for 3m12s`, `exit code 0 after 45s`, … as of now.
fn state_phrase(job: &Job) -> String {
    match job.finished_at {
        None => format!("{} for {}", job.state, duration(Utc::now() - job.started_at)),
        Some(finished_at) => format!("{} after {}", ending(job), duration(finished_at - job.started_at)),
    }
}

#[async_trait]
impl Tool for ListJobsTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, _arguments: Value) -> ToolOutput {
        let filter =
            JobFilter { session_id: Some(ctx.session_id.clone()), limit: Some(LIST_LIMIT), ..JobFilter::default() };
        let jobs = match self.jobs.list(&filter).await {
            Ok(jobs) => jobs,
            Err(error) => return ToolOutput::failure(format!("could not list the background jobs: {error}")),
        };
        if jobs.is_empty() {
            return ToolOutput::success("This conversation has no background jobs.");
        }
        let timezone = ctx.origin.as_ref().and_then(|origin| origin.timezone.as_deref());
        let running = jobs.iter().filter(|job| job.state == JobState::Running).count();
        let mut lines = vec![format!("Background jobs of this conversation, newest first ({running} running):")];
        for job in &jobs {
            lines.push(format!(
                "- {}  {}  started {}  `{}`",
                job.id,
                state_phrase(job),
                local_time(job.started_at, timezone),
                shown_command(&job.command)
            ));
        }
        ToolOutput::success(lines.join("\n")).with_summary(format!("{} jobs, {running} running", jobs.len()))
    }
}

#[async_trait]
impl Tool for JobOutputTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: JobOutputParams = match parse(JOB_OUTPUT, arguments) {
            Ok(params) => params,
            Err(output) => return output,
        };
        let job = match session_job(&self.jobs, ctx, &params.job_id).await {
            Ok(job) => job,
            Err(output) => return output,
        };
        let lines = params.tail_lines.unwrap_or(DEFAULT_TAIL_LINES).clamp(1, MAX_TAIL_LINES);
        let header = format!(
            "Job {} ({}): `{}`\nLogs: {}\n",
            job.id,
            state_phrase(&job),
            shown_command(&job.command),
            self.jobs.shown_logs(&job)
        );
        ToolOutput::success(format!("{header}{}", self.jobs.output(&job, lines))).with_summary(state_phrase(&job))
    }
}

#[async_trait]
impl Tool for CancelJobTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: CancelJobParams = match parse(CANCEL_JOB, arguments) {
            Ok(params) => params,
            Err(output) => return output,
        };
        let job = match session_job(&self.jobs, ctx, &params.job_id).await {
            Ok(job) => job,
            Err(output) => return output,
        };
        match self.jobs.cancel(&job.id, CANCEL_JOB).await {
            Ok(job) => ToolOutput::success(format!(
                "Job {} cancelled after {}: its processes were stopped. No wakeup alert will follow for it.",
                job.id,
                duration(job.finished_at.unwrap_or_else(Utc::now) - job.started_at)
            )),
            Err(JobsError::NotRunning(job)) => ToolOutput::failure(format!(
                "job {} is not running any more: it is {} ({}); nothing was stopped",
                job.id,
                job.state,
                ending(&job)
            )),
            Err(error) => ToolOutput::failure(format!("could not cancel job {}: {error}", job.id)),
        }
    }
}
