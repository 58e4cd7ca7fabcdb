//! The runtime: the [`Agent`] handle, its configured models, and the tasks it runs (intake,
//! stop signals, the worker pool) until shutdown.
//!
//! Its jobs live in their own modules: `intake` (root message → activation of its kind → lane),
//! `worker` (claim, heartbeat, access check, run, resolve the root's status), `maintenance`
//! (compaction and titles on the background lane), `compact` (writing a summary; `/compact`),
//! `recovery` (work of dead processes at start-up), `visibility` (access at load time, the
//! per-agent view of a shared session, thread and channel context) and `model_log` (the
//! per-session model log of debug mode).
//!
//! One worker runs a session at a time (the queue hands a session to one worker until its lease
//! is released). A turn runs in its own task: a panic in one session is logged, the message is
//! marked `error`, and every other session goes on.

mod compact;
mod intake;
mod maintenance;
mod model_log;
mod recovery;
mod sweep;
mod visibility;
mod worker;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use kesoku_broker::{Control, Queue, QueueDepths, StopReason};
use kesoku_core::activation::MaintenanceTask;
use kesoku_core::{ActivationId, Lane, MessageFilter, MessageId, SessionId, Status};
use kesoku_gateway::Gateway;
use kesoku_llm::Model;
use kesoku_store::Ledger;
use kesoku_tools::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use intake::dispatch_id;
pub use recovery::RecoveryReport;
pub use sweep::SweepReport;

use crate::config::{AgentConfig, LaneLimits};
use crate::entries;
use crate::error::AgentError;
use crate::turn::StopSignal;

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
    /// The configured agents (`[[agents]]`), their intros read; empty: the default agent only.
    pub personas: crate::personas::Personas,
    /// Session leases shared by every process (`[broker] url`): a worker runs a session's turn
    /// only while it holds the session's lease. `None` in one process, where the queue already
    /// hands a session to one worker at a time.
    pub leasing: Option<SessionLeasing>,
}

/// Session leases across processes, and how long one lasts without a renewal (a killed
/// process's sessions are taken over after that).
#[derive(Clone)]
pub struct SessionLeasing {
    pub leases: Arc<dyn kesoku_broker::lease::SessionLeases>,
    pub ttl: Duration,
}

impl std::fmt::Debug for SessionLeasing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLeasing").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

/// Which tasks [`Agent::run_tasks`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tasks {
    /// Intake (waiting messages → ledger rows → queue), its sweep, the sub-agent result keeper.
    pub intake: bool,
    /// The worker pool and the stop signals for its turns.
    pub workers: bool,
}

impl Tasks {
    /// Everything: one process does it all.
    pub const ALL: Tasks = Tasks { intake: true, workers: true };
    /// Intake only (`kesoku start --role ingest`).
    pub const INTAKE: Tasks = Tasks { intake: true, workers: false };
    /// Workers only (`kesoku start --role worker`).
    pub const WORKERS: Tasks = Tasks { intake: false, workers: true };
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

struct Inner {
    deps: AgentDeps,
    system_prompt: String,
    worker_id: String,
    // Short critical sections only (insert/remove/lookup), never held across an await.
    running: Mutex<HashMap<SessionId, RunningTurn>>,
    // Messages whose activation is queued, so a re-announced message is not queued twice.
    queued: Mutex<HashSet<MessageId>>,
    // Maintenance waiting or running, one per (session, task).
    maintenance: Mutex<HashSet<(SessionId, MaintenanceTask)>>,
}

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
                maintenance: Mutex::new(HashSet::new()),
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

    /// The session leases shared across processes, when configured.
    pub fn leasing(&self) -> Option<&SessionLeasing> {
        self.inner.deps.leasing.as_ref()
    }

    /// The limits of each lane.
    pub fn limits(&self) -> &LaneLimits {
        &self.inner.deps.limits
    }

    /// The staging folder of a session.
    pub fn session_dir(&self, session_id: &SessionId) -> PathBuf {
        self.inner.deps.workspace.join("sessions").join(session_id.as_str())
    }

    pub async fn queue_depths(&self) -> Result<QueueDepths, kesoku_broker::BrokerError> {
        self.inner.deps.queue.depths().await
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

    /// Run intake, stop signals and the worker pool until `shutdown` fires; then give running
    /// turns `grace` to finish before stopping them (their messages go back to `pending_agent`).
    pub async fn run(&self, shutdown: CancellationToken, grace: Duration) {
        self.run_tasks(Tasks::ALL, shutdown, grace).await;
    }

    /// [`Agent::run`] with only some of its tasks: the intake side (intake, its sweep, the
    /// sub-agent result keeper) and the worker side (the worker pool and the stop signals that
    /// reach its turns), for processes that split them over a shared queue.
    pub async fn run_tasks(&self, which: Tasks, shutdown: CancellationToken, grace: Duration) {
        let mut tasks = JoinSet::new();
        if which.intake {
            let agent = self.clone();
            let shutdown_intake = shutdown.clone();
            tasks.spawn(async move { agent.intake(shutdown_intake).await });
            let agent = self.clone();
            let shutdown_sweep = shutdown.clone();
            tasks.spawn(async move { agent.sweep(shutdown_sweep).await });
            // Sub-agents' results go back to their parents; stopped parents stop their children.
            tasks.spawn(crate::subagents::ResultKeeper::new(self.inner.deps.gateway.clone()).run(shutdown.clone()));
        }
        let controls_stop = CancellationToken::new();
        let controls = which.workers.then(|| {
            let agent = self.clone();
            let stop = controls_stop.clone();
            tokio::spawn(async move { agent.controls(stop).await })
        });
        let workers = if which.workers { self.inner.deps.config.max_concurrent_turns.max(1) } else { 0 };
        for _ in 0..workers {
            let agent = self.clone();
            let shutdown = shutdown.clone();
            tasks.spawn(async move { agent.worker(shutdown).await });
        }
        if self.inner.deps.leasing.is_some() {
            // Several processes: one of them may be killed mid-turn at any time, not only
            // before a restart of this one.
            let agent = self.clone();
            let shutdown = shutdown.clone();
            tasks.spawn(async move { agent.sweep_orphans_until(shutdown).await });
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
        if let Some(controls) = controls {
            let _ = controls.await;
        }
    }

    /// Stop signals: a stop for a session whose turn runs here stops that turn.
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
}
