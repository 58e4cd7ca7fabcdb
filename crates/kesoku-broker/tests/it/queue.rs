use std::time::Duration;

use chrono::Utc;
use kesoku_broker::queue::Aging;
use kesoku_broker::{MemoryQueue, Queue};
use kesoku_core::{Activation, ActivationId, ActivationPayload, Lane, MessageId, SessionId};

fn activation(id: &str, session: &str, lane: Lane) -> Activation {
    Activation {
        id: ActivationId::from(id),
        session_id: SessionId::from(session),
        chatbot_id: "cli".into(),
        channel_id: "cli".into(),
        triggered_by: "User".into(),
        delegation_user: None,
        depth: 0,
        lane,
        expected_response: Default::default(),
        locale: None,
        timezone: None,
        model: None,
        output_schema: None,
        created_at: Utc::now(),
        payload: ActivationPayload::Message { message_id: MessageId::from(id) },
    }
}

fn ids(queue: &MemoryQueue, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut leases = Vec::new();
    for _ in 0..n {
        match queue.try_pop() {
            Some(lease) => {
                out.push(lease.activation.id.to_string());
                leases.push(lease);
            }
            None => out.push("-".into()),
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn interactive_first_then_responsive_then_background() {
    let queue = MemoryQueue::new(Aging { step: Duration::from_secs(60) });
    queue.push(activation("bg", "s1", Lane::Background)).await.expect("push");
    queue.push(activation("resp", "s2", Lane::Responsive)).await.expect("push");
    queue.push(activation("int", "s3", Lane::Interactive)).await.expect("push");
    assert_eq!(ids(&queue, 3), ["int", "resp", "bg"]);
}

#[tokio::test(start_paused = true)]
async fn aging_promotes_waiting_work_so_it_never_starves() {
    let queue = MemoryQueue::new(Aging { step: Duration::from_secs(5) });
    queue.push(activation("bg", "s1", Lane::Background)).await.expect("push");
    tokio::time::advance(Duration::from_secs(11)).await;
    // Two aging steps: background now ranks with fresh interactive work and has waited longer.
    queue.push(activation("int", "s2", Lane::Interactive)).await.expect("push");
    assert_eq!(ids(&queue, 2), ["bg", "int"]);
}

#[tokio::test(start_paused = true)]
async fn one_activation_per_session_at_a_time_in_order() {
    let queue = MemoryQueue::default();
    queue.push(activation("a1", "s1", Lane::Interactive)).await.expect("push");
    queue.push(activation("a2", "s1", Lane::Interactive)).await.expect("push");
    queue.push(activation("b1", "s2", Lane::Responsive)).await.expect("push");
    let first = queue.try_pop().expect("a1 runnable");
    assert_eq!(first.activation.id.as_str(), "a1");
    // s1 is out: its next activation waits, s2's runs.
    let second = queue.try_pop().expect("b1 runnable");
    assert_eq!(second.activation.id.as_str(), "b1");
    assert!(queue.try_pop().is_none(), "a2 must wait for a1");
    assert_eq!(queue.depths().running, 2);
    first.release();
    assert_eq!(queue.try_pop().expect("a2 after release").activation.id.as_str(), "a2");
}

#[tokio::test(start_paused = true)]
async fn pop_waits_until_work_arrives_or_a_session_frees_up() {
    let queue = MemoryQueue::default();
    queue.push(activation("a1", "s1", Lane::Interactive)).await.expect("push");
    queue.push(activation("a2", "s1", Lane::Interactive)).await.expect("push");
    let first = queue.pop().await.expect("pop");
    let waiter = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.pop().await.map(|l| l.activation.id.to_string()) })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    drop(first);
    let next = waiter.await.expect("join").expect("pop");
    assert_eq!(next, "a2");
    let removed = queue.remove_session(&SessionId::from("s1"));
    assert!(removed.is_empty());
}
