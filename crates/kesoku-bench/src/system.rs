//! An in-process Kesoku wired the way the binary wires it (store, in-memory broker, gateway,
//! lane queue with the binary's lane caps, agent with the built-in tools), over a fresh SQLite
//! file or a fresh PostgreSQL schema, plus a chatbot-like [`Client`] that posts messages and
//! waits for their answers.
//!
//! It owns nothing the binary does not: no HTTP API (see the `kesoku-bench-service` binary for
//! that) and no config file. The PostgreSQL schema is created here and dropped on
//! [`StoreSetup::cleanup`]; the SQLite file lives in a temporary directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use kesoku_agent::{Agent, AgentConfig, AgentDeps, LaneLimits, ModelSet};
use kesoku_broker::queue::Aging;
use kesoku_broker::{LaneCaps, MemoryBroker, MemoryQueue};
use kesoku_core::{Message, MessageFilter, MessageId, MessageType, Role, Session, Status};
use kesoku_gateway::{Gateway, ListenFrom};
use kesoku_llm::Model;
use kesoku_store::StoreHandle;
use kesoku_tools::Registry;
use sqlx::Connection;
use tempfile::TempDir;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Which store backend a run uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The embedded default: one SQLite file (WAL).
    Sqlite,
    /// PostgreSQL at this URL; each run gets a schema of its own.
    Postgres(String),
}

impl Backend {
    pub fn label(&self) -> &'static str {
        match self {
            Backend::Sqlite => "embedded (SQLite)",
            Backend::Postgres(_) => "PostgreSQL",
        }
    }
}

/// An opened store and what to remove afterwards.
pub struct StoreSetup {
    pub handle: StoreHandle,
    /// The URL it was opened with (for a second process on the same store).
    pub url: String,
    /// A temporary directory holding the SQLite file (and usable as a workspace).
    pub dir: TempDir,
    pg_schema: Option<(String, String)>,
}

impl std::fmt::Debug for StoreSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSetup").field("dir", &self.dir.path()).finish_non_exhaustive()
    }
}

impl StoreSetup {
    /// A fresh store on `backend`.
    pub async fn open(backend: &Backend) -> anyhow::Result<StoreSetup> {
        let dir = tempfile::Builder::new().prefix("kesoku-bench-").tempdir().context("creating a temp dir")?;
        let (url, pg_schema) = match backend {
            Backend::Sqlite => (format!("sqlite://{}", dir.path().join("kesoku.db").display()), None),
            Backend::Postgres(admin_url) => {
                let schema = format!("kesoku_bench_{}", ulid::Ulid::generate().to_string().to_lowercase());
                let mut conn = sqlx::PgConnection::connect(admin_url).await.context("connecting to PostgreSQL")?;
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
                    .execute(&mut conn)
                    .await
                    .context("creating the benchmark schema")?;
                let _ = conn.close().await;
                let separator = if admin_url.contains('?') { '&' } else { '?' };
                let url = format!("{admin_url}{separator}options=-c%20search_path%3D{schema}");
                (url, Some((admin_url.clone(), schema)))
            }
        };
        let handle = kesoku_store::open(&url).await.context("opening the store")?;
        Ok(StoreSetup { handle, url, dir, pg_schema })
    }

    /// Drop the PostgreSQL schema (the temp dir goes with the value).
    pub async fn cleanup(self) {
        if let Some((admin_url, schema)) = &self.pg_schema {
            let result = async {
                let mut conn = sqlx::PgConnection::connect(admin_url).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")))
                    .execute(&mut conn)
                    .await?;
                conn.close().await
            }
            .await;
            if let Err(error) = result {
                eprintln!("note: could not drop benchmark schema {schema}: {error}");
            }
        }
    }
}

/// What the agent is built with.
pub struct AgentSetup {
    pub model: Arc<dyn Model>,
    pub config: AgentConfig,
    pub limits: LaneLimits,
    pub tools: Registry,
    /// The queue's lane caps; `None`: the binary's, sized for `config.max_concurrent_turns`.
    pub lane_caps: Option<LaneCaps>,
}

impl AgentSetup {
    /// `model` with the default agent settings and the built-in tools.
    pub fn with_model(model: Arc<dyn Model>) -> AgentSetup {
        AgentSetup {
            model,
            config: AgentConfig::default(),
            limits: LaneLimits::default(),
            tools: kesoku_tools::builtin_registry(&kesoku_tools::ToolsConfig::default()),
            lane_caps: None,
        }
    }
}

/// A running agent over a store.
pub struct System {
    pub store: StoreSetup,
    pub gateway: Gateway,
    pub agent: Agent,
    /// The agent's queue, for benchmarks that push activations straight onto it.
    pub queue: MemoryQueue,
    pub workspace: PathBuf,
    shutdown: CancellationToken,
    run: Option<JoinHandle<()>>,
    // Stops the agent if the system is dropped without `stop`.
    _stop_on_drop: tokio_util::sync::DropGuard,
}

impl std::fmt::Debug for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("System").field("workspace", &self.workspace).finish_non_exhaustive()
    }
}

impl System {
    /// Wire and start the agent (recovery first, as the binary does).
    pub async fn start(store: StoreSetup, setup: AgentSetup) -> anyhow::Result<System> {
        let gateway = Gateway::new(Arc::clone(&store.handle.store), Arc::new(MemoryBroker::default()));
        let workspace = store.dir.path().join("workspace");
        std::fs::create_dir_all(workspace.join("sessions")).context("creating the workspace")?;
        let caps = setup.lane_caps.unwrap_or_else(|| LaneCaps::for_workers(setup.config.max_concurrent_turns));
        let queue = MemoryQueue::new(Aging::default(), caps);
        let agent = Agent::new(AgentDeps {
            gateway: gateway.clone(),
            ledger: Arc::clone(&store.handle.ledger),
            queue: Arc::new(queue.clone()),
            models: ModelSet::single(setup.model),
            tools: Arc::new(setup.tools),
            workspace: workspace.clone(),
            config: setup.config,
            limits: setup.limits,
            intro: None,
            personas: Default::default(),
            leasing: None,
        });
        agent.recover().await.context("recovery")?;
        let shutdown = CancellationToken::new();
        let run = {
            let agent = agent.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { agent.run(shutdown, Duration::from_secs(5)).await })
        };
        let _stop_on_drop = shutdown.clone().drop_guard();
        Ok(System { store, gateway, agent, queue, workspace, shutdown, run: Some(run), _stop_on_drop })
    }

    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// Stop the agent, drop the store's schema; returns nothing the caller must keep.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(run) = self.run.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
        }
        self.store.cleanup().await;
    }
}

/// The chatbot id the benchmark client posts as.
pub const BENCH_CHATBOT: &str = "bench";

/// How one posted message ended, as the client saw it.
#[derive(Debug, Clone)]
pub struct Answered {
    pub root: MessageId,
    /// Posting started → the final text reached the client.
    pub latency: Duration,
    /// The root's terminal status.
    pub status: Status,
    /// Final texts seen for this root (1 unless something was duplicated).
    pub answers: usize,
    /// Wall-clock instants of the post and of the first final text heard, to split the latency
    /// against the store's stamps.
    pub posted_wall: chrono::DateTime<chrono::Utc>,
    pub heard_wall: Option<chrono::DateTime<chrono::Utc>>,
}

struct Waiting {
    posted_at: Instant,
    posted_wall: chrono::DateTime<chrono::Utc>,
    answered_at: Option<(Instant, chrono::DateTime<chrono::Utc>)>,
    answers: usize,
    done: oneshot::Sender<Answered>,
}

enum Command {
    Watch {
        root: MessageId,
        posted_at: Instant,
        posted_wall: chrono::DateTime<chrono::Utc>,
        done: oneshot::Sender<Answered>,
    },
}

/// A chatbot-like client: posts user messages, hears every change of its chatbot's messages,
/// marks answers `delivered` (as a chatbot does), and reports each message's latency once its
/// root is resolved.
#[derive(Clone)]
pub struct Client {
    gateway: Gateway,
    commands: mpsc::UnboundedSender<Command>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Client")
    }
}

impl Client {
    /// Start listening (before anything is posted, so nothing is missed).
    pub async fn start(gateway: &Gateway) -> Client {
        let (commands, receiver) = mpsc::unbounded_channel();
        let events = gateway.listen(MessageFilter::default().with_chatbot(BENCH_CHATBOT), ListenFrom::Now);
        // The listener subscribes when first polled: poll it from a task started now, and give
        // it a moment to subscribe before the first post.
        let (subscribed_tx, subscribed_rx) = oneshot::channel();
        tokio::spawn(listen_loop(gateway.clone(), Box::pin(events), receiver, subscribed_tx));
        let _ = subscribed_rx.await;
        Client { gateway: gateway.clone(), commands }
    }

    /// A new session for this client on channel `channel`.
    pub async fn new_session(&self, channel: &str) -> anyhow::Result<Session> {
        let session = Session::new(BENCH_CHATBOT, channel, chrono::Utc::now());
        self.gateway.store().create_session(&session).await?;
        Ok(session)
    }

    /// Post `content` to `session`; the receiver resolves when the root reaches a terminal status.
    pub async fn post(&self, session: &Session, content: &str) -> anyhow::Result<oneshot::Receiver<Answered>> {
        let message = Message::user_text(&session.id, BENCH_CHATBOT, &session.channel_id, "Bench", content);
        let (done, receiver) = oneshot::channel();
        let posted_at = Instant::now();
        let posted_wall = chrono::Utc::now();
        let _ = self.commands.send(Command::Watch { root: message.id.clone(), posted_at, posted_wall, done });
        self.gateway.post(&message).await?;
        Ok(receiver)
    }

    /// Post and wait for the answer.
    pub async fn ask(&self, session: &Session, content: &str) -> anyhow::Result<Answered> {
        let receiver = self.post(session, content).await?;
        receiver.await.context("the client stopped before the answer")
    }
}

async fn listen_loop(
    gateway: Gateway,
    mut events: std::pin::Pin<
        Box<dyn futures::Stream<Item = kesoku_gateway::GatewayResult<kesoku_store::MessageEvent>> + Send>,
    >,
    mut commands: mpsc::UnboundedReceiver<Command>,
    subscribed: oneshot::Sender<()>,
) {
    let mut waiting: HashMap<MessageId, Waiting> = HashMap::new();
    // The first poll subscribes; a pending poll means it is subscribed and waiting for events.
    let mut subscribed = Some(subscribed);
    let (deliver_tx, mut deliver_rx) = mpsc::unbounded_channel::<MessageId>();
    {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            while let Some(id) = deliver_rx.recv().await {
                let _ = gateway.update_status(&id, Status::Delivered).await;
            }
        });
    }
    loop {
        let event = tokio::select! {
            biased;
            command = commands.recv() => {
                match command {
                    Some(Command::Watch { root, posted_at, posted_wall, done }) => {
                        waiting.insert(root, Waiting { posted_at, posted_wall, answered_at: None, answers: 0, done });
                        continue;
                    }
                    None => return,
                }
            }
            event = events.next() => event,
            () = async {}, if subscribed.is_some() => {
                if let Some(ready) = subscribed.take() {
                    let _ = ready.send(());
                }
                continue;
            }
        };
        let Some(Ok(event)) = event else {
            if event.is_none() {
                return;
            }
            continue;
        };
        let message = event.message;
        if message.role == Role::Assistant
            && message.message_type == MessageType::Text
            && message.status == Status::Pending
            && let Some(parent) = &message.parent_id
            && let Some(entry) = waiting.get_mut(parent)
        {
            entry.answers += 1;
            entry.answered_at.get_or_insert_with(|| (Instant::now(), chrono::Utc::now()));
            let _ = deliver_tx.send(message.id.clone());
            continue;
        }
        if message.parent_id.is_none()
            && matches!(message.status, Status::Processed | Status::Error | Status::Interrupted)
            && let Some(entry) = waiting.remove(&message.id)
        {
            let answered_at = entry.answered_at.map_or_else(Instant::now, |(at, _)| at);
            let _ = entry.done.send(Answered {
                root: message.id.clone(),
                latency: answered_at.saturating_duration_since(entry.posted_at),
                status: message.status,
                answers: entry.answers,
                posted_wall: entry.posted_wall,
                heard_wall: entry.answered_at.map(|(_, wall)| wall),
            });
        }
    }
}
