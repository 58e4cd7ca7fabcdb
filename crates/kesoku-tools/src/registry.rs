//! The set of tools offered to the model, and the one door through which they are called.
//!
//! [`Registry::call`] is where a model's request becomes a tool call: it finds the tool, checks
//! the arguments against the tool's schema, and makes sure that whatever happens (an unknown
//! name, bad arguments, a panic inside the tool) the answer is a [`ToolOutput`], never a crash of
//! the turn. It does not time calls out or count them: limits belong to the tools and the agent.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Map, Value};

use crate::output::first_chars;
use crate::schema;
use crate::tool::{Tool, ToolContext, ToolOutput, ToolSpec};

/// Longest tool name providers accept.
const MAX_NAME_LEN: usize = 64;
/// How much of a panic message reaches the model.
const MAX_PANIC_MESSAGE_CHARS: usize = 300;

/// Tools by name. Cloning is cheap and shares the tools.
#[derive(Clone, Default)]
pub struct Registry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

/// Why a tool could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("a tool named `{name}` is already registered; give the new tool another name")]
    DuplicateName { name: String },
    #[error(
        "tool name `{name}` is not accepted by model providers; use a letter or `_` followed by letters, \
         digits, `_` or `-`, at most 64 characters"
    )]
    InvalidName { name: String },
    #[error("tool `{name}` has an unusable parameters schema: {reason}")]
    InvalidSchema { name: String, reason: String },
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a tool. Its name must be unique and acceptable to providers, and its parameters an
    /// object schema.
    pub fn register<T: Tool>(&mut self, tool: T) -> Result<(), RegistryError> {
        self.register_shared(Arc::new(tool))
    }

    /// Add a tool that is shared with something else (e.g. several tools of one MCP server).
    pub fn register_shared(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let spec = tool.spec();
        let name = spec.name.clone();
        if !is_valid_name(&name) {
            return Err(RegistryError::InvalidName { name });
        }
        if let Err(reason) = schema::check_parameters_schema(&spec.parameters) {
            return Err(RegistryError::InvalidSchema { name, reason });
        }
        if self.tools.contains_key(&name) {
            return Err(RegistryError::DuplicateName { name });
        }
        self.tools.insert(name, tool);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Tool names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// Every tool's spec, sorted by name: the same order on every call, so the tool list
    /// does not break a provider's prompt cache.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values().map(|tool| tool.spec())
    }

    /// The tools among `names` only (a configured agent's `tools`); names not registered are
    /// skipped (the binary checks them against [`Registry::names`] at start-up).
    pub fn subset<S: AsRef<str>>(&self, names: &[S]) -> Registry {
        let tools = self
            .tools
            .iter()
            .filter(|(name, _)| names.iter().any(|n| n.as_ref() == name.as_str()))
            .map(|(name, tool)| (name.clone(), Arc::clone(tool)))
            .collect();
        Registry { tools }
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Call tool `name` with the model's `arguments`.
    ///
    /// Always answers with an output: an unknown name, arguments that do not fit the schema, a
    /// cancelled context and a panicking tool each give an error output saying so. `null`
    /// arguments count as `{}`, and a JSON object sent as a string is parsed.
    pub async fn call(&self, name: &str, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let Some(tool) = self.tools.get(name) else {
            let known: Vec<&str> = self.names().collect();
            let shown = if name.chars().count() > MAX_NAME_LEN {
                format!("{}…", first_chars(name, MAX_NAME_LEN))
            } else {
                name.to_owned()
            };
            return ToolOutput::failure(format!(
                "there is no tool named `{shown}`; the available tools are: {}",
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            ));
        };
        let mut arguments = match normalize_arguments(arguments) {
            Ok(arguments) => arguments,
            Err(problem) => return ToolOutput::failure(format!("invalid arguments for tool `{name}`: {problem}")),
        };
        if let Err(mismatch) = schema::validate(&tool.spec().parameters, &mut arguments) {
            return ToolOutput::failure(format!("invalid arguments for tool `{name}`: {mismatch}"));
        }
        if ctx.cancel.is_cancelled() {
            return ToolOutput::failure(format!("tool `{name}` was not run: the turn was cancelled"));
        }

        tracing::debug!(tool = name, call_id = %ctx.call_id, session_id = %ctx.session_id, "tool call started");
        // A tool is called through `&self`; if it panics half-way, its own state may be
        // inconsistent, but nothing of the registry's is, and the tool's answer is an error.
        let outcome = AssertUnwindSafe(tool.call(ctx, arguments)).catch_unwind().await;
        match outcome {
            Ok(output) => {
                tracing::debug!(tool = name, call_id = %ctx.call_id, failed = output.is_error(), "tool call finished");
                output
            }
            Err(panic) => {
                let message = panic_message(panic.as_ref());
                tracing::error!(tool = name, call_id = %ctx.call_id, panic = %message, "tool panicked");
                ToolOutput::failure(format!(
                    "tool `{name}` failed unexpectedly (it panicked: {message}); this is a bug in the tool, \
                     not a problem with your arguments"
                ))
            }
        }
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry").field("tools", &self.tools.keys().collect::<Vec<_>>()).finish()
    }
}

fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_');
    first_ok && name.len() <= MAX_NAME_LEN && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn normalize_arguments(arguments: Value) -> Result<Value, String> {
    match arguments {
        Value::Null => Ok(Value::Object(Map::new())),
        Value::String(text) if text.trim().is_empty() => Ok(Value::Object(Map::new())),
        Value::String(text) => match serde_json::from_str::<Value>(&text) {
            Ok(parsed @ Value::Object(_)) => Ok(parsed),
            Ok(_) | Err(_) => Err("expected a JSON object of named arguments, got a string".to_owned()),
        },
        other @ (Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_)) => Ok(other),
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    let text = if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "no message".to_owned()
    };
    if text.chars().count() > MAX_PANIC_MESSAGE_CHARS {
        let cut: String = text.chars().take(MAX_PANIC_MESSAGE_CHARS).collect();
        format!("{cut}…")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_providers_rules() {
        for good in ["run_shell_command", "_x", "a-b", "A1", &"a".repeat(64)] {
            assert!(is_valid_name(good), "{good} should be accepted");
        }
        for bad in ["", "1abc", "-x", "has space", "dot.name", "ünicode", &"a".repeat(65)] {
            assert!(!is_valid_name(bad), "{bad} should be refused");
        }
    }

    #[test]
    fn a_subset_keeps_only_the_named_tools_that_exist() {
        let all = crate::builtin_registry(&crate::ToolsConfig::default());
        let first: Vec<String> = all.names().take(2).map(str::to_owned).collect();
        let subset = all.subset(&[first[0].as_str(), first[1].as_str(), "no_such_tool"]);
        assert_eq!(subset.names().collect::<Vec<_>>(), [first[0].as_str(), first[1].as_str()]);
        assert!(all.subset::<&str>(&[]).is_empty());
    }
}
