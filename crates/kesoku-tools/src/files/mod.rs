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

use crate::config::FilesConfig;
use crate::tool::{ToolContext, ToolOutput};
pub use edit::EditFileTool;
use paths::{ConfinedPath, confine_blocking};
pub use read::ReadFileTool;
pub use write::WriteFileTool;

pub const READ_FILE: &str = "read_file";
pub const WRITE_FILE: &str = "write_file";
pub const EDIT_FILE: &str = "edit_file";

/// Bring out-of-range settings into range (see `ToolsConfig::validate` for the report).
fn effective(config: &FilesConfig) -> FilesConfig {
    FilesConfig { max_read_chars: config.max_read_chars.max(1_000), max_file_bytes: config.max_file_bytes.max(1) }
}

/// Run a file tool's filesystem work on a blocking thread: confine `raw`, refuse what is neither
/// a regular file nor a folder (a FIFO's open would wait for the other end for good, a device
/// has no end), then `work` with the confined path. One trip for the whole call, not one per
/// system call (each trip wakes a thread and then the runtime again, which costs more than the
/// calls themselves). Not on the runtime's thread: a slow or hung filesystem under the
/// workspace (a network share) must stall only its tool call, never the service.
async fn on_blocking_thread<T, F>(ctx: &ToolContext, raw: &str, work: F) -> Result<T, ToolOutput>
where
    T: Send + 'static,
    F: FnOnce(ConfinedPath, &str) -> Result<T, ToolOutput> + Send + 'static,
{
    let (workspace, staging) = (ctx.workspace.clone(), ctx.staging_path());
    let raw_owned = raw.to_owned();
    let joined = tokio::task::spawn_blocking(move || {
        let target = confine_blocking(&workspace, &staging, &raw_owned)
            .map_err(|error| ToolOutput::failure(error.to_string()))?;
        target.reject_special(&raw_owned)?;
        work(target, &raw_owned)
    })
    .await;
    match joined {
        Ok(result) => result,
        Err(join_error) => Err(ToolOutput::failure(format!("could not reach `{raw}`: {join_error}"))),
    }
}

impl ConfinedPath {
    /// Refuse what exists but is neither a regular file nor a folder.
    fn reject_special(&self, raw: &str) -> Result<(), ToolOutput> {
        match self.found {
            Some(found) if !found.is_file && !found.is_dir => Err(ToolOutput::failure(format!(
                "`{raw}` is not a regular file (it is a FIFO, a socket or a device); file tools read and write \
                 regular files only: use run_shell_command for it"
            ))),
            _ => Ok(()),
        }
    }

    /// Refuse a folder where a file is wanted, with the command that lists it.
    fn reject_folder(&self, raw: &str) -> Result<(), ToolOutput> {
        match self.found {
            Some(found) if found.is_dir => Err(ToolOutput::failure(format!(
                "`{raw}` is a folder, not a file; list it with run_shell_command (`ls -la {raw}`)"
            ))),
            _ => Ok(()),
        }
    }
}
