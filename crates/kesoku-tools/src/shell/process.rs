//! Running one command under `/bin/sh -c` in a process group of its own, and making sure the
//! whole group is gone when the call ends, however it ends.
//!
//! The command inherits nothing it was not given: a cleared environment rebuilt by the caller,
//! `/dev/null` as stdin, pipes for stdout and stderr. Its processes never outlive the call: on
//! exit, timeout, cancellation, or the call's future being dropped, the group is killed. A
//! process that leaves the group on purpose (`setsid`, daemons) escapes this; we stop reading
//! its output shortly after the group is gone rather than wait for it.
//!
//! The one exception is asked for by the caller: with [`OnTimeout::Move`], a command that
//! reaches its timeout is handed over alive ([`Run::Moved`]: the child, its group, its pipes
//! and what was read from them so far) instead of being killed, for the background-job seam to
//! adopt. This module knows nothing of policy, output formatting or the model.

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncRead;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::capture::{CappedBuffer, StreamText, capture};

/// The shell, by absolute path: the cleared environment may have no `PATH` to find it with.
pub(crate) const SHELL: &str = "/bin/sh";

/// How long to keep reading after the group is gone: long enough for the pipes to deliver what
/// is in them, short enough that an escaped process holding a pipe open cannot hold the call.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// What to do with a command that reaches its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnTimeout {
    /// SIGTERM the group, SIGKILL it after the grace.
    Kill,
    /// Leave it running and hand it over ([`Run::Moved`]).
    Move,
}

pub(crate) struct RunRequest<'a> {
    pub command: &'a str,
    pub cwd: &'a Path,
    pub env: Vec<(OsString, OsString)>,
    pub timeout: Duration,
    pub kill_grace: Duration,
    pub on_timeout: OnTimeout,
    /// Bytes of each stream kept from its start and from its end.
    pub head_bytes: usize,
    pub tail_bytes: usize,
}

/// How the command ended.
#[derive(Debug)]
pub(crate) enum RunEnd {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
    /// Waiting for the shell failed (the group was killed all the same).
    WaitFailed(io::Error),
}

#[derive(Debug)]
pub(crate) struct Finished {
    pub end: RunEnd,
    pub stdout: StreamText,
    pub stderr: StreamText,
}

/// What [`run`] gives back.
#[derive(Debug)]
pub(crate) enum Run {
    /// The call is over and so is every process of the group.
    Finished(Finished),
    /// The command reached its timeout with [`OnTimeout::Move`] and still runs.
    Moved(Box<Moved>),
}

/// A command still running after its timeout, handed over by [`run`].
pub(crate) struct Moved {
    /// The shell, leader of the command's process group (not killed on drop).
    pub child: Child,
    pub pid: i32,
    /// The pipes, unread beyond what `*_so_far` holds (`None` if a reader failed).
    pub stdout: Option<Box<dyn AsyncRead + Send + Unpin>>,
    pub stderr: Option<Box<dyn AsyncRead + Send + Unpin>>,
    pub stdout_so_far: StreamText,
    pub stderr_so_far: StreamText,
}

impl std::fmt::Debug for Moved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Moved").field("pid", &self.pid).finish_non_exhaustive()
    }
}

/// Run the command to its end, or (with [`OnTimeout::Move`]) to its timeout. `Err` only when it
/// could not be started.
pub(crate) async fn run(request: RunRequest<'_>, cancel: &CancellationToken) -> io::Result<Run> {
    let mut command = Command::new(SHELL);
    command
        .arg("-c")
        .arg(request.command)
        .current_dir(request.cwd)
        .env_clear()
        .envs(request.env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        // A command that may be moved must survive its `Child` being dropped later (the
        // background monitor stopping with the service); the group guard below still kills it
        // whenever the call ends without moving it.
        .kill_on_drop(request.on_timeout == OnTimeout::Kill);
    let mut child = command.spawn()?;
    let pid = child.id().and_then(|pid| i32::try_from(pid).ok());
    let Some(pid) = pid else {
        return Err(io::Error::other("the command's process id could not be read"));
    };
    // With `process_group(0)` the shell leads a new group whose id is its pid.
    let mut group = ProcessGroup { id: Pid::from_raw(pid), armed: true };

    let stop_reading = CancellationToken::new();
    let _stop_reading_on_drop = stop_reading.clone().drop_guard();
    let buffer = || CappedBuffer::new(request.head_bytes, request.tail_bytes);
    let stdout = spawn_capture(child.stdout.take(), buffer(), &stop_reading);
    let stderr = spawn_capture(child.stderr.take(), buffer(), &stop_reading);

    let end = wait_for_end(&mut child, &group, request.timeout, request.kill_grace, request.on_timeout, cancel).await;
    let Some(end) = end else {
        // Moved: stop reading, take the pipes back, and let the group live.
        group.armed = false;
        stop_reading.cancel();
        let (stdout, stdout_so_far) = stdout.await.unwrap_or_else(|_| (None, buffer()));
        let (stderr, stderr_so_far) = stderr.await.unwrap_or_else(|_| (None, buffer()));
        return Ok(Run::Moved(Box::new(Moved {
            child,
            pid,
            stdout: stdout.map(|pipe| Box::new(pipe) as Box<dyn AsyncRead + Send + Unpin>),
            stderr: stderr.map(|pipe| Box::new(pipe) as Box<dyn AsyncRead + Send + Unpin>),
            stdout_so_far: stdout_so_far.into_text(),
            stderr_so_far: stderr_so_far.into_text(),
        })));
    };
    // Whatever the command left running in its group goes too: a call's processes never
    // outlive it, so the concurrency cap counts everything that runs.
    group.kill_and_disarm();

    let (stdout, stderr) = collect(stdout, stderr, &stop_reading).await;
    Ok(Run::Finished(Finished {
        end,
        stdout: stdout.unwrap_or_else(buffer).into_text(),
        stderr: stderr.unwrap_or_else(buffer).into_text(),
    }))
}

/// How the command ended; `None` when it reached its timeout and is to be moved.
async fn wait_for_end(
    child: &mut Child,
    group: &ProcessGroup,
    timeout: Duration,
    kill_grace: Duration,
    on_timeout: OnTimeout,
    cancel: &CancellationToken,
) -> Option<RunEnd> {
    let end = tokio::select! {
        biased;
        () = cancel.cancelled() => {
            group.signal(Signal::SIGKILL);
            let _ = child.wait().await;
            RunEnd::Cancelled
        }
        status = child.wait() => match status {
            Ok(status) => RunEnd::Exited(status),
            Err(error) => RunEnd::WaitFailed(error),
        },
        () = tokio::time::sleep(timeout) => {
            if on_timeout == OnTimeout::Move {
                return None;
            }
            group.signal(Signal::SIGTERM);
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                _ = child.wait() => {}
                () = tokio::time::sleep(kill_grace) => {}
            }
            group.signal(Signal::SIGKILL);
            let _ = child.wait().await;
            RunEnd::TimedOut
        }
    };
    Some(end)
}

/// Read a pipe on a task of its own; the task gives back the pipe with what it read.
fn spawn_capture<R>(
    pipe: Option<R>,
    buffer: CappedBuffer,
    stop: &CancellationToken,
) -> JoinHandle<(Option<R>, CappedBuffer)>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let stop = stop.clone();
    tokio::spawn(async move {
        match pipe {
            Some(pipe) => {
                let (pipe, buffer) = capture(pipe, buffer, stop).await;
                (Some(pipe), buffer)
            }
            None => (None, buffer),
        }
    })
}

/// Wait for both readers, telling them to stop after [`DRAIN_GRACE`]. `None` for a reader that
/// failed (its output is lost, the call goes on).
async fn collect<R, E>(
    stdout: JoinHandle<(Option<R>, CappedBuffer)>,
    stderr: JoinHandle<(Option<E>, CappedBuffer)>,
    stop: &CancellationToken,
) -> (Option<CappedBuffer>, Option<CappedBuffer>) {
    let both = async { (stdout.await.ok().map(|(_, buffer)| buffer), stderr.await.ok().map(|(_, buffer)| buffer)) };
    tokio::pin!(both);
    tokio::select! {
        results = &mut both => results,
        () = tokio::time::sleep(DRAIN_GRACE) => {
            stop.cancel();
            both.await
        }
    }
}

/// A process group to kill when the call is over.
struct ProcessGroup {
    id: Pid,
    /// Cleared once the group has been killed for good, so that dropping the guard later does
    /// not signal a group id the system may have handed out again.
    armed: bool,
}

impl ProcessGroup {
    fn signal(&self, signal: Signal) {
        match killpg(self.id, signal) {
            // ESRCH: nobody is left in the group, which is the goal.
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(error) => {
                tracing::warn!(group = self.id.as_raw(), ?signal, %error, "could not signal a tool's process group")
            }
        }
    }

    fn kill_and_disarm(&mut self) {
        if self.armed {
            self.signal(Signal::SIGKILL);
            self.armed = false;
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // Reached with `armed` set only when the call's future is dropped mid-run (the turn
        // task was aborted): the processes must not outlive it.
        self.kill_and_disarm();
    }
}
