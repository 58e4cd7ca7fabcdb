//! The local model's configuration, as it appears in the Kesoku config file.
//!
//! Plain data with defaults and validation; the binary reads the file, this crate never reads the
//! environment for it.

use crate::error::LocalError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Context window used when the config does not set one (capped by the model's own).
pub const DEFAULT_CONTEXT_WINDOW: usize = 4096;

/// How to run one GGUF chat model in-process.
///
/// ```toml
/// path = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
/// context_window = 4096      # tokens; default min(4096, the model's training context)
/// max_output_tokens = 512
/// temperature = 0.7          # 0 = greedy
/// top_p = 0.9
/// seed = 42                  # omit for a fresh seed per generation
/// threads = 2                # omit for all available cores
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
}

fn default_max_output_tokens() -> usize {
    512
}

fn default_temperature() -> f32 {
    0.7
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
