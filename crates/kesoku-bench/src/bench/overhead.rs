//! Framework overhead per turn: a message posted → its final text reaches the chatbot, minus the
//! time spent inside the model (measured around the provider's stream, so HTTP to the mock and
//! parsing its stream count as model time).
//!
//! Turns run one at a time, each in a new session, against the OpenAI-style provider and a mock
//! server on 127.0.0.1 answering instantly (or after a fixed delay); see [`crate::mock`] for why
//! it is the policy server and not the vendor mock. The tool turn calls
//! `read_file` on a small file: an in-process built-in tool, so the figure is the framework's
//! (posting the call and the result, the second model request) and not a process start.

use std::time::Duration;

use anyhow::Context;
use kesoku_core::Status;
use serde_json::json;

use crate::bench::{Row, Scale, Verdict, mock_model, p50_p99};
use crate::mock::{HttpPolicy, PolicyServer};
use crate::models::ModelClock;
use crate::stats::Summary;
use crate::system::{AgentSetup, Backend, Client, StoreSetup, System};

/// Which turn is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnKind {
    Plain,
    OneToolCall,
}

impl TurnKind {
    fn label(self) -> &'static str {
        match self {
            TurnKind::Plain => "plain turn",
            TurnKind::OneToolCall => "turn with one tool call",
        }
    }
}

/// Overhead and end-to-end latency of one kind of turn.
#[derive(Debug, Clone)]
pub struct Measured {
    pub kind: TurnKind,
    pub model_latency: Duration,
    pub overhead: Summary,
    pub end_to_end: Summary,
    pub model_time: Summary,
    /// Where the time of a turn went, from the timestamps the store and the ledger recorded
    /// (medians over the measured turns; `None` where a turn lacked a stamp).
    pub phases: Vec<(&'static str, Duration)>,
    /// The same for the turn with the largest overhead alone: where a p99 comes from.
    pub slowest: Vec<(&'static str, Duration)>,
}

/// Run `iterations` turns of each kind (after a warm-up) for each model latency.
pub async fn run(backend: &Backend, scale: Scale) -> anyhow::Result<Vec<Measured>> {
    let iterations = scale.pick(60, 500);
    let slow_iterations = scale.pick(10, 40);
    let mut results = Vec::new();
    for (latency, count) in [(Duration::ZERO, iterations), (Duration::from_millis(200), slow_iterations)] {
        for kind in [TurnKind::Plain, TurnKind::OneToolCall] {
            results.push(measure(backend, kind, latency, count).await?);
        }
    }
    Ok(results)
}

async fn measure(backend: &Backend, kind: TurnKind, latency: Duration, iterations: usize) -> anyhow::Result<Measured> {
    let policy = match kind {
        TurnKind::Plain => HttpPolicy { latency, ..HttpPolicy::instant_text() },
        TurnKind::OneToolCall => {
            HttpPolicy { calls: 1, tool: "read_file".to_owned(), arguments: json!({"path": "notes.txt"}), latency }
        }
    };
    let mock = PolicyServer::start(policy);
    let clock = ModelClock::default();
    let store = StoreSetup::open(backend).await?;
    let setup = AgentSetup::with_model(mock_model(&mock.base_url(), &clock)?);
    let system = System::start(store, setup).await?;
    std::fs::write(system.workspace().join("notes.txt"), "a short note\n").context("writing the tool's file")?;
    let client = Client::start(&system.gateway).await;
    let warmup = (iterations / 10).max(3);
    let (mut overhead, mut end_to_end, mut model_time) = (Vec::new(), Vec::new(), Vec::new());
    let mut measured_roots = Vec::new();
    for index in 0..warmup + iterations {
        let session = client.new_session(&format!("overhead-{index}")).await?;
        let model_before = clock.total();
        let answered = client.ask(&session, "What is the answer?").await?;
        anyhow::ensure!(answered.status == Status::Processed, "a benchmark turn ended {:?}", answered.status);
        let model = clock.total().saturating_sub(model_before);
        if index >= warmup {
            end_to_end.push(answered.latency);
            model_time.push(model);
            overhead.push(answered.latency.saturating_sub(model));
            measured_roots.push(Turn {
                session: session.id.clone(),
                root: answered.root.clone(),
                model,
                posted: answered.posted_wall,
                heard: answered.heard_wall,
                model_end: clock.last_end(),
            });
        }
    }
    let requests = mock.requests();
    let medians = phases(&system, &measured_roots).await?;
    let slowest = match overhead.iter().enumerate().max_by_key(|(_, overhead)| **overhead) {
        Some((index, _)) => phases(&system, &measured_roots[index..=index]).await?,
        None => Vec::new(),
    };
    system.stop().await;
    let per_turn = if kind == TurnKind::Plain { 1 } else { 2 };
    anyhow::ensure!(
        requests == ((warmup + iterations) * per_turn) as u64,
        "the mock got {requests} requests for {} turns",
        warmup + iterations
    );
    let summary = |samples: &[Duration]| Summary::of(samples).context("no samples");
    Ok(Measured {
        kind,
        model_latency: latency,
        overhead: summary(&overhead)?,
        end_to_end: summary(&end_to_end)?,
        model_time: summary(&model_time)?,
        phases: medians,
        slowest,
    })
}

/// One measured turn, for [`phases`].
struct Turn {
    session: kesoku_core::SessionId,
    root: kesoku_core::MessageId,
    /// Time inside the model during the turn.
    model: Duration,
    /// Wall clock: the client posted, the client heard the final text, the last model call ended.
    posted: chrono::DateTime<chrono::Utc>,
    heard: Option<chrono::DateTime<chrono::Utc>>,
    model_end: Option<chrono::DateTime<chrono::Utc>>,
}

/// The median time between the stamps a turn leaves: the client's post, the user message
/// written, its activation queued (intake), started (a worker took it), each later message of
/// the turn written (tool call, tool result, final answer), minus model time where a model call
/// sits between two stamps, and the client hearing the final text. (Stamps are wall clock;
/// a message's is taken when its write starts.)
async fn phases(system: &System, turns: &[Turn]) -> anyhow::Result<Vec<(&'static str, Duration)>> {
    use kesoku_core::{MessageFilter, MessageType, Role};
    let store = &system.store.handle;
    let mut spans: Vec<(&'static str, Vec<Duration>)> = Vec::new();
    let mut add =
        |name: &'static str, from: Option<chrono::DateTime<chrono::Utc>>, to: Option<chrono::DateTime<chrono::Utc>>| {
            let (Some(from), Some(to)) = (from, to) else { return };
            let span = (to - from).to_std().unwrap_or_default();
            match spans.iter_mut().find(|(known, _)| *known == name) {
                Some((_, samples)) => samples.push(span),
                None => spans.push((name, vec![span])),
            }
        };
    for Turn { session: session_id, root: root_id, model, posted, heard, model_end } in turns {
        let messages = store.store.list_messages(&MessageFilter::session(session_id)).await?;
        let Some(root) = messages.iter().find(|m| &m.id == root_id) else { continue };
        let ledger = store
            .ledger
            .list_activations(&kesoku_store::LedgerFilter {
                session_id: Some(session_id.clone()),
                ..Default::default()
            })
            .await?;
        let Some(entry) = ledger.iter().find(|e| e.message_id.as_ref() == Some(root_id)) else { continue };
        add("post → written", Some(*posted), root.created_at);
        add("written → queued", root.created_at, Some(entry.enqueued_at));
        add("queued → started", Some(entry.enqueued_at), entry.started_at);
        // The turn's own messages in the order they were written (the claim keeps no stamp
        // once the turn is over, so the first span starts at the ledger's start).
        let mut previous = entry.started_at;
        let calls = messages.iter().filter(|m| m.message_type == MessageType::ToolCall).count() as u32;
        // Model time is split evenly over the model calls (1 + one per tool step).
        let per_call = *model / (calls + 1);
        // (Each measured turn has a session of its own: every other message is the turn's.)
        for message in messages.iter().filter(|m| &m.id != root_id) {
            let name = match (message.role, message.message_type) {
                (_, MessageType::ToolCall) => "→ tool call written (minus model)",
                (_, MessageType::ToolResult) => "→ tool result written",
                (Role::Assistant, MessageType::Text) => "→ final answer written (minus model)",
                _ => continue,
            };
            let model_part = if message.message_type == MessageType::ToolResult { Duration::ZERO } else { per_call };
            add(
                name,
                previous,
                message.created_at.map(|at| at - chrono::Duration::from_std(model_part).unwrap_or_default()),
            );
            if message.role == Role::Assistant && message.message_type == MessageType::Text {
                add("(of which: model done → final answer written)", *model_end, message.created_at);
            }
            previous = message.created_at;
        }
        add("→ client heard the final text", previous, *heard);
    }
    Ok(spans
        .into_iter()
        .filter_map(|(name, samples)| Summary::of(&samples).map(|summary| (name, summary.p50)))
        .collect())
}

/// The phase medians of a run and the phases of its slowest turn, for the row's note.
fn phase_note(measured: &Measured) -> String {
    let list = |phases: &[(&str, Duration)]| {
        phases.iter().map(|(name, span)| format!("{name} {}", crate::stats::ms(*span))).collect::<Vec<_>>().join(", ")
    };
    let mut note = String::new();
    if !measured.phases.is_empty() {
        note.push_str(&format!("; phase medians: {}", list(&measured.phases)));
    }
    if !measured.slowest.is_empty() {
        note.push_str(&format!("; the slowest turn: {}", list(&measured.slowest)));
    }
    note
}

/// The report rows of these measurements.
pub fn rows(backend: &Backend, measured: &[Measured]) -> Vec<Row> {
    let embedded = *backend == Backend::Sqlite;
    measured
        .iter()
        .map(|m| {
            let mock = if m.model_latency.is_zero() {
                "instant mock".to_owned()
            } else {
                format!("{} ms mock", m.model_latency.as_millis())
            };
            let (target, verdict) = if embedded {
                let met = m.overhead.p50 <= Duration::from_millis(1) && m.overhead.p99 <= Duration::from_millis(5);
                ("p50 ≤ 1 ms, p99 ≤ 5 ms", Verdict::of(met))
            } else {
                ("(embedded only)", Verdict::Info)
            };
            Row::new(
                &format!("1. overhead, {} ({mock})", m.kind.label()),
                backend.label(),
                p50_p99(&m.overhead),
                target,
                verdict,
                format!(
                    "{} turns; end to end {}; model time p50 {}{}",
                    m.overhead.samples,
                    p50_p99(&m.end_to_end),
                    crate::stats::ms(m.model_time.p50),
                    phase_note(m)
                ),
            )
        })
        .collect()
}
