//! The Redis backends, for many processes sharing one Redis.
//!
//! Keys (every one under the configured prefix, `kesoku` by default):
//! - `{prefix}:events`: the pub/sub channel of [`RedisBroker`] (message notices, control
//!   signals), each event wrapped with the id of the process that sent it;
//! - `{prefix}:lane:{interactive|responsive|background}`: one stream per lane, read by the
//!   consumer group `workers`, one consumer per [`RedisQueue`] (per process).
//!
//! The queue's rules:
//! - An entry read by a process is pending for it until its lease is acknowledged, which
//!   happens only after the activation's outcome is in the ledger (`XACK` then `XDEL`).
//! - Consumers silent for ten times `reclaim_after` and holding nothing are deleted.
//! - A process keeps its pending entries alive (`XCLAIM` to itself, every quarter of
//!   `reclaim_after`); the entries of a process that stopped doing so (killed) are taken over by
//!   another with `XAUTOCLAIM` once idle for `reclaim_after`. A lease dropped without `ack`
//!   stops being kept alive, so its entry comes back the same way.
//! - Lane priority, aging (from the entry's id, the time it was added) and lane caps are applied
//!   per process by the same scheduler as the memory queue, over the entries it has read; it
//!   reads only from lanes under their cap, one entry per lane at a time, when nothing it holds
//!   can run.
//! - One session at a time holds within a process (its entries wait in that process's lanes
//!   while the session's turn is out). Across processes it needs a session lease, taken in
//!   `take_local` and given back by [`RedisAck`]: the seam for that is marked there.

mod broker;
mod queue;

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::BrokerError;

pub use broker::RedisBroker;
pub use queue::RedisQueue;

/// Where the Redis backends live and how they behave (`[broker]` in the config).
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]`.
    pub url: String,
    /// Put before every key and channel, so several deployments (or tests) share one Redis.
    pub prefix: String,
    /// How long an entry read by a process may go without a sign of life before another
    /// process takes it over.
    pub reclaim_after: Duration,
    /// The longest one Redis operation may take, waiting for a reconnection included: after
    /// it the operation fails (and is retried with backoff by whoever called it), so an outage
    /// never hangs a caller.
    pub operation_timeout: Duration,
}

impl RedisOptions {
    pub const DEFAULT_PREFIX: &str = "kesoku";
    pub const DEFAULT_RECLAIM_AFTER: Duration = Duration::from_secs(60);
    pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

    pub fn new(url: impl Into<String>) -> Self {
        RedisOptions {
            url: url.into(),
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            reclaim_after: Self::DEFAULT_RECLAIM_AFTER,
            operation_timeout: Self::DEFAULT_OPERATION_TIMEOUT,
        }
    }
}

/// The URL without its password, for messages.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://***@{}", &url[..scheme], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

fn unavailable(url: &str, error: &redis::RedisError) -> BrokerError {
    BrokerError::Unavailable(format!(
        "Redis at {} failed: {error}; check that it runs and that `[broker] url` is right \
         (remove `[broker] url` to use the in-process broker)",
        redacted(url)
    ))
}

fn client(url: &str) -> Result<redis::Client, BrokerError> {
    redis::Client::open(url).map_err(|error| {
        BrokerError::Unavailable(format!(
            "`[broker] url` = {:?} is not a Redis URL ({error}); write it as redis://host:6379",
            redacted(url)
        ))
    })
}

/// A connection that reconnects by itself. `response_timeout`: how long one command may take
/// (a blocking read needs more than its block time).
///
/// Bounded: the connection manager's defaults retry a reconnection with growing delays (about
/// 9 s in all) while commands wait; here one attempt takes at most `operation_timeout`, with
/// one quick retry, and connecting at all gives up after `operation_timeout` too. Callers retry
/// with their own backoff ([`backoff`]), so a process outlives an outage and notices it promptly.
async fn manager(
    client: &redis::Client,
    url: &str,
    operation_timeout: Duration,
    response_timeout: Duration,
) -> Result<ConnectionManager, BrokerError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(operation_timeout))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200));
    let connecting = client.get_connection_manager_with_config(config);
    match tokio::time::timeout(operation_timeout, connecting).await {
        Ok(connected) => connected.map_err(|error| unavailable(url, &error)),
        Err(_) => Err(timed_out(url, operation_timeout)),
    }
}

fn timed_out(url: &str, timeout: Duration) -> BrokerError {
    BrokerError::Unavailable(format!(
        "Redis at {} did not answer within {} ms; check that it runs and is reachable \
         (`[broker] operation_timeout_ms` sets this limit)",
        redacted(url),
        timeout.as_millis()
    ))
}

/// `PING`, within `timeout`: the readiness check of the Redis backends.
async fn ping(conn: &ConnectionManager, url: &str, timeout: Duration) -> Result<(), BrokerError> {
    let mut conn = conn.clone();
    match tokio::time::timeout(timeout, redis::cmd("PING").query_async::<String>(&mut conn)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(unavailable(url, &error)),
        Err(_) => Err(timed_out(url, timeout)),
    }
}

/// After a failure, how long to wait before the next attempt: doubling up to 5 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(5))
}

/// An id for this process's broker or queue: unique across processes and restarts.
fn instance_id() -> String {
    format!("{}-{}", std::process::id(), ulid::Ulid::generate())
}
