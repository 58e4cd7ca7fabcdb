//! Running one command under `/bin/sh -c` in a process group of its own, and making sure the
//! whole group is gone when the call ends, however it ends.
//!
//! The command inherits nothing it was not given: a cleared environment rebuilt by the caller,
//! `/dev/null` as stdin, pipes for stdout and stderr. Its processes never outlive the call: on
//! exit, timeout, cancellation, or the call's future being dropped, the group is killed. A
//! process that leaves the group on purpose (`setsid`, daemons) escapes this; we stop reading
//! its output shortly after the group is gone rather than wait for it.
//! This module knows nothing of policy, output formatting or the model.

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
const SHELL: &str = "/bin/sh";

/// How long to keep reading after the group is gone: long enough for the pipes to deliver what
/// is in them, short enough that an escaped process holding a pipe open cannot hold the call.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

pub(crate) struct RunRequest<'a> {
    pub command: &'a str,
    pub cwd: &'a Path,
    pub env: Vec<(OsString, OsString)>,
    pub timeout: Duration,
    pub kill_grace: Duration,
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

/// Run the command to its end. `Err` only when it could not be started.
pub(crate) async fn run(request: RunRequest<'_>, cancel: &CancellationToken) -> io::Result<Finished> {
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
        .kill_on_drop(true);
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

    let end = wait_for_end(&mut child, &group, request.timeout, request.kill_grace, cancel).await;
    // Whatever the command left running in its group goes too: a call's processes never
    // outlive it, so the concurrency cap counts everything that runs.
    group.kill_and_disarm();

    let (stdout, stderr) = collect(stdout, stderr, &stop_reading).await;
    Ok(Finished {
        end,
        stdout: stdout.unwrap_or_else(buffer).into_text(),
        stderr: stderr.unwrap_or_else(buffer).into_text(),
    })
}

async fn wait_for_end(
    child: &mut Child,
    group: &ProcessGroup,
    timeout: Duration,
    kill_grace: Duration,
    cancel: &CancellationToken,
) -> RunEnd {
    tokio::select! {
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
    }
}

fn spawn_capture<R>(pipe: Option<R>, buffer: CappedBuffer, stop: &CancellationToken) -> JoinHandle<CappedBuffer>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let stop = stop.clone();
    match pipe {
        Some(pipe) => tokio::spawn(capture(pipe, buffer, stop)),
        None => tokio::spawn(capture(tokio::io::empty(), buffer, stop)),
    }
}

/// Wait for both readers, telling them to stop after [`DRAIN_GRACE`]. `None` for a reader that
/// failed (its output is lost, the call goes on).
async fn collect(
    stdout: JoinHandle<CappedBuffer>,
    stderr: JoinHandle<CappedBuffer>,
    stop: &CancellationToken,
) -> (Option<CappedBuffer>, Option<CappedBuffer>) {
    let both = async { (stdout.await.ok(), stderr.await.ok()) };
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
