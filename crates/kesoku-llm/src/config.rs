//! A named model's configuration (`[models.NAME]` in the binary's TOML) and building a model from it.
//!
//! This module does not read the environment or files: the binary does, and hands the API key
//! in as a [`Secret`]. [`resolve_api_key`] takes a lookup function so the rule for which
//! variable to read is testable without touching the process environment.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Model;
use crate::conversation::ThinkingLevel;
use crate::error::{LlmError, LlmErrorKind};
use crate::providers::{anthropic::AnthropicModel, gemini::GeminiModel, openai::OpenAiModel};
use crate::retry::RetryPolicy;
use crate::secret::Secret;

/// Which wire protocol a model speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// Google Gemini API (`generateContent`, `streamGenerateContent`).
    Gemini,
    /// OpenAI-style chat completions (OpenAI, Ollama, vLLM, llama.cpp, LM Studio, OpenRouter).
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic messages.
    Anthropic,
    /// A GGUF model run inside the process (`kesoku-local`); needs no key and no server.
    Local,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Gemini => "gemini",
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Local => "local",
        }
    }

    /// The base URL the vendor's own SDK uses.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Provider::Gemini => "https://generativelanguage.googleapis.com",
            Provider::OpenAi => "https://api.openai.com/v1",
            Provider::Anthropic => "https://api.anthropic.com",
            Provider::Local => "",
        }
    }

    /// The environment variable the vendor's SDK reads the key from.
    pub fn default_api_key_env(self) -> &'static str {
        match self {
            Provider::Gemini => "GEMINI_API_KEY",
            Provider::OpenAi => "OPENAI_API_KEY",
            Provider::Anthropic => "ANTHROPIC_API_KEY",
            Provider::Local => "",
        }
    }

    fn default_context_window(self) -> u32 {
        match self {
            Provider::Gemini => 1_048_576,
            Provider::OpenAi => 128_000,
            Provider::Anthropic => 200_000,
            Provider::Local => 4096,
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Time limits of a model's HTTP calls (`[models.NAME.timeouts]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timeouts {
    /// Establishing the connection (TCP and TLS).
    pub connect_seconds: f64,
    /// From sending the request to the first byte of the answer (headers and first chunk). For a
    /// non-streaming call this covers the whole generation.
    pub first_byte_seconds: f64,
    /// Longest silence between two chunks of a streamed answer.
    pub idle_seconds: f64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { connect_seconds: 10.0, first_byte_seconds: 300.0, idle_seconds: 120.0 }
    }
}

/// The same limits as durations, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeoutDurations {
    pub connect: Duration,
    pub first_byte: Duration,
    pub idle: Duration,
}

impl Timeouts {
    pub(crate) fn durations(&self) -> Result<TimeoutDurations, String> {
        let convert = |field: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .ok()
                .filter(|duration| !duration.is_zero())
                .ok_or_else(|| format!("timeouts.{field} must be a positive number of seconds, got {value}"))
        };
        Ok(TimeoutDurations {
            connect: convert("connect_seconds", self.connect_seconds)?,
            first_byte: convert("first_byte_seconds", self.first_byte_seconds)?,
            idle: convert("idle_seconds", self.idle_seconds)?,
        })
    }
}

/// One `[models.NAME]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub provider: Provider,
    /// The vendor's model id (`gemini-2.5-flash`, `gpt-4.1`, `claude-sonnet-4-5`, `llama3.2`, …).
    pub model: String,
    /// Overrides the vendor's endpoint. OpenAI-style URLs end in `/v1`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// The environment variable holding the API key. Unset: the vendor's usual variable
    /// (`GEMINI_API_KEY`, `ANTHROPIC_API_KEY`; `OPENAI_API_KEY` only for OpenAI's own endpoint —
    /// a custom OpenAI-style server such as Ollama gets no key unless one is named here).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Default thinking level of requests that do not set one. Unset: thinking models show their
    /// thoughts at their own effort (Gemini 2.5 and later: `includeThoughts`; Claude 3.7 Sonnet
    /// to 4.5: extended thinking with a 1,024-token budget; Claude 4.6 and later: adaptive
    /// thinking), and reasoning text from OpenAI-style servers is kept as thoughts. `"off"`: no
    /// thoughts are asked for or kept.
    #[serde(default)]
    pub thinking: Option<ThinkingLevel>,
    /// Default output limit of requests that do not set one.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// The model's context window in tokens (defaults: Gemini 1,048,576; OpenAI 128,000; Anthropic 200,000).
    #[serde(default)]
    pub context_window: Option<u32>,
    /// Default sampling temperature of requests that do not set one.
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub timeouts: Timeouts,
    #[serde(default)]
    pub retry: RetryPolicy,
}

/// The output limit used when neither the request nor the config sets one.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 8192;

impl ModelConfig {
    /// A config with defaults for everything but provider and model id.
    pub fn new(provider: Provider, model: impl Into<String>) -> Self {
        ModelConfig {
            provider,
            model: model.into(),
            base_url: None,
            api_key_env: None,
            thinking: None,
            max_output_tokens: None,
            context_window: None,
            temperature: None,
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
        }
    }

    /// The base URL in effect, without a trailing slash.
    pub fn effective_base_url(&self) -> String {
        self.base_url.as_deref().unwrap_or(self.provider.default_base_url()).trim_end_matches('/').to_owned()
    }

    /// The environment variable the key is read from, if any (see [`ModelConfig::api_key_env`]).
    pub fn effective_api_key_env(&self) -> Option<String> {
        if let Some(name) = &self.api_key_env {
            return Some(name.clone());
        }
        match self.provider {
            Provider::Gemini | Provider::Anthropic => Some(self.provider.default_api_key_env().to_owned()),
            Provider::OpenAi if self.base_url.is_none() => Some(self.provider.default_api_key_env().to_owned()),
            Provider::OpenAi | Provider::Local => None,
        }
    }

    /// What the agent needs to know about the model.
    pub fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: self.provider,
            model: self.model.clone(),
            context_window: self.context_window.unwrap_or(self.provider.default_context_window()),
            max_output_tokens: self.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS),
        }
    }
}

/// Facts about a configured model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub provider: Provider,
    /// The vendor's model id.
    pub model: String,
    /// Context window in tokens.
    pub context_window: u32,
    /// Output limit applied when a request sets none.
    pub max_output_tokens: u32,
}

/// Find the API key of model `name` with `lookup` (the binary passes `std::env::var(..).ok()`).
///
/// `Ok(None)` when the model needs no key (a custom OpenAI-style endpoint with no
/// `api_key_env`). A variable that is named (or implied by the provider) but unset or empty is
/// an error naming the variable.
pub fn resolve_api_key(
    name: &str,
    config: &ModelConfig,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<Secret>, LlmError> {
    let Some(variable) = config.effective_api_key_env() else {
        return Ok(None);
    };
    match lookup(&variable) {
        Some(value) if !value.trim().is_empty() => Ok(Some(Secret::new(value.trim()))),
        Some(_) | None => Err(LlmError::new(
            LlmErrorKind::Config,
            format!(
                "environment variable `{variable}` is not set or empty: export the {} API key there, or name another variable with `api_key_env`",
                config.provider
            ),
        )
        .with_model(name)),
    }
}

/// Build model `name` from its configuration and key.
pub fn build_model(name: &str, config: &ModelConfig, api_key: Option<Secret>) -> Result<Arc<dyn Model>, LlmError> {
    let config_error = |message: String| LlmError::new(LlmErrorKind::Config, message).with_model(name);
    if config.model.trim().is_empty() {
        return Err(config_error("`model` is empty: set the vendor's model id".to_owned()));
    }
    config.retry.validate().map_err(config_error)?;
    let base_url = config.effective_base_url();
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return Err(config_error(format!("`base_url` must start with http:// or https://, got `{base_url}`")));
    }
    match config.provider {
        Provider::Gemini | Provider::Anthropic if api_key.is_none() => {
            return Err(config_error(format!(
                "no API key: {} needs one; set `{}`",
                config.provider,
                config.effective_api_key_env().unwrap_or_else(|| config.provider.default_api_key_env().to_owned())
            )));
        }
        Provider::Local => {
            return Err(config_error(
                "`provider = \"local\"` models are loaded from a GGUF file by the binary, not built here".to_owned(),
            ));
        }
        Provider::Gemini | Provider::Anthropic | Provider::OpenAi => {}
    }
    let model: Arc<dyn Model> = match config.provider {
        Provider::Gemini => Arc::new(GeminiModel::new(name, config, api_key)?),
        Provider::OpenAi => Arc::new(OpenAiModel::new(name, config, api_key)?),
        Provider::Anthropic => Arc::new(AnthropicModel::new(name, config, api_key)?),
        Provider::Local => return Err(config_error("local models are loaded by the binary".to_owned())),
    };
    Ok(model)
}

/// [`resolve_api_key`] then [`build_model`].
pub fn build_model_with_lookup(
    name: &str,
    config: &ModelConfig,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Model>, LlmError> {
    let api_key = resolve_api_key(name, config, lookup)?;
    build_model(name, config, api_key)
}
