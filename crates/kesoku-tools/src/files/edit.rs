//! `edit_file`: replace the one occurrence of a piece of text in a text file.
//!
//! The match must be exact and unique (overlapping occurrences count), so that an edit never
//! lands somewhere the model did not mean; on any failure the file is left as it was.

use std::path::Path;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::ConfinedPath;
use super::{EDIT_FILE, effective, on_blocking_thread};
use crate::config::FilesConfig;
use crate::tool::{Tool, ToolContext, ToolOutput, ToolSpec, parse_arguments};

/// Line numbers listed when `old_text` matches several places.
const LISTED_MATCHES: usize = 10;

/// The `edit_file` tool.
pub struct EditFileTool {
    spec: ToolSpec,
    config: FilesConfig,
}

#[derive(Deserialize)]
struct EditParams {
    path: String,
    old_text: String,
    new_text: String,
}

impl EditFileTool {
    pub fn new(config: &FilesConfig) -> Self {
        let config = effective(config);
        let spec = ToolSpec {
            name: EDIT_FILE.to_owned(),
            description: "Replace one piece of text in an existing text file. `old_text` must occur exactly once \
                          in the file, character for character (whitespace and indentation included); quote \
                          enough surrounding lines to make it unique. To create a file or replace all of it, use \
                          write_file."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path of the file, relative to the workspace."},
                    "old_text": {"type": "string", "description": "The exact text to replace; must occur exactly once."},
                    "new_text": {"type": "string", "description": "The text to put in its place (may be empty)."}
                },
                "required": ["path", "old_text", "new_text"]
            }),
        };
        Self { spec, config }
    }
}

#[async_trait]
impl Tool for EditFileTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: EditParams = match parse_arguments(EDIT_FILE, arguments) {
            Ok(params) => params,
            Err(output) => return output,
        };
        let EditParams { path: raw, old_text, new_text } = params;
        if old_text.is_empty() {
            return ToolOutput::failure(
                "`old_text` is empty; give the exact text to replace (to create or overwrite a whole file, use write_file)",
            );
        }
        if old_text == new_text {
            return ToolOutput::failure("`old_text` and `new_text` are the same; the edit would change nothing");
        }
        let max_file_bytes = self.config.max_file_bytes;
        let done = on_blocking_thread(ctx, &raw, move |target, raw| {
            let text = read_text(&target, raw, max_file_bytes)?;
            edit_text(&target.path, raw, &text, &old_text, &new_text)
        })
        .await;
        match done {
            Ok(message) => ToolOutput::success(message.clone()).with_summary(message),
            Err(output) => output,
        }
    }
}

/// The file's text, if it is an existing text file small enough to edit.
fn read_text(target: &ConfinedPath, raw: &str, max_file_bytes: usize) -> Result<String, ToolOutput> {
    let Some(found) = target.found else {
        return Err(ToolOutput::failure(format!("file `{raw}` does not exist; use write_file to create it")));
    };
    target.reject_folder(raw)?;
    if found.len > max_file_bytes as u64 {
        return Err(ToolOutput::failure(format!(
            "`{raw}` is {} bytes, more than the {max_file_bytes} bytes edit_file handles (tools.files.max_file_bytes); \
             edit it with run_shell_command (e.g. `sed`)",
            found.len
        )));
    }
    let bytes =
        std::fs::read(&target.path).map_err(|error| ToolOutput::failure(format!("could not read `{raw}`: {error}")))?;
    String::from_utf8(bytes)
        .map_err(|_| ToolOutput::failure(format!("`{raw}` is not UTF-8 text; edit_file edits text files only")))
}

/// Replace the one occurrence of `old_text` and write the file; the message saying where, or why
/// nothing was changed.
fn edit_text(path: &Path, raw: &str, text: &str, old_text: &str, new_text: &str) -> Result<String, ToolOutput> {
    let matches = match_positions(text, old_text);
    let line_of = |index: usize| text[..index].matches('\n').count() + 1;
    match matches.as_slice() {
        [] => {
            let hint = if text.contains("\r\n") && !old_text.contains('\r') {
                " (the file has Windows line endings, `\\r\\n`)"
            } else {
                ""
            };
            Err(ToolOutput::failure(format!(
                "`old_text` does not occur in `{raw}`{hint}; read the file again and copy the text exactly, \
                 whitespace and indentation included"
            )))
        }
        [index] => {
            let index = *index;
            let edited = format!("{}{new_text}{}", &text[..index], &text[index + old_text.len()..]);
            std::fs::write(path, edited.as_bytes())
                .map_err(|error| ToolOutput::failure(format!("could not write `{raw}`: {error}")))?;
            Ok(format!("replaced the text at line {} of `{raw}`", line_of(index)))
        }
        several => {
            let lines: Vec<String> =
                several.iter().take(LISTED_MATCHES).map(|index| line_of(*index).to_string()).collect();
            let etc = if several.len() > LISTED_MATCHES { ", …" } else { "" };
            Err(ToolOutput::failure(format!(
                "`old_text` occurs {} times in `{raw}` (at lines {}{etc}); the file was not changed. Include \
                 more of the surrounding text so that it matches exactly one place",
                several.len(),
                lines.join(", ")
            )))
        }
    }
}

/// Byte offsets of every occurrence of `needle` in `haystack`, overlapping ones included (`aa`
/// occurs twice in `aaa`: replacing "the" occurrence would be ambiguous).
fn match_positions(haystack: &str, needle: &str) -> Vec<usize> {
    let mut positions = Vec::new();
    let mut from = 0;
    while let Some(found) = haystack[from..].find(needle) {
        let index = from + found;
        positions.push(index);
        let step = haystack[index..].chars().next().map_or(1, char::len_utf8);
        from = index + step;
    }
    positions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_matches_count() {
        assert_eq!(match_positions("aaa", "aa"), vec![0, 1]);
        assert_eq!(match_positions("héhé", "hé"), vec![0, 3]);
        assert_eq!(match_positions("abc", "x"), Vec::<usize>::new());
    }
}
