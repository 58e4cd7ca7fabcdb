//! The tool contract: what a tool declares ([`ToolSpec`]), what it is given ([`ToolContext`]),
//! what it returns ([`ToolOutput`]) and the [`Tool`] trait tying them together.
//!
//! This module holds no tool and no policy; it is deliberately free of I/O.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use kesoku_core::{ActivationId, MessageId, SessionId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What the model is told about a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls the tool by: a letter or `_`, then letters, digits, `_` or `-`,
    /// at most 64 in all (the names every provider accepts).
    pub name: String,
    /// What the tool does and when to use it, written for the model.
    pub description: String,
    /// A JSON Schema object (`{"type": "object", "properties": …, "required": …}`) describing the
    /// arguments. Keep to the subset every provider accepts: `type`, `properties`, `required`,
    /// `description`, `enum`, `items`, `minimum`, `maximum`.
    pub parameters: Value,
}

/// Everything a tool call may know about where and for whom it runs.
///
/// Build it with [`ToolContext::new`]; the fields are public to read.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The agent's workspace: the root that file tools are confined to and the directory shell
    /// commands run in.
    pub workspace: PathBuf,
    /// The session's folder for files tools produce (saved full outputs, scratch files). Meant
    /// to be inside the workspace; a relative path is taken relative to the workspace.
    pub staging_dir: PathBuf,
    pub session_id: SessionId,
    /// Fires when the turn is interrupted: a tool stops what it is doing (killing any process it
    /// started) and returns promptly.
    pub cancel: CancellationToken,
    /// The provider's id for this call (or one the agent made up); names saved output files.
    pub call_id: String,
    /// The turn this call belongs to, for tools whose work outlives the call (background jobs,
    /// follow-ups): where it came from and where its results go. `None` outside a turn.
    pub origin: Option<ToolOrigin>,
    /// The connections of the person the work runs for (its activation's delegation user), read
    /// at call time. `None` when the work runs for nobody in particular; a tool that needs a
    /// connection then says so in its error.
    pub grants: Option<Arc<dyn Grants>>,
    /// The configured agent (`[[agents]]` name) whose turn makes the call; `None`: the default
    /// agent. Work the call starts for later (a sub-agent's result) goes back to it.
    pub agent: Option<String>,
}

/// A person's connection grants (tokens set with `kesoku grants`), as tools read them at call
/// time. The runtime implements it over the store for the activation's delegation user; the
/// secret goes from here into the tool's request and nowhere else (not the model's context,
/// not a stored message, not a log line).
#[async_trait]
pub trait Grants: Send + Sync + std::fmt::Debug {
    /// Who the grants belong to (for error texts; not a secret).
    fn user(&self) -> &str;
    /// The secret of grant `name` (`github`, `drive`, …), `None` when the person has none.
    async fn grant(&self, name: &str) -> Result<Option<GrantSecret>, String>;
}

/// A grant's secret. `Debug` and `Display` print `[redacted]`; it is deliberately not
/// `Serialize`. [`GrantSecret::expose`] is for the one place it is sent.
#[derive(Clone, PartialEq, Eq)]
pub struct GrantSecret(String);

impl GrantSecret {
    pub fn new(value: impl Into<String>) -> Self {
        GrantSecret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the secret replaced by `[redacted]` (a tool output that
    /// echoes a request, say).
    pub fn scrub(&self, text: &str) -> String {
        if self.0.len() < 4 { text.to_owned() } else { text.replace(&self.0, "[redacted]") }
    }
}

impl std::fmt::Debug for GrantSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for GrantSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// The turn a tool call belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOrigin {
    /// The turn's root message.
    pub message_id: MessageId,
    /// Reply routing of the turn.
    pub chatbot_id: String,
    pub channel_id: String,
    /// IANA time zone of the user or channel (times given to and read from the model are in it),
    /// when one is configured.
    pub timezone: Option<String>,
    /// The activation's depth in an agent-to-agent chain (0: a person or a schedule asked).
    pub depth: u32,
    /// The activation the call runs in, for work it starts (a sub-agent) to refer back to.
    pub activation_id: Option<ActivationId>,
}

impl ToolContext {
    /// A context with a fresh, never-cancelled token.
    pub fn new(
        workspace: impl Into<PathBuf>,
        staging_dir: impl Into<PathBuf>,
        session_id: SessionId,
        call_id: impl Into<String>,
    ) -> Self {
        Self {
            workspace: workspace.into(),
            staging_dir: staging_dir.into(),
            session_id,
            cancel: CancellationToken::new(),
            call_id: call_id.into(),
            origin: None,
            grants: None,
            agent: None,
        }
    }

    /// Say which turn the call belongs to.
    pub fn with_origin(mut self, origin: ToolOrigin) -> Self {
        self.origin = Some(origin);
        self
    }

    /// Give the call the connections of the person the work runs for.
    pub fn with_grants(mut self, grants: Arc<dyn Grants>) -> Self {
        self.grants = Some(grants);
        self
    }

    /// Say which configured agent's turn makes the call.
    pub fn with_agent(mut self, agent: Option<String>) -> Self {
        self.agent = agent;
        self
    }

    /// Use `cancel` (typically a child of the turn's token) instead of a fresh token.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// The same context for another call of the same turn.
    pub fn for_call(&self, call_id: impl Into<String>) -> Self {
        Self { call_id: call_id.into(), ..self.clone() }
    }

    /// The staging folder as a path usable from any working directory.
    pub fn staging_path(&self) -> PathBuf {
        if self.staging_dir.is_absolute() { self.staging_dir.clone() } else { self.workspace.join(&self.staging_dir) }
    }

    /// `path` as the model should read it: relative to the workspace when it is inside it.
    pub fn display_path(&self, path: &Path) -> String {
        match path.strip_prefix(&self.workspace) {
            Ok(relative) if !relative.as_os_str().is_empty() => relative.display().to_string(),
            Ok(_) | Err(_) => path.display().to_string(),
        }
    }
}

/// The result of one call.
///
/// `content` is what the model and the user see: for a process, its output; for a refusal or a
/// bad argument, the reason. When `error` is set the call failed; the agent records it as
/// `metadata.tool_error` and should make it visible to the model too (for a command that exited
/// non-zero, `content` is the command's output and only `error` says `exit code N`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolOutput {
    pub content: String,
    /// A short line for `metadata.tool_result` (e.g. `5 passed in 0.42s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Set when the tool failed: goes to `metadata.tool_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ToolOutput {
    /// A successful call.
    pub fn success(content: impl Into<String>) -> Self {
        Self { content: content.into(), summary: None, error: None }
    }

    /// A failed call with nothing to show but the reason, which becomes the content too.
    pub fn failure(error: impl Into<String>) -> Self {
        let error = error.into();
        Self { content: error.clone(), summary: None, error: Some(error) }
    }

    /// A failed call that still produced something to show (a command's output).
    pub fn failure_with_content(content: impl Into<String>, error: impl Into<String>) -> Self {
        Self { content: content.into(), summary: None, error: Some(error.into()) }
    }

    pub fn with_summary(mut self, summary: impl Into<String>) -> Self {
        self.summary = Some(summary.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.error.is_some()
    }
}

/// A capability the model can call.
///
/// A tool never panics on bad arguments and never returns a Rust error: every failure is a
/// [`ToolOutput`] with `error` set, which goes back to the model. The [`Registry`](crate::Registry)
/// validates arguments against [`ToolSpec::parameters`] before calling, and turns a panic into an
/// error output, but a tool called directly must cope with any JSON.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    fn spec(&self) -> &ToolSpec;

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput;
}

/// Parse a tool's arguments into its parameter struct, as an error output when they do not fit.
pub(crate) fn parse_arguments<T: serde::de::DeserializeOwned>(tool: &str, arguments: Value) -> Result<T, ToolOutput> {
    serde_json::from_value(arguments)
        .map_err(|error| ToolOutput::failure(format!("invalid arguments for tool `{tool}`: {error}")))
}
