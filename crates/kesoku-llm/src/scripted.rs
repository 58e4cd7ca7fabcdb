//! `ScriptedModel`: a [`Model`] that answers from a script, for testing the agent without HTTP.
//!
//! Each request takes the next [`ScriptStep`]: an answer (streamed as its deltas, then
//! `Completed`), an exact list of stream items (errors included), an error from `stream()`
//! itself, a delay before any of these, or a stream that hangs until it is dropped. Every
//! request is recorded. With `tokio::time::pause()` delays cost no real time.
//!
//! ```
//! # use kesoku_llm::{ScriptedModel, ScriptStep, Model, Request};
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let model = ScriptedModel::new("test", vec![ScriptStep::text("hello")]);
//! let response = model.generate(&Request::user_text("hi")).await.expect("scripted answer");
//! assert_eq!(response.text_content(), "hello");
//! assert_eq!(model.requests().len(), 1);
//! # }
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::Notify;

use crate::config::{ModelInfo, Provider};
use crate::conversation::{Part, Request, Response, ToolCall};
use crate::error::{LlmError, LlmErrorKind};
use crate::{Model, ResponseStream, StreamEvent};

/// What the scripted model does for one request.
#[derive(Debug, Clone)]
pub enum ScriptStep {
    /// Stream this answer: a delta per text and thought part, a `ToolCall` per call, then `Completed`.
    Respond(Response),
    /// Yield exactly these items, nothing added (use it for errors after some output).
    Stream(Vec<Result<StreamEvent, LlmError>>),
    /// `stream()` itself fails with this error: nothing is yielded.
    Fail(LlmError),
    /// Wait this long (before the first event), then do the inner step.
    Delay(Duration, Box<ScriptStep>),
    /// Yield these events, then wait forever: only dropping the stream ends it.
    HangAfter(Vec<StreamEvent>),
}

impl ScriptStep {
    /// Answer with plain text.
    pub fn text(text: impl Into<String>) -> Self {
        ScriptStep::Respond(Response::text(text))
    }

    /// Answer with one tool call (id `call_1`).
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        ScriptStep::Respond(Response::from_parts(vec![Part::ToolCall(ToolCall {
            id: "call_1".to_owned(),
            name: name.into(),
            arguments,
            signature: None,
        })]))
    }

    /// Answer with these parts.
    pub fn parts(parts: Vec<Part>) -> Self {
        ScriptStep::Respond(Response::from_parts(parts))
    }

    /// Hang before producing anything.
    pub fn hang() -> Self {
        ScriptStep::HangAfter(Vec::new())
    }

    /// This step after `delay`.
    pub fn delayed(self, delay: Duration) -> Self {
        ScriptStep::Delay(delay, Box::new(self))
    }
}

/// The events a complete answer streams as.
pub fn response_events(response: &Response) -> Vec<StreamEvent> {
    let mut events = Vec::new();
    for part in &response.parts {
        match part {
            Part::Text { text, .. } if !text.is_empty() => events.push(StreamEvent::TextDelta(text.clone())),
            Part::Thought { text, .. } if !text.is_empty() => events.push(StreamEvent::ThoughtDelta(text.clone())),
            Part::ToolCall(call) => events.push(StreamEvent::ToolCall(call.clone())),
            Part::Text { .. } | Part::Thought { .. } | Part::ToolResult(_) | Part::Attachment(_) => {}
        }
    }
    events.push(StreamEvent::Completed(response.clone()));
    events
}

#[derive(Debug, Default)]
struct Shared {
    // Short critical sections only, never held across an await.
    steps: Mutex<VecDeque<ScriptStep>>,
    /// Each request with when it came in (`stream()` was called), in order.
    requests: Mutex<Vec<(Request, chrono::DateTime<chrono::Utc>)>>,
    cancellations: AtomicUsize,
    cancelled: Notify,
}

/// A model answering from a script.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    name: String,
    info: ModelInfo,
    shared: Arc<Shared>,
}

/// Counts a hanging stream's cancellation when the stream is dropped.
struct CancelGuard(Arc<Shared>);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.0.cancellations.fetch_add(1, Ordering::SeqCst);
        self.0.cancelled.notify_waiters();
    }
}

impl ScriptedModel {
    pub fn new(name: impl Into<String>, steps: Vec<ScriptStep>) -> Self {
        let name = name.into();
        let info = ModelInfo {
            provider: Provider::OpenAi,
            model: format!("scripted-{name}"),
            context_window: 128_000,
            max_output_tokens: 8192,
        };
        let shared = Shared { steps: Mutex::new(steps.into()), ..Shared::default() };
        ScriptedModel { name, info, shared: Arc::new(shared) }
    }

    /// Report this info instead of the default (128,000-token window).
    pub fn with_info(mut self, info: ModelInfo) -> Self {
        self.info = info;
        self
    }

    /// Add a step at the end of the script.
    pub fn push(&self, step: ScriptStep) {
        self.shared.steps.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push_back(step);
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(|(r, _)| r.clone())
            .collect()
    }

    /// When each request came in (`stream()` was called), in order.
    pub fn requested_at(&self) -> Vec<chrono::DateTime<chrono::Utc>> {
        self.shared.requests.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).iter().map(|(_, at)| *at).collect()
    }

    /// Steps not used yet.
    pub fn remaining(&self) -> usize {
        self.shared.steps.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    /// How many hanging streams were dropped by the caller.
    pub fn cancellations(&self) -> usize {
        self.shared.cancellations.load(Ordering::SeqCst)
    }

    /// Wait until `count` hanging streams have been dropped.
    pub async fn wait_for_cancellations(&self, count: usize) {
        loop {
            let notified = self.shared.cancelled.notified();
            if self.cancellations() >= count {
                return;
            }
            notified.await;
        }
    }
}

#[async_trait]
impl Model for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        let number = {
            let mut requests = self.shared.requests.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            requests.push((request.clone(), chrono::Utc::now()));
            requests.len()
        };
        let step = self.shared.steps.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop_front();
        let mut step = step.ok_or_else(|| {
            LlmError::new(LlmErrorKind::Scripted, format!("the script has no step left for request #{number}"))
                .with_model(&self.name)
        })?;
        while let ScriptStep::Delay(delay, inner) = step {
            tokio::time::sleep(delay).await;
            step = *inner;
        }
        match step {
            ScriptStep::Respond(response) => {
                Ok(Box::pin(futures::stream::iter(response_events(&response).into_iter().map(Ok))))
            }
            ScriptStep::Stream(items) => Ok(Box::pin(futures::stream::iter(items))),
            ScriptStep::Fail(error) => Err(error),
            ScriptStep::HangAfter(events) => {
                let guard = CancelGuard(Arc::clone(&self.shared));
                let hang = futures::stream::once(async move {
                    let _guard = guard;
                    futures::future::pending::<()>().await;
                })
                .filter_map(|()| async { None });
                Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok)).chain(hang)))
            }
            ScriptStep::Delay(..) => Err(LlmError::new(LlmErrorKind::Scripted, "unreachable nested delay")),
        }
    }
}
