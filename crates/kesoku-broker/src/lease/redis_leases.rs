//! Session leases in Redis, shared by every process using the same server and key prefix.
//!
//! Keys, under a prefix (default `kesoku`):
//! - `{prefix}:lease:{session_id}`: the lease, `"{fencing_token}:{holder}"`, with a `PX` ttl.
//! - `{prefix}:lease-fencing`: the last fencing token handed out, for every session. One
//!   counter rather than one per session: tokens then increase per session as well, and no key
//!   is left behind per session ever leased.
//! - `{prefix}:leases-held`: a sorted set of sessions by their lease's expiry (Redis server time,
//!   ms), kept by the same scripts, so that counting live leases for `/metrics` is a
//!   `ZREMRANGEBYSCORE` of the expired few and a `ZCARD`, not a `SCAN` of the keyspace.
//!
//! Every operation is one Lua script (the `redis` crate's `Script`: `EVALSHA`, loading the script
//! on `NOSCRIPT`), so each is atomic. Acquiring in particular must be: an `INCR` then a separate
//! `SET NX PX` would let a slow acquirer, whose `SET` lands after a faster one's lease has come
//! and gone, install an older token after a newer one. Renewal and release compare the stored
//! value before `PEXPIRE` or `DEL`, so a holder never extends or deletes a lease it lost.
//!
//! Times come from the Redis server (`TIME`), never from the processes' clocks, so skew between
//! machines does not matter; a token is at least the server's clock in microseconds, so tokens
//! keep increasing after Redis loses its data (a restart without persistence).

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use kesoku_core::SessionId;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, FromRedisValue, RedisError, Script, ScriptInvocation};
use tokio::time::Instant;

use super::{LeaseError, LeaseHolder, LeaseKeeper, SessionLease, SessionLeases, ttl_millis};

/// The key prefix when none is given.
pub const DEFAULT_KEY_PREFIX: &str = "kesoku";
/// How long one lease operation may wait for Redis when no other bound is set.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

/// Lua's `tostring` writes numbers past 14 digits in exponent form, so the token is formatted
/// with `%d`; a number passed to `redis.call` is written with 17 digits, which is exact here.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS: the lease, the fencing counter, the held set. ARGV: session id, holder, ttl (ms).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local time = redis.call('TIME')
local token = redis.call('INCR', KEYS[2])
local floor = tonumber(time[1]) * 1000000 + tonumber(time[2])
if token < floor then
  redis.call('SET', KEYS[2], floor)
  token = floor
end
local ttl = tonumber(ARGV[3])
redis.call('SET', KEYS[1], string.format('%d:%s', token, ARGV[2]), 'NX', 'PX', ttl)
redis.call('ZADD', KEYS[3], tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) + ttl, ARGV[1])
return token
",
    )
});

static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS: the lease, the held set. ARGV: the lease's value, ttl (ms), session id.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
local time = redis.call('TIME')
redis.call('ZADD', KEYS[2], tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) + ttl, ARGV[3])
return 1
",
    )
});

static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS: the lease, the held set. ARGV: the lease's value, session id.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
",
    )
});

static HELD_COUNT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS: the held set.
local time = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
return redis.call('ZCARD', KEYS[1])
",
    )
});

/// Session leases in Redis. Cheap to clone; clones share one multiplexed connection.
#[derive(Clone)]
pub struct RedisLeases {
    keeper: std::sync::Arc<Keeper>,
}

struct Keeper {
    connection: ConnectionManager,
    prefix: String,
    /// The connection's response timeout does not cover waiting for a reconnection (with the
    /// crate's default backoff, several seconds while Redis is down), so each operation has a
    /// deadline of its own.
    operation_timeout: Duration,
}

impl std::fmt::Debug for RedisLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeases").field("prefix", &self.keeper.prefix).finish_non_exhaustive()
    }
}

fn unavailable(error: RedisError) -> LeaseError {
    LeaseError::Unavailable(error.to_string())
}

impl RedisLeases {
    /// Leases on an existing connection (share the broker's), under `prefix` (keys
    /// `{prefix}:lease:…`). Its response timeout bounds how long an operation may wait.
    pub fn new(connection: ConnectionManager, prefix: impl Into<String>) -> Self {
        Self {
            keeper: std::sync::Arc::new(Keeper {
                connection,
                prefix: prefix.into(),
                operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            }),
        }
    }

    /// Give up on an operation (and return [`LeaseError::Unavailable`]) after `timeout`
    /// (default [`DEFAULT_OPERATION_TIMEOUT`]). An acquire that times out may still have taken
    /// the lease on the server; nobody holds that lease, and it ends after its ttl.
    pub fn with_operation_timeout(self, timeout: Duration) -> Self {
        let keeper = &self.keeper;
        Self {
            keeper: std::sync::Arc::new(Keeper {
                connection: keeper.connection.clone(),
                prefix: keeper.prefix.clone(),
                operation_timeout: timeout,
            }),
        }
    }

    /// Connect to the Redis at `url` (`redis://host:port/db`) with the `redis` crate's default
    /// timeouts (1 s per connection attempt, 500 ms per response), under `prefix`. Gives up
    /// after [`DEFAULT_OPERATION_TIMEOUT`] when no connection is made (the crate alone would go
    /// on retrying with backoff for about ten seconds). Whatever the connection's settings, each
    /// operation then gives up after the operation timeout.
    pub async fn connect(url: &str, prefix: impl Into<String>) -> Result<Self, LeaseError> {
        // The URL may hold a password: it is never part of an error.
        let client = Client::open(url).map_err(|error| LeaseError::InvalidUrl(format!("{:?}", error.kind())))?;
        let connecting = ConnectionManager::new_with_config(client, ConnectionManagerConfig::new());
        let connection = match tokio::time::timeout(DEFAULT_OPERATION_TIMEOUT, connecting).await {
            Ok(connected) => connected.map_err(unavailable)?,
            Err(_) => {
                return Err(LeaseError::Unavailable(format!(
                    "no connection to redis within {} ms",
                    DEFAULT_OPERATION_TIMEOUT.as_millis()
                )));
            }
        };
        Ok(Self::new(connection, prefix))
    }

    pub fn prefix(&self) -> &str {
        &self.keeper.prefix
    }
}

impl Keeper {
    /// Run a lease script, within the operation timeout.
    async fn invoke<T: FromRedisValue>(&self, invocation: &ScriptInvocation<'_>) -> Result<T, LeaseError> {
        let mut connection = self.connection.clone();
        match tokio::time::timeout(self.operation_timeout, invocation.invoke_async(&mut connection)).await {
            Ok(answer) => answer.map_err(unavailable),
            Err(_) => Err(LeaseError::Unavailable(format!(
                "no answer from redis within {} ms",
                self.operation_timeout.as_millis()
            ))),
        }
    }

    fn lease_key(&self, session_id: &SessionId) -> String {
        format!("{}:lease:{}", self.prefix, session_id)
    }

    fn fencing_key(&self) -> String {
        format!("{}:lease-fencing", self.prefix)
    }

    fn held_key(&self) -> String {
        format!("{}:leases-held", self.prefix)
    }
}

/// What the lease's key holds while `lease` is current.
fn lease_value(lease: &SessionLease) -> String {
    format!("{}:{}", lease.fencing_token, lease.holder)
}

#[async_trait]
impl SessionLeases for RedisLeases {
    async fn acquire(
        &self,
        session_id: &SessionId,
        holder: &LeaseHolder,
        ttl: Duration,
    ) -> Result<Option<SessionLease>, LeaseError> {
        let millis = ttl_millis(ttl)?;
        let ttl = Duration::from_millis(millis);
        let keeper = &self.keeper;
        let sent_at = Instant::now();
        let token: i64 = keeper
            .invoke(
                ACQUIRE
                    .key(keeper.lease_key(session_id))
                    .key(keeper.fencing_key())
                    .key(keeper.held_key())
                    .arg(session_id.as_str())
                    .arg(holder.as_str())
                    .arg(millis),
            )
            .await?;
        if token == 0 {
            return Ok(None);
        }
        let fencing_token = u64::try_from(token)
            .map_err(|_| LeaseError::Protocol(format!("a fencing token must be positive, got {token}")))?;
        Ok(Some(SessionLease {
            session_id: session_id.clone(),
            holder: holder.clone(),
            fencing_token,
            ttl,
            acquired_at: sent_at,
            keeper: self.keeper.clone(),
        }))
    }

    async fn held_count(&self) -> Result<u64, LeaseError> {
        let keeper = &self.keeper;
        keeper.invoke(&HELD_COUNT.key(keeper.held_key())).await
    }
}

#[async_trait]
impl LeaseKeeper for Keeper {
    async fn renew(&self, lease: &SessionLease) -> Result<bool, LeaseError> {
        let millis = ttl_millis(lease.ttl)?;
        self.invoke(
            RENEW
                .key(self.lease_key(&lease.session_id))
                .key(self.held_key())
                .arg(lease_value(lease))
                .arg(millis)
                .arg(lease.session_id.as_str()),
        )
        .await
    }

    async fn release(&self, lease: &SessionLease) -> Result<bool, LeaseError> {
        self.invoke(
            RELEASE
                .key(self.lease_key(&lease.session_id))
                .key(self.held_key())
                .arg(lease_value(lease))
                .arg(lease.session_id.as_str()),
        )
        .await
    }
}
