//! The worker: take an activation from the queue, check it, claim its message, keep the claim
//! alive, run the turn in its own task, and resolve how it ended (the root's status, the
//! steered messages' statuses, the ledger outcome). A panic in a turn marks its message `error`
//! and the worker goes on.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use kesoku_broker::StopReason;
use kesoku_broker::lease::{KeptLease, LeaseHolder};
use kesoku_core::activation::AfterPass;
use kesoku_core::{
    Activation, ActivationId, ActivationPayload, Message, MessageFilter, MessageId, Orchestration, Outcome, Role,
    SessionId, Status, TurnOrigin, Usage,
};
use kesoku_gateway::GatewayError;
use kesoku_llm::{LlmError, Request, Response};
use kesoku_store::StoreError;
use tokio_util::sync::CancellationToken;

use super::intake::is_human;
use super::model_log::write_model_log;
use super::{Agent, RunningTurn, lock, visibility};
use crate::compaction;
use crate::config::QueueMode;
use crate::context::ActivationContext;
use crate::entries;
use crate::error::AgentError;
use crate::orchestration;
use crate::turn::{StopSignal, Turn, TurnDeps, TurnEnd};

/// A session's lease held while its turn runs, and the task that stops the turn if it is lost.
struct HeldSession {
    kept: KeptLease,
    watcher: tokio::task::JoinHandle<()>,
}

impl HeldSession {
    async fn release(self) {
        self.watcher.abort();
        let session_id = self.kept.lease().session_id().clone();
        match self.kept.release().await {
            Ok(_) => {}
            // It expires after its ttl; the next turn of the session waits that long at most.
            Err(error) => tracing::warn!(%error, %session_id, "releasing a session's lease failed"),
        }
    }
}

impl Agent {
    pub(super) async fn worker(&self, shutdown: CancellationToken) {
        // Who this worker is when it holds a session's lease (several processes only).
        let holder = LeaseHolder::generate();
        loop {
            let lease = tokio::select! {
                _ = shutdown.cancelled() => return,
                lease = self.inner.deps.queue.pop() => lease,
            };
            let Ok(lease) = lease else { return };
            if let Some(message_id) = lease.activation.payload.message_reference() {
                lock(&self.inner.queued).remove(message_id);
            }
            // Across processes, the session's lease first; shutting down while waiting drops
            // the activation unacknowledged, so the queue hands it out again.
            let Some(session_lease) = self.hold_session(&lease.activation, &holder, &shutdown).await else { return };
            let activation = lease.activation.clone();
            let agent = self.clone();
            // Its own task: a panic in one turn is caught here and the worker goes on.
            let outcome = tokio::spawn(async move { agent.run_activation(&activation).await }).await;
            if let Err(join_error) = outcome {
                tracing::error!(activation_id = %lease.activation.id, error = %join_error, "a turn panicked");
                self.after_panic(&lease.activation).await;
            }
            // The outcome is in the ledger now (`run_activation` or `after_panic` recorded
            // it): only now may the queue forget the activation, and then the session's lease
            // go to whoever runs its next turn.
            let activation_id = lease.activation.id.clone();
            if let Err(error) = lease.ack().await {
                tracing::warn!(%activation_id, %error, "acknowledging a finished activation failed; it may be handed out again");
            }
            if let Some(held) = session_lease {
                held.release().await;
            }
        }
    }

    /// The session's lease for `activation` when several processes share the work: waits while
    /// another process's worker runs the session (retrying through a brief Redis outage) and
    /// keeps it renewed; a lease lost mid-turn stops the turn, which hands its message back.
    /// `Some(None)`: no lease needed (one process, or maintenance, which runs beside turns);
    /// `None`: shutdown came first.
    async fn hold_session(
        &self,
        activation: &Activation,
        holder: &LeaseHolder,
        shutdown: &CancellationToken,
    ) -> Option<Option<HeldSession>> {
        let Some(leasing) = &self.inner.deps.leasing else { return Some(None) };
        if matches!(activation.payload, ActivationPayload::Maintenance { .. }) {
            return Some(None);
        }
        let session_id = &activation.session_id;
        let mut pause = Duration::from_millis(100);
        let lease = loop {
            let attempt = leasing.leases.acquire_within(session_id, holder, leasing.ttl, leasing.ttl);
            let acquired = tokio::select! {
                _ = shutdown.cancelled() => return None,
                acquired = attempt => acquired,
            };
            match acquired {
                Ok(Some(lease)) => break lease,
                // Another process's worker runs this session: keep waiting for it.
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(%error, %session_id, "taking the session's lease failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        };
        let kept = lease.keep_alive();
        let lost = kept.lost_token();
        let agent = self.clone();
        let session = session_id.clone();
        let watcher = tokio::spawn(async move {
            lost.cancelled().await;
            tracing::warn!(session_id = %session, "the session's lease was lost; stopping its turn so its message is handed back");
            if let Some(turn) = lock(&agent.inner.running).get(&session).cloned() {
                turn.stop.stop(StopReason::Shutdown);
            }
        });
        Some(Some(HeldSession { kept, watcher }))
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
        // The start is recorded while the turn loads its message (the intake stored the row
        // before queueing the activation); the end is recorded after both.
        let started = async {
            if let Err(error) = ledger.record_started(&activation.id, Utc::now()).await {
                tracing::error!(%error, "recording an activation start failed");
            }
        };
        let max_depth = self.inner.deps.config.max_depth;
        let run = async {
            match &activation.payload {
                // Depth is a guardrail in the contract, not in the prompt: a chain of agents that went
                // too deep stops here, before any model call.
                _ if activation.depth > max_depth => self.refuse_too_deep(activation, max_depth).await,
                ActivationPayload::Maintenance { task } => self.run_maintenance(activation, *task).await,
                // Every other kind this version produces runs a turn on its stored root.
                ActivationPayload::Message { message_id }
                | ActivationPayload::Workflow { message_id, .. }
                | ActivationPayload::DirectTrigger { message_id, .. }
                | ActivationPayload::FollowUp { message_id, .. }
                | ActivationPayload::SubAgentResult { message_id, .. }
                | ActivationPayload::BackgroundJobResult { message_id, .. } => {
                    self.run_message(activation, message_id).await
                }
                ActivationPayload::VoiceTranscript { .. } => (
                    Outcome::Failed,
                    Some(format!("activations of kind `{}` are not handled by this version", activation.kind())),
                    Usage::default(),
                ),
            }
        };
        let ((), (outcome, error, usage)) = tokio::join!(started, run);
        metrics::counter!("kesoku_turns_total", "outcome" => outcome.as_str(), "lane" => activation.lane.as_str())
            .increment(1);
        if let Err(record_error) =
            ledger.record_finished(&activation.id, Utc::now(), outcome, error.as_deref(), &usage).await
        {
            tracing::error!(error = %record_error, "recording an activation end failed");
        }
    }

    async fn run_message(&self, activation: &Activation, message_id: &MessageId) -> (Outcome, Option<String>, Usage) {
        match self.run_message_inner(activation, message_id).await {
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
        let (message, newer) = tokio::join!(store.get_message(message_id), newer);
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
        // And its agent must sit in the message's channel (`[[agents]]`, read now, not at intake).
        if let Some((detail, short)) =
            visibility::load_denied(&self.inner.deps.personas, visibility::acting_agent(activation), &message)
        {
            return self.deny_load(activation, &message, detail, &short).await;
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
            return Ok(self.unclaimed(activation, &message.id).await);
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

    /// The outcome of an activation whose message was no longer pending. Usually another run
    /// handled or stopped it (`cancelled`). But when the message ended `processed` and no
    /// activation of it is recorded as `succeeded`, this activation is a redelivery of the one
    /// that answered it: its worker died after resolving the message and before the ledger
    /// heard the outcome (activation ids derive from the message and its revision, so the
    /// redelivery writes the same row). The row then says `succeeded`, so every answered
    /// message keeps exactly one successful row.
    async fn unclaimed(&self, activation: &Activation, message_id: &MessageId) -> (Outcome, Option<String>, Usage) {
        let cancelled = (
            Outcome::Cancelled,
            Some("the message was no longer pending (already handled or stopped)".to_owned()),
            Usage::default(),
        );
        let store = self.inner.deps.gateway.store();
        let Ok(Some(now)) = store.get_message(message_id).await else { return cancelled };
        if now.status != Status::Processed {
            return cancelled;
        }
        let filter =
            kesoku_store::LedgerFilter { session_id: Some(activation.session_id.clone()), ..Default::default() };
        let Ok(rows) = self.inner.deps.ledger.list_activations(&filter).await else { return cancelled };
        let answered_elsewhere = rows.iter().any(|row| {
            row.id != activation.id
                && row.message_id.as_ref() == Some(message_id)
                && row.outcome == Some(Outcome::Succeeded)
        });
        // Its own answer, not a turn it joined (steered messages end `processed` too, without one).
        let answers = MessageFilter::session(&activation.session_id)
            .with_roles(&[Role::Assistant])
            .with_types(&[kesoku_core::MessageType::Text]);
        let Ok(answers) = store.list_messages(&answers).await else { return cancelled };
        let answered_here = answers.iter().any(|m| m.parent_id.as_ref() == Some(message_id));
        let redelivered = activation.id.as_str().starts_with(&format!("{}_{message_id}@", ActivationId::PREFIX));
        if answered_elsewhere || !answered_here || !redelivered {
            return cancelled;
        }
        (
            Outcome::Succeeded,
            Some(
                "answered by an earlier delivery of this activation (its worker stopped before recording it)"
                    .to_owned(),
            ),
            Usage::default(),
        )
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

    /// The model that answers an activation: the one it names (a cron job's or trigger's
    /// `model`, a channel's, carried as the root's `metadata.model`), else the default. An
    /// unknown name is logged and the default answers.
    fn model_for(&self, activation: &Activation) -> Arc<dyn kesoku_llm::Model> {
        let models = &self.inner.deps.models;
        match activation.model.as_deref() {
            Some(name) => models.get(name).unwrap_or_else(|| {
                tracing::warn!(model = name, activation_id = %activation.id, "the work names a model that is not configured; the default answers");
                models.default_model()
            }),
            None => models.default_model(),
        }
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
        let Some(session) = session? else {
            let detail = format!("session `{}` does not exist (missing session context)", root.session_id);
            self.fail_root(&root, activation, &detail, "this conversation's session is missing").await;
            return Ok((Outcome::Failed, Some(detail), Usage::default()));
        };
        // A configured agent's turn: its own model, tools, prompt and name (the sender).
        let persona = match activation.agent.as_deref() {
            Some(name) => match deps.personas.get(name) {
                Some(persona) => Some(persona),
                None => {
                    let detail = format!("the agent `{name}` is not configured ([[agents]]); nobody answered");
                    self.fail_root(&root, activation, &detail, &detail).await;
                    return Ok((Outcome::Failed, Some(detail), Usage::default()));
                }
            },
            None => None,
        };
        let model = persona
            .and_then(|p| p.model.as_deref())
            .and_then(|name| deps.models.get(name))
            .unwrap_or_else(|| self.model_for(activation));
        let persona_tools =
            persona.map(|p| orchestration::tools_of(&deps.tools, p, activation.orchestration.is_some()));
        let persona_prompt =
            persona.map(|p| entries::system_prompt(&p.name, deps.config.system_prompt.as_deref(), p.intro.as_deref()));
        let limits = deps.limits.for_lane(activation.lane);
        let context = ActivationContext::derive(activation, limits, model);
        let history = compaction::apply_summaries(history?);
        let untitled = deps.config.titles && session.title.is_none();
        self.before_turn(&root, &history, context.model.info().context_window, untitled);
        let history = visibility::agent_view(history, visibility::acting_agent(activation), &root.id);
        let staging_dir = self.session_dir(&root.session_id);
        let zone = entries::Zone::named(context.timezone.as_deref());
        let mut entries = vec![entries::activation_context_entry(&context, &zone.now())];
        if let Some((trigger, task)) = activation.payload.trigger() {
            entries.push(entries::trigger_context_entry(&root.session_id, trigger, task, &zone));
        }
        let mut context_entries = self.context_entries(activation, &root, &history, &zone).await?;
        entries.append(&mut context_entries.entries);
        let log_dir = staging_dir.clone();
        let model_log = move |step: u32, request: &Request, response: Result<&Response, &LlmError>| {
            write_model_log(&log_dir, step, request, response);
        };
        let turn_deps = TurnDeps {
            gateway,
            tools: persona_tools.as_ref().unwrap_or(&deps.tools),
            workspace: &deps.workspace,
            staging_dir: staging_dir.clone(),
            agent_name: persona.map_or(deps.config.name.as_str(), |p| p.name.as_str()),
            system_prompt: persona_prompt.as_deref().unwrap_or(&self.inner.system_prompt),
            entries,
            model_log: if deps.config.debug { Some(&model_log) } else { None },
            steer_as: (deps.config.queue_mode_for(&root.chatbot_id, &root.channel_id) == QueueMode::Steer)
                .then_some(self.inner.worker_id.as_str()),
            persona: persona.map(|p| p.name.as_str()),
        };
        let mut turn = Turn::new(turn_deps, &context, root.clone(), history, stop);
        let end = turn.run().await;
        let usage = turn.usage;
        let steered = std::mem::take(&mut turn.steered);
        let answer = turn.answer.take();
        drop(turn);
        // Messages that joined the turn end as its root does.
        let steered_status = match &end {
            TurnEnd::Answered { .. }
            | TurnEnd::Unstructured { .. }
            | TurnEnd::LimitExceeded { .. }
            | TurnEnd::Passed => Status::Processed,
            TurnEnd::Stopped { reason: StopReason::Shutdown } => Status::PendingAgent,
            TurnEnd::Stopped { .. } => Status::Interrupted,
            TurnEnd::Failed { .. } => Status::Error,
        };
        for id in &steered {
            gateway.update_status(id, steered_status).await?;
        }
        let resolved = match end {
            TurnEnd::Answered { note } => {
                if let (Some(persona), Some(answer)) = (persona, &answer) {
                    self.hand_on_mention(activation, &root, &persona.name, answer).await?;
                }
                gateway.update_status(&root.id, Status::Processed).await?;
                (Outcome::Succeeded, note)
            }
            TurnEnd::Passed => self.after_pass(activation, &root).await?,
            TurnEnd::Unstructured { problem } => {
                gateway.update_status(&root.id, Status::Processed).await?;
                (Outcome::Failed, Some(format!("structured output: {problem} (after one retry)")))
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
        let note = match (resolved.1, context_entries.note()) {
            (Some(note), Some(withheld)) => Some(format!("{note}; {withheld}")),
            (note, withheld) => note.or(withheld),
        };
        Ok((resolved.0, note, usage))
    }

    /// Resolve a configured agent's pass. In a round, the next agent is written onto the root
    /// (`metadata.activation`) and then the root goes back to `pending_agent`, so the intake
    /// dispatches it (a crash in between is recovered as an orphan carrying the new dispatch);
    /// when every agent has passed, or outside a round, the root is closed with no answer.
    async fn after_pass(
        &self,
        activation: &Activation,
        root: &Message,
    ) -> Result<(Outcome, Option<String>), AgentError> {
        let gateway = &self.inner.deps.gateway;
        match activation.orchestration.as_ref().map(Orchestration::after_pass) {
            Some(AfterPass::Dispatch(next)) => {
                let metadata = orchestration::next_dispatch(root, activation, next);
                gateway.update_metadata(&root.id, &metadata).await?;
                gateway.update_status(&root.id, Status::PendingAgent).await?;
                Ok((Outcome::Succeeded, Some("passed".to_owned())))
            }
            Some(AfterPass::AllPassed) => {
                gateway.update_status(&root.id, Status::Processed).await?;
                Ok((Outcome::Succeeded, Some("every agent passed".to_owned())))
            }
            None => {
                gateway.update_status(&root.id, Status::Processed).await?;
                Ok((Outcome::Succeeded, Some("passed".to_owned())))
            }
        }
    }

    /// A configured agent's answer that mentions another agent sitting in the channel hands it
    /// on: one root for the first one mentioned, one level deeper (agents never call each other
    /// directly; the worker refuses it beyond `[agent] max_depth`).
    async fn hand_on_mention(
        &self,
        activation: &Activation,
        root: &Message,
        from: &str,
        answer: &Message,
    ) -> Result<(), AgentError> {
        let Some(peer) = orchestration::mentioned_peer(&self.inner.deps.personas, from, root, &answer.content) else {
            return Ok(());
        };
        let handed = orchestration::mention_root(answer, root, activation, from, &peer.name);
        match self.inner.deps.gateway.post(&handed).await {
            Ok(_) => Ok(()),
            // Posted by an earlier run of this turn.
            Err(GatewayError::Store(StoreError::Duplicate { .. })) => Ok(()),
            Err(GatewayError::Broker(error)) => {
                tracing::warn!(%error, message_id = %handed.id, "a mention's root is stored but was not announced");
                Ok(())
            }
            Err(error) => Err(error.into()),
        }
    }

    /// An activation deeper than `[agent] max_depth` (the `delegate` tool refuses those, so this
    /// is defence in depth: a root posted by other means): its root is closed as `error` with a
    /// notice, never run, and the ledger says `refused`.
    async fn refuse_too_deep(&self, activation: &Activation, max_depth: u32) -> (Outcome, Option<String>, Usage) {
        let why = format!(
            "refused: depth limit of {max_depth} ([agent] max_depth); this activation is at depth {}",
            activation.depth
        );
        if let Some(message_id) = activation.payload.message_reference() {
            let gateway = &self.inner.deps.gateway;
            // Only the activation's own root is closed (the access check of `run_message`): a
            // forged activation naming another session's message leaves it alone.
            let owned = match gateway.store().get_message(message_id).await {
                Ok(Some(message)) => {
                    message.session_id == activation.session_id
                        && message.chatbot_id == activation.chatbot_id
                        && message.channel_id == activation.channel_id
                }
                Ok(None) => false,
                Err(error) => {
                    tracing::error!(%error, %message_id, "reading a root beyond the depth limit failed");
                    false
                }
            };
            if owned {
                match gateway
                    .claim(message_id, Status::Processing, &[Status::PendingAgent], &self.inner.worker_id)
                    .await
                {
                    Ok(Some(claimed)) => self.fail_root(&claimed.message, activation, &why, &why).await,
                    Ok(None) => {}
                    Err(error) => tracing::error!(%error, %message_id, "closing a root beyond the depth limit failed"),
                }
            }
        }
        (Outcome::Refused, Some(why), Usage::default())
    }

    /// Mark the root `error`, tell the user briefly, keep the full error in the staging folder.
    pub(super) async fn fail_root(&self, root: &Message, activation: &Activation, detail: &str, short: &str) {
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

fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)
}
