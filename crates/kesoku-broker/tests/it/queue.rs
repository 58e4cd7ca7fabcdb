use std::time::Duration;

use chrono::Utc;
use kesoku_broker::queue::{Aging, LaneCaps, QueueLease};
use kesoku_broker::{MemoryQueue, Queue, QueueDepths};
use kesoku_core::activation::MaintenanceTask;
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
        agent: None,
        orchestration: None,
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

/// A background maintenance activation (a title) of `session`.
fn maintenance(id: &str, session: &str) -> Activation {
    Activation {
        payload: ActivationPayload::Maintenance { task: MaintenanceTask::Title },
        ..activation(id, session, Lane::Background)
    }
}

fn id_of(lease: &Option<QueueLease>) -> &str {
    lease.as_ref().map_or("-", |lease| lease.activation.id.as_str())
}

fn depths(interactive: usize, responsive: usize, background: usize, running: usize) -> QueueDepths {
    QueueDepths { interactive, responsive, background, running }
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
    let queue = MemoryQueue::new(Aging { step: Duration::from_secs(60) }, LaneCaps::unlimited());
    queue.push(activation("bg", "s1", Lane::Background)).await.expect("push");
    queue.push(activation("resp", "s2", Lane::Responsive)).await.expect("push");
    queue.push(activation("int", "s3", Lane::Interactive)).await.expect("push");
    assert_eq!(ids(&queue, 3), ["int", "resp", "bg"]);
}

#[tokio::test(start_paused = true)]
async fn aging_promotes_waiting_work_so_it_never_starves() {
    let queue = MemoryQueue::new(Aging { step: Duration::from_secs(5) }, LaneCaps::unlimited());
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
    assert_eq!(queue.depths_now().running, 2);
    first.ack().await.expect("ack");
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
    let removed = Queue::remove_session(&queue, &SessionId::from("s1")).await.expect("remove");
    assert!(removed.is_empty());
}

#[test]
fn caps_keep_a_quarter_of_the_workers_free_of_automation() {
    let caps = |workers| {
        let caps = LaneCaps::for_workers(workers);
        (caps.responsive_and_background, caps.background)
    };
    assert_eq!(caps(0), (1, 1), "no pool still runs every lane");
    assert_eq!(caps(1), (1, 1), "one worker serves every lane");
    assert_eq!(caps(2), (1, 1));
    assert_eq!(caps(4), (3, 1));
    assert_eq!(caps(16), (12, 4));
    assert_eq!(MemoryQueue::for_workers(16).caps(), LaneCaps { responsive_and_background: 12, background: 4 });
}

#[tokio::test(start_paused = true)]
async fn interactive_work_is_handed_out_at_once_when_automation_fills_its_caps() {
    // Four workers: responsive and background together ≤ 3, background ≤ 1.
    let queue = MemoryQueue::new(Aging { step: Duration::from_secs(60) }, LaneCaps::for_workers(4));
    for index in 0..3 {
        queue.push(activation(&format!("bg{index}"), &format!("b{index}"), Lane::Background)).await.expect("push");
    }
    for index in 0..2 {
        queue.push(activation(&format!("resp{index}"), &format!("r{index}"), Lane::Responsive)).await.expect("push");
    }
    let mut out = Vec::new();
    for _ in 0..4 {
        out.push(queue.try_pop());
    }
    let handed: Vec<&str> = out.iter().map(id_of).collect();
    assert_eq!(handed, ["resp0", "resp1", "bg0", "-"], "at most one background, at most three automated");
    assert_eq!(queue.depths_now(), depths(0, 0, 2, 3));

    // Every automated slot is taken: a person's message goes out at once, and so does the next.
    queue.push(activation("int0", "i0", Lane::Interactive)).await.expect("push");
    queue.push(activation("int1", "i1", Lane::Interactive)).await.expect("push");
    queue.push(activation("resp2", "r2", Lane::Responsive)).await.expect("push");
    out.push(queue.try_pop());
    out.push(queue.try_pop());
    assert_eq!((id_of(&out[4]), id_of(&out[5])), ("int0", "int1"));
    assert!(queue.try_pop().is_none(), "automation still waits for its slots");
    assert_eq!(queue.depths_now(), depths(0, 1, 2, 5));

    // The background activation ends: its automated slot goes to the responsive one (a lane
    // above), and the background lane, with a free slot of its own, still waits for the total.
    drop(out.remove(2));
    let next = queue.try_pop();
    assert_eq!(id_of(&next), "resp2");
    assert!(queue.try_pop().is_none(), "three automated activations are out again");
    assert_eq!(queue.depths_now(), depths(0, 0, 2, 5));
    // A responsive one ends: now the background lane gets the slot.
    drop(out.remove(0));
    assert_eq!(id_of(&queue.try_pop()), "bg1");
}

#[tokio::test(start_paused = true)]
async fn without_caps_automation_can_take_every_slot() {
    let queue = MemoryQueue::new(Aging { step: Duration::from_secs(60) }, LaneCaps::unlimited());
    for index in 0..4 {
        queue.push(activation(&format!("bg{index}"), &format!("b{index}"), Lane::Background)).await.expect("push");
    }
    let out: Vec<Option<QueueLease>> = (0..4).map(|_| queue.try_pop()).collect();
    assert!(out.iter().all(Option::is_some), "all four background activations go out");
    assert_eq!(queue.depths_now(), depths(0, 0, 0, 4));
}

#[tokio::test(start_paused = true)]
async fn background_progresses_under_a_stream_of_interactive_work() {
    let queue = MemoryQueue::new(Aging { step: Duration::from_secs(5) }, LaneCaps::for_workers(4));
    queue.push(activation("bg", "b", Lane::Background)).await.expect("push");
    // One worker's worth of interactive work: every second a new message arrives and the
    // worker takes the best runnable activation.
    let mut handed = Vec::new();
    for second in 0..12 {
        queue.push(activation(&format!("int{second}"), &format!("i{second}"), Lane::Interactive)).await.expect("push");
        let lease = queue.try_pop().expect("something is runnable");
        handed.push(lease.activation.id.to_string());
        drop(lease);
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let at = handed.iter().position(|id| id == "bg").expect("the background activation ran");
    // Two aging steps (10 s) lift it to the interactive lane, where it has waited longest.
    assert_eq!(at, 10, "{handed:?}");
    assert!(handed[..at].iter().all(|id| id.starts_with("int")), "{handed:?}");
    assert_eq!(queue.depths_now(), depths(1, 0, 0, 0), "one interactive message is still waiting");
}

#[tokio::test(start_paused = true)]
async fn maintenance_runs_beside_its_sessions_turn_but_not_beside_its_other_maintenance() {
    let queue = MemoryQueue::new(Aging::default(), LaneCaps::for_workers(16));
    queue.push(activation("t1", "s1", Lane::Interactive)).await.expect("push");
    queue.push(maintenance("m1", "s1")).await.expect("push");
    queue.push(maintenance("m2", "s1")).await.expect("push");
    queue.push(activation("t2", "s1", Lane::Interactive)).await.expect("push");
    queue.push(maintenance("m3", "s2")).await.expect("push");
    let turn = queue.try_pop();
    let first_maintenance = queue.try_pop();
    let other_session = queue.try_pop();
    assert_eq!((id_of(&turn), id_of(&first_maintenance), id_of(&other_session)), ("t1", "m1", "m3"));
    assert!(queue.try_pop().is_none(), "t2 waits for t1, m2 waits for m1");
    assert_eq!(queue.depths_now(), depths(1, 0, 1, 3));

    drop(first_maintenance);
    let second_maintenance = queue.try_pop();
    assert_eq!(id_of(&second_maintenance), "m2", "the next maintenance runs beside the same turn");
    assert!(queue.try_pop().is_none(), "t2 still waits for t1");
    drop(turn);
    let next_turn = queue.try_pop();
    assert_eq!(id_of(&next_turn), "t2");
    assert_eq!(queue.depths_now(), depths(0, 0, 0, 3), "t2, m2 and m3 are out");
}

#[tokio::test(start_paused = true)]
async fn pop_wakes_when_a_lane_slot_frees_up() {
    let queue = MemoryQueue::new(Aging { step: Duration::from_secs(60) }, LaneCaps::for_workers(2));
    queue.push(activation("bg1", "b1", Lane::Background)).await.expect("push");
    queue.push(activation("bg2", "b2", Lane::Background)).await.expect("push");
    let first = queue.pop().await.expect("pop");
    assert_eq!(first.activation.id.as_str(), "bg1");
    let waiter = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.pop().await.map(|l| l.activation.id.to_string()) })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "bg2 waits: the one background slot is taken");
    first.ack().await.expect("ack");
    assert_eq!(waiter.await.expect("join").expect("pop"), "bg2");
}
