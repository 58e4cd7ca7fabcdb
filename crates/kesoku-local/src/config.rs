//! The local model's configuration, as it appears in the Kesoku config file.
//!
//! Plain data with defaults and validation; the binary reads the file, this crate never reads the
//! environment for it.
//!
//! The defaults are a profile for small models: greedy sampling (the same answer every time),
//! a short output cap, and no tools offered ([`LocalModelConfig::tools`]), with
//! [`SMALL_MODEL_SYSTEM_PROMPT`] in place of the agent's long built-in instructions. A model
//! that was trained to call tools opts in with `tools = true` and gets the full agent.

use crate::error::LocalError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Context window used when the config does not set one (capped by the model's own).
pub const DEFAULT_CONTEXT_WINDOW: usize = 4096;

/// The system prompt for a local model offered no tools, unless the config gives one: the
/// agent's built-in prompt is about tools and steps, which such a model cannot use, and every
/// prompt token costs a small model's CPU time before the first answer token. `{name}` is the
/// agent's name.
pub const SMALL_MODEL_SYSTEM_PROMPT: &str =
    "You are {name}, a helpful assistant. Answer the question directly and briefly.";

/// How to run one GGUF chat model in-process.
///
/// ```toml
/// path = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
/// context_window = 4096      # tokens; default min(4096, the model's training context)
/// max_output_tokens = 256
/// temperature = 0.0          # 0 = greedy (the default: the same answer every time)
/// top_p = 0.9
/// seed = 42                  # omit for a fresh seed per generation
/// threads = 2                # omit for all available cores
/// tools = false              # offer the agent's tools (only for models trained to call them)
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalModelConfig {
    /// The `.gguf` file.
    pub path: PathBuf,
    /// Prompt plus output tokens kept in the key/value cache.
    #[serde(default)]
    pub context_window: Option<usize>,
    /// Output tokens per generation unless a request asks for fewer.
    #[serde(default = "default_max_output_tokens")]
    pub max_output_tokens: usize,
    /// Sampling temperature; 0 picks the most likely token every time.
    #[serde(default = "default_temperature")]
    pub temperature: f32,
    /// Nucleus sampling threshold in (0, 1].
    #[serde(default = "default_top_p")]
    pub top_p: f32,
    /// Seed of the sampler; `None` draws a new seed per generation.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Compute threads; `None` uses every available core.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Whether the agent offers its tools to this model. Off by default: a small model does
    /// not call them well, and their schemas would be most of every prompt it reads.
    #[serde(default)]
    pub tools: bool,
}

/// Enough for a paragraph; a small model that loses its way stops here instead of filling the
/// context window.
fn default_max_output_tokens() -> usize {
    256
}

/// Greedy: a small model sampled at a higher temperature drifts off topic more often.
fn default_temperature() -> f32 {
    0.0
}

fn default_top_p() -> f32 {
    0.9
}

impl LocalModelConfig {
    /// A config with every default, for the model at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            context_window: None,
            max_output_tokens: default_max_output_tokens(),
            temperature: default_temperature(),
            top_p: default_top_p(),
            seed: None,
            threads: None,
            tools: false,
        }
    }

    /// Checks ranges; called by [`crate::LocalModel::load`].
    pub fn validate(&self) -> Result<(), LocalError> {
        if self.context_window == Some(0) {
            return Err(LocalError::Config("context_window must be at least 1".into()));
        }
        if self.max_output_tokens == 0 {
            return Err(LocalError::Config("max_output_tokens must be at least 1".into()));
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(LocalError::Config(format!("temperature must be 0 or more, got {}", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(LocalError::Config(format!("top_p must be in (0, 1], got {}", self.top_p)));
        }
        if self.threads == Some(0) {
            return Err(LocalError::Config("threads must be at least 1".into()));
        }
        Ok(())
    }

    /// The thread count to use.
    pub fn effective_threads(&self) -> usize {
        self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}
