//! Two agents (as two processes would) over one store, each with its own queue: the session
//! lease keeps them from running turns of one session at the same time.

use std::sync::Arc;
use std::time::Duration;

use kesoku_agent::{AgentConfig, QueueMode, SessionLeasing};
use kesoku_broker::lease::MemoryLeases;
use kesoku_core::{Outcome, Status};
use kesoku_llm::ScriptStep;

use crate::harness::{Harness, Options};

fn options(leasing: &SessionLeasing) -> Options {
    Options {
        // Each message waits for the one before it instead of interrupting it.
        config: AgentConfig { queue_mode: QueueMode::Queue, ..AgentConfig::default() },
        leasing: Some(leasing.clone()),
        ..Options::default()
    }
}

#[tokio::test]
async fn two_processes_never_run_turns_of_one_session_at_once() {
    let leasing = SessionLeasing { leases: Arc::new(MemoryLeases::new()), ttl: Duration::from_secs(30) };
    let slow = |text: &str| ScriptStep::text(text).delayed(Duration::from_millis(300));
    let h = Harness::start_with(vec![slow("one"), slow("two"), slow("three")], options(&leasing)).await;
    let (_other, other_shutdown, other_run) = h.boot_another(options(&leasing)).await;

    // Both agents' intakes see every message and queue it; both have idle workers.
    let mut roots = Vec::new();
    for text in ["first", "second", "third"] {
        roots.push(h.post_user(text).await);
    }
    for root in &roots {
        assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);
    }

    let mut turns: Vec<_> = h
        .ledger()
        .await
        .into_iter()
        .filter(|row| row.outcome == Some(Outcome::Succeeded))
        .filter_map(|row| Some((row.started_at?, row.finished_at?)))
        .collect();
    assert_eq!(turns.len(), 3, "each message answered once");
    turns.sort();
    for pair in turns.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "two turns of the session overlapped: {pair:?}");
    }
    // The lease is free again once the turns are done.
    assert_eq!(leasing.leases.held_count().await.expect("count"), 0);
    other_shutdown.cancel();
    other_run.await.expect("the other agent stops");
}
