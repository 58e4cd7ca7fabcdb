//! Intake across processes: several intakes on one store queue each waiting message once, and
//! the sweep queues what fell between the ledger and the queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::Utc;
use kesoku_agent::{Agent, AgentConfig, AgentDeps, ModelSet, SweepReport, Tasks, dispatch_id};
use kesoku_broker::{MemoryBroker, MemoryQueue, Queue};
use kesoku_core::{ActivationKind, Lane, LedgerEntry, Message, Usage};
use kesoku_gateway::Gateway;
use kesoku_llm::ScriptedModel;
use kesoku_store::{Ledger, LedgerFilter, StoreHandle};
use tokio_util::sync::CancellationToken;

/// A ledger that counts the enqueue records it was asked for (after storing them).
struct CountingLedger {
    inner: Arc<dyn Ledger>,
    enqueues: AtomicUsize,
}

#[async_trait::async_trait]
impl Ledger for CountingLedger {
    async fn record_enqueued(&self, entry: &LedgerEntry) -> kesoku_store::StoreResult<bool> {
        let stored = self.inner.record_enqueued(entry).await;
        self.enqueues.fetch_add(1, Ordering::SeqCst);
        stored
    }
    async fn record_started(
        &self,
        id: &kesoku_core::ActivationId,
        at: chrono::DateTime<Utc>,
    ) -> kesoku_store::StoreResult<()> {
        self.inner.record_started(id, at).await
    }
    async fn record_finished(
        &self,
        id: &kesoku_core::ActivationId,
        at: chrono::DateTime<Utc>,
        outcome: kesoku_core::Outcome,
        error: Option<&str>,
        usage: &Usage,
    ) -> kesoku_store::StoreResult<()> {
        self.inner.record_finished(id, at, outcome, error, usage).await
    }
    async fn get_activation(&self, id: &kesoku_core::ActivationId) -> kesoku_store::StoreResult<Option<LedgerEntry>> {
        self.inner.get_activation(id).await
    }
    async fn list_activations(&self, filter: &LedgerFilter) -> kesoku_store::StoreResult<Vec<LedgerEntry>> {
        self.inner.list_activations(filter).await
    }
    async fn unfinished_activations(&self) -> kesoku_store::StoreResult<Vec<LedgerEntry>> {
        self.inner.unfinished_activations().await
    }
    async fn record_delivery_failure(
        &self,
        root_message_id: &kesoku_core::MessageId,
        reason: &str,
    ) -> kesoku_store::StoreResult<()> {
        self.inner.record_delivery_failure(root_message_id, reason).await
    }
}

struct Shared {
    dir: tempfile::TempDir,
    handle: StoreHandle,
    gateway: Gateway,
    queue: Arc<MemoryQueue>,
}

async fn shared() -> Shared {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("kesoku.db").display());
    let handle = kesoku_store::open(&url).await.expect("open store");
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    Shared { dir, handle, gateway, queue: Arc::new(MemoryQueue::default()) }
}

/// An agent of its own (as another process would have) over the shared store and queue.
fn agent(shared: &Shared, ledger: Arc<dyn Ledger>, config: AgentConfig) -> Agent {
    let workspace = shared.dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    Agent::new(AgentDeps {
        gateway: shared.gateway.clone(),
        ledger,
        queue: Arc::clone(&shared.queue) as Arc<dyn Queue>,
        models: ModelSet::single(Arc::new(ScriptedModel::new("scripted", vec![]))),
        tools: Arc::new(kesoku_tools::Registry::default()),
        workspace,
        config,
        limits: Default::default(),
        intro: None,
        personas: Default::default(),
        leasing: None,
    })
}

async fn post(shared: &Shared, session: usize, text: &str) -> (Message, i64) {
    let session = shared.gateway.resolve_session("api", &format!("channel-{session}")).await.expect("session");
    let message = Message::user_text(&session.id, "api", &session.channel_id, "Chii", text);
    let event = shared.gateway.post(&message).await.expect("post");
    (event.message, event.rev)
}

async fn queued(shared: &Shared) -> usize {
    let depths = shared.queue.depths().await.expect("depths");
    depths.interactive + depths.responsive + depths.background
}

async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn two_intakes_queue_each_waiting_message_once() {
    let shared = shared().await;
    let counting = Arc::new(CountingLedger { inner: Arc::clone(&shared.handle.ledger), enqueues: AtomicUsize::new(0) });
    let ledger: Arc<dyn Ledger> = counting.clone();
    // Some messages wait before the intakes start (each reads them at start), more arrive live.
    let mut messages = Vec::new();
    for i in 0..10 {
        messages.push(post(&shared, i % 4, &format!("early {i}")).await);
    }
    let shutdown = CancellationToken::new();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let agent = agent(&shared, Arc::clone(&ledger), AgentConfig::default());
        let shutdown = shutdown.clone();
        runs.push(tokio::spawn(async move { agent.run_tasks(Tasks::INTAKE, shutdown, Duration::from_secs(1)).await }));
    }
    for i in 0..10 {
        messages.push(post(&shared, i % 4, &format!("live {i}")).await);
    }
    // Both intakes recorded every message (one stored each row, the other found it there).
    wait_until("both intakes to record every message", async || {
        counting.enqueues.load(Ordering::SeqCst) >= 2 * messages.len()
    })
    .await;
    shutdown.cancel();
    for run in runs {
        tokio::time::timeout(Duration::from_secs(20), run).await.expect("intakes stop").expect("join");
    }
    assert_eq!(queued(&shared).await, messages.len(), "each message queued once, not once per intake");
    let rows = shared.handle.ledger.list_activations(&LedgerFilter::default()).await.expect("ledger");
    assert_eq!(rows.len(), messages.len(), "one ledger row per message");
    for (message, rev) in &messages {
        let row = shared.handle.ledger.get_activation(&dispatch_id(&message.id, *rev)).await.expect("get");
        assert_eq!(
            row.and_then(|r| r.message_id),
            Some(message.id.clone()),
            "the row of {} has the derived id",
            message.id
        );
    }
}

#[tokio::test]
async fn the_sweep_queues_an_activation_recorded_but_never_queued() {
    let shared = shared().await;
    let config = AgentConfig { requeue_after_s: 60, ..AgentConfig::default() };
    let agent = agent(&shared, Arc::clone(&shared.handle.ledger), config);
    // What an intake killed between its ledger insert and its push leaves: a row, nothing queued.
    let (lost, lost_rev) = post(&shared, 1, "lost between the ledger and the queue").await;
    let (fresh, fresh_rev) = post(&shared, 2, "recorded a moment ago, its push on the way").await;
    let row = |message: &Message, rev: i64, enqueued_at| LedgerEntry {
        id: dispatch_id(&message.id, rev),
        kind: ActivationKind::Message,
        lane: Lane::Interactive,
        session_id: message.session_id.clone(),
        message_id: Some(message.id.clone()),
        triggered_by: message.sender.clone(),
        delegation_user: None,
        depth: 0,
        agent: None,
        enqueued_at,
        started_at: None,
        finished_at: None,
        outcome: None,
        error: None,
        usage: Usage::default(),
    };
    let ledger = &shared.handle.ledger;
    ledger.record_enqueued(&row(&lost, lost_rev, Utc::now() - chrono::Duration::minutes(5))).await.expect("lost row");
    ledger.record_enqueued(&row(&fresh, fresh_rev, Utc::now())).await.expect("fresh row");

    let report = agent.sweep_once().await.expect("sweep");
    assert_eq!(report, SweepReport { requeued: 1, ..SweepReport::default() }, "only the old row is queued again");
    let lease = Queue::try_pop(&*shared.queue).await.expect("pop").expect("the lost activation is queued");
    assert_eq!(lease.activation.id, dispatch_id(&lost.id, lost_rev));
    assert_eq!(lease.activation.payload.message_reference(), Some(&lost.id));
    // While its lane holds work, a row waiting its turn is not taken for lost.
    let activation = lease.activation.clone();
    lease.ack().await.expect("ack");
    shared.queue.push(activation).await.expect("push back");
    assert_eq!(agent.sweep_once().await.expect("sweep"), SweepReport::default(), "a busy lane: nothing queued twice");
}

#[tokio::test]
async fn the_sweep_records_a_waiting_message_no_intake_recorded() {
    let shared = shared().await;
    // requeue_after_s = 0: every waiting message is old enough.
    let config = AgentConfig { requeue_after_s: 0, ..AgentConfig::default() };
    let agent = agent(&shared, Arc::clone(&shared.handle.ledger), config);
    let (waiting, rev) = post(&shared, 1, "posted while no intake ran").await;

    let report = agent.sweep_once().await.expect("sweep");
    assert_eq!(report, SweepReport { recorded: 1, ..SweepReport::default() });
    let row = shared.handle.ledger.get_activation(&dispatch_id(&waiting.id, rev)).await.expect("get");
    assert_eq!(row.and_then(|r| r.message_id), Some(waiting.id.clone()));
    assert_eq!(queued(&shared).await, 1);
    // Its row now exists and its lane holds it: the next sweep leaves it alone.
    assert_eq!(agent.sweep_once().await.expect("sweep"), SweepReport::default());
    assert_eq!(queued(&shared).await, 1, "queued once");
}
