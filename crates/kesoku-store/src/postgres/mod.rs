//! The PostgreSQL backend, for several processes sharing one store.
//!
//! Tables live in the first schema of the connection's `search_path` (`public` unless the
//! URL or the options say otherwise), so one database can hold several stores.
//!
//! [`PgStore`] is connected here, over a pool; the rest lives in rooms of its own:
//! - `rev_gate`: how revisions are handed out so that a reader never skips a change committed
//!   late (an advisory lock every revision-taking statement holds shared);
//! - `schema`: migrations, once per schema, under an advisory lock;
//! - `store` and `ledger`: the [`crate::Store`] and [`crate::Ledger`] implementations;
//! - `work`: the statements of follow-ups and background jobs.
//!
//! This module holds no SQL of messages, sessions, the ledger or work rows.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row};

use crate::clock::{Clock, truncate};
use crate::common::OpenMode;
use crate::decode::BackendRow;
use crate::error::{StoreError, StoreResult};
use crate::sql::{Arg, Query};

mod ledger;
mod rev_gate;
mod schema;
mod store;
mod work;

/// How a [`PgStore`]'s pool behaves (`[database]` in the config). Every wait is bounded, so a
/// PostgreSQL outage makes store calls fail after a while (and callers retry) instead of hanging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgPoolSettings {
    /// Connections per store (per process).
    pub max_connections: u32,
    /// The longest a store call waits for a connection: for a free one from the pool, or for a
    /// new one to be opened (connecting and logging in included). Past it the call fails with
    /// a retryable error.
    pub acquire_timeout: Duration,
    /// PostgreSQL's `statement_timeout` on every connection: a statement running longer is
    /// cancelled by the server. `None`: the server's setting.
    pub statement_timeout: Option<Duration>,
}

impl PgPoolSettings {
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;
    pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
}

impl Default for PgPoolSettings {
    fn default() -> Self {
        PgPoolSettings {
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            acquire_timeout: Self::DEFAULT_ACQUIRE_TIMEOUT,
            statement_timeout: Some(Self::DEFAULT_STATEMENT_TIMEOUT),
        }
    }
}
/// A pooled connection idle at least this long is pinged before use (and replaced if dead);
/// one in use more recently is handed out as it is. sqlx's default pings on every acquire:
/// one more round trip per store call, a good part of a turn's time on PostgreSQL.
const PING_WHEN_IDLE: Duration = Duration::from_secs(1);

/// A store in one PostgreSQL schema. Clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    clock: Clock,
    /// The schema holding the tables, for errors and logs.
    schema: Arc<str>,
    /// `hashtext(schema)`: the second key of this store's advisory locks.
    schema_key: i32,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("schema", &self.schema).finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connect to `url` (`postgres://…` or `postgresql://…`) and migrate the schema.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        Self::connect_in_mode(parse_url(url)?, OpenMode::CreateIfMissing).await
    }

    /// Connect with prepared options (for example with a `search_path` naming a test schema).
    pub async fn connect_with(options: PgConnectOptions) -> StoreResult<Self> {
        Self::connect_in_mode(options, OpenMode::CreateIfMissing).await
    }

    /// Connect to a database that already holds a Kesoku store ([`StoreError::Missing`] otherwise).
    pub async fn connect_existing_with(options: PgConnectOptions) -> StoreResult<Self> {
        Self::connect_in_mode(options, OpenMode::MustExist).await
    }

    /// Use `clock` for every timestamp this store writes and for orphan ages.
    pub fn with_clock(mut self, clock: impl Into<Clock>) -> Self {
        self.clock = clock.into();
        self
    }

    /// Close the pool (waits for connections in use to come back).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Connect with prepared options and pool settings, and migrate the schema.
    pub async fn connect_with_pool(options: PgConnectOptions, pool: PgPoolSettings) -> StoreResult<Self> {
        Self::connect_in_mode_with(options, OpenMode::CreateIfMissing, pool).await
    }

    pub(crate) async fn connect_in_mode(options: PgConnectOptions, mode: OpenMode) -> StoreResult<Self> {
        Self::connect_in_mode_with(options, mode, PgPoolSettings::default()).await
    }

    pub(crate) async fn connect_in_mode_with(
        options: PgConnectOptions,
        mode: OpenMode,
        settings: PgPoolSettings,
    ) -> StoreResult<Self> {
        let options = match settings.statement_timeout {
            Some(timeout) => options.options([("statement_timeout", format!("{}ms", timeout.as_millis()))]),
            None => options,
        };
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(settings.acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_WHEN_IDLE {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?;
        let (schema, schema_key): (Option<String>, Option<i32>) =
            sqlx::query_as("SELECT current_schema()::text, hashtext(current_schema())").fetch_one(&pool).await?;
        let (Some(schema), Some(schema_key)) = (schema, schema_key) else {
            pool.close().await;
            return Err(StoreError::Migration(
                "the connection's search_path names no existing schema to keep the tables in: \
                 create the schema or fix search_path"
                    .to_owned(),
            ));
        };
        let store = PgStore { pool, clock: Clock::system(), schema: Arc::from(schema), schema_key };
        if let Err(error) = store.migrate(mode).await {
            store.pool.close().await;
            return Err(error);
        }
        Ok(store)
    }

    fn what(&self) -> String {
        format!("postgresql schema `{}`", self.schema)
    }
}

impl BackendRow for PgRow {
    fn opt_text(&self, column: &'static str) -> Result<Option<String>, String> {
        self.try_get(column).map_err(|error| error.to_string())
    }

    fn opt_int(&self, column: &'static str) -> Result<Option<i64>, String> {
        self.try_get(column).map_err(|error| error.to_string())
    }

    fn opt_time(&self, column: &'static str) -> Result<Option<DateTime<Utc>>, String> {
        self.try_get(column).map_err(|error| error.to_string())
    }

    fn opt_metadata(&self, column: &'static str) -> Result<Option<kesoku_core::Metadata>, String> {
        let value: Option<serde_json::Value> = self.try_get(column).map_err(|error| error.to_string())?;
        value.map(crate::decode::metadata_from_value).transpose()
    }
}

/// Parse a PostgreSQL URL; the error never repeats a password.
pub(crate) fn parse_url(url: &str) -> StoreResult<PgConnectOptions> {
    PgConnectOptions::from_str(url)
        .map_err(|error| StoreError::BadUrl { url: redact(url), reason: format!("not a postgresql url: {error}") })
}

/// `scheme://user:secret@host/…` → `scheme://user:***@host/…`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Every row decoded, into a vector sized up front: a `collect` into `Result<Vec<_>>` cannot see
/// the count and grows by doubling, which for a 10,000-message history copied the messages
/// over and over into fresh pages.
fn decode_all<T>(rows: &[PgRow], decode: impl Fn(&PgRow) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    let mut decoded = Vec::with_capacity(rows.len());
    for row in rows {
        decoded.push(decode(row)?);
    }
    Ok(decoded)
}

fn bind(query: Query) -> sqlx::query::Query<'static, Postgres, PgArguments> {
    let mut bound = sqlx::query(AssertSqlSafe(query.text));
    for arg in query.args {
        bound = match arg {
            Arg::Text(text) => bound.bind(text),
            Arg::Int(value) => bound.bind(value),
            Arg::Time(at) => bound.bind(truncate(at)),
        };
    }
    bound
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kesoku_test_support::db::pg_schema;

    use super::{PgPoolSettings, PgStore, redact};

    /// The pool settings reach every connection: PostgreSQL cancels a statement past
    /// `statement_timeout`, and the pool opens no more than `max_connections`.
    #[tokio::test]
    async fn pool_settings_bound_statements_and_size_the_pool() {
        let Some(db) = pg_schema().await else { return };
        let settings = PgPoolSettings {
            max_connections: 2,
            acquire_timeout: Duration::from_secs(10),
            statement_timeout: Some(Duration::from_millis(1234)),
        };
        let store = PgStore::connect_with_pool(db.connect_options(), settings).await.expect("connect");
        let shown: String = sqlx::query_scalar("SHOW statement_timeout").fetch_one(&store.pool).await.expect("show");
        assert_eq!(shown, "1234ms");
        let slow = sqlx::query("SELECT pg_sleep(5)").execute(&store.pool).await;
        let error = slow.expect_err("a statement past statement_timeout is cancelled");
        assert!(error.to_string().contains("statement timeout"), "{error}");
        assert_eq!(store.pool.options().get_max_connections(), 2);
        store.close().await;
        db.cleanup().await;
    }

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(redact("postgres://kesoku:hunter2@db:5432/k?x=1"), "postgres://kesoku:***@db:5432/k?x=1");
        assert_eq!(redact("postgres://kesoku@db/k"), "postgres://kesoku@db/k");
        assert_eq!(redact("postgres://db/k"), "postgres://db/k");
    }
}
