use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kesoku_broker::MemoryBroker;
use kesoku_core::{Message, MessageFilter, SessionId, Status};
use kesoku_gateway::{Gateway, ListenFrom};
use kesoku_test_support::db;

/// A gateway over a fresh SQLite store and a broker with a tiny ring (so lag is easy to cause).
async fn gateway(capacity: usize) -> (Gateway, tempfile::TempDir) {
    let (dir, url) = db::temp_sqlite_url();
    let handle = kesoku_store::open(&url).await.expect("open store");
    (Gateway::new(handle.store, Arc::new(MemoryBroker::new(capacity))), dir)
}

fn user(session: &SessionId, n: usize) -> Message {
    Message::user_text(session, "cli", "cli", "User", format!("m{n}"))
}

async fn next_with_timeout<S: futures::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    tokio::time::timeout(Duration::from_secs(5), stream.next()).await.ok().flatten()
}

#[tokio::test]
async fn post_persists_then_announces() {
    let (gateway, _db) = gateway(64).await;
    let session = SessionId::from("s1");
    let mut live = Box::pin(gateway.listen(MessageFilter::session(&session), ListenFrom::Now));
    // Let the stream subscribe before posting.
    let posted = {
        let gateway = gateway.clone();
        let message = user(&session, 1);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            gateway.post(&message).await.expect("post")
        })
    };
    let event = next_with_timeout(&mut live).await.expect("an event").expect("not an error");
    let posted = posted.await.expect("join");
    assert_eq!(event.message.id, posted.message.id);
    assert!(event.created);
    let stored = gateway.store().get_message(&posted.message.id).await.expect("get").expect("stored");
    assert_eq!(stored.content, "m1");
}

#[tokio::test]
async fn current_yields_stored_work_then_live_without_duplicates() {
    let (gateway, _db) = gateway(64).await;
    let session = SessionId::from("s1");
    let first = gateway.post(&user(&session, 1)).await.expect("post");
    let done = gateway.post(&user(&session, 2)).await.expect("post");
    gateway.claim(&done.message.id, Status::Processing, &[Status::PendingAgent], "w").await.expect("claim");
    // A restarted dispatcher asks for its pending work: it gets the stored one, then live ones.
    let mut stream = Box::pin(gateway.listen(MessageFilter::status(Status::PendingAgent), ListenFrom::Current));
    let recovered = next_with_timeout(&mut stream).await.expect("event").expect("ok");
    assert_eq!(recovered.message.id, first.message.id);
    let third = gateway.post(&user(&session, 3)).await.expect("post");
    let live = next_with_timeout(&mut stream).await.expect("event").expect("ok");
    assert_eq!(live.message.id, third.message.id);
    // Claiming the third one changes its status: it no longer matches, so nothing more comes.
    gateway.claim(&third.message.id, Status::Processing, &[Status::PendingAgent], "w").await.expect("claim");
    assert!(tokio::time::timeout(Duration::from_millis(200), stream.next()).await.is_err());
}

#[tokio::test]
async fn a_slow_listener_catches_up_from_the_store_and_loses_nothing() {
    let (gateway, _db) = gateway(4).await;
    let session = SessionId::from("s1");
    let mut stream = Box::pin(gateway.listen(MessageFilter::session(&session), ListenFrom::AfterRev(0)));
    // Start the stream (it subscribes), then flood far past the broadcast ring.
    let first = gateway.post(&user(&session, 0)).await.expect("post");
    let event = next_with_timeout(&mut stream).await.expect("event").expect("ok");
    assert_eq!(event.message.id, first.message.id);
    let mut expected = HashSet::new();
    for n in 1..=200 {
        expected.insert(gateway.post(&user(&session, n)).await.expect("post").message.id);
    }
    let mut got = HashSet::new();
    while got.len() < expected.len() {
        let event = next_with_timeout(&mut stream).await.expect("no message may be lost").expect("ok");
        assert!(got.insert(event.message.id.clone()), "duplicate {}", event.message.id);
    }
    assert_eq!(got, expected);
    assert!(tokio::time::timeout(Duration::from_millis(200), stream.next()).await.is_err(), "nothing extra");
}

#[tokio::test]
async fn claim_is_announced_only_to_the_winner() {
    let (gateway, _db) = gateway(64).await;
    let session = SessionId::from("s1");
    let posted = gateway.post(&user(&session, 1)).await.expect("post");
    let won = gateway.claim(&posted.message.id, Status::Processing, &[Status::PendingAgent], "a").await.expect("claim");
    let lost =
        gateway.claim(&posted.message.id, Status::Processing, &[Status::PendingAgent], "b").await.expect("claim");
    assert!(won.is_some());
    assert!(lost.is_none());
    let illegal = gateway.update_status(&posted.message.id, Status::Delivered).await;
    assert!(illegal.is_err(), "processing -> delivered is not in the table");
}

/// Each gateway reports what its own listeners' duplicate filters hold: two gateways in one
/// process (as two services in one test binary, or a benchmark beside a service) do not see
/// each other's listeners, and a listener's ids leave the count when it is dropped.
#[tokio::test]
async fn each_gateway_reports_its_own_listeners_memory() {
    let (first, _first_db) = gateway(64).await;
    let (second, _second_db) = gateway(64).await;
    let session = SessionId::from("s1");
    for n in 0..3 {
        first.post(&user(&session, n)).await.expect("post");
    }
    for n in 0..7 {
        second.post(&user(&session, n)).await.expect("post");
    }
    let mut first_listener = Box::pin(first.listen(MessageFilter::session(&session), ListenFrom::Current));
    let mut second_listener = Box::pin(second.listen(MessageFilter::session(&session), ListenFrom::Current));
    for _ in 0..3 {
        next_with_timeout(&mut first_listener).await.expect("event").expect("ok");
    }
    for _ in 0..7 {
        next_with_timeout(&mut second_listener).await.expect("event").expect("ok");
    }
    let (first_memory, second_memory) = (first.listener_memory(), second.listener_memory());
    assert_eq!(first_memory.dedup_ids, 3, "{first_memory:?}");
    assert_eq!(second_memory.dedup_ids, 7, "{second_memory:?}");
    assert!(first_memory.dedup_table_bytes > 0 && second_memory.dedup_table_bytes > 0);
    // A clone counts into its gateway's figures.
    assert_eq!(first.clone().listener_memory(), first_memory);

    drop(second_listener);
    assert_eq!(second.listener_memory(), kesoku_gateway::ListenerMemory::default());
    assert_eq!(first.listener_memory(), first_memory, "dropping another gateway's listener changed this one's");
}
