//! The one error type of the model layer, with a kind and intent methods.
//!
//! Callers decide what to do from the intent methods (`is_retryable()`, `retry_after()`,
//! `is_quota()`, `is_auth()`, …), never from the text. The text says what failed and what to
//! do; it never contains an API key: auth failures name the environment variable instead, and
//! vendor messages are scrubbed of the key before they are kept.

use std::fmt;
use std::time::Duration;

/// What kind of failure an [`LlmError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LlmErrorKind {
    /// The API key is missing, invalid or lacks permission (HTTP 401/403, Gemini `API_KEY_INVALID`).
    Auth,
    /// Rate limit or quota exhausted (HTTP 429).
    RateLimited,
    /// The provider is overloaded or unavailable (HTTP 503, 529, Anthropic `overloaded_error`).
    Overloaded,
    /// Another server-side failure (HTTP 500, 502, 504, …).
    Server,
    /// The connection failed or broke.
    Network,
    /// No answer in time (connect, first byte, or between stream chunks).
    Timeout,
    /// The prompt does not fit the model's context window.
    ContextTooLong,
    /// The provider rejected the request as malformed (other 4xx).
    BadRequest,
    /// The provider's answer could not be understood.
    Protocol,
    /// The model's configuration is wrong or incomplete (missing key variable, bad URL, …).
    Config,
    /// An attachment could not be read.
    Attachment,
    /// A scripted model has no step left, or was told to fail this way (tests).
    Scripted,
}

impl LlmErrorKind {
    fn describe(self) -> &'static str {
        match self {
            LlmErrorKind::Auth => "authentication failed",
            LlmErrorKind::RateLimited => "rate limited or out of quota",
            LlmErrorKind::Overloaded => "provider overloaded or unavailable",
            LlmErrorKind::Server => "provider server error",
            LlmErrorKind::Network => "network error",
            LlmErrorKind::Timeout => "timed out",
            LlmErrorKind::ContextTooLong => "prompt too long for the context window",
            LlmErrorKind::BadRequest => "request rejected",
            LlmErrorKind::Protocol => "unexpected answer from the provider",
            LlmErrorKind::Config => "configuration error",
            LlmErrorKind::Attachment => "attachment error",
            LlmErrorKind::Scripted => "scripted model error",
        }
    }
}

/// A failed model call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmError {
    kind: LlmErrorKind,
    /// The configured model name, when known.
    model: Option<String>,
    /// The HTTP status, when the provider answered with one.
    status: Option<u16>,
    /// What happened and what to do (never a secret).
    message: String,
    /// How long the provider asked us to wait.
    retry_after: Option<Duration>,
}

impl LlmError {
    pub fn new(kind: LlmErrorKind, message: impl Into<String>) -> Self {
        LlmError { kind, model: None, status: None, message: message.into(), retry_after: None }
    }

    /// Name the configured model this error is about.
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    pub fn kind(&self) -> LlmErrorKind {
        self.kind
    }

    /// The configured model name, when known.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The HTTP status the provider answered with.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The detail text (without the kind and model prefix).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Trying the same request again may succeed (rate limits, overload, 5xx, network, timeouts).
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            LlmErrorKind::RateLimited
            | LlmErrorKind::Overloaded
            | LlmErrorKind::Server
            | LlmErrorKind::Network
            | LlmErrorKind::Timeout => true,
            LlmErrorKind::Auth
            | LlmErrorKind::ContextTooLong
            | LlmErrorKind::BadRequest
            | LlmErrorKind::Protocol
            | LlmErrorKind::Config
            | LlmErrorKind::Attachment
            | LlmErrorKind::Scripted => false,
        }
    }

    /// How long the provider asked us to wait before trying again (`Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// A rate limit or exhausted quota.
    pub fn is_quota(&self) -> bool {
        self.kind == LlmErrorKind::RateLimited
    }

    /// The key is missing, wrong or lacks permission: retrying will not help, fix the key.
    pub fn is_auth(&self) -> bool {
        self.kind == LlmErrorKind::Auth
    }

    /// The request itself is wrong (including a prompt too long); retrying will not help.
    pub fn is_bad_request(&self) -> bool {
        matches!(self.kind, LlmErrorKind::BadRequest | LlmErrorKind::ContextTooLong | LlmErrorKind::Attachment)
    }

    /// The prompt does not fit: compact the history and try again.
    pub fn is_context_too_long(&self) -> bool {
        self.kind == LlmErrorKind::ContextTooLong
    }

    pub fn is_timeout(&self) -> bool {
        self.kind == LlmErrorKind::Timeout
    }

    /// A failure another model may not have: rate limit, overload or timeout.
    pub fn should_try_fallback(&self) -> bool {
        matches!(self.kind, LlmErrorKind::RateLimited | LlmErrorKind::Overloaded | LlmErrorKind::Timeout)
    }
}

impl fmt::Display for LlmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(model) = &self.model {
            write!(f, "model `{model}`: ")?;
        }
        f.write_str(self.kind.describe())?;
        if let Some(status) = self.status {
            write!(f, " (HTTP {status})")?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        if let Some(retry_after) = self.retry_after {
            write!(f, " (the provider asked to retry after {:.1}s)", retry_after.as_secs_f64())?;
        }
        Ok(())
    }
}

impl std::error::Error for LlmError {}

/// Shorten a vendor message for an error text, keeping it on a few hundred characters.
pub(crate) fn shorten(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max_chars).collect();
    format!("{cut}…")
}
