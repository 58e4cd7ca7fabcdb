use kesoku_broker::{Broker, BrokerEvent, Control, Interest, MemoryBroker, MessageNotice, Received, StopReason};
use kesoku_core::{Message, MessageFilter, SessionId, Status};

fn stop(n: usize) -> BrokerEvent {
    BrokerEvent::Control(Control::Stop {
        session_id: SessionId::from(format!("s{n}")),
        reason: StopReason::UserRequest,
        unless_root: None,
    })
}

#[tokio::test]
async fn every_subscriber_gets_every_event_in_order() {
    let broker = MemoryBroker::new(16);
    let mut a = broker.subscribe(Interest::Everything).await.expect("subscribe");
    let mut b = broker.subscribe(Interest::Everything).await.expect("subscribe");
    for n in 0..3 {
        broker.publish(stop(n)).await.expect("publish");
    }
    for sub in [&mut a, &mut b] {
        for n in 0..3 {
            assert_eq!(sub.recv().await, Received::Event(stop(n)));
        }
    }
}

#[tokio::test]
async fn a_slow_subscriber_is_told_it_lagged_instead_of_blocking_the_publisher() {
    let broker = MemoryBroker::new(4);
    let mut slow = broker.subscribe(Interest::Everything).await.expect("subscribe");
    for n in 0..10 {
        broker.publish(stop(n)).await.expect("publish never blocks");
    }
    assert_eq!(slow.recv().await, Received::Lagged { missed: 6 });
    // After the lag it goes on with what its buffer still holds (the rest is in the store).
    for n in 0..4 {
        assert_eq!(slow.recv().await, Received::Event(stop(n)));
    }
    broker.publish(stop(10)).await.expect("publish");
    assert_eq!(slow.recv().await, Received::Event(stop(10)));
}

#[tokio::test]
async fn events_serialize_for_remote_brokers() {
    let json = serde_json::to_value(stop(1)).expect("serialize");
    assert_eq!(json["event"], "control");
    assert_eq!(json["control"], "stop");
    assert_eq!(json["reason"], "user_request");
    let back: BrokerEvent = serde_json::from_value(json).expect("deserialize");
    assert_eq!(back, stop(1));
}

fn message(session: &str, status: Status) -> BrokerEvent {
    let mut message = Message::user_text(&SessionId::from(session), "cli", "cli", "User", "hi");
    message.status = status;
    BrokerEvent::Message(Box::new(MessageNotice { rev: 1, created: true, message }))
}

#[tokio::test]
async fn each_subscriber_gets_only_the_events_it_is_for() {
    let broker = MemoryBroker::new(16);
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
    assert_eq!(controls.recv().await, Received::Event(stop(1)));
    assert_eq!(controls.recv().await, Received::Event(stop(2)));
    assert_eq!(pending.recv().await, Received::Event(waiting));
    let later = message("s4", Status::PendingAgent);
    broker.publish(later.clone()).await.expect("publish");
    assert_eq!(pending.recv().await, Received::Event(later));
    for event in sequence {
        assert_eq!(everything.recv().await, Received::Event(event));
    }
}

#[tokio::test]
async fn subscriptions_end_when_the_broker_goes() {
    let broker = MemoryBroker::new(4);
    let mut subscription = broker.subscribe(Interest::Everything).await.expect("subscribe");
    broker.publish(stop(1)).await.expect("publish");
    drop(broker);
    assert_eq!(subscription.recv().await, Received::Event(stop(1)));
    assert_eq!(subscription.recv().await, Received::Closed);
}
