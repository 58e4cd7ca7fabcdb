//! The runtime: intake (pending work becomes activations), the lane queue, the worker pool,
//! stop signals, crash recovery, and resolving how each activation ended.
//!
//! One worker runs a session at a time (the queue hands a session to one worker until its lease
//! is released). A turn runs in its own task: a panic in one session is logged, the message is
//! marked `error`, and every other session goes on.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use kesoku_broker::{Control, Queue, QueueDepths, StopReason};
use kesoku_core::activation::Trigger;
use kesoku_core::{
    Activation, ActivationId, ActivationPayload, ExpectedResponse, Lane, LedgerEntry, Message, MessageFilter,
    MessageId, MessageType, Outcome, Role, SessionId, SessionKind, Status, TurnOrigin, Usage,
};
use kesoku_gateway::{Gateway, GatewayError, ListenFrom};
use kesoku_llm::{LlmError, Model, Request, Response};
use kesoku_store::{Ledger, StoreError};
use kesoku_tools::{Registry, ToolOutput};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::compaction::{self, CompactionError};
use crate::config::{AgentConfig, LaneLimits, QueueMode};
use crate::context::ActivationContext;
use crate::entries;
use crate::turn::{RESTARTED_RESULT, StopSignal, Turn, TurnDeps, TurnEnd};

/// Why a compaction did not happen.
#[derive(Debug)]
enum CompactError {
    Summary(CompactionError),
    Gateway(GatewayError),
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no model named `{0}` is configured")]
    UnknownModel(String),
}

/// The configured models by name, and which one answers by default.
#[derive(Clone)]
pub struct ModelSet {
    models: HashMap<String, Arc<dyn Model>>,
    default: String,
}

impl std::fmt::Debug for ModelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSet").field("names", &self.models.keys().collect::<Vec<_>>()).finish()
    }
}

impl ModelSet {
    /// A set answering with `default`, which must be among `models`.
    pub fn new(models: Vec<Arc<dyn Model>>, default: &str) -> Result<Self, AgentError> {
        let models: HashMap<String, Arc<dyn Model>> = models.into_iter().map(|m| (m.name().to_owned(), m)).collect();
        if !models.contains_key(default) {
            return Err(AgentError::UnknownModel(default.to_owned()));
        }
        Ok(ModelSet { models, default: default.to_owned() })
    }

    pub fn single(model: Arc<dyn Model>) -> Self {
        let default = model.name().to_owned();
        ModelSet { models: HashMap::from([(default.clone(), model)]), default }
    }

    /// A model by its configured name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Model>> {
        self.models.get(name).cloned()
    }

    pub fn default_model(&self) -> Arc<dyn Model> {
        // `new` and `single` guarantee the default is present.
        self.models.get(&self.default).cloned().unwrap_or_else(|| unreachable_model(&self.default))
    }
}

fn unreachable_model(name: &str) -> Arc<dyn Model> {
    Arc::new(kesoku_llm::ScriptedModel::new(name, Vec::new()))
}

/// Everything the runtime is built from.
pub struct AgentDeps {
    pub gateway: Gateway,
    pub ledger: Arc<dyn Ledger>,
    pub queue: Arc<dyn Queue>,
    pub models: ModelSet,
    pub tools: Arc<Registry>,
    /// The workspace folder: tools run here; `sessions/<id>/` are the staging folders.
    pub workspace: PathBuf,
    pub config: AgentConfig,
    pub limits: LaneLimits,
    /// The role's intro text, appended to the system prompt.
    pub intro: Option<String>,
}

/// A turn running in this process.
#[derive(Debug, Clone)]
pub struct RunningTurn {
    pub activation_id: ActivationId,
    pub lane: Lane,
    pub root_id: MessageId,
    pub since: chrono::DateTime<Utc>,
    stop: StopSignal,
}

/// What recovery found and fixed at start-up.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Messages handed back from dead workers (`processing` → `pending_agent`).
    pub recovered_messages: Vec<MessageId>,
    /// Tool calls that got a synthetic "service restarted" result.
    pub closed_tool_calls: Vec<MessageId>,
    /// Ledger rows of dead workers closed as cancelled.
    pub closed_activations: Vec<ActivationId>,
}

struct Inner {
    deps: AgentDeps,
    system_prompt: String,
    worker_id: String,
    // Short critical sections only (insert/remove/lookup), never held across an await.
    running: Mutex<HashMap<SessionId, RunningTurn>>,
    // Messages whose activation is queued, so a re-announced message is not queued twice.
    queued: Mutex<HashSet<MessageId>>,
    // The ledger writes of queued activations still in flight (see `Agent::intake`).
    recording: Mutex<HashMap<ActivationId, oneshot::Receiver<Result<(), String>>>>,
}

/// Whether an activation's ledger row is written: resolved once, awaited by both the turn
/// (before its claim) and the start record.
type Recorded = Shared<BoxFuture<'static, Result<(), String>>>;

/// The agent runtime. Cheap to clone.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("worker_id", &self.inner.worker_id).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Agent {
    pub fn new(deps: AgentDeps) -> Self {
        let system_prompt =
            entries::system_prompt(&deps.config.name, deps.config.system_prompt.as_deref(), deps.intro.as_deref());
        let worker_id = crate::liveness::worker_id();
        Agent {
            inner: Arc::new(Inner {
                deps,
                system_prompt,
                worker_id,
                running: Mutex::new(HashMap::new()),
                queued: Mutex::new(HashSet::new()),
                recording: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn gateway(&self) -> &Gateway {
        &self.inner.deps.gateway
    }

    /// Who this process is when it claims a message (`host/pid/instance`).
    pub fn worker_id(&self) -> &str {
        &self.inner.worker_id
    }

    pub fn config(&self) -> &AgentConfig {
        &self.inner.deps.config
    }

    /// The limits of each lane.
    pub fn limits(&self) -> &LaneLimits {
        &self.inner.deps.limits
    }

    /// The staging folder of a session.
    pub fn session_dir(&self, session_id: &SessionId) -> PathBuf {
        self.inner.deps.workspace.join("sessions").join(session_id.as_str())
    }

    pub fn queue_depths(&self) -> QueueDepths {
        self.inner.deps.queue.depths()
    }

    /// Turns running in this process.
    pub fn running_turns(&self) -> Vec<(SessionId, RunningTurn)> {
        lock(&self.inner.running).iter().map(|(s, r)| (s.clone(), r.clone())).collect()
    }

    /// Stop a session's running turn (any process), and interrupt its waiting messages.
    pub async fn stop_session(&self, session_id: &SessionId, reason: StopReason) -> Result<usize, AgentError> {
        let gateway = &self.inner.deps.gateway;
        gateway.request_stop(session_id, reason, None).await?;
        let waiting = gateway
            .store()
            .list_messages(&MessageFilter::session(session_id).with_statuses(&[Status::PendingAgent]))
            .await?;
        let mut interrupted = 0;
        for message in waiting {
            if gateway.claim(&message.id, Status::Interrupted, &[Status::PendingAgent], "stop").await?.is_some() {
                interrupted += 1;
            }
        }
        Ok(interrupted)
    }

    /// Hand work of dead workers back, close their tool calls and ledger rows. Run before `run`.
    pub async fn recover(&self) -> Result<RecoveryReport, AgentError> {
        let gateway = &self.inner.deps.gateway;
        let store = gateway.store();
        let mut report = RecoveryReport::default();

        // Claims of processes on this host that are gone can be recovered at once; others only
        // once their claim is older than the threshold (their worker may be alive elsewhere).
        for message in store.list_messages(&MessageFilter::status(Status::Processing)).await? {
            let Some(claim) = store.claim_of(&message.id).await? else { continue };
            if crate::liveness::claim_is_dead(&claim.claimed_by, &self.inner.worker_id)
                && gateway.claim(&message.id, Status::PendingAgent, &[Status::Processing], "recovery").await?.is_some()
            {
                report.recovered_messages.push(message.id);
            }
        }
        for event in gateway.recover_orphans(self.inner.deps.config.orphan_after()).await? {
            report.recovered_messages.push(event.message.id);
        }

        for call in store.orphaned_tool_calls(None).await? {
            let root_status = match &call.parent_id {
                Some(root) => store.get_message(root).await?.map(|m| m.status),
                None => None,
            };
            if root_status == Some(Status::Processing) {
                continue; // A live worker elsewhere may still be running it.
            }
            let origin = match &call.parent_id {
                Some(root_id) => match store.get_message(root_id).await? {
                    Some(root) => TurnOrigin::of(&root, &self.inner.deps.config.name),
                    None => continue,
                },
                None => continue,
            };
            let output = ToolOutput::failure(RESTARTED_RESULT);
            let result = origin.tool_result(&call, output.content, output.summary, output.error);
            gateway.post(&result).await?;
            if call.status.can_transition_to(Status::Interrupted) {
                gateway.update_status(&call.id, Status::Interrupted).await?;
            }
            report.closed_tool_calls.push(call.id);
        }

        let ledger = &self.inner.deps.ledger;
        for entry in ledger.unfinished_activations().await? {
            let still_running = match &entry.message_id {
                Some(id) => store.get_message(id).await?.is_some_and(|m| m.status == Status::Processing),
                None => false,
            };
            if !still_running {
                ledger
                    .record_finished(
                        &entry.id,
                        Utc::now(),
                        Outcome::Cancelled,
                        Some("the worker stopped before finishing (process exit); its message was handed back"),
                        &entry.usage,
                    )
                    .await?;
                report.closed_activations.push(entry.id);
            }
        }
        Ok(report)
    }

    /// Run intake, stop signals and the worker pool until `shutdown` fires; then give running
    /// turns `grace` to finish before stopping them (their messages go back to `pending_agent`).
    pub async fn run(&self, shutdown: CancellationToken, grace: Duration) {
        let mut tasks = JoinSet::new();
        {
            let agent = self.clone();
            let shutdown = shutdown.clone();
            tasks.spawn(async move { agent.intake(shutdown).await });
        }
        let controls_stop = CancellationToken::new();
        let controls = {
            let agent = self.clone();
            let stop = controls_stop.clone();
            tokio::spawn(async move { agent.controls(stop).await })
        };
        let workers = self.inner.deps.config.max_concurrent_turns.max(1);
        for _ in 0..workers {
            let agent = self.clone();
            let shutdown = shutdown.clone();
            tasks.spawn(async move { agent.worker(shutdown).await });
        }
        shutdown.cancelled().await;
        let stopper = {
            let agent = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                for (_, turn) in agent.running_turns() {
                    turn.stop.stop(StopReason::Shutdown);
                }
            })
        };
        while tasks.join_next().await.is_some() {}
        stopper.abort();
        controls_stop.cancel();
        let _ = controls.await;
    }

    /// Queue every message that waits for the agent, in the order they arrive.
    ///
    /// The activation's ledger row is written at once when the store can do it on this thread
    /// (it is idle); when the write has to wait for the store, it goes on in the background
    /// while the activation is already queued, and the turn that takes it waits for it only at
    /// its claim, alongside reading the message. Nothing is claimed, and no start is recorded,
    /// before the row exists; a failed write leaves the message pending.
    /// This relies on the worker being in this process (it finds the write in `recording`);
    /// a queue shared between processes must have the row written before the push.
    async fn intake(&self, shutdown: CancellationToken) {
        let gateway = self.inner.deps.gateway.clone();
        let mut events = Box::pin(gateway.listen(MessageFilter::status(Status::PendingAgent), ListenFrom::Current));
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = events.next() => next,
            };
            let message = match next {
                None => return,
                Some(Ok(event)) => event.message,
                Some(Err(error)) => {
                    tracing::warn!(%error, "reading pending work failed; will catch up on the next event");
                    continue;
                }
            };
            let Some(activation) = self.record(&message).await else { continue };
            let id = activation.id.clone();
            if let Err(error) = self.dispatch(&message, activation).await {
                tracing::error!(%error, message_id = %message.id, "queueing a message failed; it stays pending");
                lock(&self.inner.queued).remove(&message.id);
                lock(&self.inner.recording).remove(&id);
            }
        }
    }

    /// Intake's first half: the activation of `message`, its ledger row written (or, if the
    /// store is busy, being written in the background); `None` when the message is already
    /// queued. (A background task costs a wake-up on another thread in the turn's path, more
    /// than the write itself when the store takes it on this thread.)
    async fn record(&self, message: &Message) -> Option<Activation> {
        if !lock(&self.inner.queued).insert(message.id.clone()) {
            return None;
        }
        let activation = self.activation_for(message);
        let entry = LedgerEntry::enqueued(&activation);
        let ledger = Arc::clone(&self.inner.deps.ledger);
        let (written, recorded) = oneshot::channel();
        lock(&self.inner.recording).insert(activation.id.clone(), recorded);
        let mut write =
            Box::pin(async move { ledger.record_enqueued(&entry).await.map_err(|error| error.to_string()) });
        match futures::poll!(&mut write) {
            std::task::Poll::Ready(result) => {
                let _ = written.send(result);
            }
            std::task::Poll::Pending => {
                tokio::spawn(async move {
                    let _ = written.send(write.await);
                });
            }
        }
        Some(activation)
    }

    /// Intake's second half, in arrival order: stop an older turn of the session when the
    /// channel's mode says so, and queue the activation.
    async fn dispatch(&self, message: &Message, activation: Activation) -> Result<(), AgentError> {
        let mode = self.inner.deps.config.queue_mode_for(&message.chatbot_id, &message.channel_id);
        if is_human(message) && mode == QueueMode::Interrupt {
            self.inner
                .deps
                .gateway
                .request_stop(&message.session_id, StopReason::NewerMessage, Some(&message.id))
                .await?;
        }
        self.inner
            .deps
            .queue
            .push(activation)
            .await
            .map_err(|e| AgentError::Store(StoreError::Migration(format!("queue: {e}"))))
    }

    fn activation_for(&self, message: &Message) -> Activation {
        let trigger =
            if message.metadata.is_cronjob == Some(true) || message.sender == kesoku_core::message::SENDER_CRONJOB {
                Trigger::Schedule
            } else if message.role == Role::System {
                Trigger::System
            } else {
                Trigger::Human
            };
        let kind = ActivationPayload::Message { message_id: message.id.clone() };
        let lane = Lane::derive(kind.kind(), trigger, SessionKind::Interactive);
        Activation {
            id: ActivationId::generate(),
            session_id: message.session_id.clone(),
            chatbot_id: message.chatbot_id.clone(),
            channel_id: message.channel_id.clone(),
            triggered_by: match trigger {
                Trigger::Human => message.sender.clone(),
                Trigger::Schedule => "cron".to_owned(),
                Trigger::System => "system".to_owned(),
            },
            delegation_user: None,
            depth: 0,
            lane,
            expected_response: ExpectedResponse::default(),
            locale: self.inner.deps.config.locale.clone(),
            timezone: self.inner.deps.config.timezone.clone(),
            created_at: Utc::now(),
            payload: kind,
        }
    }

    async fn controls(&self, stop: CancellationToken) {
        let mut controls = Box::pin(self.inner.deps.gateway.controls());
        loop {
            let control = tokio::select! {
                _ = stop.cancelled() => return,
                control = controls.next() => control,
            };
            let Some(Control::Stop { session_id, reason, unless_root }) = control else { return };
            let running = lock(&self.inner.running).get(&session_id).cloned();
            if let Some(turn) = running
                && unless_root.as_ref() != Some(&turn.root_id)
            {
                tracing::info!(session_id = %session_id, ?reason, "stopping the running turn");
                turn.stop.stop(reason);
            }
        }
    }

    async fn worker(&self, shutdown: CancellationToken) {
        loop {
            let lease = tokio::select! {
                _ = shutdown.cancelled() => return,
                lease = self.inner.deps.queue.pop() => lease,
            };
            let Ok(lease) = lease else { return };
            if let ActivationPayload::Message { message_id } = &lease.activation.payload {
                lock(&self.inner.queued).remove(message_id);
            }
            let activation = lease.activation.clone();
            let agent = self.clone();
            // Its own task: a panic in one turn is caught here and the worker goes on.
            let outcome = tokio::spawn(async move { agent.run_activation(&activation).await }).await;
            if let Err(join_error) = outcome {
                tracing::error!(activation_id = %lease.activation.id, error = %join_error, "a turn panicked");
                self.after_panic(&lease.activation).await;
            }
            lease.release();
        }
    }

    async fn after_panic(&self, activation: &Activation) {
        lock(&self.inner.running).remove(&activation.session_id);
        let detail = "internal error: the turn panicked (see the service log)";
        if let ActivationPayload::Message { message_id } = &activation.payload {
            let gateway = &self.inner.deps.gateway;
            if let Ok(Some(root)) = gateway.store().get_message(message_id).await
                && root.status == Status::Processing
            {
                self.fail_root(&root, activation, detail, "internal error").await;
            }
        }
        let _ = self
            .inner
            .deps
            .ledger
            .record_finished(&activation.id, Utc::now(), Outcome::Failed, Some(detail), &Usage::default())
            .await;
    }

    /// Run one activation to its end and record the outcome.
    pub async fn run_activation(&self, activation: &Activation) {
        let ledger = &self.inner.deps.ledger;
        // The intake may still be writing the activation's ledger row (see `intake`).
        let recording = lock(&self.inner.recording).remove(&activation.id);
        let recorded: Recorded = async move {
            match recording {
                None => Ok(()),
                Some(written) => {
                    written.await.unwrap_or_else(|_| Err("the intake stopped before writing it".to_owned()))
                }
            }
        }
        .boxed()
        .shared();
        // The start is recorded while the turn loads its message (one store round trip less
        // before the model call); the end is recorded after both.
        let started = async {
            if recorded.clone().await.is_ok()
                && let Err(error) = ledger.record_started(&activation.id, Utc::now()).await
            {
                tracing::error!(%error, "recording an activation start failed");
            }
        };
        let max_depth = self.inner.deps.config.max_depth;
        let run = async {
            match &activation.payload {
                // Depth is a guardrail in the contract, not in the prompt: a chain of agents that went
                // too deep stops here, before any model call.
                _ if activation.depth > max_depth => (
                    Outcome::LimitExceeded,
                    Some(format!("depth limit of {max_depth} (this activation is at depth {})", activation.depth)),
                    Usage::default(),
                ),
                ActivationPayload::Message { message_id } => {
                    self.run_message(activation, message_id, recorded.clone()).await
                }
                ActivationPayload::Workflow { .. }
                | ActivationPayload::FollowUp { .. }
                | ActivationPayload::SubAgentResult { .. }
                | ActivationPayload::BackgroundJobResult { .. }
                | ActivationPayload::VoiceTranscript { .. }
                | ActivationPayload::Maintenance { .. } => (
                    Outcome::Failed,
                    Some(format!("activations of kind `{}` are not handled by this version", activation.kind())),
                    Usage::default(),
                ),
            }
        };
        let ((), (outcome, error, usage)) = tokio::join!(started, run);
        if let Err(error) = recorded.await {
            // No row to finish; nothing was claimed, so the message waits for the next intake.
            tracing::error!(%error, activation_id = %activation.id, "enqueueing a message failed; it stays pending");
            return;
        }
        metrics::counter!("kesoku_turns_total", "outcome" => outcome.as_str(), "lane" => activation.lane.as_str())
            .increment(1);
        if let Err(record_error) =
            ledger.record_finished(&activation.id, Utc::now(), outcome, error.as_deref(), &usage).await
        {
            tracing::error!(error = %record_error, "recording an activation end failed");
        }
    }

    async fn run_message(
        &self,
        activation: &Activation,
        message_id: &MessageId,
        recorded: Recorded,
    ) -> (Outcome, Option<String>, Usage) {
        match self.run_message_inner(activation, message_id, recorded).await {
            Ok(result) => result,
            Err(error) => {
                tracing::error!(%error, message_id = %message_id, "a turn could not be run; the message stays for recovery");
                lock(&self.inner.running).remove(&activation.session_id);
                (Outcome::Failed, Some(format!("store error: {error}")), Usage::default())
            }
        }
    }

    async fn run_message_inner(
        &self,
        activation: &Activation,
        message_id: &MessageId,
        recorded: Recorded,
    ) -> Result<(Outcome, Option<String>, Usage), AgentError> {
        let gateway = &self.inner.deps.gateway;
        let store = gateway.store();
        // Whether a newer human message waits on the channel (interrupt mode) is asked while the
        // message itself is read: one store round trip instead of two before the claim.
        let mode = self.inner.deps.config.queue_mode_for(&activation.chatbot_id, &activation.channel_id);
        let newer = async {
            if mode == QueueMode::Interrupt {
                self.has_newer_waiting(&activation.session_id, &activation.channel_id, message_id).await
            } else {
                Ok(false)
            }
        };
        let (message, newer, recorded) = tokio::join!(store.get_message(message_id), newer, recorded);
        if let Err(error) = recorded {
            return Ok((Outcome::Failed, Some(format!("the ledger could not record it: {error}")), Usage::default()));
        }
        let Some(message) = message? else {
            return Ok((Outcome::Failed, Some(format!("message `{message_id}` does not exist")), Usage::default()));
        };
        // Access check at load time: the referenced message must belong to the activation's
        // session and reply routing, whatever the queue payload claims.
        if message.session_id != activation.session_id
            || message.chatbot_id != activation.chatbot_id
            || message.channel_id != activation.channel_id
        {
            return Ok((
                Outcome::Failed,
                Some(format!(
                    "access denied: message `{message_id}` belongs to session `{}` ({}:{}), not this activation's",
                    message.session_id, message.chatbot_id, message.channel_id
                )),
                Usage::default(),
            ));
        }
        // (Past the access check, the activation's chatbot and channel are the message's.)
        if is_human(&message) && mode == QueueMode::Interrupt && newer? {
            // Superseded before it started: the newer message's turn will see it in history.
            if gateway
                .claim(&message.id, Status::Interrupted, &[Status::PendingAgent], &self.inner.worker_id)
                .await?
                .is_some()
            {
                return Ok((Outcome::Interrupted, Some("superseded by a newer message".to_owned()), Usage::default()));
            }
        }
        let Some(claimed) =
            gateway.claim(&message.id, Status::Processing, &[Status::PendingAgent], &self.inner.worker_id).await?
        else {
            return Ok((
                Outcome::Cancelled,
                Some("the message was no longer pending (already handled or stopped)".to_owned()),
                Usage::default(),
            ));
        };
        let root = claimed.message;
        if root.metadata.is_compaction == Some(true) {
            return self.run_manual_compaction(activation, root).await;
        }
        let stop = StopSignal::default();
        lock(&self.inner.running).insert(
            root.session_id.clone(),
            RunningTurn {
                activation_id: activation.id.clone(),
                lane: activation.lane,
                root_id: root.id.clone(),
                since: Utc::now(),
                stop: stop.clone(),
            },
        );
        let heartbeat = self.spawn_heartbeat(&root.id);
        let result = self.run_claimed(activation, root, stop).await;
        heartbeat.cancel();
        lock(&self.inner.running).remove(&activation.session_id);
        result
    }

    /// Keep the claim fresh while the turn runs, so orphan recovery never takes a live turn.
    fn spawn_heartbeat(&self, message_id: &MessageId) -> CancellationToken {
        let token = CancellationToken::new();
        let period = (self.inner.deps.config.orphan_after() / 4).max(Duration::from_secs(1));
        let store = Arc::clone(self.inner.deps.gateway.store());
        let id = message_id.clone();
        let worker = self.inner.worker_id.clone();
        let stop = token.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                match store.renew_claim(&id, &worker).await {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(error) => tracing::warn!(%error, "renewing a claim failed"),
                }
            }
        });
        token
    }

    /// Whether a human message newer than `message_id` waits in the session's channel.
    async fn has_newer_waiting(
        &self,
        session_id: &SessionId,
        channel_id: &str,
        message_id: &MessageId,
    ) -> Result<bool, AgentError> {
        let waiting = self
            .inner
            .deps
            .gateway
            .store()
            .list_messages(
                &MessageFilter::session(session_id)
                    .with_channel(channel_id)
                    .with_statuses(&[Status::PendingAgent])
                    .with_roles(&[Role::User]),
            )
            .await?;
        // Listed in the order they were written: anything after ours is newer.
        let position = waiting.iter().position(|m| &m.id == message_id);
        Ok(position.is_some_and(|p| waiting[p + 1..].iter().any(is_human)))
    }

    async fn run_claimed(
        &self,
        activation: &Activation,
        root: Message,
        stop: StopSignal,
    ) -> Result<(Outcome, Option<String>, Usage), AgentError> {
        let deps = &self.inner.deps;
        let gateway = &deps.gateway;
        // The session and its history are read at once (two readers), not one after the other.
        let (session, history) = tokio::join!(
            gateway.store().get_session(&root.session_id),
            gateway.store().session_history(&root.session_id)
        );
        if session?.is_none() {
            let detail = format!("session `{}` does not exist (missing session context)", root.session_id);
            self.fail_root(&root, activation, &detail, "this conversation's session is missing").await;
            return Ok((Outcome::Failed, Some(detail), Usage::default()));
        }
        let limits = deps.limits.for_lane(activation.lane);
        let context = ActivationContext::derive(activation, limits, deps.models.default_model());
        let history = compaction::apply_summaries(history?);
        let history = self.compact_if_needed(&context, &root, history).await?;
        let staging_dir = self.session_dir(&root.session_id);
        let now = Utc::now().format("%Y-%m-%d %H:%M:%S UTC").to_string();
        let mut entries = vec![entries::activation_context_entry(&context, &now)];
        if root.metadata.is_cronjob == Some(true) {
            // A scheduled prompt: tell the model which job fired and when.
            let trigger = kesoku_core::activation::TriggerContext {
                name: root
                    .metadata
                    .extra
                    .get("cron_job")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("scheduled job")
                    .to_owned(),
                source: "cron".to_owned(),
                schedule: None,
                fired_at: root.created_at.unwrap_or_else(Utc::now),
            };
            entries.push(entries::trigger_context_entry(&root.session_id, &trigger, &root.content));
        }
        let log_dir = staging_dir.clone();
        let model_log = move |step: u32, request: &Request, response: Result<&Response, &LlmError>| {
            write_model_log(&log_dir, step, request, response);
        };
        let turn_deps = TurnDeps {
            gateway,
            tools: &deps.tools,
            workspace: &deps.workspace,
            staging_dir: staging_dir.clone(),
            agent_name: &deps.config.name,
            system_prompt: &self.inner.system_prompt,
            entries,
            model_log: if deps.config.debug { Some(&model_log) } else { None },
            steer_as: (deps.config.queue_mode_for(&root.chatbot_id, &root.channel_id) == QueueMode::Steer)
                .then_some(self.inner.worker_id.as_str()),
        };
        let mut turn = Turn::new(turn_deps, &context, root.clone(), history, stop);
        let end = turn.run().await;
        let usage = turn.usage;
        let steered = std::mem::take(&mut turn.steered);
        drop(turn);
        // Messages that joined the turn end as its root does.
        let steered_status = match &end {
            TurnEnd::Answered { .. } | TurnEnd::LimitExceeded { .. } => Status::Processed,
            TurnEnd::Stopped { reason: StopReason::Shutdown } => Status::PendingAgent,
            TurnEnd::Stopped { .. } => Status::Interrupted,
            TurnEnd::Failed { .. } => Status::Error,
        };
        for id in &steered {
            gateway.update_status(id, steered_status).await?;
        }
        let resolved = match end {
            TurnEnd::Answered { note } => {
                gateway.update_status(&root.id, Status::Processed).await?;
                (Outcome::Succeeded, note)
            }
            TurnEnd::LimitExceeded { limit } => {
                gateway.update_status(&root.id, Status::Processed).await?;
                (Outcome::LimitExceeded, Some(limit))
            }
            TurnEnd::Stopped { reason: StopReason::Shutdown } => {
                gateway.update_status(&root.id, Status::PendingAgent).await?;
                (Outcome::Cancelled, Some("the service shut down; the message will be retried".to_owned()))
            }
            TurnEnd::Stopped { reason } => {
                gateway.update_status(&root.id, Status::Interrupted).await?;
                let why = match reason {
                    StopReason::NewerMessage => "interrupted by a newer message",
                    StopReason::UserRequest | StopReason::Shutdown => "stopped by the user",
                };
                (Outcome::Interrupted, Some(why.to_owned()))
            }
            TurnEnd::Failed { detail, short } => {
                self.fail_root(&root, activation, &detail, &short).await;
                (Outcome::Failed, Some(short))
            }
        };
        Ok((resolved.0, resolved.1, usage))
    }

    /// The model that writes summaries: `[agent.compaction] model`, or the answering one.
    fn summarizer(&self) -> Arc<dyn Model> {
        let deps = &self.inner.deps;
        deps.config
            .compaction
            .model
            .as_deref()
            .and_then(|name| deps.models.get(name))
            .unwrap_or_else(|| deps.models.default_model())
    }

    /// Summarize the oldest turns of `view` and store the summary; returns the new view, or
    /// `None` when there was nothing to compact.
    async fn compact(
        &self,
        root: &Message,
        view: &[Message],
        automatic: bool,
    ) -> Result<Option<Vec<Message>>, CompactError> {
        let config = &self.inner.deps.config.compaction;
        let Some(plan) = compaction::plan(view, config.keep_recent_turns) else { return Ok(None) };
        let summarizer = self.summarizer();
        let text = compaction::summarize(summarizer.as_ref(), &plan).await.map_err(CompactError::Summary)?;
        let summary = compaction::summary_message(&root.session_id, &root.chatbot_id, &root.channel_id, &plan, &text);
        let gateway = &self.inner.deps.gateway;
        gateway.post(&summary).await.map_err(CompactError::Gateway)?;
        let notice = Message::notification(
            &root.session_id,
            Some(&root.id),
            &root.chatbot_id,
            &root.channel_id,
            compaction::notification_text(&plan, automatic),
        );
        gateway.post(&notice).await.map_err(CompactError::Gateway)?;
        let history =
            gateway.store().session_history(&root.session_id).await.map_err(|e| CompactError::Gateway(e.into()))?;
        Ok(Some(compaction::apply_summaries(history)))
    }

    /// Automatic compaction before a turn, when the prepared context passes the configured
    /// share of the window. It is recorded as its own background-lane maintenance activation.
    async fn compact_if_needed(
        &self,
        context: &ActivationContext,
        root: &Message,
        view: Vec<Message>,
    ) -> Result<Vec<Message>, AgentError> {
        let config = &self.inner.deps.config.compaction;
        let window = u64::from(context.model.info().context_window);
        if !config.auto || (compaction::estimate_tokens(&view) as f64) < config.threshold * window as f64 {
            return Ok(view);
        }
        let mut activation = self.activation_for(root);
        activation.id = ActivationId::generate();
        activation.payload =
            ActivationPayload::Maintenance { task: kesoku_core::activation::MaintenanceTask::Compaction };
        activation.lane = Lane::Background;
        activation.triggered_by = "system".to_owned();
        let ledger = &self.inner.deps.ledger;
        ledger.record_enqueued(&LedgerEntry::enqueued(&activation)).await?;
        ledger.record_started(&activation.id, Utc::now()).await?;
        let usage = Usage { model_calls: 1, ..Usage::default() };
        let (new_view, outcome, error) = match self.compact(root, &view, true).await {
            Ok(Some(new_view)) => (new_view, Outcome::Succeeded, None),
            Ok(None) => (view, Outcome::Succeeded, Some("nothing to compact: too few turns".to_owned())),
            Err(CompactError::Summary(error)) => {
                tracing::warn!(%error, session_id = %root.session_id, "automatic compaction failed; history unchanged");
                (view, Outcome::Failed, Some(error.to_string()))
            }
            Err(CompactError::Gateway(error)) => return Err(error.into()),
        };
        ledger.record_finished(&activation.id, Utc::now(), outcome, error.as_deref(), &usage).await?;
        Ok(new_view)
    }

    /// `/compact`: the Manual Compaction Trigger summarizes older turns now.
    async fn run_manual_compaction(
        &self,
        activation: &Activation,
        root: Message,
    ) -> Result<(Outcome, Option<String>, Usage), AgentError> {
        let gateway = &self.inner.deps.gateway;
        let view = compaction::apply_summaries(gateway.store().session_history(&root.session_id).await?);
        let usage = Usage { model_calls: 1, ..Usage::default() };
        match self.compact(&root, &view, false).await {
            Ok(Some(_)) => {
                gateway.update_status(&root.id, Status::Processed).await?;
                Ok((Outcome::Succeeded, None, usage))
            }
            Ok(None) => {
                let notice = TurnOrigin::of(&root, &self.inner.deps.config.name).notification(
                    "🔄 Nothing to compact yet: the conversation is still short (the first and the latest turns are always kept).",
                );
                gateway.post(&notice).await?;
                gateway.update_status(&root.id, Status::Processed).await?;
                Ok((Outcome::Succeeded, Some("nothing to compact".to_owned()), Usage::default()))
            }
            Err(CompactError::Summary(error)) => {
                let short = error.to_string();
                self.fail_root(&root, activation, &format!("{error:?}\n{error}"), &short).await;
                Ok((Outcome::Failed, Some(short), usage))
            }
            Err(CompactError::Gateway(error)) => Err(error.into()),
        }
    }

    /// Mark the root `error`, tell the user briefly, keep the full error in the staging folder.
    async fn fail_root(&self, root: &Message, activation: &Activation, detail: &str, short: &str) {
        let gateway = &self.inner.deps.gateway;
        let staging = self.session_dir(&root.session_id);
        let path = staging.join("errors").join(format!("{}.txt", activation.id));
        if let Err(error) = write_file(&path, detail) {
            tracing::warn!(%error, "could not save the error details");
        }
        let origin = TurnOrigin::of(root, &self.inner.deps.config.name);
        let notice = origin.error_notification(0, short);
        if let Err(error) = gateway.post(&notice).await {
            tracing::error!(%error, "posting an error notification failed");
        }
        if let Err(error) = gateway.update_status(&root.id, Status::Error).await {
            tracing::error!(%error, message_id = %root.id, "marking a message as error failed");
        }
    }
}

fn is_human(message: &Message) -> bool {
    message.role == Role::User
        && message.message_type == MessageType::Text
        && message.metadata.is_cronjob != Some(true)
        && message.sender != kesoku_core::message::SENDER_CRONJOB
}

fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)
}

/// Append one model call to `model-log.jsonl` in the staging folder (debug mode). Requests hold
/// no credentials: keys live only inside the providers' HTTP clients.
fn write_model_log(dir: &Path, step: u32, request: &Request, response: Result<&Response, &LlmError>) {
    let entry = json!({
        "at": Utc::now().to_rfc3339(),
        "step": step,
        "request": request,
        "response": response.ok(),
        "error": response.err().map(|e| e.to_string()),
    });
    let line = format!("{entry}\n");
    let path = dir.join("model-log.jsonl");
    let result = std::fs::create_dir_all(dir).and_then(|()| {
        use std::io::Write;
        std::fs::OpenOptions::new().create(true).append(true).open(&path)?.write_all(line.as_bytes())
    });
    if let Err(error) = result {
        tracing::warn!(%error, "could not write the model log");
    }
}
