//! Lanes: how long a person's message waits for a worker while the agent is busy with background
//! work, and whether that background work still progresses.
//!
//! The real in-process agent (as [`System`] builds it: 16 workers) answers through a mock model
//! taking 100 ms per call. 200 background maintenance activations (session titles, one model
//! call each, of a session holding one answered message) are recorded in the ledger and pushed
//! straight onto the agent's queue, one per session; then 50 people each post a message in a session of their own, 20 ms apart. The wait
//! of each interactive activation is its ledger row's `started_at − enqueued_at`; background
//! progress is how many maintenance rows finished by the time the last person was answered,
//! and when the last of them finished.
//! The same run without lane caps (every lane may take every worker) is the reference.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use kesoku_agent::AgentConfig;
use kesoku_broker::{LaneCaps, Queue};
use kesoku_core::activation::MaintenanceTask;
use kesoku_core::{
    Activation, ActivationId, ActivationKind, ActivationPayload, ExpectedResponse, Lane, LedgerEntry, Message, Outcome,
    Session, Status,
};
use kesoku_store::LedgerFilter;

use crate::bench::{Row, Scale, Verdict, mock_model, p50_p99};
use crate::mock::{HttpPolicy, PolicyServer};
use crate::models::ModelClock;
use crate::stats::Summary;
use crate::system::{AgentSetup, BENCH_CHATBOT, Backend, Client, StoreSetup, System};

/// Background activations queued before the first person writes.
pub const BACKGROUND: usize = 200;
/// People writing, one message each.
pub const INTERACTIVE: usize = 50;
/// Between two people's messages.
pub const SPACING: Duration = Duration::from_millis(20);
/// Every model call (background and interactive alike) takes this long.
pub const MODEL_LATENCY: Duration = Duration::from_millis(100);
/// How long after the first post the run waits for all background work to finish.
pub const BACKGROUND_DEADLINE: Duration = Duration::from_secs(30);

/// One run: with the binary's lane caps, or without caps.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The caps in force (`None`: no caps).
    pub caps: Option<LaneCaps>,
    pub workers: usize,
    /// Interactive activations' queue waits (ledger `started_at − enqueued_at`).
    pub wait: Summary,
    /// People whose message ended `processed`.
    pub answered: usize,
    /// First post → last answer.
    pub elapsed: Duration,
    /// Background rows finished by then, and how many of those succeeded.
    pub background_finished: usize,
    pub background_succeeded: usize,
    /// First post → the last of the 200 background rows finished (`None`: not within
    /// [`BACKGROUND_DEADLINE`]).
    pub all_background: Option<Duration>,
}

pub async fn run(backend: &Backend, _scale: Scale) -> anyhow::Result<Vec<Measured>> {
    let config = AgentConfig::default();
    let capped = LaneCaps::for_workers(config.max_concurrent_turns);
    Ok(vec![measure(backend, &config, Some(capped)).await?, measure(backend, &config, None).await?])
}

async fn measure(backend: &Backend, config: &AgentConfig, caps: Option<LaneCaps>) -> anyhow::Result<Measured> {
    let mock = PolicyServer::start(HttpPolicy { latency: MODEL_LATENCY, ..HttpPolicy::instant_text() });
    let clock = ModelClock::default();
    let store = StoreSetup::open(backend).await?;
    let setup = AgentSetup {
        config: config.clone(),
        lane_caps: Some(caps.unwrap_or_else(LaneCaps::unlimited)),
        ..AgentSetup::with_model(mock_model(&mock.base_url(), &clock)?)
    };
    let system = System::start(store, setup).await?;
    let client = Client::start(&system.gateway).await;
    let mut people = Vec::with_capacity(INTERACTIVE);
    for index in 0..INTERACTIVE {
        people.push(client.new_session(&format!("person-{index}")).await?);
    }

    // The background work: one title per session (of its first message, already answered),
    // each row stored before it is queued.
    let ledger = &system.store.handle.ledger;
    let store = system.gateway.store();
    let mut background_sessions = HashSet::with_capacity(BACKGROUND);
    for index in 0..BACKGROUND {
        let session = Session::new(BENCH_CHATBOT, &format!("background-{index}"), Utc::now());
        store.create_session(&session).await?;
        let mut first = Message::user_text(
            &session.id,
            BENCH_CHATBOT,
            &session.channel_id,
            "Bench",
            format!("What does job {index} do?"),
        );
        first.status = Status::Processed;
        store.insert_message(&first).await?;
        background_sessions.insert(session.id.clone());
        let activation = title(&session);
        ledger.record_enqueued(&LedgerEntry::enqueued(&activation)).await?;
        system.queue.push(activation).await?;
    }

    let started = Instant::now();
    let mut answers = Vec::with_capacity(INTERACTIVE);
    for (index, session) in people.iter().enumerate() {
        answers.push(client.post(session, &format!("question {index}")).await?);
        tokio::time::sleep(SPACING).await;
    }
    let mut answered = 0;
    for answer in answers {
        let answer = answer.await.context("the client stopped before an answer")?;
        answered += usize::from(answer.status == Status::Processed);
    }
    let elapsed = started.elapsed();
    // The people's sessions ask for titles too; only the queued 200 count.
    let queued_background = || async {
        let rows = ledger
            .list_activations(&LedgerFilter { kind: Some(ActivationKind::Maintenance), ..LedgerFilter::default() })
            .await?;
        anyhow::Ok(rows.into_iter().filter(|row| background_sessions.contains(&row.session_id)).collect::<Vec<_>>())
    };
    let background: Vec<LedgerEntry> = queued_background().await?;
    // Then the background work alone, to its end (bounded: a stuck run still reports).
    let mut all_background = None;
    while started.elapsed() < BACKGROUND_DEADLINE {
        let rows = queued_background().await?;
        if rows.iter().all(|row| row.finished_at.is_some()) {
            all_background = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let interactive = ledger
        .list_activations(&LedgerFilter {
            lane: Some(Lane::Interactive),
            limit: Some(u32::try_from(INTERACTIVE).unwrap_or(u32::MAX)),
            ..LedgerFilter::default()
        })
        .await?;
    system.stop().await;

    let waits: Vec<Duration> = interactive
        .iter()
        .filter_map(|row| row.started_at.map(|at| (at - row.enqueued_at).to_std().unwrap_or_default()))
        .collect();
    Ok(Measured {
        caps,
        workers: config.max_concurrent_turns,
        wait: Summary::of(&waits).context("no interactive activation started")?,
        answered,
        elapsed,
        background_finished: background.iter().filter(|row| row.finished_at.is_some()).count(),
        background_succeeded: background.iter().filter(|row| row.outcome == Some(Outcome::Succeeded)).count(),
        all_background,
    })
}

/// A session-title maintenance activation of `session`, on the background lane.
fn title(session: &Session) -> Activation {
    Activation {
        id: ActivationId::generate(),
        session_id: session.id.clone(),
        chatbot_id: session.chatbot_id.clone(),
        channel_id: session.channel_id.clone(),
        triggered_by: "system".to_owned(),
        delegation_user: None,
        depth: 0,
        agent: None,
        orchestration: None,
        lane: Lane::Background,
        expected_response: ExpectedResponse::default(),
        locale: None,
        timezone: None,
        model: None,
        output_schema: None,
        created_at: Utc::now(),
        payload: ActivationPayload::Maintenance { task: MaintenanceTask::Title },
    }
}

pub fn rows(backend: &Backend, measured: &[Measured]) -> Vec<Row> {
    measured
        .iter()
        .map(|m| {
            let caps = match m.caps {
                Some(caps) => format!("lane caps {}/{}", caps.responsive_and_background, caps.background),
                None => "no lane caps".to_owned(),
            };
            // Judged with caps: an interactive activation should not wait for a background turn
            // to end (one background model call is 100 ms).
            let (target, verdict) = match m.caps {
                Some(_) => ("p99 < 100 ms (one background call)", Verdict::of(m.wait.p99 < MODEL_LATENCY)),
                None => ("", Verdict::Info),
            };
            let all = match m.all_background {
                Some(at) => format!("all {BACKGROUND} finished {:.1} s after the first post", at.as_secs_f64()),
                None => format!("not all finished within {} s", BACKGROUND_DEADLINE.as_secs()),
            };
            Row::new(
                &format!(
                    "7. lanes: interactive wait, {BACKGROUND} background queued ({} ms mock, {} workers, {caps})",
                    MODEL_LATENCY.as_millis(),
                    m.workers
                ),
                backend.label(),
                p50_p99(&m.wait),
                target,
                verdict,
                format!(
                    "{} of {INTERACTIVE} answered in {:.1} s (posted {} ms apart); background finished meanwhile: {} \
                     of {BACKGROUND} ({} succeeded); {all}",
                    m.answered,
                    m.elapsed.as_secs_f64(),
                    SPACING.as_millis(),
                    m.background_finished,
                    m.background_succeeded
                ),
            )
        })
        .collect()
}
