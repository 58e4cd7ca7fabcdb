//! The SQLite backend: one file in WAL mode, the embedded default.
//!
//! Writes go through a pool of exactly one connection, so our own writers never meet
//! `SQLITE_BUSY`; another process writing the same file waits for the lock (busy timeout).
//! A write is either one statement or a transaction opened with `BEGIN IMMEDIATE`; both take
//! the write lock before reading anything, so what they read is the newest state. Reads use a
//! small pool of read-only connections, which WAL lets run beside the writer.
//!
//! Because writes are serialised, a revision is simply `MAX(rev) + 1` read by the writing
//! statement itself: revisions are handed out in commit order, which is what lets
//! [`Store::changes_since`] readers never skip a change.
//!
//! Status changes read the row first (on a reader, so a corrupt row is refused before anything
//! is written), then apply a compare-and-set `UPDATE … WHERE status = <what was read>`, retried
//! when a concurrent change got there first.
//!
//! Opening never changes a file that is not ours: the file is inspected first (read only, no
//! journal-mode change), and only an empty database or a Kesoku store is migrated.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use kesoku_core::{
    ActivationId, LedgerEntry, Message, MessageFilter, MessageId, Metadata, Outcome, Session, SessionId, Status, Usage,
};
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Row, Sqlite, Transaction};

use crate::clock::{Clock, truncate};
use crate::common::{
    CAS_ATTEMPTS, OpenMode, check_claim, event, insert_error, not_found, session_reference_error, stamp,
};
use crate::decode::{self, BackendRow, Cells, StoredMessage};
use crate::error::{StoreError, StoreResult};
use crate::migrate::{self, Inspection, VERSION_TABLE, Verdict};
use crate::sql::{Arg, LEDGER_COLUMNS, MESSAGE_COLUMNS, MESSAGE_COLUMNS_M, Query, SESSION_COLUMNS, SESSION_COLUMNS_S};
use crate::{Claim, Ledger, LedgerFilter, MessageEvent, SessionFilter, Store};

/// The revision of a change made by one statement (which holds the write lock while reading it).
const NEXT_REV: &str = "(SELECT COALESCE(MAX(rev), 0) + 1 FROM messages)";
/// Read-only connections beside the writer.
const READERS: u32 = 4;
/// How long a statement waits for another process's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// SQLite's "file is not a database" and "database disk image is malformed" result codes.
const SQLITE_NOTADB: &str = "26";
const SQLITE_CORRUPT: &str = "11";
const SQLITE_CANTOPEN: &str = "14";

/// A store in one SQLite file (or in memory). Clones share the pools.
#[derive(Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    clock: Clock,
    /// The file path (or `:memory:`), for errors and logs.
    location: Arc<str>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("location", &self.location).finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Open the store in `path`, creating the file (and the schema) when missing.
    pub async fn open(path: impl AsRef<Path>) -> StoreResult<Self> {
        Self::open_file(path.as_ref(), OpenMode::CreateIfMissing).await
    }

    /// Open the store in `path`, which must exist ([`StoreError::Missing`] otherwise); for
    /// commands that only read.
    pub async fn open_existing(path: impl AsRef<Path>) -> StoreResult<Self> {
        Self::open_file(path.as_ref(), OpenMode::MustExist).await
    }

    /// A private in-memory store (one connection: every pooled connection would otherwise see
    /// its own empty database). Gone when the store is dropped.
    pub async fn open_in_memory() -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")?.busy_timeout(BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await?;
        let store =
            SqliteStore { writer: pool.clone(), reader: pool, clock: Clock::system(), location: Arc::from(":memory:") };
        store.migrate().await?;
        Ok(store)
    }

    /// Use `clock` for every timestamp this store writes and for orphan ages.
    pub fn with_clock(mut self, clock: impl Into<Clock>) -> Self {
        self.clock = clock.into();
        self
    }

    /// Close both pools (waits for connections in use to come back).
    pub async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }

    async fn open_file(path: &Path, mode: OpenMode) -> StoreResult<Self> {
        let location: Arc<str> = Arc::from(path.display().to_string());
        let what = describe(&location);
        let exists = tokio::fs::try_exists(path).await.map_err(|error| StoreError::Foreign {
            what: what.clone(),
            reason: format!("it cannot be checked: {error}"),
        })?;
        if !exists && mode == OpenMode::MustExist {
            return Err(StoreError::Missing { what: format!("store file {what}") });
        }
        let base = SqliteConnectOptions::new()
            .filename(PathBuf::from(path))
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            .synchronous(SqliteSynchronous::Normal);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(base.clone().create_if_missing(mode == OpenMode::CreateIfMissing))
            .await
            .map_err(|error| open_error(error, &what))?;
        let opened = Self::prepare_file(&writer, &location, mode).await;
        if let Err(error) = opened {
            writer.close().await;
            return Err(error);
        }
        let reader = SqlitePoolOptions::new()
            .max_connections(READERS)
            .min_connections(0)
            .connect_with(base.read_only(true))
            .await
            .map_err(|error| open_error(error, &what))?;
        let store = SqliteStore { writer, reader, clock: Clock::system(), location };
        Ok(store)
    }

    /// Judge the file without writing, then switch it to WAL and migrate.
    async fn prepare_file(writer: &SqlitePool, location: &Arc<str>, mode: OpenMode) -> StoreResult<()> {
        let what = &describe(location);
        {
            let mut conn = writer.acquire().await.map_err(|error| open_error(error, what))?;
            let inspection = inspect(&mut conn).await.map_err(|error| open_error(error, what))?;
            if migrate::judge(&inspection, what)? == Verdict::Empty && mode == OpenMode::MustExist {
                return Err(StoreError::Missing { what: format!("the kesoku store in {what}") });
            }
            let mode: String = sqlx::query_scalar("PRAGMA journal_mode = WAL")
                .fetch_one(&mut *conn)
                .await
                .map_err(|error| open_error(error, what))?;
            if !mode.eq_ignore_ascii_case("wal") {
                tracing::warn!(journal_mode = %mode, store = what, "sqlite store is not in WAL mode");
            }
        }
        let store = SqliteStore {
            writer: writer.clone(),
            reader: writer.clone(),
            clock: Clock::system(),
            location: Arc::clone(location),
        };
        store.migrate().await
    }

    /// Apply pending migrations, each in its own write transaction, judging the database again
    /// inside each (another process may have migrated meanwhile).
    async fn migrate(&self) -> StoreResult<()> {
        loop {
            let mut tx = self.write_tx().await?;
            let inspection = inspect(&mut tx).await?;
            let verdict = migrate::judge(&inspection, &describe(&self.location))?;
            let Some(step) = migrate::next(migrate::SQLITE, verdict) else {
                tx.commit().await?;
                return Ok(());
            };
            sqlx::raw_sql(step.sql).execute(&mut *tx).await.map_err(|error| {
                StoreError::Migration(format!(
                    "schema version {} ({}) could not be applied: {error}",
                    step.version, step.description
                ))
            })?;
            sqlx::query("INSERT INTO kesoku_schema_version (version, description, applied_at) VALUES ($1, $2, $3)")
                .bind(step.version)
                .bind(step.description)
                .bind(time_text(self.clock.now()))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            tracing::info!(version = step.version, store = %self.location, "sqlite store migrated");
        }
    }

    async fn write_tx(&self) -> StoreResult<Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Insert one message with revision `rev`, or the next one when `None`.
    async fn insert_in(
        &self,
        conn: &mut SqliteConnection,
        message: &Message,
        rev: Option<i64>,
        now: DateTime<Utc>,
    ) -> StoreResult<MessageEvent> {
        let stored = stamp(message, now);
        let row = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO messages (id, session_id, parent_id, chatbot_id, channel_id, sender, role, type, content, \
             status, metadata, step, created_at, updated_at, turn_id, phase, rev, created_rev) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
             COALESCE((SELECT p.turn_id FROM messages p WHERE p.id = $3 AND p.session_id = $2), $1), $15, \
             COALESCE($16, {NEXT_REV}), COALESCE($16, {NEXT_REV})) RETURNING rev"
        )))
        .bind(stored.id.as_str())
        .bind(stored.session_id.as_str())
        .bind(stored.parent_id.as_ref().map(MessageId::as_str))
        .bind(&stored.chatbot_id)
        .bind(&stored.channel_id)
        .bind(&stored.sender)
        .bind(stored.role.as_str())
        .bind(stored.message_type.as_str())
        .bind(&stored.content)
        .bind(stored.status.as_str())
        .bind(stored.metadata.to_value().to_string())
        .bind(i64::from(stored.step))
        .bind(stored.created_at.map(time_text))
        .bind(stored.updated_at.map(time_text))
        .bind(stored.phase() as i64)
        .bind(rev)
        .fetch_one(&mut *conn)
        .await
        .map_err(|error| insert_error(error, "message", stored.id.as_str()))?;
        let rev: i64 = row.try_get("rev")?;
        Ok(MessageEvent { rev, created: true, message: stored })
    }

    async fn fetch_message(&self, id: &MessageId) -> StoreResult<Option<StoredMessage>> {
        let row = sqlx::query(AssertSqlSafe(format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = $1")))
            .bind(id.as_str())
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(decode::message).transpose()
    }

    async fn messages(&self, query: Query) -> StoreResult<Vec<StoredMessage>> {
        let rows = bind(query).fetch_all(&self.reader).await?;
        rows.iter().map(decode::message).collect()
    }

    /// The recovery of orphans, with "now" given (the trait method passes the clock's).
    async fn recover_orphans_before(
        &self,
        threshold: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<MessageId>> {
        let mut tx = self.write_tx().await?;
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM messages WHERE status = 'processing' AND COALESCE(claimed_at, updated_at) < $1 \
             ORDER BY seq",
        )
        .bind(time_text(threshold))
        .fetch_all(&mut *tx)
        .await?;
        let mut rev = next_rev(&mut tx).await?;
        let mut recovered = Vec::with_capacity(ids.len());
        for id in ids {
            let done = sqlx::query(
                "UPDATE messages SET status = 'pending_agent', updated_at = $2, rev = $3, claimed_by = NULL, \
                 claimed_at = NULL WHERE id = $1 AND status = 'processing'",
            )
            .bind(&id)
            .bind(time_text(now))
            .bind(rev)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 1 {
                rev += 1;
                recovered.push(MessageId::from(id));
            }
        }
        tx.commit().await?;
        Ok(recovered)
    }
}

impl BackendRow for SqliteRow {
    fn opt_text(&self, column: &'static str) -> Result<Option<String>, String> {
        self.try_get(column).map_err(|error| error.to_string())
    }

    fn opt_int(&self, column: &'static str) -> Result<Option<i64>, String> {
        self.try_get(column).map_err(|error| error.to_string())
    }

    fn opt_time(&self, column: &'static str) -> Result<Option<DateTime<Utc>>, String> {
        self.opt_text(column)?.map(|text| decode::parse_time_text(&text)).transpose()
    }

    fn opt_json(&self, column: &'static str) -> Result<Option<serde_json::Value>, String> {
        self.opt_text(column)?.map(|text| decode::parse_json_text(&text)).transpose()
    }
}

/// How errors name a store file.
fn describe(location: &str) -> String {
    format!("`{location}`")
}

/// How times are stored: fixed-width UTC text to the microsecond, so text order is time order.
fn time_text(at: DateTime<Utc>) -> String {
    truncate(at).format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

fn bind(query: Query) -> sqlx::query::Query<'static, Sqlite, SqliteArguments> {
    let mut bound = sqlx::query(AssertSqlSafe(query.text));
    for arg in query.args {
        bound = match arg {
            Arg::Text(text) => bound.bind(text),
            Arg::Int(value) => bound.bind(value),
            Arg::Time(at) => bound.bind(time_text(at)),
        };
    }
    bound
}

/// The revision the next change gets (inside a write transaction, so nobody else takes it).
async fn next_rev(tx: &mut SqliteConnection) -> StoreResult<i64> {
    Ok(sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NEXT_REV}"))).fetch_one(tx).await?)
}

/// Tables and schema version, read without writing anything.
async fn inspect(conn: &mut SqliteConnection) -> Result<Inspection, sqlx::Error> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name",
    )
    .fetch_all(&mut *conn)
    .await?;
    let version = if tables.iter().any(|t| t == VERSION_TABLE) {
        sqlx::query_scalar("SELECT MAX(version) FROM kesoku_schema_version").fetch_one(&mut *conn).await?
    } else {
        None
    };
    Ok(Inspection { tables, version })
}

/// An error met while opening, with SQLite's "not a database" family named for what it is.
fn open_error(error: sqlx::Error, what: &str) -> StoreError {
    let code = error.as_database_error().and_then(|db| db.code()).map(|code| code.into_owned());
    let reason = match code.as_deref() {
        Some(SQLITE_NOTADB) => "the file is not a SQLite database".to_owned(),
        Some(SQLITE_CORRUPT) => "the SQLite file is damaged (database disk image is malformed)".to_owned(),
        Some(SQLITE_CANTOPEN) => {
            "sqlite cannot open it: check that its directory exists and is writable and that it is a file".to_owned()
        }
        _ => return StoreError::Database(error),
    };
    StoreError::Foreign { what: what.to_owned(), reason }
}

#[async_trait]
impl Store for SqliteStore {
    async fn insert_message(&self, message: &Message) -> StoreResult<MessageEvent> {
        // One statement: it holds the write lock while reading MAX(rev).
        let mut conn = self.writer.acquire().await?;
        self.insert_in(&mut conn, message, None, self.clock.now()).await
    }

    async fn insert_messages(&self, messages: &[Message]) -> StoreResult<Vec<MessageEvent>> {
        let mut tx = self.write_tx().await?;
        let first = next_rev(&mut tx).await?;
        let now = self.clock.now();
        let mut events = Vec::with_capacity(messages.len());
        for (rev, message) in (first..).zip(messages) {
            events.push(self.insert_in(&mut tx, message, Some(rev), now).await?);
        }
        tx.commit().await?;
        Ok(events)
    }

    async fn get_message(&self, id: &MessageId) -> StoreResult<Option<Message>> {
        Ok(self.fetch_message(id).await?.map(|stored| stored.message))
    }

    async fn list_messages(&self, filter: &MessageFilter) -> StoreResult<Vec<Message>> {
        let mut query = Query::new(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE 1 = 1"));
        query.message_filter(filter, "").push(" ORDER BY seq").limit(filter.limit);
        Ok(self.messages(query).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn update_status(&self, id: &MessageId, to: Status) -> StoreResult<MessageEvent> {
        for _ in 0..CAS_ATTEMPTS {
            let Some(current) = self.fetch_message(id).await? else { return Err(not_found("message", id.as_str())) };
            let from = current.message.status;
            from.check_transition(to)
                .map_err(|source| StoreError::IllegalTransition { id: id.as_str().to_owned(), source })?;
            let row = sqlx::query(AssertSqlSafe(format!(
                "UPDATE messages SET status = $2, updated_at = $3, rev = {NEXT_REV}, \
                 claimed_by = CASE WHEN $2 = 'processing' THEN NULL ELSE claimed_by END, \
                 claimed_at = CASE WHEN $2 = 'processing' THEN $3 ELSE claimed_at END \
                 WHERE id = $1 AND status = $4 RETURNING {MESSAGE_COLUMNS}"
            )))
            .bind(id.as_str())
            .bind(to.as_str())
            .bind(time_text(self.clock.now()))
            .bind(from.as_str())
            .fetch_optional(&self.writer)
            .await?;
            if let Some(row) = row {
                return Ok(event(decode::message(&row)?, false));
            }
        }
        Err(StoreError::Contention { id: id.as_str().to_owned() })
    }

    async fn claim(
        &self,
        id: &MessageId,
        to: Status,
        expected: &[Status],
        claimed_by: &str,
    ) -> StoreResult<Option<MessageEvent>> {
        check_claim(id, to, expected)?;
        if expected.is_empty() {
            return Ok(None);
        }
        // Look on a reader first: a corrupt row is refused before anything is written, and
        // most losers of a race stop here without queueing for the writer. The UPDATE below
        // stays the only authority.
        let Some(current) = self.fetch_message(id).await? else { return Err(not_found("message", id.as_str())) };
        if !expected.contains(&current.message.status) {
            return Ok(None);
        }
        let mut query = Query::with_args(
            &format!(
                "UPDATE messages SET status = $1, updated_at = $2, rev = {NEXT_REV}, \
                 claimed_by = CASE WHEN $1 = 'processing' THEN $3 ELSE claimed_by END, \
                 claimed_at = CASE WHEN $1 = 'processing' THEN $2 ELSE claimed_at END \
                 WHERE id = $4"
            ),
            vec![
                Arg::Text(to.as_str().to_owned()),
                Arg::Time(self.clock.now()),
                Arg::Text(claimed_by.to_owned()),
                Arg::Text(id.as_str().to_owned()),
            ],
        );
        query.and_in("status", expected.iter().map(|s| s.as_str())).push(&format!(" RETURNING {MESSAGE_COLUMNS}"));
        let row = bind(query).fetch_optional(&self.writer).await?;
        row.map(|row| decode::message(&row).map(|stored| event(stored, false))).transpose()
    }

    async fn renew_claim(&self, id: &MessageId, claimed_by: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE messages SET claimed_at = $1 WHERE id = $2 AND status = 'processing' AND claimed_by = $3",
        )
        .bind(time_text(self.clock.now()))
        .bind(id.as_str())
        .bind(claimed_by)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn claim_of(&self, id: &MessageId) -> StoreResult<Option<Claim>> {
        let row = sqlx::query("SELECT id, status, claimed_by, claimed_at FROM messages WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.reader)
            .await?;
        let Some(row) = row else { return Err(not_found("message", id.as_str())) };
        let cells = Cells::new(&row, "messages")?;
        let status: Status = cells.parse("status")?;
        let claimed_by = cells.opt_text("claimed_by")?;
        let claimed_at = cells.opt_time("claimed_at")?;
        Ok(match (status, claimed_by, claimed_at) {
            (Status::Processing, Some(claimed_by), Some(claimed_at)) => Some(Claim { claimed_by, claimed_at }),
            _ => None,
        })
    }

    async fn update_metadata(&self, id: &MessageId, metadata: &Metadata) -> StoreResult<MessageEvent> {
        // Read first, so a row we cannot understand is refused before it is changed.
        if self.fetch_message(id).await?.is_none() {
            return Err(not_found("message", id.as_str()));
        }
        let row = sqlx::query(AssertSqlSafe(format!(
            "UPDATE messages SET metadata = $2, updated_at = $3, rev = {NEXT_REV} WHERE id = $1 \
             RETURNING {MESSAGE_COLUMNS}"
        )))
        .bind(id.as_str())
        .bind(metadata.to_value().to_string())
        .bind(time_text(self.clock.now()))
        .fetch_optional(&self.writer)
        .await?;
        let Some(row) = row else { return Err(not_found("message", id.as_str())) };
        Ok(event(decode::message(&row)?, false))
    }

    async fn session_history(&self, session_id: &SessionId) -> StoreResult<Vec<Message>> {
        let query = Query::with_args(
            &format!(
                "SELECT {MESSAGE_COLUMNS_M} FROM messages m LEFT JOIN messages r ON r.id = m.turn_id \
                 WHERE m.session_id = $1 ORDER BY COALESCE(r.seq, m.seq), m.step, m.phase, m.seq"
            ),
            vec![Arg::Text(session_id.as_str().to_owned())],
        );
        Ok(self.messages(query).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn recover_orphans(&self, older_than: Duration) -> StoreResult<Vec<MessageId>> {
        let now = self.clock.now();
        let threshold = chrono::Duration::from_std(older_than)
            .ok()
            .and_then(|age| now.checked_sub_signed(age))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        self.recover_orphans_before(threshold, now).await
    }

    async fn orphaned_tool_calls(&self, session_id: Option<&SessionId>) -> StoreResult<Vec<Message>> {
        let mut query = Query::new(&format!(
            "SELECT {MESSAGE_COLUMNS_M} FROM messages m WHERE m.type = 'tool_call' \
             AND NOT EXISTS (SELECT 1 FROM messages r WHERE r.parent_id = m.id AND r.type = 'tool_result')"
        ));
        if let Some(session_id) = session_id {
            query.and_eq("m.session_id", Arg::Text(session_id.as_str().to_owned()));
        }
        query.push(" ORDER BY m.seq");
        Ok(self.messages(query).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn changes_since(&self, after: i64, filter: &MessageFilter, limit: u32) -> StoreResult<Vec<MessageEvent>> {
        let mut query =
            Query::with_args(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE rev > $1"), vec![Arg::Int(after)]);
        query.message_filter(filter, "").push(" ORDER BY rev").limit(Some(limit));
        let stored = self.messages(query).await?;
        Ok(stored
            .into_iter()
            .map(|s| {
                let created = s.created_rev > after;
                event(s, created)
            })
            .collect())
    }

    async fn current_rev(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT COALESCE(MAX(rev), 0) FROM messages").fetch_one(&self.reader).await?)
    }

    async fn create_session(&self, session: &Session) -> StoreResult<()> {
        let mut tx = self.write_tx().await?;
        insert_session(&mut tx, session).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_session(&self, id: &SessionId) -> StoreResult<Option<Session>> {
        let row = sqlx::query(AssertSqlSafe(format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1")))
            .bind(id.as_str())
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(decode::session).transpose()
    }

    async fn list_sessions(&self, filter: &SessionFilter) -> StoreResult<Vec<Session>> {
        let mut query = Query::new(&format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE 1 = 1"));
        if let Some(chatbot_id) = &filter.chatbot_id {
            query.and_eq("chatbot_id", Arg::Text(chatbot_id.clone()));
        }
        if let Some(channel_id) = &filter.channel_id {
            query.and_eq("channel_id", Arg::Text(channel_id.clone()));
        }
        query.push(" ORDER BY created_at DESC, id DESC").limit(filter.limit);
        let rows = bind(query).fetch_all(&self.reader).await?;
        rows.iter().map(decode::session).collect()
    }

    async fn set_session_title(&self, id: &SessionId, title: &str) -> StoreResult<()> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query("UPDATE sessions SET title = $2, updated_at = $3 WHERE id = $1")
            .bind(id.as_str())
            .bind(title)
            .bind(time_text(self.clock.now()))
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("session", id.as_str()));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn active_session(&self, chatbot_id: &str, channel_id: &str) -> StoreResult<Option<SessionId>> {
        let id: Option<String> =
            sqlx::query_scalar("SELECT session_id FROM channel_sessions WHERE chatbot_id = $1 AND channel_id = $2")
                .bind(chatbot_id)
                .bind(channel_id)
                .fetch_optional(&self.reader)
                .await?;
        Ok(id.map(SessionId::from))
    }

    async fn set_active_session(&self, chatbot_id: &str, channel_id: &str, session_id: &SessionId) -> StoreResult<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query(
            "INSERT INTO channel_sessions (chatbot_id, channel_id, session_id) VALUES ($1, $2, $3) \
             ON CONFLICT (chatbot_id, channel_id) DO UPDATE SET session_id = excluded.session_id",
        )
        .bind(chatbot_id)
        .bind(channel_id)
        .bind(session_id.as_str())
        .execute(&mut *tx)
        .await
        .map_err(|error| session_reference_error(error, session_id.as_str()))?;
        tx.commit().await?;
        Ok(())
    }

    async fn resolve_session(&self, chatbot_id: &str, channel_id: &str) -> StoreResult<Session> {
        if let Some(session) = active_in(&self.reader, chatbot_id, channel_id).await? {
            return Ok(session);
        }
        // The write transaction holds SQLite's write lock, so checking again and creating is
        // atomic against every other writer, in this process or another.
        let mut tx = self.write_tx().await?;
        if let Some(session) = active_in(&mut *tx, chatbot_id, channel_id).await? {
            tx.commit().await?;
            return Ok(session);
        }
        let session = Session::new(chatbot_id, channel_id, self.clock.now());
        insert_session(&mut tx, &session).await?;
        sqlx::query("INSERT INTO channel_sessions (chatbot_id, channel_id, session_id) VALUES ($1, $2, $3)")
            .bind(chatbot_id)
            .bind(channel_id)
            .bind(session.id.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(session)
    }
}

async fn insert_session(tx: &mut SqliteConnection, session: &Session) -> StoreResult<()> {
    sqlx::query(AssertSqlSafe(format!("INSERT INTO sessions ({SESSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)")))
        .bind(session.id.as_str())
        .bind(&session.chatbot_id)
        .bind(&session.channel_id)
        .bind(session.title.as_deref())
        .bind(time_text(session.created_at))
        .bind(time_text(session.updated_at))
        .execute(tx)
        .await
        .map_err(|error| insert_error(error, "session", session.id.as_str()))?;
    Ok(())
}

async fn active_in<'e, E>(executor: E, chatbot_id: &str, channel_id: &str) -> StoreResult<Option<Session>>
where
    E: sqlx::Executor<'e, Database = Sqlite>,
{
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT {SESSION_COLUMNS_S} FROM channel_sessions c JOIN sessions s ON s.id = c.session_id \
         WHERE c.chatbot_id = $1 AND c.channel_id = $2"
    )))
    .bind(chatbot_id)
    .bind(channel_id)
    .fetch_optional(executor)
    .await?;
    row.as_ref().map(decode::session).transpose()
}

#[async_trait]
impl Ledger for SqliteStore {
    async fn record_enqueued(&self, entry: &LedgerEntry) -> StoreResult<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO activations ({LEDGER_COLUMNS}) VALUES \
             ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) \
             ON CONFLICT (id) DO NOTHING"
        )))
        .bind(entry.id.as_str())
        .bind(entry.kind.as_str())
        .bind(entry.lane.as_str())
        .bind(entry.session_id.as_str())
        .bind(entry.message_id.as_ref().map(MessageId::as_str))
        .bind(&entry.triggered_by)
        .bind(entry.delegation_user.as_deref())
        .bind(i64::from(entry.depth))
        .bind(time_text(entry.enqueued_at))
        .bind(entry.started_at.map(time_text))
        .bind(entry.finished_at.map(time_text))
        .bind(entry.outcome.map(Outcome::as_str))
        .bind(entry.error.as_deref())
        .bind(decode::count(entry.usage.model_calls))
        .bind(decode::count(entry.usage.tool_calls))
        .bind(decode::count(entry.usage.input_tokens))
        .bind(decode::count(entry.usage.output_tokens))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn record_started(&self, id: &ActivationId, at: DateTime<Utc>) -> StoreResult<()> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query("UPDATE activations SET started_at = $2 WHERE id = $1")
            .bind(id.as_str())
            .bind(time_text(at))
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("activation", id.as_str()));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn record_finished(
        &self,
        id: &ActivationId,
        at: DateTime<Utc>,
        outcome: Outcome,
        error: Option<&str>,
        usage: &Usage,
    ) -> StoreResult<()> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(
            "UPDATE activations SET finished_at = $2, outcome = $3, error = $4, model_calls = $5, tool_calls = $6, \
             input_tokens = $7, output_tokens = $8 WHERE id = $1",
        )
        .bind(id.as_str())
        .bind(time_text(at))
        .bind(outcome.as_str())
        .bind(error)
        .bind(decode::count(usage.model_calls))
        .bind(decode::count(usage.tool_calls))
        .bind(decode::count(usage.input_tokens))
        .bind(decode::count(usage.output_tokens))
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("activation", id.as_str()));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn get_activation(&self, id: &ActivationId) -> StoreResult<Option<LedgerEntry>> {
        let row = sqlx::query(AssertSqlSafe(format!("SELECT {LEDGER_COLUMNS} FROM activations WHERE id = $1")))
            .bind(id.as_str())
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(decode::ledger_entry).transpose()
    }

    async fn list_activations(&self, filter: &LedgerFilter) -> StoreResult<Vec<LedgerEntry>> {
        let mut query = Query::new(&format!("SELECT {LEDGER_COLUMNS} FROM activations WHERE 1 = 1"));
        if let Some(session_id) = &filter.session_id {
            query.and_eq("session_id", Arg::Text(session_id.as_str().to_owned()));
        }
        if filter.only_unsuccessful {
            query.push(" AND outcome IS NOT NULL AND outcome <> 'succeeded'");
        }
        query.push(" ORDER BY enqueued_at DESC, id DESC").limit(filter.limit);
        let rows = bind(query).fetch_all(&self.reader).await?;
        rows.iter().map(decode::ledger_entry).collect()
    }

    async fn unfinished_activations(&self) -> StoreResult<Vec<LedgerEntry>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {LEDGER_COLUMNS} FROM activations WHERE started_at IS NOT NULL AND finished_at IS NULL \
             ORDER BY enqueued_at, id"
        )))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(decode::ledger_entry).collect()
    }
}
