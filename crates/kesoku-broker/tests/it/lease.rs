//! Session leases: one contract, run on the in-process backend and on the real Redis at
//! `KESOKU_TEST_REDIS_URL` (skipped, saying so, when it is unset; failed when
//! `KESOKU_REQUIRE_SERVERS=1`). Each Redis test has a key prefix of its own. Short ttls are
//! fine here: tests wait for a state (with generous timeouts), never assert on a duration.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kesoku_broker::lease::{LeaseError, LeaseHolder, MemoryLeases, RedisLeases, SessionLease, SessionLeases};
use kesoku_core::SessionId;
use kesoku_test_support::proxy::CuttableProxy;
use tokio::sync::Barrier;

const REDIS_URL_VAR: &str = "KESOKU_TEST_REDIS_URL";
/// Long enough never to expire during a test.
const LONG: Duration = Duration::from_secs(600);
/// Short enough to expire soon.
const SHORT: Duration = Duration::from_millis(100);
/// How long a test waits for a state before failing.
const PATIENCE: Duration = Duration::from_secs(20);

/// Instantiate each `async fn case(place: &Place)` once per backend.
macro_rules! leases_tests {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn memory() {
                    let place = super::Place::memory();
                    super::$case(&place).await;
                    place.cleanup().await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis() {
                    let Some(place) = super::Place::redis().await else { return };
                    super::$case(&place).await;
                    place.cleanup().await;
                }
            }
        )*
    };
}

leases_tests!(
    one_holder_at_a_time,
    releasing_lets_another_holder_in,
    an_expired_lease_is_taken_over_and_its_old_holder_is_fenced_off,
    of_many_concurrent_acquirers_exactly_one_wins,
    renewals_keep_a_lease_past_its_ttl,
    a_kept_lease_that_is_lost_cancels_its_token,
    fencing_tokens_increase_across_holders,
    held_count_forgets_expired_leases,
    a_ttl_under_a_millisecond_is_refused,
    a_lease_keeps_its_ttl_in_whole_milliseconds,
    acquiring_within_a_patience_waits_for_the_release,
);

/// Where leases live for one test: a process's memory, or a key prefix on the test Redis.
pub enum Place {
    Memory(MemoryLeases),
    Redis { url: String, prefix: String, first: RedisLeases },
}

impl Place {
    fn memory() -> Place {
        Place::Memory(MemoryLeases::new())
    }

    async fn redis() -> Option<Place> {
        let url = kesoku_test_support::db::redis_url()?;
        let prefix = format!("kesoku_test_{}", ulid::Ulid::generate().to_string().to_lowercase());
        let first = RedisLeases::connect(&url, prefix.clone())
            .await
            .unwrap_or_else(|error| panic!("cannot connect to the test redis at {REDIS_URL_VAR}: {error}"));
        Some(Place::Redis { url, prefix, first })
    }

    /// The leases as one process sees them.
    fn leases(&self) -> Arc<dyn SessionLeases> {
        match self {
            Place::Memory(leases) => Arc::new(leases.clone()),
            Place::Redis { first, .. } => Arc::new(first.clone()),
        }
    }

    /// The same leases as another process sees them (with Redis, a connection of its own).
    async fn another_process(&self) -> Arc<dyn SessionLeases> {
        match self {
            Place::Memory(leases) => Arc::new(leases.clone()),
            Place::Redis { url, prefix, .. } => Arc::new(
                RedisLeases::connect(url, prefix.clone()).await.expect("a second connection to the test redis"),
            ),
        }
    }

    /// A plain connection to the test Redis (Redis only), for changing keys behind the leases.
    async fn raw_redis(&self) -> Option<(redis::aio::MultiplexedConnection, String)> {
        match self {
            Place::Memory(_) => None,
            Place::Redis { url, prefix, .. } => {
                let client = redis::Client::open(url.as_str()).expect("the test redis url parses");
                let connection =
                    client.get_multiplexed_async_connection().await.expect("a raw connection to the test redis");
                Some((connection, prefix.clone()))
            }
        }
    }

    /// Delete the test's keys (best effort).
    async fn cleanup(self) {
        let Some((mut connection, prefix)) = self.raw_redis().await else { return };
        let keys: Vec<String> = match redis::cmd("KEYS").arg(format!("{prefix}:*")).query_async(&mut connection).await {
            Ok(keys) => keys,
            Err(error) => {
                eprintln!("note: could not list the test's redis keys: {error}");
                return;
            }
        };
        if !keys.is_empty()
            && let Err(error) = redis::cmd("DEL").arg(&keys).query_async::<()>(&mut connection).await
        {
            eprintln!("note: could not delete the test's redis keys: {error}");
        }
    }
}

/// Poll `probe` until it returns `Some`, failing after [`PATIENCE`].
async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn acquire(
    leases: &Arc<dyn SessionLeases>,
    session: &SessionId,
    holder: &LeaseHolder,
    ttl: Duration,
) -> Option<SessionLease> {
    leases.acquire(session, holder, ttl).await.expect("acquire answers")
}

async fn held(leases: &Arc<dyn SessionLeases>) -> u64 {
    leases.held_count().await.expect("held_count answers")
}

async fn one_holder_at_a_time(place: &Place) {
    let (a, b) = (place.leases(), place.another_process().await);
    let (holder_a, holder_b) = (LeaseHolder::generate(), LeaseHolder::generate());
    let session = SessionId::generate();

    let lease = acquire(&a, &session, &holder_a, LONG).await.expect("a free session's lease is granted");
    assert_eq!(lease.session_id(), &session);
    assert_eq!(lease.holder(), &holder_a);
    assert!(acquire(&b, &session, &holder_b, LONG).await.is_none(), "another holder must not get a held lease");
    assert!(acquire(&a, &session, &holder_a, LONG).await.is_none(), "a lease is not re-entrant");

    // Other sessions are independent.
    let other = SessionId::generate();
    let other_lease = acquire(&b, &other, &holder_b, LONG).await.expect("another session's lease is free");
    assert_eq!(held(&a).await, 2);
    assert_eq!(held(&b).await, 2);
    assert!(lease.renew().await.expect("renew answers"), "the holder renews its own lease");
    assert!(other_lease.release().await.expect("release answers"));
    assert_eq!(held(&a).await, 1);
}

async fn releasing_lets_another_holder_in(place: &Place) {
    let (a, b) = (place.leases(), place.another_process().await);
    let (holder_a, holder_b) = (LeaseHolder::generate(), LeaseHolder::generate());
    let session = SessionId::generate();

    let first = acquire(&a, &session, &holder_a, LONG).await.expect("granted");
    let first_token = first.fencing_token();
    assert!(first.release().await.expect("release answers"), "the holder's release ends its lease");
    assert_eq!(held(&b).await, 0);

    let second = acquire(&b, &session, &holder_b, LONG).await.expect("a released lease is free");
    assert!(second.fencing_token() > first_token, "{} > {first_token}", second.fencing_token());
    assert_eq!(held(&a).await, 1);
    assert!(second.release().await.expect("release answers"));
    assert_eq!(held(&a).await, 0);
}

async fn an_expired_lease_is_taken_over_and_its_old_holder_is_fenced_off(place: &Place) {
    let (a, b, c) = (place.leases(), place.another_process().await, place.another_process().await);
    let (holder_a, holder_b, holder_c) = (LeaseHolder::generate(), LeaseHolder::generate(), LeaseHolder::generate());
    let session = SessionId::generate();

    let stale = acquire(&a, &session, &holder_a, SHORT).await.expect("granted");
    // Not renewed: after its ttl another holder takes the session over.
    let newer = wait_for("the expired lease to be taken over", || acquire(&b, &session, &holder_b, LONG)).await;
    assert!(newer.fencing_token() > stale.fencing_token(), "{} > {}", newer.fencing_token(), stale.fencing_token());

    assert!(!stale.renew().await.expect("renew answers"), "the old holder's renewal must say the lease is lost");
    assert!(!stale.release().await.expect("release answers"), "the old holder's release must say it was not ours");
    // The old holder touched nothing: the new holder still has the session.
    assert!(acquire(&c, &session, &holder_c, LONG).await.is_none(), "the new holder's lease survives");
    assert!(newer.renew().await.expect("renew answers"));
    assert_eq!(held(&c).await, 1);
}

async fn of_many_concurrent_acquirers_exactly_one_wins(place: &Place) {
    const ACQUIRERS: usize = 16;
    let session = SessionId::generate();
    let barrier = Arc::new(Barrier::new(ACQUIRERS));
    let mut tasks = Vec::new();
    for _ in 0..ACQUIRERS {
        let leases = place.another_process().await;
        let (session, barrier) = (session.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let holder = LeaseHolder::generate();
            barrier.wait().await;
            acquire(&leases, &session, &holder, LONG).await
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        if let Some(lease) = task.await.expect("an acquirer task ends") {
            winners.push(lease);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one acquirer wins: {winners:?}");
    assert_eq!(held(&place.leases()).await, 1);
}

async fn renewals_keep_a_lease_past_its_ttl(place: &Place) {
    let (a, b) = (place.leases(), place.another_process().await);
    let (holder_a, holder_b) = (LeaseHolder::generate(), LeaseHolder::generate());
    let session = SessionId::generate();
    // Generous, so that a busy machine's scheduling delays do not outlast a renewal period.
    let ttl = Duration::from_secs(2);

    let kept = acquire(&a, &session, &holder_a, ttl).await.expect("granted").keep_alive();
    let token = kept.fencing_token();
    // Several ttls pass; the renewals (every ttl/3) keep the lease ours throughout.
    for _ in 0..6 {
        tokio::time::sleep(ttl / 2).await;
        assert!(acquire(&b, &session, &holder_b, LONG).await.is_none(), "a kept lease stays held past its ttl");
    }
    assert!(!kept.is_lost());
    assert!(!kept.lost_token().is_cancelled());
    assert_eq!(kept.lease().fencing_token(), token);

    assert!(kept.release().await.expect("release answers"), "the kept lease was still ours");
    let next = acquire(&b, &session, &holder_b, LONG).await.expect("a released lease is free");
    assert!(next.fencing_token() > token);
}

async fn a_kept_lease_that_is_lost_cancels_its_token(place: &Place) {
    let (a, b, c) = (place.leases(), place.another_process().await, place.another_process().await);
    let (holder_a, holder_b, holder_c) = (LeaseHolder::generate(), LeaseHolder::generate(), LeaseHolder::generate());
    let session = SessionId::generate();

    // Renewing far less often than the ttl: the lease expires between renewals (as when the
    // holder is paused), and its next renewal finds it lost.
    let kept = acquire(&a, &session, &holder_a, SHORT).await.expect("granted").keep_alive_every(Duration::from_secs(1));
    let lost = kept.lost_token();
    let newer = wait_for("the unrenewed lease to be taken over", || acquire(&b, &session, &holder_b, LONG)).await;
    tokio::time::timeout(PATIENCE, lost.cancelled()).await.expect("the lost token is cancelled");
    assert!(kept.is_lost());

    assert!(!kept.release().await.expect("release answers"), "a lost lease's release says it was not ours");
    assert!(acquire(&c, &session, &holder_c, LONG).await.is_none(), "the new holder's lease survives");
    assert!(newer.release().await.expect("release answers"));
}

async fn fencing_tokens_increase_across_holders(place: &Place) {
    let processes = [place.leases(), place.another_process().await, place.another_process().await];
    let session = SessionId::generate();
    let mut last = 0;
    for round in 0..9 {
        let leases = &processes[round % processes.len()];
        let lease = acquire(leases, &session, &LeaseHolder::generate(), LONG).await.expect("a released lease is free");
        assert!(lease.fencing_token() > last, "round {round}: {} > {last}", lease.fencing_token());
        last = lease.fencing_token();
        // Leases of other sessions in between do not matter.
        let other = acquire(leases, &SessionId::generate(), &LeaseHolder::generate(), LONG).await.expect("granted");
        assert!(other.release().await.expect("release answers"));
        assert!(lease.release().await.expect("release answers"));
    }
}

async fn held_count_forgets_expired_leases(place: &Place) {
    let (a, b) = (place.leases(), place.another_process().await);
    let holder = LeaseHolder::generate();
    for _ in 0..3 {
        acquire(&a, &SessionId::generate(), &holder, SHORT).await.expect("granted");
    }
    let kept = acquire(&b, &SessionId::generate(), &holder, LONG).await.expect("granted");
    wait_for("the short leases to expire", || async {
        let count = held(&b).await;
        assert!(count >= 1, "the long lease is still held, yet held_count is {count}");
        (count == 1).then_some(())
    })
    .await;
    assert!(kept.release().await.expect("release answers"));
    assert_eq!(held(&a).await, 0);
}

async fn a_ttl_under_a_millisecond_is_refused(place: &Place) {
    let leases = place.leases();
    let session = SessionId::generate();
    for ttl in [Duration::ZERO, Duration::from_micros(999)] {
        match leases.acquire(&session, &LeaseHolder::generate(), ttl).await {
            Err(error @ LeaseError::InvalidTtl { .. }) => {
                assert!(!error.is_retryable());
                assert!(error.to_string().contains("between 1 ms"), "{error}");
            }
            other => panic!("a ttl of {ttl:?} must be refused, got {other:?}"),
        }
    }
    assert_eq!(held(&leases).await, 0);
}

async fn a_lease_keeps_its_ttl_in_whole_milliseconds(place: &Place) {
    let lease =
        acquire(&place.leases(), &SessionId::generate(), &LeaseHolder::generate(), Duration::from_micros(1_500_900))
            .await
            .expect("granted");
    assert_eq!(lease.ttl(), Duration::from_millis(1500));
}

async fn acquiring_within_a_patience_waits_for_the_release(place: &Place) {
    let (a, b) = (place.leases(), place.another_process().await);
    let session = SessionId::generate();
    let first = acquire(&a, &session, &LeaseHolder::generate(), LONG).await.expect("granted");
    let first_token = first.fencing_token();

    // No patience: the held lease is not granted.
    let impatient = b.acquire_within(&session, &LeaseHolder::generate(), LONG, Duration::ZERO).await;
    assert!(impatient.expect("acquire_within answers").is_none());

    let waiter = tokio::spawn({
        let session = session.clone();
        async move { b.acquire_within(&session, &LeaseHolder::generate(), LONG, PATIENCE).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(first.release().await.expect("release answers"), "the waiter must not have taken a held lease");
    let second =
        waiter.await.expect("the waiter ends").expect("acquire_within answers").expect("granted once released");
    assert!(second.fencing_token() > first_token);
}

// Redis only.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_prefixes_keep_leases_apart() {
    let (Some(one), Some(two)) = (Place::redis().await, Place::redis().await) else { return };
    let session = SessionId::generate();
    let holder = LeaseHolder::generate();
    assert!(acquire(&one.leases(), &session, &holder, LONG).await.is_some());
    assert!(acquire(&two.leases(), &session, &holder, LONG).await.is_some(), "another prefix is another cluster");
    assert_eq!(held(&one.leases()).await, 1);
    one.cleanup().await;
    two.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fencing_tokens_keep_increasing_after_redis_forgets_them() {
    let Some(place) = Place::redis().await else { return };
    let leases = place.leases();
    let session = SessionId::generate();
    let first = acquire(&leases, &session, &LeaseHolder::generate(), LONG).await.expect("granted");
    let first_token = first.fencing_token();
    assert!(first.release().await.expect("release answers"));

    // As after a restart without persistence: the counter is gone.
    let (mut raw, prefix) = place.raw_redis().await.expect("a redis place");
    let deleted: u64 =
        redis::cmd("DEL").arg(format!("{prefix}:lease-fencing")).query_async(&mut raw).await.expect("DEL answers");
    assert_eq!(deleted, 1, "the fencing counter lives at {prefix}:lease-fencing");

    let second = acquire(&leases, &session, &LeaseHolder::generate(), LONG).await.expect("granted");
    assert!(second.fencing_token() > first_token, "{} > {first_token}", second.fencing_token());
    place.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keys_name_the_holder_and_expire() {
    let Some(place) = Place::redis().await else { return };
    let session = SessionId::generate();
    let holder = LeaseHolder::from("worker-7");
    let lease = acquire(&place.leases(), &session, &holder, LONG).await.expect("granted");
    let (mut raw, prefix) = place.raw_redis().await.expect("a redis place");
    let key = format!("{prefix}:lease:{session}");
    let value: String = redis::cmd("GET").arg(&key).query_async(&mut raw).await.expect("GET answers");
    assert_eq!(value, format!("{}:worker-7", lease.fencing_token()));
    let ttl_ms: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut raw).await.expect("PTTL answers");
    assert!(ttl_ms > 0, "the lease key has a ttl, got {ttl_ms}");
    place.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_is_a_retryable_error_and_a_bad_url_is_not() {
    match RedisLeases::connect("redis://127.0.0.1:1", "kesoku_test_unreachable").await {
        Err(error) => assert!(error.is_retryable(), "{error}"),
        Ok(_) => panic!("nothing listens on port 1"),
    }
    match RedisLeases::connect("redis://:hunter2@[not a host", "kesoku_test_bad").await {
        Err(error) => {
            assert!(!error.is_retryable(), "{error}");
            assert!(!error.to_string().contains("hunter2"), "the password must not be in the error: {error}");
        }
        Ok(_) => panic!("the url does not parse"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_kept_lease_is_lost_when_redis_stays_unreachable_for_its_ttl() {
    let Some(place) = Place::redis().await else { return };
    let Place::Redis { url, prefix, .. } = &place else { panic!("Place::redis makes a redis place") };
    let info = redis::Client::open(url.as_str()).expect("the test redis url parses").get_connection_info().clone();
    let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
        panic!("{REDIS_URL_VAR} must name a plain tcp address for this test")
    };
    let proxy = CuttableProxy::start(format!("{host}:{port}")).await.expect("a local port for the proxy");
    let client =
        redis::Client::open(info.set_addr(redis::ConnectionAddr::Tcp("127.0.0.1".to_owned(), proxy.addr().port())))
            .expect("the proxied connection info is valid");
    let connection = redis::aio::ConnectionManager::new_with_config(client, redis::aio::ConnectionManagerConfig::new())
        .await
        .expect("a connection to redis through the proxy");
    let through_proxy = RedisLeases::new(connection, prefix.clone());
    let session = SessionId::generate();

    let kept = through_proxy
        .acquire(&session, &LeaseHolder::generate(), Duration::from_secs(1))
        .await
        .expect("acquire answers")
        .expect("granted")
        .keep_alive();
    let lost = kept.lost_token();
    proxy.cut();
    // No renewal can be confirmed now: once the ttl has passed, the holder must count the lease
    // as lost (Redis has expired it by then, and anyone may take the session).
    tokio::time::timeout(PATIENCE, lost.cancelled()).await.expect("the lease counts as lost");
    let (direct, holder) = (place.leases(), LeaseHolder::generate());
    let newer =
        wait_for("another process to take the session over", || acquire(&direct, &session, &holder, LONG)).await;
    assert!(newer.fencing_token() > kept.fencing_token());
    match kept.release().await {
        Err(error) => assert!(error.is_retryable(), "{error}"),
        Ok(released) => assert!(!released, "a lost lease's release says it was not ours"),
    }
    place.cleanup().await;
}
