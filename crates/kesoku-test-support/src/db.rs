//! A fresh database per test: a SQLite file in its own temporary directory, or a PostgreSQL
//! schema of its own in the database named by `KESOKU_TEST_POSTGRES_URL`.
//!
//! This module knows no Kesoku table and does not depend on `kesoku-store` (whose tests depend
//! on this crate); it only hands out empty places to put a store.
//!
//! PostgreSQL tests skip (printing why) when the URL is unset, unless `KESOKU_REQUIRE_SERVERS=1`,
//! in which case a missing URL or an unreachable server fails the test loudly.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Connection};
use tempfile::TempDir;

/// The PostgreSQL server tests use (for example `postgres://postgres@127.0.0.1:5432/test`).
pub const POSTGRES_URL_VAR: &str = "KESOKU_TEST_POSTGRES_URL";
/// The test Redis's URL (each test puts its own key prefix on it).
pub const REDIS_URL_VAR: &str = "KESOKU_TEST_REDIS_URL";
/// Set to `1` to make tests fail, not skip, when a server they need is not configured.
pub const REQUIRE_SERVERS_VAR: &str = "KESOKU_REQUIRE_SERVERS";
/// Prefix of the schemas made by [`pg_schema`].
pub const TEST_SCHEMA_PREFIX: &str = "kesoku_test_";
/// Test schemas older than this are dropped by the first [`pg_schema`] call of a process
/// (left behind by test runs that were killed).
const STALE_AFTER: Duration = Duration::from_secs(60 * 60);

static STALE_SWEPT: AtomicBool = AtomicBool::new(false);

/// A new temporary directory and the path of a (not yet existing) SQLite file inside it. The
/// directory and everything in it go away when the guard drops.
pub fn temp_sqlite_path() -> (TempDir, PathBuf) {
    let dir = match tempfile::Builder::new().prefix("kesoku-test-").tempdir() {
        Ok(dir) => dir,
        Err(error) => panic!("cannot create a temporary directory for a test database: {error}"),
    };
    let path = dir.path().join("kesoku.db");
    (dir, path)
}

/// Like [`temp_sqlite_path`], as a `sqlite://` URL.
pub fn temp_sqlite_url() -> (TempDir, String) {
    let (dir, path) = temp_sqlite_path();
    let url = format!("sqlite://{}", path.display());
    (dir, url)
}

/// Whether `KESOKU_REQUIRE_SERVERS=1`: missing servers fail tests instead of skipping them.
pub fn servers_required() -> bool {
    std::env::var(REQUIRE_SERVERS_VAR).is_ok_and(|value| value.trim() == "1")
}

/// A PostgreSQL schema made for one test. Call [`PgTestDb::cleanup`] at the end; if the test
/// panics first, dropping the value removes the schema (on a thread of its own).
#[derive(Debug)]
pub struct PgTestDb {
    schema: String,
    admin_url: String,
    url: String,
    cleaned: bool,
}

impl PgTestDb {
    /// The schema's name (`kesoku_test_<ulid>`).
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// A URL whose connections use the schema (`?options=-c search_path=…`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Connect options whose connections use the schema.
    pub fn connect_options(&self) -> PgConnectOptions {
        match PgConnectOptions::from_str(&self.url) {
            Ok(options) => options,
            Err(error) => panic!("the test database url built from {POSTGRES_URL_VAR} does not parse: {error}"),
        }
    }

    /// Drop the schema and everything in it. Best effort: a failure is printed, not raised.
    /// Close the pools using it first.
    pub async fn cleanup(mut self) {
        self.cleaned = true;
        drop_schema_at(&self.admin_url, &self.schema).await;
    }
}

impl Drop for PgTestDb {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // Not cleaned up: the test panicked. Drop the schema on a fresh runtime, since this may
        // run inside (or outside) any runtime.
        let (admin_url, schema) = (self.admin_url.clone(), self.schema.clone());
        let dropped =
            std::thread::spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(drop_schema_at(&admin_url, &schema)),
                Err(error) => eprintln!("note: could not drop test schema {schema}: {error}"),
            })
            .join();
        if dropped.is_err() {
            eprintln!("note: dropping test schema {} failed", self.schema);
        }
    }
}

/// Drop `schema`, printing (not raising) a failure.
async fn drop_schema_at(admin_url: &str, schema: &str) {
    let result = async {
        let mut conn = PgConnection::connect(admin_url).await?;
        drop_schema(&mut conn, schema).await?;
        conn.close().await
    }
    .await;
    if let Err(error) = result {
        eprintln!("note: could not drop test schema {schema}: {error}");
    }
}

/// The test Redis's URL (`KESOKU_TEST_REDIS_URL`, trimmed), or `None` (after printing why) when
/// it is not set.
///
/// # Panics
/// When `KESOKU_REQUIRE_SERVERS=1` and the URL is unset: a test meant to run must not pass
/// silently.
pub fn redis_url() -> Option<String> {
    match std::env::var(REDIS_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url.trim().to_owned()),
        Ok(_) | Err(_) => {
            assert!(
                !servers_required(),
                "{REQUIRE_SERVERS_VAR}=1 but {REDIS_URL_VAR} is not set: set it (for example redis://127.0.0.1:6379)"
            );
            eprintln!("skipped: {REDIS_URL_VAR} is not set");
            None
        }
    }
}

/// A fresh, empty schema in the test PostgreSQL database, or `None` (after printing why) when
/// `KESOKU_TEST_POSTGRES_URL` is not set.
///
/// # Panics
/// When `KESOKU_REQUIRE_SERVERS=1` and the URL is unset, or when the URL is set but the server
/// cannot be reached or the schema cannot be created: a test that was meant to run must not
/// pass silently.
pub async fn pg_schema() -> Option<PgTestDb> {
    let admin_url = match std::env::var(POSTGRES_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => url.trim().to_owned(),
        Ok(_) | Err(_) => {
            if servers_required() {
                panic!(
                    "{REQUIRE_SERVERS_VAR}=1 but {POSTGRES_URL_VAR} is not set: set it to a PostgreSQL URL \
                     (for example postgres://postgres@127.0.0.1:5432/test) or unset {REQUIRE_SERVERS_VAR}"
                );
            }
            eprintln!("skipped: {POSTGRES_URL_VAR} is not set");
            return None;
        }
    };
    let mut conn = match PgConnection::connect(&admin_url).await {
        Ok(conn) => conn,
        Err(error) => panic!("cannot connect to the test PostgreSQL server from {POSTGRES_URL_VAR}: {error}"),
    };
    if !STALE_SWEPT.swap(true, Ordering::SeqCst) {
        drop_stale_schemas(&mut conn).await;
    }
    let schema = format!("{TEST_SCHEMA_PREFIX}{}", ulid::Ulid::generate().to_string().to_lowercase());
    if let Err(error) = sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\""))).execute(&mut conn).await {
        panic!("cannot create test schema {schema}: {error}");
    }
    if let Err(error) = conn.close().await {
        eprintln!("note: closing the admin connection failed: {error}");
    }
    let separator = if admin_url.contains('?') { '&' } else { '?' };
    let url = format!("{admin_url}{separator}options=-c%20search_path%3D{schema}");
    Some(PgTestDb { schema, admin_url, url, cleaned: false })
}

async fn drop_schema(conn: &mut PgConnection, schema: &str) -> Result<(), sqlx::Error> {
    // The name is one we generated or listed from pg_namespace with our prefix; quoting keeps
    // it an identifier.
    let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", schema.replace('"', "\"\""));
    sqlx::query(AssertSqlSafe(sql)).execute(conn).await.map(|_| ())
}

/// Drop test schemas whose ULID says they were made more than [`STALE_AFTER`] ago.
async fn drop_stale_schemas(conn: &mut PgConnection) {
    let names: Vec<String> =
        match sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE starts_with(nspname, $1)")
            .bind(TEST_SCHEMA_PREFIX)
            .fetch_all(&mut *conn)
            .await
        {
            Ok(names) => names,
            Err(error) => {
                eprintln!("note: could not list old test schemas: {error}");
                return;
            }
        };
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    for name in names {
        let Some(suffix) = name.strip_prefix(TEST_SCHEMA_PREFIX) else { continue };
        let Ok(id) = ulid::Ulid::from_string(&suffix.to_uppercase()) else { continue };
        let age_ms = now_ms.saturating_sub(u128::from(id.timestamp_ms()));
        if age_ms > STALE_AFTER.as_millis()
            && let Err(error) = drop_schema(conn, &name).await
        {
            eprintln!("note: could not drop old test schema {name}: {error}");
        }
    }
}
