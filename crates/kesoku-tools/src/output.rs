//! Text helpers shared by tools: cutting by characters, picking a summary line, and saving a
//! full output to the session's staging folder.
//!
//! Nothing here decides how much to show; callers pass their limits.

use std::io;
use std::path::PathBuf;

use tokio::io::AsyncWriteExt;

use crate::tool::ToolContext;

/// Folder inside the staging folder where full outputs are saved.
pub const SAVED_OUTPUT_DIR: &str = "tool_outputs";

/// Longest summary line, in characters.
const MAX_SUMMARY_CHARS: usize = 200;

/// The last `count` characters of `text` (all of it when shorter).
pub(crate) fn last_chars(text: &str, count: usize) -> &str {
    if count == 0 {
        return "";
    }
    match text.char_indices().rev().nth(count - 1) {
        Some((start, _)) => &text[start..],
        None => text,
    }
}

/// The first `count` characters of `text` (all of it when shorter).
pub(crate) fn first_chars(text: &str, count: usize) -> &str {
    match text.char_indices().nth(count) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// The last line of `text` that says something, without the rulers around it: for
/// `===== 5 passed in 0.42s =====` it is `5 passed in 0.42s` (spec example 6.1).
pub(crate) fn summary_line(text: &str) -> Option<String> {
    const DECORATION: &[char] = &['=', '-', '*', '#', '_', '~', '+', '|', '>', '<'];
    text.lines().rev().map(|line| line.trim().trim_matches(DECORATION).trim()).find(|line| !line.is_empty()).map(
        |line| {
            if line.chars().count() > MAX_SUMMARY_CHARS {
                format!("{}…", first_chars(line, MAX_SUMMARY_CHARS - 1))
            } else {
                line.to_owned()
            }
        },
    )
}

/// Save `text` as `<staging>/tool_outputs/<tool>-<call id>.txt` (with `-2`, `-3`… if taken) and
/// return the path as the model should read it (relative to the workspace when inside it).
pub(crate) async fn save_full_output(ctx: &ToolContext, tool: &str, text: &str) -> io::Result<String> {
    let folder = ctx.staging_path().join(SAVED_OUTPUT_DIR);
    tokio::fs::create_dir_all(&folder).await?;
    let stem = format!("{tool}-{}", file_safe(&ctx.call_id));
    let mut attempt = 1u32;
    loop {
        let name = if attempt == 1 { format!("{stem}.txt") } else { format!("{stem}-{attempt}.txt") };
        let path: PathBuf = folder.join(name);
        match tokio::fs::OpenOptions::new().write(true).create_new(true).open(&path).await {
            Ok(mut file) => {
                file.write_all(text.as_bytes()).await?;
                file.flush().await?;
                return Ok(ctx.display_path(&path));
            }
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists && attempt < 1_000 => attempt += 1,
            Err(error) => return Err(error),
        }
    }
}

/// `call_id` reduced to characters safe in a file name, never empty.
fn file_safe(call_id: &str) -> String {
    let safe: String =
        call_id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').take(64).collect();
    if safe.is_empty() { "call".to_owned() } else { safe }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_by_characters_not_bytes() {
        assert_eq!(last_chars("héllo", 4), "éllo");
        assert_eq!(last_chars("abc", 10), "abc");
        assert_eq!(last_chars("abc", 0), "");
        assert_eq!(first_chars("héllo", 2), "hé");
        assert_eq!(first_chars("ab", 5), "ab");
    }

    #[test]
    fn summary_is_the_last_meaningful_line_without_rulers() {
        let pytest = "collected 5 items\n\ntests/test_history.py .....   [100%]\n\
                      ============================== 5 passed in 0.42s ===============================\n";
        assert_eq!(summary_line(pytest).as_deref(), Some("5 passed in 0.42s"));
        assert_eq!(summary_line("done\n=====\n\n").as_deref(), Some("done"));
        assert_eq!(summary_line("  \n"), None);
        let long = "x".repeat(500);
        assert_eq!(summary_line(&long).map(|line| line.chars().count()), Some(MAX_SUMMARY_CHARS));
    }

    #[test]
    fn call_ids_become_safe_file_names() {
        assert_eq!(file_safe("call_01/../x"), "call_01x");
        assert_eq!(file_safe("../"), "call");
    }
}
