//! `read_file`: a window of lines of a text file, within a character budget.
//!
//! It streams the file (a huge file or a huge line costs only the budget) and returns the text as
//! stored, without line numbers, so that the model can quote it to `edit_file`.

use std::io::{self, BufRead, BufReader};
use std::path::Path;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{READ_FILE, effective, on_blocking_thread};
use crate::config::FilesConfig;
use crate::output::first_chars;
use crate::tool::{Tool, ToolContext, ToolOutput, ToolSpec, parse_arguments};

/// The `read_file` tool.
pub struct ReadFileTool {
    spec: ToolSpec,
    config: FilesConfig,
}

#[derive(Deserialize)]
struct ReadParams {
    path: String,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    limit: Option<u64>,
}

impl ReadFileTool {
    pub fn new(config: &FilesConfig) -> Self {
        let config = effective(config);
        let spec = ToolSpec {
            name: READ_FILE.to_owned(),
            description: format!(
                "Read a text file inside the workspace (or this session's staging folder). Returns the text \
                 exactly as stored, so that it can be quoted in edit_file. At most {} characters are returned \
                 per call; a note at the end then says which `offset` continues. Use `offset` and `limit` to \
                 read part of a long file.",
                config.max_read_chars
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path of the file, relative to the workspace."},
                    "offset": {"type": "integer", "minimum": 1, "description": "Line to start at, counting from 1 (default 1)."},
                    "limit": {"type": "integer", "minimum": 1, "description": "Most lines to return (default: as many as fit)."}
                },
                "required": ["path"]
            }),
        };
        Self { spec, config }
    }
}

#[async_trait]
impl Tool for ReadFileTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: ReadParams = match parse_arguments(READ_FILE, arguments) {
            Ok(params) => params,
            Err(output) => return output,
        };
        let start = params.offset.unwrap_or(1).max(1);
        let limit = params.limit.filter(|limit| *limit > 0);
        let max_chars = self.config.max_read_chars;
        let raw = params.path;
        let excerpt = on_blocking_thread(ctx, &raw, move |target, raw| {
            if !target.exists() {
                return Err(ToolOutput::failure(format!("file `{raw}` does not exist")));
            }
            target.reject_folder(raw)?;
            read_excerpt(&target.path, start, limit, max_chars)
                .map_err(|error| ToolOutput::failure(format!("could not read `{raw}`: {error}")))
        })
        .await;
        let excerpt = match excerpt {
            Ok(excerpt) => excerpt,
            Err(output) => return output,
        };
        excerpt.into_output(&raw, start, max_chars)
    }
}

/// What one `read_file` call found.
#[derive(Debug)]
enum Excerpt {
    Binary,
    /// The file has `lines` lines, all before `offset`.
    PastEnd {
        lines: u64,
    },
    Lines {
        text: String,
        /// Number of the last line shown (0 if none).
        last_line: u64,
        /// Whether lines follow the last one shown.
        more: bool,
        /// The one line shown was longer than the budget and only its start is shown.
        line_cut: bool,
    },
}

impl Excerpt {
    fn into_output(self, raw: &str, start: u64, max_chars: usize) -> ToolOutput {
        let (text, last_line, more, line_cut) = match self {
            Excerpt::Binary => {
                return ToolOutput::failure(format!(
                    "`{raw}` looks like a binary file (it contains NUL bytes); read_file shows text only. Inspect it \
                     with run_shell_command (e.g. `file {raw}` or `xxd {raw} | head`)"
                ));
            }
            Excerpt::PastEnd { lines } => {
                return ToolOutput::failure(format!(
                    "`{raw}` has {lines} lines, so there is nothing from line {start} on; use a smaller `offset`"
                ));
            }
            Excerpt::Lines { text, last_line, more, line_cut } => (text, last_line, more, line_cut),
        };
        if start == 1 && !more && !line_cut {
            if text.is_empty() {
                return ToolOutput::success("[the file is empty]").with_summary(format!("`{raw}` is empty"));
            }
            return ToolOutput::success(text).with_summary(format!("read {last_line} lines of `{raw}`"));
        }
        let mut note = if line_cut {
            format!("[line {last_line} is longer than {max_chars} characters; only its start is shown")
        } else {
            format!("[lines {start}-{last_line} of `{raw}`")
        };
        if more {
            note.push_str(&format!("; more lines follow: call read_file with offset={} to continue]", last_line + 1));
        } else {
            note.push_str("; this is the end of the file]");
        }
        let separator = if text.ends_with('\n') || text.is_empty() { "\n" } else { "\n\n" };
        ToolOutput::success(format!("{text}{separator}{note}"))
            .with_summary(format!("read lines {start}-{last_line} of `{raw}`"))
    }
}

fn read_excerpt(path: &Path, start: u64, limit: Option<u64>, max_chars: usize) -> io::Result<Excerpt> {
    let mut reader = BufReader::with_capacity(64 * 1024, std::fs::File::open(path)?);
    if reader.fill_buf()?.contains(&0) {
        return Ok(Excerpt::Binary);
    }
    let mut line = Vec::new();
    let mut line_number = 0u64;
    while line_number + 1 < start {
        if next_line(&mut reader, &mut line, 0)?.is_none() {
            return Ok(Excerpt::PastEnd { lines: line_number });
        }
        line_number += 1;
    }
    if start > 1 && reader.fill_buf()?.is_empty() {
        return Ok(Excerpt::PastEnd { lines: line_number });
    }

    // Enough bytes to hold more than `max_chars` characters of any encoding.
    let keep = max_chars.saturating_mul(4).saturating_add(4);
    let mut text = String::new();
    let mut text_chars = 0usize;
    let mut shown = 0u64;
    let mut line_cut = false;
    let more = loop {
        if limit.is_some_and(|limit| shown >= limit) {
            break !reader.fill_buf()?.is_empty();
        }
        if next_line(&mut reader, &mut line, keep)?.is_none() {
            break false;
        }
        let decoded = String::from_utf8_lossy(&line);
        let count = decoded.chars().count();
        if text_chars + count > max_chars {
            if shown == 0 {
                // One line longer than the whole budget: show its start rather than nothing.
                text.push_str(first_chars(&decoded, max_chars));
                line_cut = true;
                line_number += 1;
                break !reader.fill_buf()?.is_empty();
            }
            // This line is not shown; the note sends the model back to it.
            break true;
        }
        text.push_str(&decoded);
        text_chars += count;
        shown += 1;
        line_number += 1;
    };
    Ok(Excerpt::Lines { text, last_line: line_number, more, line_cut })
}

/// Read one line (newline included) keeping at most `keep` bytes of it; the rest of a longer
/// line is skipped. `None` at the end of the file.
fn next_line(reader: &mut impl BufRead, line: &mut Vec<u8>, keep: usize) -> io::Result<Option<()>> {
    line.clear();
    let mut read_any = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(read_any.then_some(()));
        }
        read_any = true;
        let (chunk, complete) = match available.iter().position(|byte| *byte == b'\n') {
            Some(end) => (&available[..=end], true),
            None => (available, false),
        };
        let room = keep.saturating_sub(line.len()).min(chunk.len());
        line.extend_from_slice(&chunk[..room]);
        let used = chunk.len();
        reader.consume(used);
        if complete {
            return Ok(Some(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_skipped_past_the_kept_bytes() {
        let data = format!("{}\nsecond\n", "x".repeat(100));
        let mut reader = BufReader::with_capacity(8, data.as_bytes());
        let mut line = Vec::new();
        assert_eq!(next_line(&mut reader, &mut line, 10).ok(), Some(Some(())));
        assert_eq!(line, b"xxxxxxxxxx");
        assert_eq!(next_line(&mut reader, &mut line, 10).ok(), Some(Some(())));
        assert_eq!(line, b"second\n");
        assert_eq!(next_line(&mut reader, &mut line, 10).ok(), Some(None));
    }
}
