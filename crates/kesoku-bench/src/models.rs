//! Models for measuring the framework: a wrapper that clocks the time spent inside a model (so
//! it can be subtracted from a turn), and an in-process "policy" model that plays a scripted
//! multi-tool turn whatever happened before (a crash, a retry), deciding from the request alone.
//!
//! These are not providers: the benchmarks talk to real providers over HTTP against the mock
//! vendor servers of `kesoku-test-support`; the policy model serves tests that must not depend
//! on HTTP timing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use kesoku_llm::{
    LlmError, Model, ModelInfo, Part, Request, Response, ResponseStream, StreamEvent, ToolCall, TurnRole,
};
use serde_json::Value;

/// Time spent inside a model, summed over calls. Cheap to clone; clones share the sums.
#[derive(Debug, Clone, Default)]
pub struct ModelClock {
    inner: Arc<ClockInner>,
}

#[derive(Debug, Default)]
struct ClockInner {
    nanos: AtomicU64,
    calls: AtomicU64,
    /// Wall clock at the end of the latest call.
    last_end: std::sync::Mutex<Option<chrono::DateTime<chrono::Utc>>>,
}

impl ModelClock {
    /// Total time inside the model so far.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.inner.nanos.load(Ordering::SeqCst))
    }

    /// Model calls so far.
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::SeqCst)
    }

    /// Wall clock at the end of the latest model call.
    pub fn last_end(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        *self.inner.last_end.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, elapsed: Duration) {
        *self.inner.last_end.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(chrono::Utc::now());
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.inner.nanos.fetch_add(nanos, Ordering::SeqCst);
        self.inner.calls.fetch_add(1, Ordering::SeqCst);
    }
}

/// A model that measures each call of the model it wraps: from `stream()` to the answer's
/// `Completed` event (or its error). The caller's own work between events is included, which
/// makes the subtracted "model time" an upper bound and the framework overhead a lower bound
/// only by the few microseconds the agent spends between stream events.
pub struct TimedModel {
    inner: Arc<dyn Model>,
    clock: ModelClock,
}

impl TimedModel {
    pub fn new(inner: Arc<dyn Model>, clock: ModelClock) -> Self {
        TimedModel { inner, clock }
    }
}

#[async_trait]
impl Model for TimedModel {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        let started = Instant::now();
        let stream = match self.inner.stream(request).await {
            Ok(stream) => stream,
            Err(error) => {
                self.clock.record(started.elapsed());
                return Err(error);
            }
        };
        let clock = self.clock.clone();
        let mut recorded = false;
        Ok(Box::pin(stream.map(move |item| {
            if !recorded && matches!(item, Ok(StreamEvent::Completed(_)) | Err(_)) {
                recorded = true;
                clock.record(started.elapsed());
            }
            item
        })))
    }
}

/// What the policy model does in each turn: `calls` tool calls of `tool` with `arguments`, one
/// per model step, then a final text quoting the user's message.
#[derive(Debug, Clone)]
pub struct Policy {
    pub tool: String,
    pub arguments: Value,
    pub calls: usize,
    /// Wait this long before answering (a slow model), real time.
    pub latency: Duration,
}

impl Policy {
    /// Plain turns: no tool call, an answer at once.
    pub fn plain() -> Self {
        Policy { tool: String::new(), arguments: Value::Null, calls: 0, latency: Duration::ZERO }
    }
}

/// The text a policy answer starts with; the rest is the user's message.
pub const ANSWER_PREFIX: &str = "answer to: ";

/// Decide the next answer of a turn from the request alone: count the tool calls the model
/// already made after the last user text, and call again until the policy's count is reached.
pub fn policy_answer(policy: &Policy, request: &Request) -> Response {
    let last_user_text = request.turns.iter().rposition(|turn| {
        turn.role == TurnRole::User && turn.parts.iter().any(|part| matches!(part, Part::Text { .. }))
    });
    let start = last_user_text.map_or(0, |index| index + 1);
    let made = request.turns[start..]
        .iter()
        .filter(|turn| turn.role == TurnRole::Model)
        .flat_map(|turn| &turn.parts)
        .filter(|part| matches!(part, Part::ToolCall(_)))
        .count();
    if made < policy.calls {
        return Response::from_parts(vec![Part::ToolCall(ToolCall {
            id: format!("call_{}_{made}", ulid::Ulid::generate()),
            name: policy.tool.clone(),
            arguments: policy.arguments.clone(),
            signature: None,
        })]);
    }
    let question = last_user_text
        .and_then(|index| {
            request.turns[index].parts.iter().rev().find_map(|part| match part {
                Part::Text { text, .. } => Some(text.clone()),
                Part::Thought { .. } | Part::ToolCall(_) | Part::ToolResult(_) | Part::Attachment(_) => None,
            })
        })
        .unwrap_or_default();
    Response::text(format!("{ANSWER_PREFIX}{question}"))
}

/// An in-process model following a [`Policy`].
#[derive(Debug, Clone)]
pub struct PolicyModel {
    name: String,
    info: ModelInfo,
    policy: Policy,
}

impl PolicyModel {
    pub fn new(name: &str, policy: Policy) -> Self {
        let info = ModelInfo {
            provider: kesoku_llm::Provider::OpenAi,
            model: format!("policy-{name}"),
            context_window: 128_000,
            max_output_tokens: 8192,
        };
        PolicyModel { name: name.to_owned(), info, policy }
    }
}

#[async_trait]
impl Model for PolicyModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        if !self.policy.latency.is_zero() {
            tokio::time::sleep(self.policy.latency).await;
        }
        let response = policy_answer(&self.policy, request);
        let events = kesoku_llm::scripted::response_events(&response);
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

#[cfg(test)]
mod tests {
    use kesoku_llm::{ToolResult, Turn};
    use serde_json::json;

    use super::*;

    fn user(text: &str) -> Turn {
        Turn { role: TurnRole::User, parts: vec![Part::Text { text: text.to_owned(), signature: None }] }
    }

    #[test]
    fn the_policy_calls_until_its_count_then_answers() {
        let policy = Policy { tool: "read_file".into(), arguments: json!({"path": "a"}), calls: 2, ..Policy::plain() };
        let mut request = Request { turns: vec![user("old"), user("hello")], ..Request::default() };
        for round in 0..2 {
            let answer = policy_answer(&policy, &request);
            let calls = answer.tool_calls();
            assert_eq!(calls.len(), 1, "round {round}");
            let call = calls[0].clone();
            request.turns.push(Turn { role: TurnRole::Model, parts: vec![Part::ToolCall(call.clone())] });
            request.turns.push(Turn {
                role: TurnRole::User,
                parts: vec![Part::ToolResult(ToolResult {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    output: "ok".to_owned(),
                    error: None,
                })],
            });
        }
        let answer = policy_answer(&policy, &request);
        assert!(answer.tool_calls().is_empty());
        assert_eq!(answer.text_content(), "answer to: hello");
    }
}
