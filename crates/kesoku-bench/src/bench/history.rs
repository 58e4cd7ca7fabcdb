//! History: load a 10,000-message session in phased order from the store, then clean and
//! transpile it into model turns (`history_to_conversation`, which strips past thoughts and
//! notifications, pairs results with calls and merges roles) — what every model call of a long
//! session pays.
//!
//! The session is 2,000 completed turns of five messages (question, thought, tool call, tool
//! result, answer) of realistic sizes, written before the clock starts.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use kesoku_core::{Message, MessageId, Session, Status, TurnOrigin};
use kesoku_llm::{HistoryOptions, history_to_conversation};
use serde_json::json;

use crate::bench::{Row, Scale, Verdict, p50_p99};
use crate::stats::Summary;
use crate::system::{Backend, StoreSetup};

/// Messages in the measured session.
pub const MESSAGES: usize = 10_000;

#[derive(Debug, Clone)]
pub struct Measured {
    pub messages: usize,
    pub load: Summary,
    pub transpile: Summary,
    pub total: Summary,
    /// The first read after the store opened (nothing cached): load, and load + transpile.
    pub cold_load: Duration,
    pub cold_total: Duration,
    pub turns: usize,
}

pub async fn run(backend: &Backend, scale: Scale) -> anyhow::Result<Measured> {
    let setup = StoreSetup::open(backend).await?;
    let store = &setup.handle.store;
    let session = Session::new("bench", "history", Utc::now());
    store.create_session(&session).await?;
    let mut last_root = fill(store.as_ref(), &session, 0..MESSAGES / 5).await?;
    let repeats = scale.pick(5, 40);
    let (mut load, mut transpile, mut total) = (Vec::new(), Vec::new(), Vec::new());
    let mut cold = None;
    let mut turns = 0;
    let mut messages = 0;
    for index in 0..repeats + 2 {
        if index > 0 {
            // What happens between two model calls of a real session: another turn was written
            // (and its statuses changed), so the store cannot answer from an unchanged copy.
            let next = MESSAGES / 5 + index;
            last_root = fill(store.as_ref(), &session, next..next + 1).await?;
        }
        let started = Instant::now();
        let history = store.session_history(&session.id).await?;
        let loaded = started.elapsed();
        // As the turn loop does it: the system prompt in front, the history borrowed.
        let system_prompt = Message::system_prompt(&session.id, "You are Kesoku.");
        let mut all: Vec<&Message> = Vec::with_capacity(history.len() + 1);
        all.push(&system_prompt);
        all.extend(history.iter());
        let options = HistoryOptions { active_root: Some(&last_root), attachment_base: None };
        let conversation = history_to_conversation(&all, &options);
        let finished = started.elapsed();
        messages = all.len() - 1;
        turns = conversation.turns.len();
        if index == 0 {
            // The first read after start-up: every row decoded.
            cold = Some((loaded, finished));
        } else if index >= 2 {
            // The second run warms the caches and is not counted either.
            load.push(loaded);
            transpile.push(finished.saturating_sub(loaded));
            total.push(finished);
        }
    }
    setup.cleanup().await;
    anyhow::ensure!(messages >= MESSAGES, "the session holds {messages} messages, not {MESSAGES}");
    let summary = |samples: &[Duration]| Summary::of(samples).context("no samples");
    let (cold_load, cold_total) = cold.context("no first read")?;
    Ok(Measured {
        messages,
        load: summary(&load)?,
        transpile: summary(&transpile)?,
        total: summary(&total)?,
        cold_load,
        cold_total,
        turns,
    })
}

/// Write turns `range` of the session; returns the root of the last one.
async fn fill(
    store: &dyn kesoku_store::Store,
    session: &Session,
    range: std::ops::Range<usize>,
) -> anyhow::Result<MessageId> {
    let question = "Could you look at the build log and tell me why the integration tests failed on the \
                    release branch last night?";
    let thought = "The user wants the failure cause. I will read the log file first, then summarise the \
                   failing test and the error message it printed.";
    let result = "=== STDOUT ===\nrunning 42 tests\n".to_owned() + &"test store::claims ... ok\n".repeat(12);
    let answer = "The integration tests failed because the PostgreSQL test schema was not cleaned up: \
                  `claims::exactly_one_claimant_wins` found rows from an earlier run. Dropping the stale \
                  schema fixes it; the other 41 tests passed.";
    let mut last_root = None;
    let mut batch = Vec::with_capacity(500);
    for turn in range {
        let mut root = Message::user_text(&session.id, "bench", "history", "User", format!("{turn}: {question}"));
        root.status = Status::Processed;
        let origin = TurnOrigin::of(&root, "Kesoku");
        let thinking = origin.thought(1, thought, None);
        let mut call = origin.tool_call(1, &format!("call_{turn}"), "read_file", json!({"path": "logs/build.log"}));
        call.status = Status::Delivered;
        let mut output = origin.tool_result(&call, result.clone(), Some("42 tests".to_owned()), None);
        output.status = Status::Delivered;
        let mut reply = origin.final_text(2, answer, None);
        reply.status = Status::Delivered;
        last_root = Some(root.id.clone());
        batch.extend([root, thinking, call, output, reply]);
        if batch.len() >= 500 {
            store.insert_messages(&batch).await?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        store.insert_messages(&batch).await?;
    }
    last_root.context("no turn was written")
}

pub fn rows(backend: &Backend, measured: &Measured) -> Vec<Row> {
    let embedded = *backend == Backend::Sqlite;
    let (target, verdict) = if embedded {
        ("≤ 10 ms", Verdict::of(measured.total.p50 <= Duration::from_millis(10)))
    } else {
        ("(embedded only)", Verdict::Info)
    };
    vec![Row::new(
        "5. history: load + clean + transpile, 10,000 messages",
        backend.label(),
        p50_p99(&measured.total),
        target,
        verdict,
        format!(
            "{} runs, a new turn written before each; load {}; clean + transpile {}; {} messages, {} model \
             turns; first read after start-up (nothing cached) {:.1} ms, of which load {:.1} ms",
            measured.total.samples,
            p50_p99(&measured.load),
            p50_p99(&measured.transpile),
            measured.messages,
            measured.turns,
            measured.cold_total.as_secs_f64() * 1000.0,
            measured.cold_load.as_secs_f64() * 1000.0
        ),
    )]
}
