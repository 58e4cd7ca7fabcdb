//! The SQLite backend: one file in WAL mode, the embedded default.
//!
//! [`SqliteStore`] is opened here: the file is inspected first (read only, no journal-mode
//! change), and only an empty database or a Kesoku store is migrated, so opening never changes
//! a file that is not ours. The rest lives in rooms of its own:
//! - `engine`: the writer thread with group commit, the reader threads, and the gate that runs
//!   a job on the caller's thread when its connection is idle (durability is stated there);
//! - `checkpoint`: the log's checkpoints, on a thread and a connection of their own;
//! - `rows`: binding queries and decoding rows, and how times are stored;
//! - `store` and `ledger`: the [`crate::Store`] and [`crate::Ledger`] implementations (revisions
//!   are explained in `store`);
//! - `work`: the statements of follow-ups and background jobs;
//! - `history_cache`: long sessions' decoded histories, kept current by revision.
//!
//! This module holds no SQL of messages, sessions, the ledger or work rows, and never runs a job itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OpenFlags, params};

use crate::clock::Clock;
use crate::common::OpenMode;
use crate::error::{StoreError, StoreResult};
use crate::migrate::{self, Inspection, VERSION_TABLE, Verdict};
use crate::{Footprint, SqliteMemory};

mod checkpoint;
mod engine;
pub(crate) mod history_cache;
mod ledger;
mod rows;
mod store;
mod work;

use engine::{Engine, closed};
use history_cache::HistoryCache;
use rows::time_text;

/// Reader threads (each with a read-only connection) beside the writer.
const READERS: usize = 2;
/// How long a statement waits for another process's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 128;

/// A store in one SQLite file (or in memory). Clones share the connections.
#[derive(Clone)]
pub struct SqliteStore {
    engine: Arc<Engine>,
    /// Long sessions' decoded histories, brought forward by revision on each read.
    history: Arc<HistoryCache>,
    clock: Clock,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("location", &self.engine.location).finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Open the store in `path`, creating the file (and the schema) when missing.
    pub async fn open(path: impl AsRef<Path>) -> StoreResult<Self> {
        Self::open_file(path.as_ref(), OpenMode::CreateIfMissing, Footprint::Service).await
    }

    /// Open the store in `path`, which must exist ([`StoreError::Missing`] otherwise); for
    /// commands that only read.
    pub async fn open_existing(path: impl AsRef<Path>) -> StoreResult<Self> {
        Self::open_file(path.as_ref(), OpenMode::MustExist, Footprint::Service).await
    }

    /// Like [`SqliteStore::open_existing`], holding the connections and threads `footprint`
    /// says.
    pub async fn open_existing_with(path: impl AsRef<Path>, footprint: Footprint) -> StoreResult<Self> {
        Self::open_file(path.as_ref(), OpenMode::MustExist, footprint).await
    }

    /// A private in-memory store (one connection, shared by reads and writes). Gone when the
    /// store is dropped.
    pub async fn open_in_memory() -> StoreResult<Self> {
        let clock = Clock::system();
        let now = clock.now();
        let conn = tokio::task::spawn_blocking(move || -> StoreResult<Connection> {
            let conn = Connection::open_in_memory()?;
            configure(&conn, true)?;
            migrate_blocking(&conn, ":memory:", now)?;
            Ok(conn)
        })
        .await
        .map_err(|error| closed(&format!("opening the in-memory store failed: {error}")))??;
        let engine = Engine::start(conn, Vec::new(), None, Arc::from(":memory:"));
        Ok(SqliteStore { engine: Arc::new(engine), history: Arc::default(), clock })
    }

    /// SQLite's plan for `sql` with `values`, its steps joined by `; ` (for tests asserting that
    /// a query reads through an index).
    #[cfg(test)]
    pub(crate) fn query_plan(&self, sql: &str, values: Vec<rusqlite::types::Value>) -> String {
        self.engine.with_writer(|conn| {
            let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).expect("explain");
            let rows = statement
                .query_map(rusqlite::params_from_iter(values), |row| row.get::<_, String>(3))
                .expect("plan")
                .collect::<Result<Vec<_>, _>>()
                .expect("plan rows");
            rows.join("; ")
        })
    }

    /// Use `clock` for every timestamp this store writes and for orphan ages.
    pub fn with_clock(mut self, clock: impl Into<Clock>) -> Self {
        self.clock = clock.into();
        self
    }

    /// Close the connections: jobs queued before this finish first; later calls on any clone
    /// fail.
    pub async fn close(&self) {
        self.engine.close().await;
    }

    async fn open_file(path: &Path, mode: OpenMode, footprint: Footprint) -> StoreResult<Self> {
        let location: Arc<str> = Arc::from(path.display().to_string());
        let what = describe(&location);
        let exists = tokio::fs::try_exists(path).await.map_err(|error| StoreError::Foreign {
            what: what.clone(),
            reason: format!("it cannot be checked: {error}"),
        })?;
        if !exists && mode == OpenMode::MustExist {
            return Err(StoreError::Missing { what: format!("store file {what}") });
        }
        let clock = Clock::system();
        let now = clock.now();
        let owned_path = PathBuf::from(path);
        let (writer, readers, checkpointer) =
            tokio::task::spawn_blocking(move || open_blocking(&owned_path, mode, footprint, &what, now))
                .await
                .map_err(|error| closed(&format!("opening the store failed: {error}")))??;
        let engine = Engine::start(writer, readers, checkpointer, location);
        Ok(SqliteStore { engine: Arc::new(engine), history: Arc::default(), clock })
    }
}

/// Open and judge the file, switch it to WAL, migrate, and open the readers.
fn open_blocking(
    path: &Path,
    mode: OpenMode,
    footprint: Footprint,
    what: &str,
    now: DateTime<Utc>,
) -> StoreResult<(Connection, Vec<Connection>, Option<Connection>)> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if mode == OpenMode::CreateIfMissing {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let writer = Connection::open_with_flags(path, flags).map_err(|error| open_error(error, what))?;
    configure(&writer, true).map_err(|error| open_error_of(error, what))?;
    let inspection = inspect(&writer).map_err(|error| open_error(error, what))?;
    if migrate::judge(&inspection, what)? == Verdict::Empty && mode == OpenMode::MustExist {
        return Err(StoreError::Missing { what: format!("the kesoku store in {what}") });
    }
    let journal: String =
        writer.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(|error| open_error(error, what))?;
    if !journal.eq_ignore_ascii_case("wal") {
        tracing::warn!(journal_mode = %journal, store = what, "sqlite store is not in WAL mode");
    }
    migrate_blocking(&writer, what, now)?;
    let reader_count = match footprint {
        Footprint::Service => READERS,
        Footprint::Command => 0,
    };
    let mut readers = Vec::with_capacity(reader_count);
    for _ in 0..reader_count {
        let reader =
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(|error| open_error(error, what))?;
        configure(&reader, false).map_err(|error| open_error_of(error, what))?;
        readers.push(reader);
    }
    // A command's store leaves checkpoints automatic: its few writes seldom reach 1,000 pages
    // of log, and a thread and a connection more would be most of what it holds.
    let checkpointer = if journal.eq_ignore_ascii_case("wal") && footprint == Footprint::Service {
        checkpoint::open_checkpoint_connection(path, &writer, what)
    } else {
        None
    };
    Ok((writer, readers, checkpointer))
}

/// Settings of every connection (none of them writes to the file).
fn configure(conn: &Connection, writer: bool) -> StoreResult<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Sorting a long history (the phased order) must not spill to temporary files.
    conn.execute_batch("PRAGMA temp_store = MEMORY;")?;
    if writer {
        // A burst can grow the log far past its usual size; SQLite reuses the file from its
        // start afterwards but never shrinks it unless told.
        conn.execute_batch(
            "PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL; PRAGMA journal_size_limit = 16777216;",
        )?;
    }
    Ok(())
}

/// Apply pending migrations, each in its own write transaction, judging the database again
/// inside each (another process may have migrated meanwhile).
fn migrate_blocking(conn: &Connection, location: &str, now: DateTime<Utc>) -> StoreResult<()> {
    loop {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let applied = (|| {
            let inspection = inspect(conn)?;
            let verdict = migrate::judge(&inspection, &describe(location))?;
            let Some(step) = migrate::next(migrate::SQLITE, verdict) else { return Ok(None) };
            conn.execute_batch(step.sql).map_err(|error| {
                StoreError::Migration(format!(
                    "schema version {} ({}) could not be applied: {error}",
                    step.version, step.description
                ))
            })?;
            conn.execute(
                "INSERT INTO kesoku_schema_version (version, description, applied_at) VALUES (?1, ?2, ?3)",
                params![step.version, step.description, time_text(now)],
            )?;
            Ok(Some(step.version))
        })();
        match applied {
            Ok(None) => {
                conn.execute_batch("COMMIT")?;
                return Ok(());
            }
            Ok(Some(version)) => {
                conn.execute_batch("COMMIT")?;
                tracing::info!(version, store = %location, "sqlite store migrated");
            }
            Err(error) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(error);
            }
        }
    }
}

/// Tables and schema version, read without writing anything.
fn inspect(conn: &Connection) -> Result<Inspection, rusqlite::Error> {
    let tables: Vec<String> = {
        let mut statement = conn.prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
             ORDER BY name",
        )?;
        let rows = statement.query_map([], |row| row.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    let version = if tables.iter().any(|t| t == VERSION_TABLE) {
        conn.query_row("SELECT MAX(version) FROM kesoku_schema_version", [], |row| row.get(0))?
    } else {
        None
    };
    Ok(Inspection { tables, version })
}

/// SQLite's primary result code of an error, if it is one of SQLite's.
fn primary_code(error: &rusqlite::Error) -> Option<i32> {
    if let rusqlite::Error::SqliteFailure(code, _) = error { Some(code.extended_code & 0xff) } else { None }
}

/// An error met while opening, with SQLite's "not a database" family named for what it is.
fn open_error(error: rusqlite::Error, what: &str) -> StoreError {
    let reason = match primary_code(&error) {
        Some(rusqlite::ffi::SQLITE_NOTADB) => "the file is not a SQLite database".to_owned(),
        Some(rusqlite::ffi::SQLITE_CORRUPT) => {
            "the SQLite file is damaged (database disk image is malformed)".to_owned()
        }
        Some(rusqlite::ffi::SQLITE_CANTOPEN) => {
            "sqlite cannot open it: check that its directory exists and is writable and that it is a file".to_owned()
        }
        _ => return StoreError::Sqlite(error),
    };
    StoreError::Foreign { what: what.to_owned(), reason }
}

/// [`open_error`] for a store error that may hold a SQLite one.
fn open_error_of(error: StoreError, what: &str) -> StoreError {
    if let StoreError::Sqlite(inner) = error { open_error(inner, what) } else { error }
}

/// How errors name a store file.
fn describe(location: &str) -> String {
    format!("`{location}`")
}

/// What the SQLite library has allocated in this process (see [`SqliteMemory`]).
#[allow(unsafe_code)]
pub fn sqlite_library_memory() -> SqliteMemory {
    // SAFETY: both functions take no pointers and only read SQLite's global counters (kept
    // under its own mutex since the library is built with SQLITE_DEFAULT_MEMSTATUS on); they
    // are callable at any time, before or after any connection opens; the argument 0 asks not
    // to reset the high-water mark.
    let (used, highwater) =
        unsafe { (rusqlite::ffi::sqlite3_memory_used(), rusqlite::ffi::sqlite3_memory_highwater(0)) };
    SqliteMemory { bytes: u64::try_from(used).unwrap_or(0), highwater_bytes: u64::try_from(highwater).unwrap_or(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's own allocations (connections' page caches, schemas, statements) are seen while
    /// a store is open.
    #[tokio::test]
    async fn sqlites_allocations_are_reported() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("kesoku.db")).await.expect("create");
        let memory = sqlite_library_memory();
        assert!(memory.bytes > 0, "{memory:?}");
        assert!(memory.highwater_bytes >= memory.bytes, "{memory:?}");
        store.close().await;
    }
}
