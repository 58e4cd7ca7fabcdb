//! Laying out a command's output for the model: `=== STDOUT ===\n{stdout}\n=== STDERR ===\n{stderr}`,
//! cut to a character budget by keeping the end of each stream.
//!
//! When something must be cut, each stream keeps what it needs if it is short and the rest of the
//! budget goes to the other; two long streams share it evenly. Both headers always stay. This
//! module does no I/O: the caller saves the full text and passes the marker naming the file.

use super::capture::StreamText;
use crate::output::last_chars;

const STDOUT_HEADER: &str = "=== STDOUT ===\n";
const STDERR_HEADER: &str = "=== STDERR ===\n";

/// The uncut layout, when it fits in `max_chars` and nothing was left out while capturing.
pub(crate) fn whole_if_fits(stdout: &StreamText, stderr: &StreamText, max_chars: usize) -> Option<String> {
    if stdout.was_cut() || stderr.was_cut() {
        return None;
    }
    let whole = layout(&stdout.text, &stderr.text);
    (whole.chars().count() <= max_chars).then_some(whole)
}

/// The layout of everything captured, with omission markers: what is saved to a file.
pub(crate) fn full(stdout: &StreamText, stderr: &StreamText) -> String {
    layout(&stdout.with_omission_marker(), &stderr.with_omission_marker())
}

/// The layout cut to at most `max_chars` characters (given a budget larger than the headers and
/// two markers), each cut stream starting with `marker` (a line, newline included).
pub(crate) fn cut(stdout: &StreamText, stderr: &StreamText, max_chars: usize, marker: &str) -> String {
    let overhead = STDOUT_HEADER.len() + 1 + STDERR_HEADER.len();
    let available = max_chars.saturating_sub(overhead);
    let half = available / 2;
    let stdout_len = stdout.text.chars().count();
    let stderr_len = stderr.text.chars().count();
    let stdout_whole = !stdout.was_cut() && stdout_len <= half;
    let stderr_whole = !stderr.was_cut() && stderr_len <= half;
    let (stdout_budget, stderr_budget) = if stderr_whole {
        (available - stderr_len, stderr_len)
    } else if stdout_whole {
        (stdout_len, available - stdout_len)
    } else {
        (half, available - half)
    };
    let marker_len = marker.chars().count();
    let section = |stream: &StreamText, len: usize, budget: usize| -> String {
        if !stream.was_cut() && len <= budget {
            stream.text.clone()
        } else {
            format!("{marker}{}", last_chars(&stream.text, budget.saturating_sub(marker_len)))
        }
    };
    layout(&section(stdout, stdout_len, stdout_budget), &section(stderr, stderr_len, stderr_budget))
}

fn layout(stdout: &str, stderr: &str) -> String {
    format!("{STDOUT_HEADER}{stdout}\n{STDERR_HEADER}{stderr}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(text: &str) -> StreamText {
        StreamText { text: text.to_owned(), head_len: text.len(), omitted_bytes: 0, total_bytes: text.len() as u64 }
    }

    const MARKER: &str = "[cut]\n";

    #[test]
    fn short_output_is_laid_out_whole() {
        let whole = whole_if_fits(&stream("out"), &stream("err\n"), 100);
        assert_eq!(whole.as_deref(), Some("=== STDOUT ===\nout\n=== STDERR ===\nerr\n"));
        assert_eq!(whole_if_fits(&stream(&"x".repeat(100)), &stream(""), 100), None);
    }

    #[test]
    fn a_short_stream_stays_whole_and_the_long_one_keeps_its_end() {
        let long = (1..=200).map(|n| format!("{n}\n")).collect::<String>();
        let content = cut(&stream(&long), &stream("boom"), 100, MARKER);
        assert_eq!(content.chars().count(), 100);
        assert!(content.starts_with("=== STDOUT ===\n[cut]\n"), "{content}");
        assert!(content.ends_with("199\n200\n\n=== STDERR ===\nboom"), "{content}");

        let content = cut(&stream("ok"), &stream(&long), 100, MARKER);
        assert!(content.starts_with("=== STDOUT ===\nok\n=== STDERR ===\n[cut]\n"), "{content}");
        assert!(content.ends_with("200\n"), "{content}");
        assert_eq!(content.chars().count(), 100);
    }

    #[test]
    fn two_long_streams_share_the_budget() {
        let long = "y".repeat(1_000);
        let content = cut(&stream(&long), &stream(&long), 101, MARKER);
        assert_eq!(content.chars().count(), 101);
        assert_eq!(content.matches("[cut]").count(), 2);
    }
}
