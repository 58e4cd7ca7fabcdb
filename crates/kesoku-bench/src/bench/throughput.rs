//! Throughput: plain turns per second with 1,000 sessions talking at once (a closed loop: each
//! session posts its next message when the previous one is answered), against an instant mock
//! and against one answering after 200 ms.
//!
//! In the same run it measures the limit alone: the store doing exactly the reads and writes of
//! a plain turn (user message, ledger rows, claim, history, final text, statuses, delivery) with
//! the same concurrency and nothing else, and the CPU the process used during the full run. The
//! lower of "store alone" and "CPU" is what stops throughput.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use futures::future::try_join_all;
use kesoku_agent::AgentConfig;
use kesoku_core::{
    ActivationId, ActivationKind, Lane, LedgerEntry, Message, MessageFilter, Outcome, Session, Status, TurnOrigin,
    Usage,
};
use kesoku_store::StoreHandle;

use crate::bench::{Row, Scale, Verdict, mock_model, p50_p99};
use crate::mock::{HttpPolicy, PolicyServer};
use crate::models::ModelClock;
use crate::procfs::own_cpu_time;
use crate::stats::Summary;
use crate::system::{AgentSetup, Backend, Client, StoreSetup, System};

/// One throughput run.
#[derive(Debug, Clone)]
pub struct Measured {
    pub model_latency: Duration,
    pub sessions: usize,
    pub max_concurrent_turns: usize,
    pub turns: usize,
    pub elapsed: Duration,
    pub turns_per_second: f64,
    /// CPU seconds per wall second (2.0 = both cores busy).
    pub cpu_cores_used: f64,
    pub latency: Summary,
    pub lost: usize,
}

/// The store alone doing a plain turn's reads and writes.
#[derive(Debug, Clone)]
pub struct StoreOnly {
    pub turns: usize,
    pub turns_per_second: f64,
    pub writes_per_turn: usize,
    pub cpu_cores_used: f64,
}

pub async fn run(backend: &Backend, scale: Scale) -> anyhow::Result<(Vec<Measured>, StoreOnly)> {
    let sessions = 1000;
    let rounds = scale.pick(2, 10);
    let mut results = Vec::new();
    // The default pool (16 turns at a time), then a pool sized for 1,000 sessions: a turn spends
    // most of its time waiting (on the model, on the store's commit), so 16 turns cannot keep
    // two cores busy even with an instant model.
    let wide = AgentConfig { max_concurrent_turns: 1000, ..AgentConfig::default() };
    results.push(measure(backend, sessions, rounds, Duration::ZERO, AgentConfig::default()).await?);
    results.push(measure(backend, sessions, rounds, Duration::ZERO, wide.clone()).await?);
    // With a slow model the worker pool is the limit: the default of 16 turns at a time allows
    // at most 80 turns/s at 200 ms, so the slow run also shows a pool sized for the load.
    let slow_rounds = scale.pick(1, 3);
    results.push(measure(backend, sessions, slow_rounds, Duration::from_millis(200), AgentConfig::default()).await?);
    results.push(measure(backend, sessions, slow_rounds, Duration::from_millis(200), wide).await?);
    let store_only = store_alone(backend, sessions, rounds).await?;
    Ok((results, store_only))
}

async fn measure(
    backend: &Backend,
    sessions: usize,
    rounds: usize,
    latency: Duration,
    config: AgentConfig,
) -> anyhow::Result<Measured> {
    let mock = PolicyServer::start(HttpPolicy { latency, ..HttpPolicy::instant_text() });
    let clock = ModelClock::default();
    let store = StoreSetup::open(backend).await?;
    let max_concurrent_turns = config.max_concurrent_turns;
    let setup = AgentSetup { config, ..AgentSetup::with_model(mock_model(&mock.base_url(), &clock)?) };
    let system = System::start(store, setup).await?;
    let client = Client::start(&system.gateway).await;
    let mut all = Vec::with_capacity(sessions);
    for index in 0..sessions {
        all.push(client.new_session(&format!("load-{index}")).await?);
    }
    // One warm-up turn per session is not counted: it opens every session once.
    run_rounds(&client, &all, 1).await?;
    let cpu_before = own_cpu_time();
    let started = Instant::now();
    let latencies = run_rounds(&client, &all, rounds).await?;
    let elapsed = started.elapsed();
    let cpu = own_cpu_time().saturating_sub(cpu_before);
    let expected = sessions * rounds;
    let processed = latencies.iter().filter(|(status, _)| *status == Status::Processed).count();
    let samples: Vec<Duration> = latencies.iter().map(|(_, latency)| *latency).collect();
    system.stop().await;
    Ok(Measured {
        model_latency: latency,
        sessions,
        max_concurrent_turns,
        turns: processed,
        elapsed,
        turns_per_second: processed as f64 / elapsed.as_secs_f64(),
        cpu_cores_used: cpu.as_secs_f64() / elapsed.as_secs_f64(),
        latency: Summary::of(&samples).context("no turns")?,
        lost: expected - processed,
    })
}

/// Every session asks `rounds` questions one after the other, all sessions at once.
async fn run_rounds(client: &Client, sessions: &[Session], rounds: usize) -> anyhow::Result<Vec<(Status, Duration)>> {
    let tasks = sessions.iter().map(|session| {
        let client = client.clone();
        let session = session.clone();
        async move {
            let mut out = Vec::with_capacity(rounds);
            for round in 0..rounds {
                let answered = client.ask(&session, &format!("question {round}")).await?;
                out.push((answered.status, answered.latency));
            }
            anyhow::Ok(out)
        }
    });
    let joined = try_join_all(tasks.map(tokio::spawn)).await.context("a load task panicked")?;
    let mut all = Vec::new();
    for result in joined {
        all.extend(result?);
    }
    Ok(all)
}

/// The reads and writes the runtime and a chatbot make for one plain turn, straight on the
/// store: no agent, no broker, no model.
pub async fn store_alone(backend: &Backend, sessions: usize, rounds: usize) -> anyhow::Result<StoreOnly> {
    let setup = StoreSetup::open(backend).await?;
    let handle = setup.handle.clone();
    let mut all = Vec::with_capacity(sessions);
    for index in 0..sessions {
        let session = Session::new("bench", &format!("store-{index}"), Utc::now());
        handle.store.create_session(&session).await?;
        all.push(session);
    }
    let cpu_before = own_cpu_time();
    let started = Instant::now();
    let tasks = all.iter().map(|session| {
        let handle = handle.clone();
        let session = session.clone();
        tokio::spawn(async move {
            for round in 0..rounds {
                one_turn(&handle, &session, round).await?;
            }
            anyhow::Ok(())
        })
    });
    for result in try_join_all(tasks).await.context("a store task panicked")? {
        result?;
    }
    let elapsed = started.elapsed();
    let cpu = own_cpu_time().saturating_sub(cpu_before);
    setup.cleanup().await;
    let turns = sessions * rounds;
    Ok(StoreOnly {
        turns,
        turns_per_second: turns as f64 / elapsed.as_secs_f64(),
        writes_per_turn: WRITES_PER_TURN,
        cpu_cores_used: cpu.as_secs_f64() / elapsed.as_secs_f64(),
    })
}

/// Writes in [`one_turn`]: user message, ledger enqueued, claim, ledger started, final text,
/// root processed, ledger finished, final delivered.
const WRITES_PER_TURN: usize = 8;

async fn one_turn(handle: &StoreHandle, session: &Session, round: usize) -> anyhow::Result<()> {
    let store = &handle.store;
    let ledger = &handle.ledger;
    let root = Message::user_text(&session.id, "bench", &session.channel_id, "Bench", format!("question {round}"));
    store.insert_message(&root).await?;
    let now = Utc::now();
    let entry = LedgerEntry {
        id: ActivationId::generate(),
        kind: ActivationKind::Message,
        lane: Lane::Interactive,
        session_id: session.id.clone(),
        message_id: Some(root.id.clone()),
        triggered_by: "Bench".to_owned(),
        delegation_user: None,
        depth: 0,
        agent: None,
        enqueued_at: now,
        started_at: None,
        finished_at: None,
        outcome: None,
        error: None,
        usage: Usage::default(),
    };
    ledger.record_enqueued(&entry).await?;
    ledger.record_started(&entry.id, Utc::now()).await?;
    store.get_message(&root.id).await?;
    store.list_messages(&MessageFilter::session(&session.id).with_statuses(&[Status::PendingAgent])).await?;
    store.claim(&root.id, Status::Processing, &[Status::PendingAgent], "bench-worker").await?;
    store.get_session(&session.id).await?;
    store.session_history(&session.id).await?;
    let origin = TurnOrigin::of(&root, "Kesoku");
    let answer = origin.final_text(1, "The answer is 42.", None);
    store.insert_messages(std::slice::from_ref(&answer)).await?;
    store.update_status(&root.id, Status::Processed).await?;
    ledger.record_finished(&entry.id, Utc::now(), Outcome::Succeeded, None, &Usage::default()).await?;
    store.update_status(&answer.id, Status::Delivered).await?;
    Ok(())
}

pub fn rows(backend: &Backend, measured: &[Measured], store_only: &StoreOnly) -> Vec<Row> {
    let embedded = *backend == Backend::Sqlite;
    let mut rows: Vec<Row> = measured
        .iter()
        .map(|m| {
            let instant = m.model_latency.is_zero();
            // Judged with the pool sized for the load; the default pool's row is for reference.
            let (target, verdict) = if embedded && instant && m.max_concurrent_turns >= m.sessions {
                ("≥ 2,000 turns/s on 2 cores", Verdict::of(m.turns_per_second >= 2000.0))
            } else {
                ("", Verdict::Info)
            };
            let mock =
                if instant { "instant mock".to_owned() } else { format!("{} ms mock", m.model_latency.as_millis()) };
            Row::new(
                &format!("2. throughput, {} sessions ({mock}, {} workers)", m.sessions, m.max_concurrent_turns),
                backend.label(),
                format!("{:.0} turns/s", m.turns_per_second),
                target,
                verdict,
                format!(
                    "{} turns in {:.1} s, {} lost; latency {}; CPU {:.2} of 2 cores",
                    m.turns,
                    m.elapsed.as_secs_f64(),
                    m.lost,
                    p50_p99(&m.latency),
                    m.cpu_cores_used
                ),
            )
        })
        .collect();
    rows.push(Row::new(
        "2. limit: the store alone, a plain turn's reads and writes",
        backend.label(),
        format!("{:.0} turns/s", store_only.turns_per_second),
        "",
        Verdict::Info,
        format!(
            "{} turns, {} writes each ({:.0} writes/s), 1,000 concurrent; CPU {:.2} of 2 cores",
            store_only.turns,
            store_only.writes_per_turn,
            store_only.turns_per_second * store_only.writes_per_turn as f64,
            store_only.cpu_cores_used
        ),
    ));
    rows
}
