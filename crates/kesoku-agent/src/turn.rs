//! The turn loop: model call → thoughts and tool calls posted → tools run concurrently →
//! results posted → next model call … → final text.
//!
//! One rule: every step is a message stored (through the gateway) before anything that depends
//! on it happens. A tool starts only after its call is stored, and the next model call goes out
//! only after every result of the step is stored. So a crash at any point leaves a history the
//! next run continues from: a stored call without a result gets exactly one synthetic
//! "restarted" result, and nothing the user or the model saw is missing from the store.
//! The loop owns no status of the root message: it returns how the turn ended and the runtime
//! resolves it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use kesoku_broker::StopReason;
use kesoku_core::history::turn_root;
use kesoku_core::{Message, MessageId, MessageType, Role, Status, TurnMetrics, TurnOrigin, Usage};
use kesoku_gateway::{Gateway, GatewayError};
use kesoku_llm::{
    FinishReason, HistoryOptions, LlmError, Request, Response, ToolDeclaration, collect_response,
    history_to_conversation,
};
use kesoku_tools::{Grants, Registry, ToolContext, ToolOrigin, ToolOutput};
use tokio_util::sync::CancellationToken;

use crate::context::{ActivationContext, LimitKind};
use crate::grants::StoreGrants;
use crate::structured;

/// Text of the nudge posted after an empty model answer.
pub const NUDGE_TEXT: &str = "Your previous response had empty content. Please provide a final user-facing response \
summarizing your results/actions.";
/// Reply when the model answers with nothing even after the nudge.
pub const EMPTY_FALLBACK_TEXT: &str =
    "I could not produce an answer this time. Please try again, or rephrase your request.";
/// How long tools get to clean up (kill their processes) after a stop.
const TOOL_CLEANUP_GRACE: Duration = Duration::from_secs(5);

/// A stop request with its reason; cheap to clone, first reason wins.
#[derive(Clone, Default)]
pub struct StopSignal {
    token: CancellationToken,
    reason: Arc<OnceLock<StopReason>>,
}

impl std::fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopSignal").field("reason", &self.reason.get()).finish()
    }
}

impl StopSignal {
    pub fn stop(&self, reason: StopReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    pub fn reason(&self) -> Option<StopReason> {
        self.reason.get().copied()
    }

    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// How a turn ended.
#[derive(Debug)]
pub enum TurnEnd {
    /// A final text was posted.
    Answered { note: Option<String> },
    /// A limit stopped it; a final text saying so was posted.
    LimitExceeded { limit: String },
    /// A stop request ended it.
    Stopped { reason: StopReason },
    /// It failed; `detail` is the full error (for the staging folder), `short` for the user.
    Failed { detail: String, short: String },
    /// A final text was posted, but it does not follow the activation's output schema even
    /// after one retry: `problem` says how.
    Unstructured { problem: String },
    /// A configured agent passed (the `pass` tool, or a final text that is empty or `pass`):
    /// nothing was posted for users; the runtime dispatches the next agent or closes the round.
    Passed,
}

/// A sink for each model call's request and answer (debug mode).
pub type ModelLog = dyn Fn(u32, &Request, Result<&Response, &LlmError>) + Send + Sync;

/// What the loop needs from the runtime.
pub struct TurnDeps<'a> {
    pub gateway: &'a Gateway,
    pub tools: &'a Registry,
    pub workspace: &'a PathBuf,
    pub staging_dir: PathBuf,
    pub agent_name: &'a str,
    pub system_prompt: &'a str,
    /// Virtual entries put before the root (activation context, trigger context).
    pub entries: Vec<Message>,
    /// Called with each model request/response when debugging is on.
    pub model_log: Option<&'a ModelLog>,
    /// `queue_mode = "steer"`: newer messages on the channel join this turn at its next
    /// boundary. Holds who claims them.
    pub steer_as: Option<&'a str>,
    /// The configured agent (`[[agents]]`) whose turn this is: every message the turn stores
    /// carries it as `metadata.agent`, and the turn may pass. `None`: the default agent.
    pub persona: Option<&'a str>,
}

/// One running turn.
pub struct Turn<'a> {
    deps: TurnDeps<'a>,
    context: &'a ActivationContext,
    origin: TurnOrigin,
    root: Message,
    /// The session in phased order, kept up to date in memory as the turn posts.
    history: Vec<Message>,
    stop: StopSignal,
    pub usage: Usage,
    step: u32,
    /// Tool calls of this turn still waiting for a result, in the order they were posted.
    open_calls: Vec<Message>,
    last_input_tokens: u64,
    /// Newer messages that joined this turn (steer mode), claimed by it.
    pub steered: Vec<MessageId>,
    /// An earlier run of this turn (that died) already posted the final answer.
    answered_before: bool,
    /// An earlier run of this turn, by the same agent, called `pass` and died before the root
    /// was resolved.
    passed_before: bool,
    /// The final answer as stored (a configured agent's answer may mention another agent).
    pub answer: Option<Message>,
}

enum StepError {
    Stopped,
    Limit(LimitKind),
    Model(LlmError),
    Store(GatewayError),
}

impl From<GatewayError> for StepError {
    fn from(error: GatewayError) -> Self {
        StepError::Store(error)
    }
}

impl<'a> Turn<'a> {
    pub fn new(
        deps: TurnDeps<'a>,
        context: &'a ActivationContext,
        root: Message,
        history: Vec<Message>,
        stop: StopSignal,
    ) -> Self {
        let origin = TurnOrigin::of(&root, deps.agent_name);
        // A recovered turn continues after the steps its earlier run stored.
        let by_id: HashMap<&MessageId, &Message> = history.iter().map(|m| (&m.id, m)).collect();
        let mut step = 0;
        let mut open_calls = Vec::new();
        let answered: HashSet<&MessageId> = history
            .iter()
            .filter(|m| m.message_type == MessageType::ToolResult)
            .filter_map(|m| m.parent_id.as_ref())
            .collect();
        for message in &history {
            if turn_root(message, &by_id) == &root.id && message.id != root.id {
                step = step.max(message.step);
                if message.message_type == MessageType::ToolCall && !answered.contains(&message.id) {
                    open_calls.push(message.clone());
                }
            }
        }
        // An earlier run that posted its final answer and died before the root was resolved
        // left the answer as the last step of the turn, with no tool call beside it.
        let last_step: Vec<&Message> = history
            .iter()
            .filter(|m| m.id != root.id && m.step == step && step > 0 && turn_root(m, &by_id) == &root.id)
            .collect();
        let answered_before = open_calls.is_empty()
            && !last_step.iter().any(|m| m.message_type == MessageType::ToolCall)
            && last_step.iter().any(|m| {
                m.role == Role::Assistant
                    && m.message_type == MessageType::Text
                    && m.parent_id.as_ref() == Some(&root.id)
                    && !m.is_notification()
                    && !m.content.starts_with(kesoku_core::message::ERROR_NOTIFICATION_PREFIX)
            });
        let passed_before = deps.persona.is_some_and(|persona| {
            open_calls.is_empty()
                && last_step.iter().any(|m| {
                    m.message_type == MessageType::ToolCall
                        && m.metadata.tool_name.as_deref() == Some(crate::orchestration::PASS)
                        && m.metadata.agent.as_deref().is_some_and(|a| a.eq_ignore_ascii_case(persona))
                })
        });
        Turn {
            deps,
            context,
            origin,
            root,
            history,
            stop,
            usage: Usage::default(),
            step,
            open_calls,
            last_input_tokens: 0,
            steered: Vec::new(),
            answered_before,
            passed_before,
            answer: None,
        }
    }

    /// Run to the end. Never panics on model or tool output; store failures end the turn as
    /// `Failed` (the runtime leaves the message for recovery when it cannot even record that).
    pub async fn run(&mut self) -> TurnEnd {
        if self.answered_before {
            // Resolve the root now instead of answering a second time.
            return TurnEnd::Answered { note: Some("answered before the service restarted".to_owned()) };
        }
        if self.passed_before {
            return TurnEnd::Passed;
        }
        // Calls an earlier, crashed run left open get their synthetic result first.
        if let Err(error) = self.close_open_calls(RESTARTED_RESULT).await {
            return store_failure(error);
        }
        let mut nudged = false;
        let mut schema_retried = false;
        loop {
            if self.stop.is_stopped() {
                return self.stopped().await;
            }
            if self.usage.model_calls >= u64::from(self.context.limits.model_calls) {
                return self.limit_reached(LimitKind::ModelCalls).await;
            }
            if self.step > 0
                && let Err(error) = self.absorb_steering().await
            {
                return store_failure(error);
            }
            self.step += 1;
            let response = match self.call_model().await {
                Ok(response) => response,
                Err(StepError::Stopped) => return self.stopped().await,
                Err(StepError::Limit(limit)) => return self.limit_reached(limit).await,
                Err(StepError::Model(error)) => return self.model_failure(error).await,
                Err(StepError::Store(error)) => return store_failure(error),
            };
            let calls: Vec<kesoku_llm::ToolCall> = response.tool_calls().into_iter().cloned().collect();
            let text = response.text_content();
            let messages = self.step_messages(&response, &calls, &text);
            if let Err(error) = self.post_step(messages).await {
                return store_failure(error);
            }
            if !calls.is_empty() {
                // A message that arrived while the model answered joins now: the calls it made
                // before seeing it are skipped, and the model answers with it in view.
                match self.absorb_steering().await {
                    Ok(true) => match self.skip_open_calls().await {
                        Ok(()) => continue,
                        Err(error) => return store_failure(error),
                    },
                    Ok(false) => {}
                    Err(error) => return store_failure(error),
                }
                let calls: Vec<Message> = self.open_calls.iter().filter(|m| m.step == self.step).cloned().collect();
                let passed = self.deps.persona.is_some()
                    && calls.iter().any(|c| c.metadata.tool_name.as_deref() == Some(crate::orchestration::PASS));
                let running = self.start_tools(&calls);
                match self.run_tools(running).await {
                    // The call and its result stay as steps; nothing is answered.
                    Ok(()) if passed => return TurnEnd::Passed,
                    Ok(()) => continue,
                    Err(StepError::Stopped) => return self.stopped().await,
                    Err(StepError::Limit(limit)) => return self.limit_reached(limit).await,
                    Err(StepError::Model(error)) => return self.model_failure(error).await,
                    Err(StepError::Store(error)) => return store_failure(error),
                }
            }
            if self.deps.persona.is_some()
                && response.finish_reason != FinishReason::Blocked
                && crate::orchestration::is_pass_text(&text)
            {
                // Not posted: an agent with nothing to say passes.
                return TurnEnd::Passed;
            }
            if !text.trim().is_empty() {
                let problem = self.context.output_schema.as_ref().and_then(|schema| structured::problem(schema, &text));
                if let (Some(problem), Some(schema), false) = (&problem, &self.context.output_schema, schema_retried) {
                    // Not posted: the model hears what was wrong, once, and answers again.
                    schema_retried = true;
                    let retry = self.origin.nudge(self.step, structured::retry_text(problem, schema));
                    if let Err(error) = self.post(vec![retry]).await {
                        return store_failure(error);
                    }
                    continue;
                }
                return match self.post_final(text, response.text_signature().map(str::to_owned)).await {
                    Ok(()) => match problem {
                        Some(problem) => TurnEnd::Unstructured { problem },
                        None => TurnEnd::Answered { note: blocked_note(&response) },
                    },
                    Err(error) => store_failure(error),
                };
            }
            if response.finish_reason == FinishReason::Blocked {
                let detail = response.finish_detail.clone().unwrap_or_else(|| "blocked".to_owned());
                let text = format!("The model declined to answer this request ({detail}).");
                return match self.post_final(text, None).await {
                    Ok(()) => TurnEnd::Answered { note: Some(format!("blocked: {detail}")) },
                    Err(error) => store_failure(error),
                };
            }
            if !nudged {
                nudged = true;
                let nudge = self.origin.nudge(self.step, NUDGE_TEXT);
                if let Err(error) = self.post(vec![nudge]).await {
                    return store_failure(error);
                }
                continue;
            }
            return match self.post_final(EMPTY_FALLBACK_TEXT.to_owned(), None).await {
                Ok(()) => TurnEnd::Answered { note: Some("empty response after a nudge".to_owned()) },
                Err(error) => store_failure(error),
            };
        }
    }

    fn request(&self) -> Request {
        let system_prompt = Message::system_prompt(&self.context.session_id, self.deps.system_prompt);
        let mut messages: Vec<&Message> = Vec::with_capacity(self.history.len() + self.deps.entries.len() + 1);
        messages.push(&system_prompt);
        for message in &self.history {
            if message.id == self.root.id {
                messages.extend(self.deps.entries.iter());
            }
            messages.push(message);
        }
        let options =
            HistoryOptions { active_root: Some(&self.root.id), attachment_base: Some(self.deps.workspace.as_path()) };
        let conversation = history_to_conversation(&messages, &options);
        let tools = self
            .deps
            .tools
            .specs()
            .map(|spec| ToolDeclaration {
                name: spec.name.clone(),
                description: spec.description.clone(),
                parameters: spec.parameters.clone(),
            })
            .collect();
        Request {
            system: conversation.system,
            turns: conversation.turns,
            tools,
            output_schema: self.context.output_schema.clone(),
            ..Request::default()
        }
    }

    async fn call_model(&mut self) -> Result<Response, StepError> {
        let request = self.request();
        self.usage.model_calls += 1;
        let model = Arc::clone(&self.context.model);
        let started = std::time::Instant::now();
        let answer = async {
            let mut stream = model.stream(&request).await?;
            collect_response(&mut stream).await
        };
        let stop = self.stop.token().clone();
        let deadline = self.context.deadline();
        // Dropping `answer` drops the stream, which aborts the HTTP request.
        let result = tokio::select! {
            biased;
            _ = stop.cancelled() => return Err(StepError::Stopped),
            _ = tokio::time::sleep_until(deadline) => return Err(StepError::Limit(LimitKind::Runtime)),
            result = answer => result,
        };
        if let Some(log) = self.deps.model_log {
            log(self.step, &request, result.as_ref());
        }
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::histogram!("kesoku_model_latency_seconds", "model" => model.name().to_owned(), "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        let response = result.map_err(StepError::Model)?;
        metrics::counter!("kesoku_model_tokens_total", "kind" => "input").increment(response.usage.input_tokens);
        metrics::counter!("kesoku_model_tokens_total", "kind" => "output").increment(response.usage.output_tokens);
        self.usage.input_tokens += response.usage.input_tokens;
        self.usage.output_tokens += response.usage.output_tokens;
        self.last_input_tokens = response.usage.input_tokens;
        Ok(response)
    }

    /// The thoughts, any interim text and every tool call of one response, to post in one write.
    fn step_messages(&self, response: &Response, calls: &[kesoku_llm::ToolCall], text: &str) -> Vec<Message> {
        let mut messages = Vec::new();
        for (thought, signature) in response.thoughts() {
            if !thought.trim().is_empty() || signature.is_some() {
                messages.push(self.origin.thought(self.step, thought, signature.map(str::to_owned)));
            }
        }
        if !calls.is_empty() && !text.trim().is_empty() {
            // Text that comes with tool calls is commentary the user may see now; the turn goes on.
            let mut interim = self.origin.final_text(self.step, text, None);
            interim.metadata.thought_signature = response.text_signature().map(str::to_owned);
            messages.push(interim);
        }
        for call in calls {
            let mut message = self.origin.tool_call(self.step, &call.id, &call.name, call.arguments.clone());
            message.metadata.thought_signature = call.signature.clone();
            messages.push(message);
        }
        messages
    }

    /// Post the messages of one step (see [`Turn::step_messages`]) in one write; its tool calls
    /// are open until their results are posted.
    async fn post_step(&mut self, messages: Vec<Message>) -> Result<(), GatewayError> {
        if messages.is_empty() {
            return Ok(());
        }
        for message in self.post(messages).await? {
            if message.message_type == MessageType::ToolCall {
                self.open_calls.push(message);
            }
        }
        Ok(())
    }

    /// Write `messages` in one transaction and add them to the history; returns them as stored.
    /// The one posting path of a turn: a configured agent's messages are stamped with its name.
    async fn post(&mut self, mut messages: Vec<Message>) -> Result<Vec<Message>, GatewayError> {
        if let Some(persona) = self.deps.persona {
            for message in &mut messages {
                message.metadata.agent = Some(persona.into());
            }
        }
        let stored: Vec<Message> =
            self.deps.gateway.post_many(&messages).await?.into_iter().map(|event| event.message).collect();
        self.history.extend(stored.iter().cloned());
        Ok(stored)
    }

    /// The tool futures of `calls` (this step's, stored already), those over the turn's budget
    /// set aside; a future does nothing until polled.
    fn start_tools(&mut self, calls: &[Message]) -> Running<'a> {
        let budget = u64::from(self.context.limits.tool_calls).saturating_sub(self.usage.tool_calls);
        let (allowed, refused) = calls.split_at((budget as usize).min(calls.len()));
        self.usage.tool_calls += allowed.len() as u64;
        let cancel = CancellationToken::new();
        let running = FuturesUnordered::new();
        // The connections of the person the work runs for, read by tools at call time; the
        // user id and the secrets stay out of the model's view.
        let grants: Option<Arc<dyn Grants>> = self.context.delegation_user.as_ref().map(|user| {
            Arc::new(StoreGrants::new(Arc::clone(self.deps.gateway.store()), user.clone())) as Arc<dyn Grants>
        });
        for call in allowed {
            let name = call.metadata.tool_name.clone().unwrap_or_default();
            let arguments = call.metadata.tool_arguments.clone().unwrap_or(serde_json::Value::Null);
            let call_id = call.metadata.tool_call_id.clone().unwrap_or_else(|| call.id.to_string());
            let ctx = ToolContext::new(
                self.deps.workspace.clone(),
                self.deps.staging_dir.clone(),
                self.context.session_id.clone(),
                call_id,
            )
            .with_cancel(cancel.clone())
            .with_agent(self.deps.persona.map(str::to_owned))
            .with_origin(ToolOrigin {
                message_id: self.root.id.clone(),
                chatbot_id: self.root.chatbot_id.clone(),
                channel_id: self.root.channel_id.clone(),
                timezone: self.context.timezone.clone(),
                depth: self.context.depth,
                activation_id: Some(self.context.activation_id.clone()),
            });
            let ctx = match &grants {
                Some(grants) => ctx.with_grants(Arc::clone(grants)),
                None => ctx,
            };
            let tools = self.deps.tools;
            let call = call.clone();
            running.push(
                async move {
                    let output = tools.call(&name, &ctx, arguments).await;
                    (call, output)
                }
                .boxed(),
            );
        }
        Running { running, refused: refused.to_vec(), cancel }
    }

    /// Run this step's tools concurrently, posting each result as it arrives.
    async fn run_tools(&mut self, mut tools: Running<'a>) -> Result<(), StepError> {
        let over_limit = !tools.refused.is_empty();
        for call in std::mem::take(&mut tools.refused) {
            let limit = LimitKind::ToolCalls.describe(&self.context.limits);
            let text = format!("Tool call not run: the turn reached its {limit}.");
            self.post_result(&call, ToolOutput::failure(text)).await?;
        }
        let Running { mut running, cancel, .. } = tools;
        let deadline = self.context.deadline();
        let stop = self.stop.clone();
        let mut ended: Option<StepError> = None;
        while ended.is_none() {
            tokio::select! {
                biased;
                _ = stop.token().cancelled() => ended = Some(StepError::Stopped),
                _ = tokio::time::sleep_until(deadline) => ended = Some(StepError::Limit(LimitKind::Runtime)),
                next = running.next() => match next {
                    Some((call, output)) => self.post_result(&call, output).await?,
                    None => break,
                },
            }
        }
        if let Some(error) = ended {
            // Tell the tools to stop and give them a moment to kill their processes; their
            // outputs are replaced by the synthetic results the caller posts.
            cancel.cancel();
            let _ = tokio::time::timeout(TOOL_CLEANUP_GRACE, async { while running.next().await.is_some() {} }).await;
            return Err(error);
        }
        if over_limit {
            return Err(StepError::Limit(LimitKind::ToolCalls));
        }
        Ok(())
    }

    async fn post_result(&mut self, call: &Message, output: ToolOutput) -> Result<(), GatewayError> {
        let result = self.result_of(call, output);
        self.post(vec![result]).await?;
        self.open_calls.retain(|open| open.id != call.id);
        Ok(())
    }

    fn result_of(&self, call: &Message, output: ToolOutput) -> Message {
        let tool = call.metadata.tool_name.clone().unwrap_or_default();
        let result = if output.error.is_some() { "error" } else { "ok" };
        metrics::counter!("kesoku_tool_calls_total", "tool" => tool, "result" => result).increment(1);
        self.origin.tool_result(call, output.content, output.summary, output.error)
    }

    /// Steer mode: claim newer human messages of this channel and add them to the turn.
    /// Returns whether any joined.
    async fn absorb_steering(&mut self) -> Result<bool, GatewayError> {
        let Some(claimant) = self.deps.steer_as else { return Ok(false) };
        let waiting = self
            .deps
            .gateway
            .store()
            .list_messages(
                &kesoku_core::MessageFilter::session(&self.root.session_id)
                    .with_channel(&self.root.channel_id)
                    .with_statuses(&[Status::PendingAgent])
                    .with_roles(&[Role::User]),
            )
            .await?;
        let mut joined = false;
        for message in waiting {
            if message.id == self.root.id || message.is_cron_trigger() {
                continue;
            }
            let Some(claimed) =
                self.deps.gateway.claim(&message.id, Status::Processing, &[Status::PendingAgent], claimant).await?
            else {
                continue;
            };
            // In this turn's view it is input to the next step (stored, it stays its own root).
            let mut joined_message = claimed.message;
            joined_message.parent_id = Some(self.root.id.clone());
            joined_message.step = self.step;
            self.steered.push(joined_message.id.clone());
            self.history.push(joined_message);
            joined = true;
        }
        Ok(joined)
    }

    /// Give this step's calls that have not started a synthetic "skipped" result.
    async fn skip_open_calls(&mut self) -> Result<(), GatewayError> {
        for call in self.open_calls.clone() {
            self.post_result(&call, ToolOutput::failure(SKIPPED_FOR_NEWER_RESULT)).await?;
        }
        Ok(())
    }

    /// Give every open call a synthetic result and mark it interrupted.
    async fn close_open_calls(&mut self, text: &str) -> Result<(), GatewayError> {
        for call in self.open_calls.clone() {
            self.post_result(&call, ToolOutput::failure(text)).await?;
            let current = self.deps.gateway.store().get_message(&call.id).await?.map(|m| m.status);
            if current.is_some_and(|s| s.can_transition_to(Status::Interrupted)) {
                self.deps.gateway.update_status(&call.id, Status::Interrupted).await?;
            }
        }
        Ok(())
    }

    async fn stopped(&mut self) -> TurnEnd {
        let reason = self.stop.reason().unwrap_or(StopReason::UserRequest);
        let text = match reason {
            StopReason::NewerMessage => INTERRUPTED_BY_NEWER_RESULT,
            StopReason::UserRequest => STOPPED_BY_USER_RESULT,
            StopReason::Shutdown => RESTARTED_RESULT,
        };
        if let Err(error) = self.close_open_calls(text).await {
            return store_failure(error);
        }
        TurnEnd::Stopped { reason }
    }

    async fn limit_reached(&mut self, limit: LimitKind) -> TurnEnd {
        let described = limit.describe(&self.context.limits);
        if let Err(error) =
            self.close_open_calls(&format!("Tool call not finished: the turn reached its {described}.")).await
        {
            return store_failure(error);
        }
        let text = format!(
            "⏹ I stopped working on this because the turn reached its {described}. \
             Ask me to continue if you want me to go on."
        );
        match self.post_final(text, None).await {
            Ok(()) => TurnEnd::LimitExceeded { limit: described },
            Err(error) => store_failure(error),
        }
    }

    async fn model_failure(&mut self, error: LlmError) -> TurnEnd {
        if let Err(store_error) = self.close_open_calls(INTERRUPTED_BY_ERROR_RESULT).await {
            return store_failure(store_error);
        }
        TurnEnd::Failed { detail: format!("{error:?}\n{error}"), short: error.to_string() }
    }

    async fn post_final(&mut self, text: String, signature: Option<String>) -> Result<(), GatewayError> {
        let metrics = self.metrics();
        let mut message = self.origin.final_text(self.step.max(1), text, Some(metrics));
        message.metadata.thought_signature = signature;
        self.answer = self.post(vec![message]).await?.pop();
        // The answer is stored and announced: let whoever waits for it (a chatbot delivering
        // it) run before this turn's bookkeeping (statuses, ledger), which a store write made
        // on this thread would otherwise run first without a pause.
        tokio::task::yield_now().await;
        Ok(())
    }

    fn metrics(&self) -> TurnMetrics {
        let completed = self
            .history
            .iter()
            .filter(|m| {
                m.parent_id.is_none()
                    && m.id != self.root.id
                    && matches!(m.role, Role::User | Role::System)
                    && m.status == Status::Processed
            })
            .count() as u64;
        // Turns a compaction summary stands in for still count.
        let summarized: u64 = self
            .history
            .iter()
            .filter_map(|m| m.metadata.compaction_summary.as_ref())
            .map(|s| u64::from(s.turns))
            .sum();
        TurnMetrics {
            session_turns: completed + summarized + 1,
            context_tokens: self.last_input_tokens,
            turn_tool_calls: self.usage.tool_calls,
            turn_tokens: self.usage.total_tokens(),
            turn_time: (self.context.elapsed().as_secs_f64() * 100.0).round() / 100.0,
        }
    }
}

/// Synthetic result of a call cut off by a newer message.
pub const INTERRUPTED_BY_NEWER_RESULT: &str = "Tool call interrupted: a newer message arrived before it finished.";
/// Synthetic result of a call skipped because a newer message joined the turn (steer mode).
pub const SKIPPED_FOR_NEWER_RESULT: &str =
    "Tool call skipped: a newer message from the user arrived before it started; see that message.";
/// Synthetic result of a call cut off by a stop request.
pub const STOPPED_BY_USER_RESULT: &str = "Tool call interrupted: the user stopped the turn before it finished.";
/// Synthetic result of a call its process never finished (crash, restart, shutdown).
pub const RESTARTED_RESULT: &str = "Tool call interrupted: the service restarted before it returned a result.";
/// Synthetic result of a call left open when the turn failed.
pub const INTERRUPTED_BY_ERROR_RESULT: &str = "Tool call interrupted: the turn failed before it finished.";

/// One tool call's future: the call and the tool's output.
type ToolRun<'a> = futures::future::BoxFuture<'a, (Message, ToolOutput)>;

/// The tools of one step: running, and refused (over the turn's budget).
struct Running<'a> {
    running: FuturesUnordered<ToolRun<'a>>,
    refused: Vec<Message>,
    /// Tells the running tools to stop.
    cancel: CancellationToken,
}

fn store_failure(error: GatewayError) -> TurnEnd {
    TurnEnd::Failed { detail: format!("{error:?}\n{error}"), short: "the message store failed".to_owned() }
}

fn blocked_note(response: &Response) -> Option<String> {
    (response.finish_reason == FinishReason::MaxOutputTokens).then(|| "answer cut at the output token limit".to_owned())
}
