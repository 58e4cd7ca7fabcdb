use kesoku_broker::{Broker, BrokerEvent, Control, MemoryBroker, Received, StopReason};
use kesoku_core::SessionId;

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
    let mut a = broker.subscribe().await.expect("subscribe");
    let mut b = broker.subscribe().await.expect("subscribe");
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
    let mut slow = broker.subscribe().await.expect("subscribe");
    for n in 0..10 {
        broker.publish(stop(n)).await.expect("publish never blocks");
    }
    assert_eq!(slow.recv().await, Received::Lagged { missed: 6 });
    // After the lag it continues with what is still in the ring.
    assert_eq!(slow.recv().await, Received::Event(stop(6)));
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
