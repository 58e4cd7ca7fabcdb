//! `read_file`, `write_file` and `edit_file`: text files inside the workspace and the session's
//! staging folder.
//!
//! Paths are confined by the `paths` module; sizes are bounded by [`FilesConfig`]. These tools handle
//! text: a binary file is refused with a pointer to the shell tool, and nothing here lists
//! folders, moves or deletes files (the shell does that).

mod edit;
mod paths;
mod read;
mod write;

use std::path::Path;

use crate::config::FilesConfig;
use crate::tool::{ToolContext, ToolOutput};
pub use edit::EditFileTool;
use paths::{ConfinedPath, confine};
pub use read::ReadFileTool;
pub use write::WriteFileTool;

pub const READ_FILE: &str = "read_file";
pub const WRITE_FILE: &str = "write_file";
pub const EDIT_FILE: &str = "edit_file";

/// Bring out-of-range settings into range (see `ToolsConfig::validate` for the report).
fn effective(config: &FilesConfig) -> FilesConfig {
    FilesConfig { max_read_chars: config.max_read_chars.max(1_000), max_file_bytes: config.max_file_bytes.max(1) }
}

async fn confined(ctx: &ToolContext, raw: &str) -> Result<ConfinedPath, ToolOutput> {
    confine(ctx, raw).await.map_err(|error| ToolOutput::failure(error.to_string()))
}

async fn reject_folder(path: &Path, raw: &str) -> Result<(), ToolOutput> {
    folder_verdict(tokio::fs::metadata(path).await, raw)
}

/// [`reject_folder`] for code already on a blocking thread.
fn reject_folder_blocking(path: &Path, raw: &str) -> Result<(), ToolOutput> {
    folder_verdict(std::fs::metadata(path), raw)
}

fn folder_verdict(metadata: std::io::Result<std::fs::Metadata>, raw: &str) -> Result<(), ToolOutput> {
    match metadata {
        Ok(metadata) if metadata.is_dir() => Err(ToolOutput::failure(format!(
            "`{raw}` is a folder, not a file; list it with run_shell_command (`ls -la {raw}`)"
        ))),
        Ok(_) => Ok(()),
        Err(error) => Err(ToolOutput::failure(format!("could not open `{raw}`: {error}"))),
    }
}
