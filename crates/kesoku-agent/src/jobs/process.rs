//! The operating-system side of a job: is its process still the one we started, how to stop its
//! group, what exit status it left.
//!
//! A job is identified by its pid, which leads its process group. Before trusting a pid read
//! back from the store (after a restart the system may have handed it to another process), we
//! check on Linux that `/proc/<pid>` is a live group leader (not a zombie) that started when the
//! job did, within [`START_TOLERANCE`]. Elsewhere only the existence of the group is checked.
//! Nothing here touches the store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kesoku_core::Job;
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// How far the start time the kernel reports may be from the job's `started_at` for the process
/// to count as the job's. Generous, because the kernel's boot time is in whole seconds and moves
/// with wall-clock steps; a different process reusing the pid and leading its own group within
/// this window of the job's start is not a realistic case.
const START_TOLERANCE: Duration = Duration::from_secs(60);

/// How often a stopping group is looked at while it gets its grace.
const STOP_POLL: Duration = Duration::from_millis(50);

/// The file the wrapper writes the job's exit status to: `<id>.exit` beside its stdout log.
pub(crate) fn exit_status_path(job: &Job) -> PathBuf {
    Path::new(&job.stdout_path).with_file_name(format!("{}.exit", job.id))
}

/// The exit status the wrapper left, with the time it was written; `None` when there is no
/// complete one (not written, or written by nobody yet).
pub(crate) fn read_exit_status(path: &Path) -> Option<(i32, Option<DateTime<Utc>>)> {
    let text = std::fs::read_to_string(path).ok()?;
    let code = text.trim().parse().ok()?;
    let written_at = std::fs::metadata(path).and_then(|metadata| metadata.modified()).ok().map(DateTime::<Utc>::from);
    Some((code, written_at))
}

/// Whether the job's process still runs (see the module docs for what is checked).
pub(crate) fn is_running(job: &Job) -> bool {
    let Some(pid) = job.pid.filter(|pid| *pid > 0) else {
        return false;
    };
    match proc_start(pid) {
        ProcStart::Live { started_at, leads_group } => {
            let skew = (started_at - job.started_at).abs().to_std().unwrap_or(Duration::MAX);
            leads_group && skew <= START_TOLERANCE
        }
        ProcStart::Gone => false,
        ProcStart::Unknown => group_exists(pid),
    }
}

/// Whether any process is in group `pgid`.
fn group_exists(pgid: i32) -> bool {
    match killpg(Pid::from_raw(pgid), None) {
        Ok(()) => true,
        // EPERM: it exists but is not ours; still alive.
        Err(Errno::EPERM) => true,
        Err(_) => false,
    }
}

/// SIGTERM the job's group; SIGKILL it if its leader still runs after `grace`. Returns whether
/// the SIGKILL was needed.
pub(crate) async fn stop_group(job: &Job, grace: Duration) -> bool {
    let Some(pid) = job.pid.filter(|pid| *pid > 0) else {
        return false;
    };
    signal_group(pid, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + grace;
    while is_running(job) {
        if tokio::time::Instant::now() >= deadline {
            signal_group(pid, Signal::SIGKILL);
            return true;
        }
        tokio::time::sleep(STOP_POLL).await;
    }
    // The leader is gone; anything of the group that ignored SIGTERM goes too. The group id
    // cannot have been reused this soon.
    signal_group(pid, Signal::SIGKILL);
    false
}

fn signal_group(pgid: i32, signal: Signal) {
    match killpg(Pid::from_raw(pgid), signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(error) => {
            tracing::warn!(group = pgid, ?signal, %error, "could not signal a background job's process group")
        }
    }
}

/// A signal number in words: `signal 9 (SIGKILL)`.
pub(crate) fn describe_signal(number: i32) -> String {
    match Signal::try_from(number) {
        Ok(signal) => format!("signal {number} ({})", signal.as_str()),
        Err(_) => format!("signal {number}"),
    }
}

enum ProcStart {
    Live {
        started_at: DateTime<Utc>,
        leads_group: bool,
    },
    /// No such process, or a zombie.
    Gone,
    /// No `/proc` to ask (not Linux).
    Unknown,
}

fn proc_start(pid: i32) -> ProcStart {
    if !Path::new("/proc/self/stat").exists() {
        return ProcStart::Unknown;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return ProcStart::Gone;
    };
    // `pid (comm) state ppid pgrp …`: comm may hold spaces and parentheses, so fields are
    // counted from the last `)`. After it: state is field 3, pgrp field 5, starttime field 22.
    let Some(after_comm) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
        return ProcStart::Unknown;
    };
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let (Some(state), Some(pgrp), Some(start_ticks)) = (fields.first(), fields.get(2), fields.get(19)) else {
        return ProcStart::Unknown;
    };
    if matches!(*state, "Z" | "X" | "x") {
        return ProcStart::Gone;
    }
    let (Ok(pgrp), Ok(start_ticks)) = (pgrp.parse::<i32>(), start_ticks.parse::<u64>()) else {
        return ProcStart::Unknown;
    };
    let (Some(boot), Some(ticks_per_second)) = (boot_time(), ticks_per_second()) else {
        return ProcStart::Unknown;
    };
    let since_boot = Duration::from_secs_f64(start_ticks as f64 / ticks_per_second as f64);
    let Some(started_at) =
        chrono::Duration::from_std(since_boot).ok().and_then(|offset| boot.checked_add_signed(offset))
    else {
        return ProcStart::Unknown;
    };
    ProcStart::Live { started_at, leads_group: pgrp == pid }
}

/// The boot time, from `/proc/stat`'s `btime` line.
fn boot_time() -> Option<DateTime<Utc>> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let seconds = stat.lines().find_map(|line| line.strip_prefix("btime "))?.trim().parse().ok()?;
    DateTime::from_timestamp(seconds, 0)
}

fn ticks_per_second() -> Option<u64> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    u64::try_from(ticks).ok().filter(|ticks| *ticks > 0)
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    fn job_with(pid: i32, started_at: DateTime<Utc>) -> Job {
        Job {
            id: kesoku_core::JobId::from("job_test".to_owned()),
            session_id: kesoku_core::SessionId::from("sess_test".to_owned()),
            chatbot_id: "cli".to_owned(),
            channel_id: "local".to_owned(),
            message_id: kesoku_core::MessageId::from("msg_test".to_owned()),
            command: "true".to_owned(),
            pid: Some(pid),
            stdout_path: "/tmp/jobs/job_test.out".to_owned(),
            stderr_path: "/tmp/jobs/job_test.err".to_owned(),
            state: kesoku_core::JobState::Running,
            exit_code: None,
            detail: None,
            started_at,
            finished_at: None,
        }
    }

    #[test]
    fn a_live_group_leader_started_with_the_job_is_running_and_other_starts_are_not() {
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "read line"])
            .stdin(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawn");
        let pid = i32::try_from(child.id()).expect("pid");
        assert!(is_running(&job_with(pid, Utc::now())));
        // The same pid, but the row says the job started a day earlier: another process.
        assert!(!is_running(&job_with(pid, Utc::now() - chrono::Duration::days(1))));
        drop(child.stdin.take());
        child.wait().expect("wait");
        assert!(!is_running(&job_with(pid, Utc::now())));
    }

    #[test]
    fn the_exit_status_file_sits_beside_the_stdout_log() {
        let job = job_with(1, Utc::now());
        assert_eq!(exit_status_path(&job), PathBuf::from("/tmp/jobs/job_test.exit"));
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(describe_signal(9), "signal 9 (SIGKILL)");
        assert_eq!(describe_signal(99), "signal 99");
    }
}
