//! The conformance suites every [`Queue`] and [`Broker`] backend passes (feature
//! `conformance`; test code, never in the binary).
//!
//! A backend's tests instantiate them with a factory:
//!
//! ```ignore
//! mod memory {
//!     kesoku_broker::queue_tests!(async { Some(crate::MemoryQueues) });
//!     kesoku_broker::broker_tests!(async { Some(crate::MemoryBrokers) });
//! }
//! ```
//!
//! The factory expression evaluates to `Option<impl QueueFactory>` (or `BrokerFactory`);
//! `None` skips the suite (a server that is not configured, unless `KESOKU_REQUIRE_SERVERS=1`,
//! which the factory enforces). Every queue or broker a factory makes is independent of the
//! others (its own key prefix on a server). Cases run in real time, never assert on durations,
//! and wait for state with generous bounds.

use std::sync::Arc;

use async_trait::async_trait;

use crate::queue::{Aging, LaneCaps};
use crate::{Broker, Queue};

/// Makes fresh, independent queues.
#[async_trait]
pub trait QueueFactory: Send + Sync {
    async fn queue(&self, aging: Aging, caps: LaneCaps) -> Arc<dyn Queue>;
}

/// Makes fresh, independent brokers, each buffering `capacity` events per subscriber.
#[async_trait]
pub trait BrokerFactory: Send + Sync {
    async fn broker(&self, capacity: usize) -> Arc<dyn Broker>;
}

/// Instantiate every queue case for the factory expression `$factory`.
#[macro_export]
macro_rules! queue_tests {
    ($factory:expr) => {
        $crate::queue_tests!(@cases $factory;
            lanes_go_by_priority,
            aging_promotes_waiting_work,
            lane_caps_keep_room_for_interactive_work,
            one_turn_per_session_at_a_time,
            maintenance_runs_beside_the_turn_only,
            pop_waits_for_a_session_to_free_up,
            depths_count_waiting_and_running,
            remove_session_drops_its_waiting_work,
            an_acknowledged_activation_is_gone,
            a_dropped_lease_frees_its_session,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(factory) = $factory.await else { return };
                $crate::conformance::queue::$case(&factory).await;
            }
        )*
    };
}

/// Instantiate every broker case for the factory expression `$factory`.
#[macro_export]
macro_rules! broker_tests {
    ($factory:expr) => {
        $crate::broker_tests!(@cases $factory;
            every_subscriber_gets_every_event_in_order,
            each_subscriber_gets_only_what_it_is_for,
            control_signals_reach_subscribers,
            a_slow_subscriber_is_told_it_lagged,
            later_subscribers_get_only_later_events,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(factory) = $factory.await else { return };
                $crate::conformance::broker::$case(&factory).await;
            }
        )*
    };
}

/// The queue cases.
#[allow(clippy::expect_used, clippy::panic)]
pub mod queue {
    use std::sync::Arc;
    use std::time::Duration;

    use chrono::Utc;
    use kesoku_core::activation::MaintenanceTask;
    use kesoku_core::{Activation, ActivationId, ActivationPayload, Lane, MessageId, SessionId};

    use super::QueueFactory;
    use crate::Queue;
    use crate::queue::{Aging, LaneCaps, QueueDepths, QueueLease};

    /// Long enough that nothing ages during a case that does not want it to.
    const NO_AGING: Aging = Aging { step: Duration::from_secs(3600) };
    /// How long a case waits for something it expects to happen before failing.
    const PATIENCE: Duration = Duration::from_secs(30);

    pub fn activation(id: &str, session: &str, lane: Lane) -> Activation {
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
    pub fn maintenance(id: &str, session: &str) -> Activation {
        Activation {
            payload: ActivationPayload::Maintenance { task: MaintenanceTask::Title },
            ..activation(id, session, Lane::Background)
        }
    }

    fn depths(interactive: usize, responsive: usize, background: usize, running: usize) -> QueueDepths {
        QueueDepths { interactive, responsive, background, running }
    }

    async fn push(queue: &dyn Queue, activation: Activation) {
        queue.push(activation).await.expect("push");
    }

    async fn next(queue: &dyn Queue) -> Option<QueueLease> {
        queue.try_pop().await.expect("try_pop")
    }

    fn id_of(lease: &Option<QueueLease>) -> &str {
        lease.as_ref().map_or("-", |lease| lease.activation.id.as_str())
    }

    /// Take `n` activations now (holding them), their ids (`-` for none).
    async fn take(queue: &dyn Queue, n: usize, held: &mut Vec<QueueLease>) -> Vec<String> {
        let mut ids = Vec::new();
        for _ in 0..n {
            match next(queue).await {
                Some(lease) => {
                    ids.push(lease.activation.id.to_string());
                    held.push(lease);
                }
                None => ids.push("-".into()),
            }
        }
        ids
    }

    async fn depths_of(queue: &dyn Queue) -> QueueDepths {
        queue.depths().await.expect("depths")
    }

    pub async fn lanes_go_by_priority(factory: &impl QueueFactory) {
        let queue = factory.queue(NO_AGING, LaneCaps::unlimited()).await;
        push(&*queue, activation("bg", "s1", Lane::Background)).await;
        push(&*queue, activation("resp", "s2", Lane::Responsive)).await;
        push(&*queue, activation("int", "s3", Lane::Interactive)).await;
        let mut held = Vec::new();
        assert_eq!(take(&*queue, 4, &mut held).await, ["int", "resp", "bg", "-"]);
    }

    pub async fn aging_promotes_waiting_work(factory: &impl QueueFactory) {
        let step = Duration::from_millis(200);
        let queue = factory.queue(Aging { step }, LaneCaps::unlimited()).await;
        push(&*queue, activation("bg", "s1", Lane::Background)).await;
        // More than two steps: the background activation ranks with fresh interactive work
        // and has waited longer (waiting longer only promotes it further).
        tokio::time::sleep(step * 3).await;
        push(&*queue, activation("int", "s2", Lane::Interactive)).await;
        let mut held = Vec::new();
        assert_eq!(take(&*queue, 2, &mut held).await, ["bg", "int"]);
    }

    pub async fn lane_caps_keep_room_for_interactive_work(factory: &impl QueueFactory) {
        // Four workers: responsive and background together ≤ 3, background ≤ 1.
        let queue = factory.queue(NO_AGING, LaneCaps::for_workers(4)).await;
        for index in 0..3 {
            push(&*queue, activation(&format!("bg{index}"), &format!("b{index}"), Lane::Background)).await;
        }
        for index in 0..2 {
            push(&*queue, activation(&format!("resp{index}"), &format!("r{index}"), Lane::Responsive)).await;
        }
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(next(&*queue).await);
        }
        let handed: Vec<&str> = out.iter().map(id_of).collect();
        assert_eq!(handed, ["resp0", "resp1", "bg0", "-"], "at most one background, at most three automated");
        assert_eq!(depths_of(&*queue).await, depths(0, 0, 2, 3));

        // Every automated slot is taken: a person's message goes out at once, and so does the next.
        push(&*queue, activation("int0", "i0", Lane::Interactive)).await;
        push(&*queue, activation("int1", "i1", Lane::Interactive)).await;
        push(&*queue, activation("resp2", "r2", Lane::Responsive)).await;
        out.push(next(&*queue).await);
        out.push(next(&*queue).await);
        assert_eq!((id_of(&out[4]), id_of(&out[5])), ("int0", "int1"));
        assert!(next(&*queue).await.is_none(), "automation still waits for its slots");
        assert_eq!(depths_of(&*queue).await, depths(0, 1, 2, 5));

        // The background activation ends: its slot goes to the responsive one (a lane above).
        let background = out.remove(2).expect("bg0 is out");
        background.ack().await.expect("ack");
        let resp2 = next(&*queue).await;
        assert_eq!(id_of(&resp2), "resp2");
        out.push(resp2);
        assert!(next(&*queue).await.is_none(), "three automated activations are out again");
        // A responsive one ends: now the background lane gets the slot.
        out.remove(0).expect("resp0 is out").ack().await.expect("ack");
        assert_eq!(id_of(&next(&*queue).await), "bg1");
    }

    pub async fn one_turn_per_session_at_a_time(factory: &impl QueueFactory) {
        let queue = factory.queue(NO_AGING, LaneCaps::unlimited()).await;
        push(&*queue, activation("a1", "s1", Lane::Interactive)).await;
        push(&*queue, activation("a2", "s1", Lane::Interactive)).await;
        push(&*queue, activation("b1", "s2", Lane::Responsive)).await;
        let first = next(&*queue).await.expect("a1 runnable");
        assert_eq!(first.activation.id.as_str(), "a1");
        // s1 is out: its next activation waits, s2's runs.
        let second = next(&*queue).await.expect("b1 runnable");
        assert_eq!(second.activation.id.as_str(), "b1");
        assert!(next(&*queue).await.is_none(), "a2 must wait for a1");
        assert_eq!(depths_of(&*queue).await.running, 2);
        first.ack().await.expect("ack");
        assert_eq!(next(&*queue).await.expect("a2 after a1").activation.id.as_str(), "a2");
    }

    pub async fn maintenance_runs_beside_the_turn_only(factory: &impl QueueFactory) {
        let queue = factory.queue(NO_AGING, LaneCaps::for_workers(16)).await;
        push(&*queue, activation("t1", "s1", Lane::Interactive)).await;
        push(&*queue, maintenance("m1", "s1")).await;
        push(&*queue, maintenance("m2", "s1")).await;
        push(&*queue, activation("t2", "s1", Lane::Interactive)).await;
        push(&*queue, maintenance("m3", "s2")).await;
        let mut held = Vec::new();
        let mut handed = take(&*queue, 3, &mut held).await;
        handed.sort();
        assert_eq!(handed, ["m1", "m3", "t1"]);
        assert!(next(&*queue).await.is_none(), "t2 waits for t1, m2 waits for m1");
        assert_eq!(depths_of(&*queue).await, depths(1, 0, 1, 3));
        let position = held.iter().position(|l| l.activation.id.as_str() == "m1").expect("m1 held");
        held.remove(position).ack().await.expect("ack");
        let m2 = next(&*queue).await;
        assert_eq!(id_of(&m2), "m2", "the next maintenance runs beside the turn");
        held.extend(m2);
        assert!(next(&*queue).await.is_none(), "t2 still waits for t1");
        let position = held.iter().position(|l| l.activation.id.as_str() == "t1").expect("t1 held");
        held.remove(position).ack().await.expect("ack");
        let t2 = next(&*queue).await;
        assert_eq!(id_of(&t2), "t2");
        held.extend(t2);
        assert_eq!(depths_of(&*queue).await, depths(0, 0, 0, 3), "t2, m2 and m3 are out");
    }

    pub async fn pop_waits_for_a_session_to_free_up(factory: &impl QueueFactory) {
        let queue = factory.queue(NO_AGING, LaneCaps::unlimited()).await;
        push(&*queue, activation("a1", "s1", Lane::Interactive)).await;
        push(&*queue, activation("a2", "s1", Lane::Interactive)).await;
        let first = tokio::time::timeout(PATIENCE, queue.pop()).await.expect("a1 in time").expect("pop");
        assert_eq!(first.activation.id.as_str(), "a1");
        let waiter = {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move { queue.pop().await.map(|l| l.activation.id.to_string()) })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a2 waits while a1 is out");
        first.ack().await.expect("ack");
        let next = tokio::time::timeout(PATIENCE, waiter).await.expect("a2 in time").expect("join").expect("pop");
        assert_eq!(next, "a2");

        // New work wakes a waiting pop too.
        let waiter = {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move { queue.pop().await.map(|l| l.activation.id.to_string()) })
        };
        push(&*queue, activation("b1", "s2", Lane::Background)).await;
        let next = tokio::time::timeout(PATIENCE, waiter).await.expect("b1 in time").expect("join").expect("pop");
        assert_eq!(next, "b1");
    }

    pub async fn depths_count_waiting_and_running(factory: &impl QueueFactory) {
        let queue = factory.queue(NO_AGING, LaneCaps::unlimited()).await;
        assert_eq!(depths_of(&*queue).await, depths(0, 0, 0, 0));
        push(&*queue, activation("i1", "s1", Lane::Interactive)).await;
        push(&*queue, activation("i2", "s2", Lane::Interactive)).await;
        push(&*queue, activation("r1", "s3", Lane::Responsive)).await;
        push(&*queue, activation("b1", "s4", Lane::Background)).await;
        assert_eq!(depths_of(&*queue).await, depths(2, 1, 1, 0));
        assert_eq!(depths_of(&*queue).await.waiting(), 4);
        let lease = next(&*queue).await.expect("i1");
        assert_eq!(depths_of(&*queue).await, depths(1, 1, 1, 1));
        lease.ack().await.expect("ack");
        assert_eq!(depths_of(&*queue).await, depths(1, 1, 1, 0));
    }

    pub async fn remove_session_drops_its_waiting_work(factory: &impl QueueFactory) {
        let queue = factory.queue(NO_AGING, LaneCaps::unlimited()).await;
        push(&*queue, activation("a1", "s1", Lane::Interactive)).await;
        push(&*queue, activation("a2", "s1", Lane::Background)).await;
        push(&*queue, activation("b1", "s2", Lane::Interactive)).await;
        let mut removed: Vec<String> = queue
            .remove_session(&SessionId::from("s1"))
            .await
            .expect("remove")
            .into_iter()
            .map(|a| a.id.to_string())
            .collect();
        removed.sort();
        assert_eq!(removed, ["a1", "a2"]);
        assert_eq!(depths_of(&*queue).await, depths(1, 0, 0, 0));
        let mut held = Vec::new();
        assert_eq!(take(&*queue, 2, &mut held).await, ["b1", "-"]);
        assert!(queue.remove_session(&SessionId::from("s1")).await.expect("remove").is_empty());
    }

    pub async fn an_acknowledged_activation_is_gone(factory: &impl QueueFactory) {
        let queue = factory.queue(NO_AGING, LaneCaps::unlimited()).await;
        push(&*queue, activation("a1", "s1", Lane::Interactive)).await;
        let lease = next(&*queue).await.expect("a1");
        lease.ack().await.expect("ack");
        assert!(next(&*queue).await.is_none(), "an acknowledged activation never comes back");
        assert_eq!(depths_of(&*queue).await, depths(0, 0, 0, 0));
    }

    pub async fn a_dropped_lease_frees_its_session(factory: &impl QueueFactory) {
        let queue = factory.queue(NO_AGING, LaneCaps::for_workers(1)).await;
        push(&*queue, activation("a1", "s1", Lane::Background)).await;
        push(&*queue, activation("a2", "s1", Lane::Background)).await;
        let lease = next(&*queue).await.expect("a1");
        assert_eq!(lease.activation.id.as_str(), "a1");
        assert!(next(&*queue).await.is_none(), "a2 waits for a1 (and for the one background slot)");
        // A panic or a shutdown drops the lease without acknowledging it.
        drop(lease);
        assert_eq!(id_of(&next(&*queue).await), "a2", "the session and the lane slot are free again");
    }
}

/// The broker cases.
#[allow(clippy::expect_used, clippy::panic)]
pub mod broker {
    use std::time::Duration;

    use kesoku_core::{Message, MessageFilter, SessionId, Status};

    use super::BrokerFactory;
    use crate::{BrokerEvent, Control, Interest, MessageNotice, Received, StopReason, Subscription};

    const PATIENCE: Duration = Duration::from_secs(30);

    pub fn stop(n: usize) -> BrokerEvent {
        BrokerEvent::Control(Control::Stop {
            session_id: SessionId::from(format!("s{n}")),
            reason: StopReason::UserRequest,
            unless_root: None,
        })
    }

    pub fn message(session: &str, status: Status) -> BrokerEvent {
        let mut message = Message::user_text(&SessionId::from(session), "cli", "cli", "User", "hi");
        message.status = status;
        BrokerEvent::Message(Box::new(MessageNotice { rev: 1, created: true, message }))
    }

    async fn recv(subscription: &mut Box<dyn Subscription>) -> Received {
        tokio::time::timeout(PATIENCE, subscription.recv()).await.expect("an event in time")
    }

    pub async fn every_subscriber_gets_every_event_in_order(factory: &impl BrokerFactory) {
        let broker = factory.broker(16).await;
        let mut a = broker.subscribe(Interest::Everything).await.expect("subscribe");
        let mut b = broker.subscribe(Interest::Everything).await.expect("subscribe");
        for n in 0..3 {
            broker.publish(stop(n)).await.expect("publish");
        }
        for sub in [&mut a, &mut b] {
            for n in 0..3 {
                assert_eq!(recv(sub).await, Received::Event(stop(n)));
            }
        }
    }

    pub async fn each_subscriber_gets_only_what_it_is_for(factory: &impl BrokerFactory) {
        let broker = factory.broker(16).await;
        let mut controls = broker.subscribe(Interest::Controls).await.expect("subscribe");
        let mut pending =
            broker.subscribe(Interest::Messages(MessageFilter::status(Status::PendingAgent))).await.expect("subscribe");
        let mut everything = broker.subscribe(Interest::Everything).await.expect("subscribe");

        let waiting = message("s2", Status::PendingAgent);
        let sequence =
            [message("s1", Status::Processed), stop(1), waiting.clone(), message("s3", Status::Processing), stop(2)];
        for event in &sequence {
            broker.publish(event.clone()).await.expect("publish");
        }
        // Each one's first events are the ones it is for, in order: the others never reached it.
        assert_eq!(recv(&mut controls).await, Received::Event(stop(1)));
        assert_eq!(recv(&mut controls).await, Received::Event(stop(2)));
        assert_eq!(recv(&mut pending).await, Received::Event(waiting));
        let later = message("s4", Status::PendingAgent);
        broker.publish(later.clone()).await.expect("publish");
        assert_eq!(recv(&mut pending).await, Received::Event(later));
        for event in sequence {
            assert_eq!(recv(&mut everything).await, Received::Event(event));
        }
    }

    pub async fn control_signals_reach_subscribers(factory: &impl BrokerFactory) {
        let broker = factory.broker(16).await;
        let mut controls = broker.subscribe(Interest::Controls).await.expect("subscribe");
        let signal = BrokerEvent::Control(Control::Stop {
            session_id: SessionId::from("s9"),
            reason: StopReason::NewerMessage,
            unless_root: Some(kesoku_core::MessageId::from("m2")),
        });
        broker.publish(signal.clone()).await.expect("publish");
        assert_eq!(recv(&mut controls).await, Received::Event(signal));
    }

    pub async fn a_slow_subscriber_is_told_it_lagged(factory: &impl BrokerFactory) {
        let broker = factory.broker(4).await;
        let mut slow = broker.subscribe(Interest::Everything).await.expect("subscribe");
        for n in 0..10 {
            broker.publish(stop(n)).await.expect("publish never blocks");
        }
        assert_eq!(recv(&mut slow).await, Received::Lagged { missed: 6 });
        // After the lag it goes on with what its buffer still holds (the rest is in the store).
        for n in 0..4 {
            assert_eq!(recv(&mut slow).await, Received::Event(stop(n)));
        }
        broker.publish(stop(10)).await.expect("publish");
        assert_eq!(recv(&mut slow).await, Received::Event(stop(10)));
    }

    pub async fn later_subscribers_get_only_later_events(factory: &impl BrokerFactory) {
        let broker = factory.broker(16).await;
        broker.publish(stop(1)).await.expect("publish");
        let mut late = broker.subscribe(Interest::Everything).await.expect("subscribe");
        broker.publish(stop(2)).await.expect("publish");
        assert_eq!(recv(&mut late).await, Received::Event(stop(2)));
    }
}
