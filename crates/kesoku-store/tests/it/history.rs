//! Phased session history: the spec's trajectories, and agreement with
//! `kesoku_core::history::phased_order` on random trajectories.

use std::path::PathBuf;

use kesoku_core::history::phased_order;
use kesoku_core::{Message, MessageId, MessageType, Role, SessionId, Status};

use crate::backend_tests;
use crate::harness::{Backend, message, prompt, without_times};

backend_tests!(
    spec_trajectories_come_back_in_phased_order,
    interruption_trajectory_replayed_through_the_store,
    history_matches_phased_order_on_random_trajectories,
    a_long_history_read_again_and_again_follows_every_change,
);

fn fixture(name: &str) -> Vec<Message> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kesoku-core/tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

async fn spec_trajectories_come_back_in_phased_order(b: &Backend) {
    for name in ["trajectory_6_1.json", "trajectory_6_2.json", "trajectory_6_3.json"] {
        let messages = fixture(name);
        let session = messages[0].session_id.clone();
        b.store.insert_messages(&messages).await.unwrap_or_else(|e| panic!("insert {name}: {e}"));
        let history = b.store.session_history(&session).await.expect("history");
        assert_eq!(history.len(), messages.len(), "{name}");
        assert!(history.iter().all(|m| m.created_at.is_some() && m.updated_at.is_some()), "{name}: stamped");
        let history: Vec<Message> = history.into_iter().map(without_times).collect();
        assert_eq!(history, messages, "{name}: field by field");
        assert_eq!(history, phased_order(messages.clone()), "{name}: the reference order");
    }
}

/// Example 6.3 as it happens: the first prompt is claimed, a thought is shown, a newer prompt
/// interrupts the turn. The end state is the fixture.
async fn interruption_trajectory_replayed_through_the_store(b: &Backend) {
    let expected = fixture("trajectory_6_3.json");
    let [user_a, thought_a, user_b] = expected.as_slice() else { panic!("6.3 has three messages") };
    let as_posted = |m: &Message, status: Status| Message { status, ..m.clone() };

    b.store.insert_message(&as_posted(user_a, Status::PendingAgent)).await.expect("post user_a");
    b.store
        .claim(&user_a.id, Status::Processing, &[Status::PendingAgent], "worker")
        .await
        .expect("claim")
        .expect("won");
    b.store.insert_message(&as_posted(thought_a, Status::Responded)).await.expect("post thought");
    b.store.update_status(&thought_a.id, Status::Delivered).await.expect("thought shown");
    b.store.update_status(&user_a.id, Status::Interrupted).await.expect("interrupt user_a");
    b.store.insert_message(&as_posted(user_b, Status::PendingAgent)).await.expect("post user_b");

    let history: Vec<Message> =
        b.store.session_history(&user_a.session_id).await.expect("history").into_iter().map(without_times).collect();
    assert_eq!(history, expected);
    // The interrupted prompt can never be picked up again.
    assert_eq!(b.store.claim(&user_a.id, Status::Processing, &[Status::PendingAgent], "w").await.expect("claim"), None);
}

/// splitmix64: a small deterministic generator, so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() { None } else { items.get(self.below(items.len())) }
    }
}

/// Messages of two sessions written in a plausible but shuffled way: turns interleave, parallel
/// tool results arrive out of order, nudges and steering messages come in, some parents are
/// unknown or in the other session. Parents are always written before their children.
fn random_trajectory(seed: u64) -> Vec<Message> {
    let mut rng = Rng(seed);
    let sessions = [format!("sess_{seed}_a"), format!("sess_{seed}_b")];
    let mut roots: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    let mut calls: [Vec<(String, u32)>; 2] = [Vec::new(), Vec::new()];
    let mut all: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    let count = 12 + rng.below(40);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let s = rng.below(2);
        let session = sessions[s].as_str();
        let id = format!("msg_{seed}_{i:03}");
        let step = rng.below(4) as u32;
        let root = rng.pick(&roots[s]).cloned();
        let kind = if root.is_none() { 0 } else { rng.below(12) };
        let mut m = match (kind, root.as_deref()) {
            (0, _) | (_, None) => message(&id, session, None, Role::User, MessageType::Text, Status::PendingAgent),
            (1, Some(root)) => {
                message(&id, session, Some(root), Role::Assistant, MessageType::Thought, Status::Responded)
            }
            (2, Some(root)) => message(&id, session, Some(root), Role::Tool, MessageType::ToolCall, Status::Responded),
            (3, Some(root)) => match rng.pick(&calls[s]).cloned() {
                Some((call, call_step)) => {
                    let mut result =
                        message(&id, session, Some(&call), Role::Tool, MessageType::ToolResult, Status::Responded);
                    result.step = call_step;
                    result
                }
                None => message(&id, session, Some(root), Role::Tool, MessageType::ToolResult, Status::Responded),
            },
            (4, Some(root)) => message(&id, session, Some(root), Role::Assistant, MessageType::Text, Status::Pending),
            (5, Some(root)) => message(&id, session, Some(root), Role::System, MessageType::Text, Status::Responded),
            (6, Some(root)) => message(&id, session, Some(root), Role::User, MessageType::Text, Status::PendingAgent),
            (7, Some(_)) => {
                message(&id, session, Some("msg_never_written"), Role::Assistant, MessageType::Text, Status::Pending)
            }
            (8, Some(_)) => match rng.pick(&all[1 - s]).cloned() {
                Some(other) => message(&id, session, Some(&other), Role::Assistant, MessageType::Text, Status::Pending),
                None => message(&id, session, None, Role::System, MessageType::Text, Status::PendingAgent),
            },
            (9, Some(_)) => match rng.pick(&all[s]).cloned() {
                // A reply to any earlier message of the session, root or not.
                Some(parent) => {
                    message(&id, session, Some(&parent), Role::Assistant, MessageType::Text, Status::Pending)
                }
                None => message(&id, session, None, Role::User, MessageType::Text, Status::PendingAgent),
            },
            (10, Some(_)) => message(&id, session, None, Role::System, MessageType::Text, Status::PendingAgent),
            (_, Some(root)) => message(&id, session, Some(root), Role::Tool, MessageType::ToolCall, Status::Responded),
        };
        if m.parent_id.is_some() && m.message_type != MessageType::ToolResult {
            m.step = step;
        }
        if m.parent_id.is_none() {
            roots[s].push(id.clone());
        }
        if m.message_type == MessageType::ToolCall {
            calls[s].push((id.clone(), m.step));
        }
        all[s].push(id);
        out.push(m);
    }
    out
}

async fn history_matches_phased_order_on_random_trajectories(b: &Backend) {
    for seed in 1..=30u64 {
        let messages = random_trajectory(seed);
        let mut rng = Rng(seed ^ 0xABCD);
        // Written in batches of random size, as a turn loop and a gateway would.
        let mut written = Vec::with_capacity(messages.len());
        let mut rest = messages.as_slice();
        while !rest.is_empty() {
            let take = 1 + rng.below(6).min(rest.len() - 1);
            let (batch, tail) = rest.split_at(take);
            let events = b.store.insert_messages(batch).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            written.extend(events.into_iter().map(|e| e.message));
            rest = tail;
        }
        for session in [format!("sess_{seed}_a"), format!("sess_{seed}_b")] {
            let session = SessionId::from(session.as_str());
            let in_write_order: Vec<Message> = written.iter().filter(|m| m.session_id == session).cloned().collect();
            let listed = b.store.list_messages(&kesoku_core::MessageFilter::session(&session)).await.expect("list");
            assert_eq!(listed, in_write_order, "seed {seed}: list is write order");
            let history = b.store.session_history(&session).await.expect("history");
            let expected = phased_order(in_write_order);
            if history != expected {
                let show = |list: &[Message]| list.iter().map(|m| m.id.as_str().to_owned()).collect::<Vec<_>>();
                panic!("seed {seed} session {session}:\n store: {:?}\n  core: {:?}", show(&history), show(&expected));
            }
        }
    }
    // The generator did exercise what it claims to.
    let sample: Vec<Message> = (1..=30u64).flat_map(random_trajectory).collect();
    assert!(sample.iter().any(|m| m.parent_id == Some(MessageId::from("msg_never_written"))));
    assert!(sample.iter().any(|m| m.message_type == MessageType::ToolResult && m.step > 0));
    assert!(sample.iter().any(|m| m.role == Role::System && m.parent_id.is_some()));
}

/// A long session (long enough for the SQLite store to keep its decoded history between reads)
/// read after each round of changes: new turns, a late message placed inside an old turn,
/// status and metadata changes of old rows, and writes by a second store on the same database
/// (another process). Every read must equal the phased order of what is stored.
async fn a_long_history_read_again_and_again_follows_every_change(b: &Backend) {
    let session = "sess_long";
    let mut rng = Rng(7);
    let mut roots = Vec::new();
    let mut answers = Vec::new();
    let mut next_id = 0usize;
    let mut id = |prefix: &str| {
        next_id += 1;
        format!("{prefix}_{next_id:05}")
    };
    let turn = |roots: &mut Vec<String>, answers: &mut Vec<String>, id: &mut dyn FnMut(&str) -> String| {
        let root = id("user");
        let call = id("call");
        let result = id("result");
        let answer = id("answer");
        roots.push(root.clone());
        answers.push(answer.clone());
        let mut call_message =
            message(&call, session, Some(&root), Role::Tool, MessageType::ToolCall, Status::Responded);
        call_message.step = 1;
        let mut result_message =
            message(&result, session, Some(&call), Role::Tool, MessageType::ToolResult, Status::Responded);
        result_message.step = 1;
        let mut answer_message =
            message(&answer, session, Some(&root), Role::Assistant, MessageType::Text, Status::Pending);
        answer_message.step = 2;
        vec![prompt(&root, session), call_message, result_message, answer_message]
    };
    let mut first = Vec::new();
    for _ in 0..80 {
        first.extend(turn(&mut roots, &mut answers, &mut id));
    }
    b.store.insert_messages(&first).await.expect("write 320 messages");
    let other = b.place.open().await.expect("a second store on the same database");
    let other_store = other.store();
    let expect_exact = |round: usize, history: Vec<Message>, stored: Vec<Message>| {
        let expected = phased_order(stored);
        if history != expected {
            let show = |list: &[Message]| {
                list.iter().map(|m| format!("{}:{}", m.id.as_str(), m.status.as_str())).collect::<Vec<_>>()
            };
            panic!("round {round}:\n store: {:?}\n  core: {:?}", show(&history), show(&expected));
        }
    };
    let session_id = SessionId::from(session);
    for round in 0..12 {
        let history = b.store.session_history(&session_id).await.expect("history");
        let stored = b.store.list_messages(&kesoku_core::MessageFilter::session(&session_id)).await.expect("list");
        assert!(stored.len() >= 320);
        expect_exact(round, history, stored);
        // The changes of this round, through this store or the other one.
        let writer = if round % 3 == 2 { &other_store } else { &b.store };
        let new_turn = turn(&mut roots, &mut answers, &mut id);
        writer.insert_messages(&new_turn).await.expect("a new turn");
        // A nudge arriving late in an old turn: its place is in the middle of the history.
        let old_root = roots[rng.below(roots.len() / 2)].clone();
        let mut late =
            message(&id("late"), session, Some(&old_root), Role::System, MessageType::Text, Status::Responded);
        late.step = 3;
        writer.insert_message(&late).await.expect("a late message");
        // Old answers delivered, and metadata changed on an old row.
        for _ in 0..3 {
            let answer = MessageId::from(answers[rng.below(answers.len())].as_str());
            let current = writer.get_message(&answer).await.expect("get").expect("stored");
            if current.status == Status::Pending {
                writer.update_status(&answer, Status::Delivered).await.expect("deliver");
            }
        }
        let root = MessageId::from(roots[rng.below(roots.len())].as_str());
        let mut metadata = kesoku_core::Metadata::default();
        metadata.extra.insert("round".to_owned(), serde_json::json!(round));
        writer.update_metadata(&root, &metadata).await.expect("metadata");
    }
    let history = b.store.session_history(&session_id).await.expect("history");
    let stored = b.store.list_messages(&kesoku_core::MessageFilter::session(&session_id)).await.expect("list");
    assert_eq!(history.len(), 320 + 12 * 5);
    assert!(history.iter().any(|m| m.metadata.extra.contains_key("round")));
    expect_exact(12, history, stored);
    other.close().await;
}
