//! The seam through which `run_shell_command` hands over work that outlives the call: a command
//! to start as a background job (`"background": true`), or a foreground command moved to the
//! background when it reached its timeout (`"on_timeout": "background"`).
//!
//! This crate checks the command (policy, length), builds its environment and spawns the
//! process, because that is what it knows; whoever implements [`Background`] (the agent's job
//! keeper) names the job, stores it, watches it and reports its end. This crate holds no store
//! and knows no job ids.
//!
//! A background job's processes deliberately escape the invariant of the other tools (a call's
//! processes never outlive it): they outlive the call, the turn, and the service.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncRead;
use tokio::process::{Child, Command};

use super::process::SHELL;
use crate::tool::ToolContext;

/// The wrapper every background job runs under: the command in a shell of its own, then its exit
/// status into the file named by `$2`. The command and the file are positional parameters, never
/// spliced into the script, so no quoting can break them. A command ended by signal N leaves
/// `128+N`, as the shell reports it; a wrapper killed itself (the whole group killed) leaves no
/// file, which is how a lost job is told from an ended one.
const WRAPPER: &str = "/bin/sh -c \"$1\"; echo $? > \"$2\"";

/// Keeps background jobs: implemented outside this crate (the agent's `jobs` module).
///
/// Both methods return the text the model is told (`Ok`) or why the job could not be kept
/// (`Err`, a sentence for the model).
#[async_trait]
pub trait Background: Send + Sync + 'static {
    /// Start `command` as a job: spawn it with [`DetachedCommand::spawn`], record it, watch it.
    async fn start(&self, ctx: &ToolContext, command: DetachedCommand) -> Result<String, String>;

    /// Take over a foreground command that reached its timeout: keep draining its pipes into
    /// log files, record it, watch it. An implementation that cannot keep it must stop it
    /// ([`MovedCommand::kill`]) before returning `Err`.
    async fn adopt(&self, ctx: &ToolContext, command: MovedCommand) -> Result<String, String>;
}

/// A checked command with its environment, to be started as a background job.
#[derive(Debug, Clone)]
pub struct DetachedCommand {
    pub(crate) command: String,
    pub(crate) cwd: PathBuf,
    pub(crate) env: Vec<(OsString, OsString)>,
}

/// Where a background job's output and exit status go.
#[derive(Debug)]
pub struct JobFiles {
    pub stdout: File,
    pub stderr: File,
    /// Written by the wrapper when the command ends (its exit status as decimal text).
    pub exit_status: PathBuf,
}

impl DetachedCommand {
    /// The command line as the model gave it.
    pub fn command(&self) -> &str {
        &self.command
    }

    /// Start it: `/bin/sh -c` under the exit-status wrapper, in the workspace, with the rebuilt
    /// environment, stdin `/dev/null`, stdout and stderr into `files`, in a process group of its
    /// own whose id is the returned child's pid. Dropping the child does not stop the job.
    pub fn spawn(&self, files: JobFiles) -> io::Result<Child> {
        Command::new(SHELL)
            .arg("-c")
            .arg(WRAPPER)
            .arg("sh")
            .arg(&self.command)
            .arg(&files.exit_status)
            .current_dir(&self.cwd)
            .env_clear()
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(files.stdout))
            .stderr(Stdio::from(files.stderr))
            .process_group(0)
            .kill_on_drop(false)
            .spawn()
    }
}

/// A foreground command that reached its timeout and is still running, with what it wrote so
/// far. Its pipes must be read from now on, or the command blocks once they are full.
pub struct MovedCommand {
    pub command: String,
    /// The shell, leader of the command's process group; dropping it does not stop the command.
    pub child: Child,
    /// The shell's pid, which is the process group id.
    pub pid: i32,
    /// The unread rest of its stdout and stderr (`None` when a reader failed: that output is lost).
    pub stdout: Option<Box<dyn AsyncRead + Send + Unpin>>,
    pub stderr: Option<Box<dyn AsyncRead + Send + Unpin>>,
    /// What was read before the timeout (for a long stream, its start and end with a line saying
    /// how much was left out).
    pub stdout_so_far: String,
    pub stderr_so_far: String,
    /// How long it has been running.
    pub running_for: Duration,
}

impl std::fmt::Debug for MovedCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MovedCommand")
            .field("command", &self.command)
            .field("pid", &self.pid)
            .field("running_for", &self.running_for)
            .finish_non_exhaustive()
    }
}

impl MovedCommand {
    /// Kill its whole process group (when it cannot be kept after all).
    pub fn kill(&self) {
        match killpg(Pid::from_raw(self.pid), Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(error) => tracing::warn!(group = self.pid, %error, "could not kill a command that could not be moved"),
        }
    }
}
