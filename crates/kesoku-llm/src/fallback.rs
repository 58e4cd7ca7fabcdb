//! `FallbackModel`: an ordered list of models tried in turn.
//!
//! The next model is tried when the current one fails with a rate limit, an overload or a
//! timeout that outlasted its own retries, and only while nothing of the answer was handed out.
//! Any other failure (bad key, bad request) is returned at once: another model would not fix it,
//! and hiding it would hide a configuration mistake.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;

use crate::config::ModelInfo;
use crate::conversation::Request;
use crate::error::{LlmError, LlmErrorKind};
use crate::{Model, ResponseStream};

/// Models tried in order.
pub struct FallbackModel {
    name: String,
    info: ModelInfo,
    models: Vec<Arc<dyn Model>>,
}

impl std::fmt::Debug for FallbackModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.models.iter().map(|model| model.name()).collect();
        f.debug_struct("FallbackModel").field("name", &self.name).field("models", &names).finish()
    }
}

impl FallbackModel {
    /// `models` in order of preference. The info is the first model's, with the smallest
    /// context window of all, so a history that fits fits every one of them.
    pub fn new(name: impl Into<String>, models: Vec<Arc<dyn Model>>) -> Result<Self, LlmError> {
        let name = name.into();
        let Some(first) = models.first() else {
            return Err(
                LlmError::new(LlmErrorKind::Config, "a fallback model needs at least one model").with_model(name)
            );
        };
        let mut info = first.info().clone();
        info.context_window =
            models.iter().map(|model| model.info().context_window).min().unwrap_or(info.context_window);
        Ok(FallbackModel { name, info, models })
    }

    /// The models, in order.
    pub fn models(&self) -> &[Arc<dyn Model>] {
        &self.models
    }
}

#[async_trait]
impl Model for FallbackModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        let mut last_error = None;
        for (index, model) in self.models.iter().enumerate() {
            let is_last = index + 1 == self.models.len();
            // Wait for the first item: until then nothing was handed out and moving on is safe.
            let attempt = match model.stream(request).await {
                Ok(mut stream) => match stream.next().await {
                    Some(Ok(first)) => {
                        let first = futures::stream::once(async move { Ok(first) });
                        return Ok(Box::pin(first.chain(stream)));
                    }
                    Some(Err(error)) => error,
                    None => LlmError::new(LlmErrorKind::Protocol, "the answer was empty").with_model(model.name()),
                },
                Err(error) => error,
            };
            if is_last || !attempt.should_try_fallback() {
                return Err(attempt);
            }
            tracing::warn!(model = model.name(), next = self.models[index + 1].name(), error = %attempt, "model unavailable, falling back");
            last_error = Some(attempt);
        }
        Err(last_error.unwrap_or_else(|| LlmError::new(LlmErrorKind::Config, "no model to try").with_model(&self.name)))
    }
}
