//! A running agent over a fresh SQLite store with a scripted model.

use std::sync::Arc;
use std::time::Duration;

use kesoku_agent::{Agent, AgentConfig, AgentDeps, LaneLimits, ModelSet};
use kesoku_broker::{MemoryBroker, MemoryQueue};
use kesoku_core::{LedgerEntry, Message, MessageId, MessageType, Role, Session, Status};
use kesoku_gateway::Gateway;
use kesoku_llm::{ScriptStep, ScriptedModel};
use kesoku_store::{Ledger, LedgerFilter, StoreHandle};
use kesoku_tools::{Registry, ToolsConfig};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const BOT: &str = "discord";
pub const CHANNEL: &str = "1234567890123";

pub struct Options {
    pub config: AgentConfig,
    pub limits: LaneLimits,
    pub grace: Duration,
    /// The ledger the agent writes to (default: the store's own).
    pub ledger: Option<Arc<dyn Ledger>>,
    /// The agent's tools (default: the built-in ones).
    pub tools: Option<Arc<Registry>>,
    /// Models besides the harness's own, which stays the default.
    pub extra_models: Vec<Arc<dyn kesoku_llm::Model>>,
    /// Offer `delegate` (sub-agents over the harness's store, `config.max_depth` deep) beside
    /// the built-in tools (when `tools` is not given).
    pub delegate: bool,
    /// The configured agents (`[[agents]]`); default: none, the default agent answers.
    pub personas: kesoku_agent::Personas,
    /// Session leases shared with other agents over the same store (several processes).
    pub leasing: Option<kesoku_agent::SessionLeasing>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: AgentConfig::default(),
            limits: LaneLimits::default(),
            grace: Duration::from_secs(5),
            ledger: None,
            tools: None,
            extra_models: Vec::new(),
            delegate: false,
            personas: Default::default(),
            leasing: None,
        }
    }
}

pub struct Harness {
    pub dir: TempDir,
    pub handle: StoreHandle,
    pub gateway: Gateway,
    pub model: ScriptedModel,
    pub agent: Agent,
    pub session: Session,
    shutdown: CancellationToken,
    run: Option<JoinHandle<()>>,
}

impl Harness {
    pub async fn start(steps: Vec<ScriptStep>) -> Harness {
        Self::start_with(steps, Options::default()).await
    }

    pub async fn start_with(steps: Vec<ScriptStep>, options: Options) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("kesoku.db").display());
        let handle = kesoku_store::open(&url).await.expect("open store");
        let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
        let session = gateway.resolve_session(BOT, CHANNEL).await.expect("session");
        let model = ScriptedModel::new("scripted", steps);
        let (agent, shutdown, run) = boot(&dir, &handle, &gateway, &model, options).await;
        Harness { dir, handle, gateway, model, agent, session, shutdown, run: Some(run) }
    }

    /// Start a new agent on the same store and model (after `shut_down`, or to simulate a
    /// second process).
    pub async fn reboot(&mut self, options: Options) {
        let (agent, shutdown, run) = boot(&self.dir, &self.handle, &self.gateway, &self.model, options).await;
        self.agent = agent;
        self.shutdown = shutdown;
        self.run = Some(run);
    }

    /// Replace the running agent with one answering through `model`.
    pub async fn reboot_with_model(&mut self, model: Arc<dyn kesoku_llm::Model>, options: Options) {
        self.shut_down().await;
        let (agent, shutdown, run) = boot_with(&self.dir, &self.handle, &self.gateway, model, options).await;
        self.agent = agent;
        self.shutdown = shutdown;
        self.run = Some(run);
    }

    /// Stop the agent as a service shutdown does, waiting for it to finish.
    /// Another agent (as another process would run) over the same store, gateway and model,
    /// with a queue of its own; stopped with the returned token.
    pub async fn boot_another(&self, options: Options) -> (Agent, CancellationToken, JoinHandle<()>) {
        boot(&self.dir, &self.handle, &self.gateway, &self.model, options).await
    }

    pub async fn shut_down(&mut self) {
        self.shutdown.cancel();
        if let Some(run) = self.run.take() {
            tokio::time::timeout(Duration::from_secs(20), run).await.expect("shutdown in time").expect("join");
        }
    }

    pub async fn post_user(&self, content: &str) -> Message {
        let message = Message::user_text(&self.session.id, BOT, CHANNEL, "Chii", content);
        self.gateway.post(&message).await.expect("post").message
    }

    pub async fn status_of(&self, id: &MessageId) -> Status {
        self.handle.store.get_message(id).await.expect("get").expect("exists").status
    }

    /// Wait until a message reaches one of `statuses`.
    pub async fn wait_status(&self, id: &MessageId, statuses: &[Status]) -> Status {
        for _ in 0..1000 {
            let status = self.status_of(id).await;
            if statuses.contains(&status) {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("message {id} never reached {statuses:?}; it is {:?}", self.status_of(id).await);
    }

    pub async fn wait_terminal(&self, id: &MessageId) -> Status {
        self.wait_status(id, &[Status::Processed, Status::Error, Status::Interrupted]).await
    }

    /// Wait until a message of `message_type` answers `root` (directly or as a tool result).
    pub async fn wait_for(&self, predicate: impl Fn(&Message) -> bool) -> Message {
        for _ in 0..1000 {
            if let Some(found) = self.history().await.into_iter().find(|m| predicate(m)) {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no matching message appeared");
    }

    pub async fn history(&self) -> Vec<Message> {
        self.handle.store.session_history(&self.session.id).await.expect("history")
    }

    pub async fn ledger(&self) -> Vec<LedgerEntry> {
        let mut rows = self.handle.ledger.list_activations(&LedgerFilter::default()).await.expect("ledger");
        rows.reverse(); // oldest first
        rows
    }

    pub async fn ledger_for(&self, message: &MessageId) -> Vec<LedgerEntry> {
        self.ledger().await.into_iter().filter(|row| row.message_id.as_ref() == Some(message)).collect()
    }

    /// The message's ledger rows once every one has an outcome (an activation may end after
    /// its message reached a terminal status, for example one that found it already taken).
    pub async fn finished_ledger_for(&self, message: &MessageId) -> Vec<LedgerEntry> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let rows = self.ledger_for(message).await;
            if !rows.is_empty() && rows.iter().all(|row| row.outcome.is_some()) {
                return rows;
            }
            assert!(tokio::time::Instant::now() < deadline, "activations of {message} never finished: {rows:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// (role, type, sender, status) of each message, for whole-trajectory comparisons.
pub fn shape(messages: &[Message]) -> Vec<(Role, MessageType, String, Status)> {
    messages.iter().map(|m| (m.role, m.message_type, m.sender.clone(), m.status)).collect()
}

async fn boot(
    dir: &TempDir,
    handle: &StoreHandle,
    gateway: &Gateway,
    model: &ScriptedModel,
    options: Options,
) -> (Agent, CancellationToken, JoinHandle<()>) {
    boot_with(dir, handle, gateway, Arc::new(model.clone()), options).await
}

async fn boot_with(
    dir: &TempDir,
    handle: &StoreHandle,
    gateway: &Gateway,
    model: Arc<dyn kesoku_llm::Model>,
    options: Options,
) -> (Agent, CancellationToken, JoinHandle<()>) {
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let default = model.name().to_owned();
    let models = ModelSet::new([vec![model], options.extra_models].concat(), &default).expect("models");
    let ledger = options.ledger.unwrap_or_else(|| Arc::clone(&handle.ledger));
    let tools = options.tools.unwrap_or_else(|| {
        let mut registry = kesoku_tools::builtin_registry(&ToolsConfig::default());
        if options.delegate {
            let subagents = kesoku_agent::Subagents::new(
                gateway.clone(),
                Arc::clone(&ledger),
                options.config.max_depth,
                options.config.name.clone(),
            )
            .with_personas(options.personas.clone());
            subagents.register(&mut registry).expect("register delegate");
        }
        Arc::new(registry)
    });
    let agent = Agent::new(AgentDeps {
        gateway: gateway.clone(),
        ledger,
        queue: Arc::new(MemoryQueue::default()),
        models,
        tools,
        workspace,
        config: options.config,
        limits: options.limits,
        intro: None,
        personas: options.personas,
        leasing: options.leasing,
    });
    agent.recover().await.expect("recover");
    let shutdown = CancellationToken::new();
    let run = {
        let agent = agent.clone();
        let shutdown = shutdown.clone();
        let grace = options.grace;
        tokio::spawn(async move { agent.run(shutdown, grace).await })
    };
    (agent, shutdown, run)
}
