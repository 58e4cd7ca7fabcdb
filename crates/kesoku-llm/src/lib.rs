//! Kesoku's model layer: a provider-neutral conversation, the [`Model`] trait, three providers
//! (Gemini, OpenAI-style chat completions, Anthropic) with streaming, timeouts, retries and
//! fallback, the one place stored history becomes model turns ([`history`]), and a scripted
//! model for tests ([`scripted`]).
//!
//! This is the only crate that knows provider JSON, and it knows nothing of storage: it takes
//! `kesoku_core::Message`s and gives back neutral types. It never reads the environment or
//! config files (the binary does and passes a [`Secret`]), and no error, log line or `Debug`
//! print of it contains an API key.

mod assemble;
pub mod check;
pub mod config;
pub mod conversation;
pub mod error;
pub mod fallback;
pub mod history;
pub mod providers;
pub mod retry;
pub mod scripted;
pub mod secret;
mod transport;

use std::pin::Pin;

use async_trait::async_trait;
use futures::{Stream, StreamExt};

pub use check::{CheckReport, check};
pub use config::{ModelConfig, ModelInfo, Provider, Timeouts, build_model, build_model_with_lookup, resolve_api_key};
pub use conversation::{
    Attachment, AttachmentSource, FinishReason, Part, Request, Response, ThinkingLevel, TokenUsage, ToolCall,
    ToolDeclaration, ToolResult, Turn, TurnRole,
};
pub use error::{LlmError, LlmErrorKind};
pub use fallback::FallbackModel;
pub use history::{Conversation, HistoryOptions, history_to_conversation};
pub use retry::RetryPolicy;
pub use scripted::{ScriptStep, ScriptedModel};
pub use secret::Secret;

/// What a streamed answer yields, in order; [`StreamEvent::Completed`] comes last.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A piece of visible text.
    TextDelta(String),
    /// A piece of the model's thinking.
    ThoughtDelta(String),
    /// A tool call, complete (arguments assembled).
    ToolCall(ToolCall),
    /// The whole answer: every part (tool calls complete), finish reason and usage.
    Completed(Response),
}

/// A streamed answer. Dropping it aborts the HTTP request.
pub type ResponseStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, LlmError>> + Send>>;

/// A configured model the agent can talk to.
///
/// `stream` retries (per the model's policy) until the answer's first event arrives; an error
/// item after that means the answer broke off and was not retried. An `Err` from `stream`
/// itself means nothing was produced.
#[async_trait]
pub trait Model: Send + Sync + 'static {
    /// The configured name (`[models.NAME]`).
    fn name(&self) -> &str;

    /// Provider, model id, context window, output limit.
    fn info(&self) -> &ModelInfo;

    /// Send `request` and stream the answer.
    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError>;

    /// Send `request` and wait for the whole answer.
    async fn generate(&self, request: &Request) -> Result<Response, LlmError> {
        let mut stream = self.stream(request).await?;
        collect_response(&mut stream).await
    }
}

/// Drive a stream to its `Completed` answer.
pub async fn collect_response(stream: &mut ResponseStream) -> Result<Response, LlmError> {
    while let Some(event) = stream.next().await {
        if let StreamEvent::Completed(response) = event? {
            return Ok(response);
        }
    }
    Err(LlmError::new(LlmErrorKind::Protocol, "the answer ended without a completed response"))
}
