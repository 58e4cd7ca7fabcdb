//! The Redis backends across processes: each queue or broker made here stands for a process;
//! those sharing a key prefix share the work and the events.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kesoku_broker::conformance::broker::stop;
use kesoku_broker::conformance::queue::activation;
use kesoku_broker::queue::{Aging, LaneCaps};
use kesoku_broker::{Broker, Interest, Queue, Received, RedisBroker, RedisOptions, RedisQueue};
use kesoku_core::Lane;

use crate::{fresh_options, redis_url};

const PATIENCE: Duration = Duration::from_secs(30);

async fn queue(options: &RedisOptions) -> RedisQueue {
    RedisQueue::connect(options, Aging::default(), LaneCaps::unlimited()).await.expect("connect to the test Redis")
}

/// Options whose silent entries are taken over quickly.
fn quick_reclaim(url: &str) -> RedisOptions {
    RedisOptions { reclaim_after: Duration::from_millis(300), ..fresh_options(url) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_entry_of_a_dead_process_is_taken_over() {
    let Some(url) = redis_url() else { return };
    let options = quick_reclaim(&url);
    let first = queue(&options).await;
    let second = queue(&options).await;
    first.push(activation("a1", "s1", Lane::Interactive)).await.expect("push");
    let lease = first.try_pop().await.expect("try_pop").expect("a1");
    // The first process dies mid-turn: its lease is never acknowledged, nothing keeps it alive.
    drop(lease);
    drop(first);
    let taken = tokio::time::timeout(PATIENCE, second.pop()).await.expect("a1 taken over in time").expect("pop");
    assert_eq!(taken.activation.id.as_str(), "a1");
    taken.ack().await.expect("ack");
    assert_eq!(second.depths().await.expect("depths").waiting(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_entry_never_comes_back() {
    let Some(url) = redis_url() else { return };
    let options = quick_reclaim(&url);
    let first = queue(&options).await;
    let second = queue(&options).await;
    first.push(activation("a1", "s1", Lane::Interactive)).await.expect("push");
    let lease = first.try_pop().await.expect("try_pop").expect("a1");
    lease.ack().await.expect("ack");
    drop(first);
    // Several reclaim periods: an entry still pending would be taken over by now.
    tokio::time::sleep(options.reclaim_after * 4).await;
    assert!(second.try_pop().await.expect("try_pop").is_none());
    assert_eq!(second.depths().await.expect("depths").waiting(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_turn_keeps_its_entry() {
    let Some(url) = redis_url() else { return };
    let options = quick_reclaim(&url);
    let running = queue(&options).await;
    let other = queue(&options).await;
    running.push(activation("a1", "s1", Lane::Interactive)).await.expect("push");
    let lease = running.try_pop().await.expect("try_pop").expect("a1");
    // The turn lasts many reclaim periods; its process is alive, so nobody takes it over.
    for _ in 0..8 {
        tokio::time::sleep(options.reclaim_after / 2).await;
        assert!(other.try_pop().await.expect("try_pop").is_none(), "a1 is still running in the first process");
    }
    lease.ack().await.expect("ack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_work_without_handing_one_entry_to_both() {
    let Some(url) = redis_url() else { return };
    let options = fresh_options(&url);
    let processes = [Arc::new(queue(&options).await), Arc::new(queue(&options).await)];
    const TOTAL: usize = 60;
    let lanes = [Lane::Interactive, Lane::Responsive, Lane::Background];
    for index in 0..TOTAL {
        let lane = lanes[index % 3];
        processes[0].push(activation(&format!("a{index}"), &format!("s{}", index % 20), lane)).await.expect("push");
    }
    let handed = Arc::new(std::sync::Mutex::new(Vec::<(usize, String)>::new()));
    let mut workers = Vec::new();
    for (process, queue) in processes.iter().enumerate() {
        for _ in 0..3 {
            let queue = Arc::clone(queue);
            let handed = Arc::clone(&handed);
            workers.push(tokio::spawn(async move {
                loop {
                    let lease = tokio::select! {
                        lease = queue.pop() => lease.expect("pop"),
                        () = tokio::time::sleep(Duration::from_secs(2)) => return,
                    };
                    handed.lock().expect("lock").push((process, lease.activation.id.to_string()));
                    // A short turn, so that both processes get a share.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    lease.ack().await.expect("ack");
                }
            }));
        }
    }
    for worker in workers {
        tokio::time::timeout(PATIENCE * 2, worker).await.expect("workers finish").expect("join");
    }
    let handed = handed.lock().expect("lock").clone();
    let mut times: HashMap<&str, usize> = HashMap::new();
    for (_, id) in &handed {
        *times.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(times.len(), TOTAL, "every activation ran");
    assert!(times.values().all(|&n| n == 1), "no activation ran twice: {times:?}");
    for process in 0..2 {
        assert!(handed.iter().any(|(p, _)| *p == process), "process {process} got a share");
    }
    assert_eq!(processes[1].depths().await.expect("depths").waiting(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_every_process_once() {
    let Some(url) = redis_url() else { return };
    let options = fresh_options(&url);
    let here = RedisBroker::connect(&options).await.expect("connect");
    let there = RedisBroker::connect(&options).await.expect("connect");
    let elsewhere = RedisBroker::connect(&fresh_options(&url)).await.expect("connect");
    let mut local = here.subscribe(Interest::Everything).await.expect("subscribe");
    let mut remote = there.subscribe(Interest::Controls).await.expect("subscribe");
    let mut unrelated = elsewhere.subscribe(Interest::Everything).await.expect("subscribe");
    here.publish(stop(1)).await.expect("publish");
    there.publish(stop(2)).await.expect("publish");
    for subscription in [&mut local, &mut remote] {
        let mut got = Vec::new();
        for _ in 0..2 {
            match tokio::time::timeout(PATIENCE, subscription.recv()).await.expect("in time") {
                Received::Event(event) => got.push(event),
                other @ (Received::Lagged { .. } | Received::Closed) => panic!("expected an event, got {other:?}"),
            }
        }
        // Each process's own event arrives at once, the other's through Redis: order may differ.
        assert!(got.contains(&stop(1)) && got.contains(&stop(2)), "{got:?}");
    }
    // Nothing twice: the next event each sees is the next one published.
    here.publish(stop(3)).await.expect("publish");
    for subscription in [&mut local, &mut remote] {
        let next = tokio::time::timeout(PATIENCE, subscription.recv()).await.expect("in time");
        assert_eq!(next, Received::Event(stop(3)));
    }
    // Another prefix is another deployment: it heard nothing.
    elsewhere.publish(stop(4)).await.expect("publish");
    assert_eq!(tokio::time::timeout(PATIENCE, unrelated.recv()).await.expect("in time"), Received::Event(stop(4)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_of_a_process_gone_for_good_is_forgotten() {
    let Some(url) = redis_url() else { return };
    let options = RedisOptions { reclaim_after: Duration::from_millis(100), ..fresh_options(&url) };
    let stream = format!("{}:lane:interactive", options.prefix);
    let consumers = || async {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        let info: redis::streams::StreamInfoConsumersReply = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(&stream)
            .arg("workers")
            .query_async(&mut conn)
            .await
            .expect("xinfo");
        info.consumers.len()
    };
    let gone = queue(&options).await;
    gone.push(activation("a1", "s1", Lane::Interactive)).await.expect("push");
    gone.try_pop().await.expect("try_pop").expect("a1").ack().await.expect("ack");
    drop(gone);
    let alive = queue(&options).await;
    alive.push(activation("a2", "s2", Lane::Interactive)).await.expect("push");
    alive.try_pop().await.expect("try_pop").expect("a2").ack().await.expect("ack");
    assert_eq!(consumers().await, 2, "the gone process's consumer and this one's");
    // Ten reclaim periods of silence, and the next look around forgets it.
    let mut left = consumers().await;
    for _ in 0..300 {
        tokio::time::sleep(options.reclaim_after).await;
        assert!(alive.try_pop().await.expect("try_pop").is_none());
        left = consumers().await;
        if left == 1 {
            break;
        }
    }
    assert_eq!(left, 1, "only the live process's consumer is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_lost_its_data_gets_its_lane_streams_back() {
    let Some(url) = redis_url() else { return };
    let options = fresh_options(&url);
    let queue = queue(&options).await;
    // Redis restarted without persistence: the streams and their group are gone.
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    for lane in ["interactive", "responsive", "background"] {
        redis::cmd("DEL")
            .arg(format!("{}:lane:{lane}", options.prefix))
            .query_async::<()>(&mut conn)
            .await
            .expect("del");
    }
    queue.push(activation("a1", "s1", Lane::Interactive)).await.expect("push");
    let lease = tokio::time::timeout(PATIENCE, queue.pop()).await.expect("a1 in time").expect("pop");
    assert_eq!(lease.activation.id.as_str(), "a1");
    lease.ack().await.expect("ack");
}

#[tokio::test]
async fn an_unreachable_redis_says_what_to_set() {
    let options = RedisOptions::new("redis://user:secret@127.0.0.1:1");
    let error = RedisQueue::connect(&options, Aging::default(), LaneCaps::unlimited())
        .await
        .expect_err("nothing listens on port 1");
    let text = error.to_string();
    assert!(text.contains("[broker] url"), "{text}");
    assert!(!text.contains("secret"), "the password stays out of errors: {text}");
    let error = RedisBroker::connect(&RedisOptions::new("http://example.com")).await.expect_err("not a Redis URL");
    assert!(error.to_string().contains("[broker] url"), "{error}");
}
