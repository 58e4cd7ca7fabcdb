//! Work the agent leaves running or scheduled beyond a turn: background jobs
//! (`run_shell_command` with `background`) and follow-ups (`schedule_followup`). Both are rows
//! in the store, so they survive restarts; each ends in exactly one root message that wakes the
//! session (a Background Wakeup Alert, a follow-up reminder), whose id is derived from the row's
//! id so that posting it twice stores it once.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::activation::wire_enum;
use crate::ids::{FollowUpId, JobId, MessageId, SessionId};

/// Where a follow-up is in its life: `pending` until it fires or is cancelled, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FollowUpState {
    Pending,
    Fired,
    Cancelled,
}

wire_enum!(FollowUpState { Pending => "pending", Fired => "fired", Cancelled => "cancelled" });

/// A follow-up the agent scheduled: at `due_at`, `task` becomes a follow-up activation in the
/// session that scheduled it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowUp {
    pub id: FollowUpId,
    pub session_id: SessionId,
    /// Reply routing of the session that scheduled it.
    pub chatbot_id: String,
    pub channel_id: String,
    pub task: String,
    pub due_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    /// The root message of the turn that scheduled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<MessageId>,
    pub state: FollowUpState,
    /// When it fired or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<DateTime<Utc>>,
}

impl FollowUp {
    /// The id of the root message its firing posts: one per follow-up, so firing twice (a
    /// restart between posting and marking it fired) stores one message.
    pub fn root_message_id(&self) -> MessageId {
        MessageId::from(format!("msg_{}", self.id))
    }
}

/// Which follow-ups to list, ordered by due time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FollowUpFilter {
    pub session_id: Option<SessionId>,
    pub state: Option<FollowUpState>,
    /// Only those due at or before this time.
    pub due_by: Option<DateTime<Utc>>,
    pub limit: Option<u32>,
}

/// Where a background job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Its process runs (or ran when last seen).
    Running,
    /// It ended by itself: `exit_code` (absent when a signal ended it; `detail` says which).
    Exited,
    /// Its process was gone when the service came back and left no exit status.
    Lost,
    /// Stopped by `cancel_job` or `kesoku jobs cancel`.
    Cancelled,
}

wire_enum!(JobState { Running => "running", Exited => "exited", Lost => "lost", Cancelled => "cancelled" });

/// A background job: a shell command running beyond the turn that started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub session_id: SessionId,
    /// Reply routing, copied from the message that started it.
    pub chatbot_id: String,
    pub channel_id: String,
    /// The root message of the turn that started it.
    pub message_id: MessageId,
    pub command: String,
    /// The shell's pid, which leads the job's process group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// Files the job's output goes to (absolute paths).
    pub stdout_path: String,
    pub stderr_path: String,
    pub state: JobState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// How it ended, in words (`killed by signal 9 (SIGKILL)`, `the process was gone after a restart`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub started_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
}

impl Job {
    /// The id of its Background Wakeup Alert: one per job, so reporting its end twice (a
    /// restart between posting the alert and recording the end) stores one alert.
    pub fn alert_message_id(&self) -> MessageId {
        MessageId::from(format!("msg_{}", self.id))
    }
}

/// How a job ended, as [`crate::work::Job`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnd {
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub detail: Option<String>,
    pub finished_at: DateTime<Utc>,
}

/// Which jobs to list, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    pub session_id: Option<SessionId>,
    pub state: Option<JobState>,
    pub limit: Option<u32>,
}
