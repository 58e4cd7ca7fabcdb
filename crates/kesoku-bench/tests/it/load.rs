//! Load: 10,000 messages in ten bursts of 1,000 (one per session, 1,000 sessions), through the
//! agent wired as the binary wires it (SQLite store, in-memory broker and queue) with an
//! in-process model answering at once. None is lost: every message is `processed` with exactly
//! one answer and one succeeded ledger row. The latency of each message (posted → answer heard)
//! is reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use kesoku_bench::models::{Policy, PolicyModel};
use kesoku_bench::stats::{Summary, ms};
use kesoku_bench::system::{AgentSetup, Backend, Client, StoreSetup, System};
use kesoku_core::{Outcome, Status};
use kesoku_store::LedgerFilter;

const SESSIONS: usize = 1000;
const BURSTS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_in_bursts_over_a_thousand_sessions_lose_nothing() {
    let store = StoreSetup::open(&Backend::Sqlite).await.expect("store");
    let model = Arc::new(PolicyModel::new("instant", Policy::plain()));
    let system = System::start(store, AgentSetup::with_model(model)).await.expect("agent");
    let client = Client::start(&system.gateway).await;
    let mut sessions = Vec::with_capacity(SESSIONS);
    for index in 0..SESSIONS {
        sessions.push(client.new_session(&format!("load-{index}")).await.expect("session"));
    }
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(SESSIONS * BURSTS);
    for burst in 0..BURSTS {
        // The whole burst is posted before any answer is awaited.
        let mut pending = Vec::with_capacity(SESSIONS);
        for session in &sessions {
            pending.push(client.post(session, &format!("burst {burst}")).await.expect("post"));
        }
        let answered = tokio::time::timeout(Duration::from_secs(120), join_all(pending)).await.expect("burst answered");
        for result in answered {
            let answered = result.expect("every message is resolved");
            assert_eq!(answered.status, Status::Processed, "{}", answered.root);
            assert_eq!(answered.answers, 1, "{} has exactly one answer", answered.root);
            latencies.push(answered.latency);
        }
    }
    let elapsed = started.elapsed();
    let store = system.gateway.store();
    let mut roots = 0;
    for session in &sessions {
        let history = store.session_history(&session.id).await.expect("history");
        let users = history.iter().filter(|m| m.parent_id.is_none()).count();
        assert_eq!(users, BURSTS, "session {} holds every message", session.id);
        assert!(history.iter().filter(|m| m.parent_id.is_none()).all(|m| m.status == Status::Processed));
        roots += users;
    }
    assert_eq!(roots, SESSIONS * BURSTS);
    let ledger = system.store.handle.ledger.list_activations(&LedgerFilter::default()).await.expect("ledger");
    assert_eq!(ledger.len(), SESSIONS * BURSTS, "one ledger row per message");
    assert!(ledger.iter().all(|row| row.outcome == Some(Outcome::Succeeded)));
    let summary = Summary::of(&latencies).expect("latencies");
    println!(
        "load: {} messages in {:.1} s ({:.0}/s, debug build), latency p50 {} p99 {} max {}",
        latencies.len(),
        elapsed.as_secs_f64(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        ms(summary.p50),
        ms(summary.p99),
        ms(summary.max)
    );
    system.stop().await;
}
