//! What the model and people read about jobs: the Background Wakeup Alert, the tool results,
//! durations, the end of a job's logs. No I/O here except reading the end of a log file.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use chrono::{DateTime, Utc};
use kesoku_core::{ActivationKind, ActivationRequest, Job, JobEnd, JobState, Message};

use super::process::describe_signal;

/// Bytes read from the end of a log to find its last lines: enough for any tail we show.
const TAIL_READ_BYTES: u64 = 256 * 1024;
/// Longest command shown in an alert or a listing, in characters.
const COMMAND_SHOWN_CHARS: usize = 200;

/// How much of a job's logs to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tail {
    /// Lines of each stream.
    pub lines: usize,
    /// Characters of both streams together.
    pub chars: usize,
}

/// The Background Wakeup Alert for `job` ending as `end` (spec seed 000: role system, type
/// text, sender System, `pending_agent`, routing of the message that started the job), with
/// the id derived from the job so that posting it twice stores it once, and the activation it
/// asks for.
pub(crate) fn wakeup_alert(job: &Job, end: &JobEnd, tail: Tail, logs_shown_as: &str) -> Message {
    let ran_for = end.finished_at - job.started_at;
    let command = shown_command(&job.command);
    let headline = match (end.state, end.exit_code) {
        (JobState::Exited, Some(code)) => {
            format!("finished with exit code {code} after {}: `{command}`", duration(ran_for))
        }
        (JobState::Exited, None) => {
            let how = end.detail.as_deref().unwrap_or("ended without an exit code");
            format!("{how} after {}: `{command}`", duration(ran_for))
        }
        (JobState::Lost, _) => format!("was lost after running at least {}: `{command}`", duration(ran_for)),
        (JobState::Cancelled, _) => format!("was cancelled after {}: `{command}`", duration(ran_for)),
        (JobState::Running, _) => format!("is still running after {}: `{command}`", duration(ran_for)),
    };
    let mut content = format!("[System Alert] Background Job {} {headline}\n", job.id);
    if let Some(detail) = end.detail.as_deref().filter(|_| end.state != JobState::Exited || end.exit_code.is_some()) {
        content.push_str(&format!("({detail})\n"));
    }
    content.push_str(&logs_tail(job, tail));
    content.push_str(&format!(
        "\nFull logs: {logs_shown_as} (read more with job_output(job_id=\"{}\") or read_file).",
        job.id
    ));
    let mut alert = Message::wakeup_alert(&job.session_id, &job.chatbot_id, &job.channel_id, content);
    alert.id = job.alert_message_id();
    alert.metadata.activation = Some(Box::new(ActivationRequest {
        kind: ActivationKind::BackgroundJobResult,
        job_id: Some(job.id.clone()),
        ..ActivationRequest::new(ActivationKind::BackgroundJobResult)
    }));
    alert
}

/// The end of both logs, labelled: `=== STDOUT ===` then `=== STDERR ===`.
pub(crate) fn logs_tail(job: &Job, tail: Tail) -> String {
    let stdout = read_tail(Path::new(&job.stdout_path), tail.lines);
    let stderr = read_tail(Path::new(&job.stderr_path), tail.lines);
    // Each stream gets half the characters, or all of them when the other is empty.
    let (stdout_chars, stderr_chars) = match (stdout.text.is_empty(), stderr.text.is_empty()) {
        (true, _) => (0, tail.chars),
        (false, true) => (tail.chars, 0),
        (false, false) => (tail.chars / 2, tail.chars - tail.chars / 2),
    };
    format!("{}{}", section("STDOUT", &stdout, stdout_chars), section("STDERR", &stderr, stderr_chars))
}

struct LogTail {
    text: String,
    /// Whether anything before `text` was left out.
    cut: bool,
    /// Why the log could not be read, if it could not.
    error: Option<String>,
}

fn section(label: &str, log: &LogTail, max_chars: usize) -> String {
    if let Some(error) = &log.error {
        return format!("=== {label} ===\n(could not be read: {error})\n");
    }
    if log.text.is_empty() {
        return format!("=== {label} ===\n(empty)\n");
    }
    let shown = last_chars(&log.text, max_chars);
    let cut = log.cut || shown.len() < log.text.len();
    let header = if cut { format!("=== {label} (end) ===\n") } else { format!("=== {label} ===\n") };
    let newline = if shown.ends_with('\n') { "" } else { "\n" };
    format!("{header}{shown}{newline}")
}

/// The last `lines` lines of a log file (invalid UTF-8 shown as U+FFFD).
fn read_tail(path: &Path, lines: usize) -> LogTail {
    let read = || -> std::io::Result<(Vec<u8>, bool)> {
        let mut file = std::fs::File::open(path)?;
        let length = file.metadata()?.len();
        let start = length.saturating_sub(TAIL_READ_BYTES);
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        file.take(TAIL_READ_BYTES).read_to_end(&mut bytes)?;
        Ok((bytes, start > 0))
    };
    match read() {
        Ok((bytes, cut_before)) => {
            let text = String::from_utf8_lossy(&bytes);
            // A cut start may fall inside a line (or a character): drop that partial first line.
            let text = if cut_before { text.split_once('\n').map_or("", |(_, rest)| rest) } else { &text };
            let (text, cut_lines) = last_lines(text, lines);
            LogTail { text: text.to_owned(), cut: cut_before || cut_lines, error: None }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            LogTail { text: String::new(), cut: false, error: Some("the file is gone".to_owned()) }
        }
        Err(error) => LogTail { text: String::new(), cut: false, error: Some(error.to_string()) },
    }
}

/// The last `count` lines of `text`, and whether lines were left out.
fn last_lines(text: &str, count: usize) -> (&str, bool) {
    let body = text.strip_suffix('\n').unwrap_or(text);
    if count == 0 {
        return ("", !text.is_empty());
    }
    match body.rmatch_indices('\n').nth(count - 1) {
        Some((at, _)) => (&text[at + 1..], true),
        None => (text, false),
    }
}

fn last_chars(text: &str, count: usize) -> &str {
    if count == 0 {
        return "";
    }
    match text.char_indices().rev().nth(count - 1) {
        Some((start, _)) => &text[start..],
        None => text,
    }
}

/// The command on one line, cut to [`COMMAND_SHOWN_CHARS`].
pub(crate) fn shown_command(command: &str) -> String {
    let one_line = command.trim().replace('\n', " ⏎ ");
    if one_line.chars().count() > COMMAND_SHOWN_CHARS {
        let cut: String = one_line.chars().take(COMMAND_SHOWN_CHARS - 1).collect();
        format!("{cut}…")
    } else {
        one_line
    }
}

/// A duration as people say it: `45s`, `3m12s`, `2h05m`, `3d4h`.
pub(crate) fn duration(span: chrono::Duration) -> String {
    let seconds = span.num_seconds().max(0);
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3_600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        3_600..86_400 => format!("{}h{:02}m", seconds / 3_600, seconds % 3_600 / 60),
        _ => format!("{}d{}h", seconds / 86_400, seconds % 86_400 / 3_600),
    }
}

/// How a job ended, in words, for listings: `exit code 0`, `killed by signal 9 (SIGKILL)`, …
pub(crate) fn ending(job: &Job) -> String {
    match (job.state, job.exit_code) {
        (JobState::Running, _) => "running".to_owned(),
        (JobState::Exited, Some(code)) => format!("exit code {code}"),
        (JobState::Exited | JobState::Lost | JobState::Cancelled, _) => {
            job.detail.clone().unwrap_or_else(|| job.state.to_string())
        }
    }
}

/// What an exit status left by the shell says: `128+N` is how it reports a command killed by
/// signal N (a command may also exit with such a code itself, hence "probably").
pub(crate) fn exit_detail(code: i32) -> Option<String> {
    (129..=128 + 64)
        .contains(&code)
        .then(|| format!("exit code {code}: probably killed by {}", describe_signal(code - 128)))
}

/// A time in the IANA zone `timezone` when it is one, else in UTC.
pub(crate) fn local_time(at: DateTime<Utc>, timezone: Option<&str>) -> String {
    crate::followups::format_local(at, crate::entries::Zone::named(timezone).tz())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_say_them() {
        let cases = [(0, "0s"), (45, "45s"), (192, "3m12s"), (7_500, "2h05m"), (273_600, "3d4h")];
        for (seconds, expected) in cases {
            assert_eq!(duration(chrono::Duration::seconds(seconds)), expected);
        }
    }

    #[test]
    fn last_lines_keep_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), ("b\nc\n", true));
        assert_eq!(last_lines("a\nb\nc", 2), ("b\nc", true));
        assert_eq!(last_lines("a\nb\n", 5), ("a\nb\n", false));
        assert_eq!(last_lines("", 5), ("", false));
    }

    #[test]
    fn long_and_multi_line_commands_are_shown_on_one_short_line() {
        assert_eq!(shown_command("make\n  && make test "), "make ⏎   && make test");
        let long = "x".repeat(500);
        assert_eq!(shown_command(&long).chars().count(), COMMAND_SHOWN_CHARS);
    }

    #[test]
    fn shell_signal_codes_are_explained() {
        assert_eq!(exit_detail(137).as_deref(), Some("exit code 137: probably killed by signal 9 (SIGKILL)"));
        assert_eq!(exit_detail(1), None);
        assert_eq!(exit_detail(128), None);
    }

    #[test]
    fn times_are_shown_in_the_zone_asked_for() {
        let at = DateTime::from_timestamp(1_767_225_600, 0).expect("time"); // 2026-01-01 00:00 UTC
        assert_eq!(local_time(at, Some("Asia/Tokyo")), "2026-01-01 09:00:00 JST");
        assert_eq!(local_time(at, None), "2026-01-01 00:00:00 UTC");
        assert_eq!(local_time(at, Some("Not/AZone")), "2026-01-01 00:00:00 UTC");
    }
}
