//! `check`: one tiny request to see that a configured model answers (`kesoku models check NAME`).
//!
//! It reports how long the first event and the whole answer took and what it cost; it does not
//! judge the answer's content.

use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::conversation::{FinishReason, Request, TokenUsage};
use crate::error::{LlmError, LlmErrorKind};
use crate::{Model, StreamEvent};

/// The prompt `check` sends.
pub const CHECK_PROMPT: &str = "Reply with the single word: ok";

/// What a check found.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    /// The configured name.
    pub name: String,
    /// The vendor's model id (as configured).
    pub model: String,
    /// The model version the provider reported, when it did.
    pub model_version: Option<String>,
    /// Time to the first streamed event.
    pub first_event_latency: Duration,
    /// Time to the complete answer.
    pub total_latency: Duration,
    pub usage: TokenUsage,
    pub finish_reason: FinishReason,
    /// The answer's text (at most 200 characters).
    pub reply: String,
}

/// Send one tiny request to `model` and report latency and usage.
pub async fn check(model: &dyn Model) -> Result<CheckReport, LlmError> {
    let request = Request::user_text(CHECK_PROMPT);
    let started = Instant::now();
    let mut stream = model.stream(&request).await?;
    let mut first_event_latency = None;
    while let Some(event) = stream.next().await {
        let event = event?;
        let elapsed = started.elapsed();
        first_event_latency.get_or_insert(elapsed);
        if let StreamEvent::Completed(response) = event {
            return Ok(CheckReport {
                name: model.name().to_owned(),
                model: model.info().model.clone(),
                model_version: response.model_version.clone(),
                first_event_latency: first_event_latency.unwrap_or(elapsed),
                total_latency: elapsed,
                usage: response.usage,
                finish_reason: response.finish_reason,
                reply: response.text_content().chars().take(200).collect(),
            });
        }
    }
    Err(LlmError::new(LlmErrorKind::Protocol, "the answer ended without a completed response").with_model(model.name()))
}
