//! Tools the agent can call: the [`Tool`] contract, the [`Registry`] the agent calls them
//! through, and the built-in tools (`run_shell_command`, `read_file`, `write_file`, `edit_file`)
//! configured by [`ToolsConfig`], and `http_request` ([`HttpTool`]), which the binary offers
//! only when `[tools.http] allowed_hosts` names hosts.
//!
//! Invariants:
//! - A tool call always ends in a [`ToolOutput`]: bad arguments, refusals, timeouts and even a
//!   panicking tool become error outputs that go back to the model, never a crashed turn.
//! - Processes a tool starts never outlive the call (killed by process group on exit, timeout,
//!   cancellation or drop), and never inherit the agent's environment beyond an allow-list. The
//!   one exception is explicit: a background job (`run_shell_command` with `background`, or
//!   `on_timeout: "background"`), handed to a [`Background`] keeper outside this crate.
//! - File tools only reach the workspace and the session's staging folder.
//! - A grant's secret ([`GrantSecret`]) goes into the one request that needs it and is scrubbed
//!   from every output and error text.
//!
//! This crate knows nothing of messages, the store or providers: the agent turns a model's tool
//! call into [`Registry::call`] and the [`ToolOutput`] into a tool result message. It reads no
//! configuration file; the binary parses `[tools]` into [`ToolsConfig`]. It is not a sandbox.

pub mod config;
pub mod files;
pub mod http;
pub mod limiter;
pub mod output;
pub mod registry;
mod schema;
pub mod shell;
pub mod tool;

use std::sync::Arc;

pub use config::{CommandPattern, FilesConfig, PolicyMode, ShellConfig, ToolsConfig, ToolsConfigError};
pub use files::{EDIT_FILE, EditFileTool, READ_FILE, ReadFileTool, WRITE_FILE, WriteFileTool};
pub use http::{HTTP_REQUEST, HttpConfig, HttpTool};
pub use limiter::{ProcessLimiter, ProcessSlot};
pub use registry::{Registry, RegistryError};
pub use shell::{Background, DetachedCommand, JobFiles, MovedCommand, RUN_SHELL_COMMAND, ShellTool};
pub use tool::{GrantSecret, Grants, Tool, ToolContext, ToolOrigin, ToolOutput, ToolSpec};

/// The built-in tools configured by `config`, minus `config.disabled`, sharing one new
/// [`ProcessLimiter`] of `config.max_concurrent_processes` slots.
///
/// Build it once per process and share it (it is cheap to clone): each call makes a new
/// limiter, and the cap holds only among tools sharing one.
pub fn builtin_registry(config: &ToolsConfig) -> Registry {
    builtin_registry_with_limiter(config, ProcessLimiter::new(config.max_concurrent_processes))
}

/// [`builtin_registry`] with a limiter the caller also gives to other process-starting tools.
pub fn builtin_registry_with_limiter(config: &ToolsConfig, limiter: ProcessLimiter) -> Registry {
    builtin_registry_with(config, limiter, None)
}

/// [`builtin_registry`] whose `run_shell_command` offers background jobs kept by `background`.
pub fn builtin_registry_with_background(config: &ToolsConfig, background: Arc<dyn Background>) -> Registry {
    builtin_registry_with(config, ProcessLimiter::new(config.max_concurrent_processes), Some(background))
}

fn builtin_registry_with(
    config: &ToolsConfig,
    limiter: ProcessLimiter,
    background: Option<Arc<dyn Background>>,
) -> Registry {
    let shell = ShellTool::new(&config.shell, limiter);
    let shell = match background {
        Some(background) => shell.with_background(background),
        None => shell,
    };
    let tools: [Arc<dyn Tool>; 4] = [
        Arc::new(shell),
        Arc::new(ReadFileTool::new(&config.files)),
        Arc::new(WriteFileTool::new(&config.files)),
        Arc::new(EditFileTool::new(&config.files)),
    ];
    let mut registry = Registry::new();
    for tool in tools {
        let name = tool.spec().name.clone();
        if config.disabled.contains(&name) {
            continue;
        }
        // Built-in names are distinct and valid and their schemas are objects (tested), so this
        // cannot fail; if it ever did, the tool would be missing and the log would say why.
        if let Err(error) = registry.register_shared(tool) {
            tracing::error!(%error, "a built-in tool could not be registered");
        }
    }
    registry
}
