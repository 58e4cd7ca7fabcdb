//! The store and the ledger: the durable truth of Kesoku.
//!
//! Two backends implement one [`Store`] trait and one [`Ledger`] trait, chosen by URL:
//! `sqlite://path` (the embedded default, WAL) and `postgres://…`. This is the only crate that
//! contains SQL. It knows nothing of brokers, models or platforms.
//!
//! Invariants every backend keeps (the conformance suite in `tests/it` checks each):
//! - every status change is checked against [`kesoku_core::Status::can_transition_to`];
//! - [`Store::claim`], [`Store::settle_followup`] and [`Store::finish_job`] are atomic
//!   compare-and-sets: of many concurrent callers exactly one wins;
//! - every insert and every change of a message bumps a global revision counter and stores it
//!   on the row, so readers can catch up with [`Store::changes_since`] after missing
//!   broadcasts; a reader that continues from the last revision it was given never skips a
//!   change that commits late (SQLite: one writer; PostgreSQL: the rev gate, see the `postgres`
//!   module). Rows that are not messages (sessions, deliveries, follow-ups, jobs) take none;
//! - a change that cannot be made (illegal transition, unknown id, duplicate id, a row this
//!   build cannot read) is a typed error and changes nothing;
//! - nothing read from disk panics: unknown enum strings and bad JSON are typed errors.
//!
//! Times are stored to the microsecond (the precision both engines keep); the store stamps them
//! from its [`Clock`], which tests replace with a [`ManualClock`].
//!
//! Start with [`open`] (or [`open_existing`] for commands that must not create a store), which
//! picks the backend from the URL and returns both traits over one pool.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use kesoku_core::{
    ActivationId, ActivationKind, DeliveryRecord, FollowUp, FollowUpFilter, FollowUpId, FollowUpState, GrantInfo, Job,
    JobEnd, JobFilter, JobId, Lane, LedgerEntry, Message, MessageFilter, MessageId, Metadata, Outcome, Role, Session,
    SessionId, Status, Usage,
};

mod clock;
mod common;
mod decode;
mod error;
mod migrate;
mod postgres;
mod sql;
mod sqlite;

pub use clock::{Clock, ManualClock};
pub use error::{StoreError, StoreResult};
pub use migrate::SCHEMA_VERSION;
pub use postgres::{PgPoolSettings, PgStore};
pub use sqlite::{SqliteStore, sqlite_library_memory};
pub use sqlx::postgres::PgConnectOptions;

use common::OpenMode;

/// A message as of one change: its full state and the revision that change got.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageEvent {
    /// Global, strictly increasing revision of this change.
    pub rev: i64,
    /// Whether the change created the message (else it updated it). In
    /// [`Store::changes_since`], whether the message was created after the reader's revision
    /// (new to the reader, even if it changed again since).
    pub created: bool,
    pub message: Message,
}

/// Who holds a claimed message, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub claimed_by: String,
    pub claimed_at: DateTime<Utc>,
}

/// Filter for listing sessions, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    pub chatbot_id: Option<String>,
    pub channel_id: Option<String>,
    pub limit: Option<u32>,
}

/// Filter for listing ledger rows, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerFilter {
    pub session_id: Option<SessionId>,
    /// Only rows whose outcome is not `succeeded` (failed, interrupted, cancelled, limit exceeded).
    pub only_unsuccessful: bool,
    /// Only activations of this kind.
    pub kind: Option<ActivationKind>,
    /// Only activations of this lane.
    pub lane: Option<Lane>,
    pub limit: Option<u32>,
}

/// The message store: messages, sessions, the channel → active session map, the delivery
/// records of messages sent to platforms, and work that outlives a turn (follow-ups, background
/// jobs).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Write a new message. Stamps `created_at`/`updated_at` when unset. Fails with
    /// [`StoreError::Duplicate`] when the id exists.
    async fn insert_message(&self, message: &Message) -> StoreResult<MessageEvent>;

    /// Write several new messages in one transaction (all or nothing), in order.
    async fn insert_messages(&self, messages: &[Message]) -> StoreResult<Vec<MessageEvent>>;

    async fn get_message(&self, id: &MessageId) -> StoreResult<Option<Message>>;

    /// Messages matching `filter`, in the order they were written.
    async fn list_messages(&self, filter: &MessageFilter) -> StoreResult<Vec<Message>>;

    /// The newest `limit` messages matching `filter` (its own limit ignored), oldest first: the
    /// recent messages of a channel or thread that a turn shows as context.
    async fn recent_messages(&self, filter: &MessageFilter, limit: u32) -> StoreResult<Vec<Message>>;

    /// For each channel of `chatbot_id`, its newest message of `role` written at or after
    /// `since` (one per channel; channels without one are left out), in the order they were
    /// written. A platform adapter reads here where it stopped listening in each channel.
    async fn newest_per_channel(&self, chatbot_id: &str, role: Role, since: DateTime<Utc>)
    -> StoreResult<Vec<Message>>;

    /// Change a message's status, checked against the transition table. Fails with
    /// [`StoreError::IllegalTransition`] (nothing changed) or [`StoreError::NotFound`].
    async fn update_status(&self, id: &MessageId, to: Status) -> StoreResult<MessageEvent>;

    /// Atomic compare-and-set: set `to` only if the current status is one of `expected`.
    /// Returns `None` when another claimant won (or the status was not expected). The
    /// transition must be legal from every expected status. When `to` is `processing`, records
    /// `claimed_by` and the claim time (orphan recovery measures from it).
    async fn claim(
        &self,
        id: &MessageId,
        to: Status,
        expected: &[Status],
        claimed_by: &str,
    ) -> StoreResult<Option<MessageEvent>>;

    /// Refresh the claim time of a `processing` message still held by `claimed_by` (the
    /// worker's heartbeat). False when the message is no longer processing or held by another.
    /// Changes no status and no revision.
    async fn renew_claim(&self, id: &MessageId, claimed_by: &str) -> StoreResult<bool>;

    /// Who holds a `processing` message, and since when.
    async fn claim_of(&self, id: &MessageId) -> StoreResult<Option<Claim>>;

    /// Replace a message's metadata (for example a platform id learned at delivery).
    async fn update_metadata(&self, id: &MessageId, metadata: &Metadata) -> StoreResult<MessageEvent>;

    /// The whole session in phased order (spec §5.1; [`kesoku_core::history::phased_order`]).
    async fn session_history(&self, session_id: &SessionId) -> StoreResult<Vec<Message>>;

    /// Messages left `processing` whose claim is older than `older_than` go back to
    /// `pending_agent`. Returns the recovered ids.
    async fn recover_orphans(&self, older_than: Duration) -> StoreResult<Vec<MessageId>>;

    /// Tool calls without a tool result answering them, oldest first; in one session or all.
    async fn orphaned_tool_calls(&self, session_id: Option<&SessionId>) -> StoreResult<Vec<Message>>;

    /// Messages changed after revision `after`, latest state of each, in revision order, at
    /// most `limit` of them. Every change with a revision at or below the last one returned is
    /// final: a reader that continues from there never skips a change committed late.
    async fn changes_since(&self, after: i64, filter: &MessageFilter, limit: u32) -> StoreResult<Vec<MessageEvent>>;

    /// The newest revision (0 on an empty store); changes up to it are final, so it is a safe
    /// starting point for [`Store::changes_since`].
    async fn current_rev(&self) -> StoreResult<i64>;

    async fn create_session(&self, session: &Session) -> StoreResult<()>;
    async fn get_session(&self, id: &SessionId) -> StoreResult<Option<Session>>;
    async fn list_sessions(&self, filter: &SessionFilter) -> StoreResult<Vec<Session>>;
    /// Set a session's title (and bump `updated_at`).
    async fn set_session_title(&self, id: &SessionId, title: &str) -> StoreResult<()>;

    /// The active session of a (chatbot, channel) pair, if any.
    async fn active_session(&self, chatbot_id: &str, channel_id: &str) -> StoreResult<Option<SessionId>>;
    /// Point a (chatbot, channel) pair at a session (which must exist).
    async fn set_active_session(&self, chatbot_id: &str, channel_id: &str, session_id: &SessionId) -> StoreResult<()>;
    /// The active session of the pair, creating and activating a new one atomically when there
    /// is none; concurrent callers get the same session.
    async fn resolve_session(&self, chatbot_id: &str, channel_id: &str) -> StoreResult<Session>;

    /// Record that one part of a message is on its platform. The first record of a
    /// `(message_id, part)` is kept: recording the same part again (a retried delivery) changes
    /// nothing and is not an error. The message need not be in the store.
    async fn record_delivery(&self, record: &DeliveryRecord) -> StoreResult<()>;

    /// The delivery records of a message, by part (none when nothing was sent).
    async fn delivery_records(&self, message_id: &MessageId) -> StoreResult<Vec<DeliveryRecord>>;

    /// Store a new follow-up as given (times cut to microseconds). Fails with
    /// [`StoreError::Duplicate`] when its id exists. Follow-ups are not messages: storing or
    /// settling one takes no revision.
    async fn insert_followup(&self, followup: &FollowUp) -> StoreResult<()>;

    async fn get_followup(&self, id: &FollowUpId) -> StoreResult<Option<FollowUp>>;

    /// Follow-ups matching `filter`, soonest due first (ties: in the order they were stored).
    async fn list_followups(&self, filter: &FollowUpFilter) -> StoreResult<Vec<FollowUp>>;

    /// Compare-and-set: move a `pending` follow-up to `to` (`fired` or `cancelled`), stamping
    /// `settled_at = at`. False when it is not pending (fired or cancelled already; nothing
    /// changed): of concurrent callers exactly one gets true. [`StoreError::NotFound`] for an
    /// unknown id; [`StoreError::IllegalChange`] when `to` is `pending`.
    async fn settle_followup(&self, id: &FollowUpId, to: FollowUpState, at: DateTime<Utc>) -> StoreResult<bool>;

    /// Store a new background job as given (times cut to microseconds). Fails with
    /// [`StoreError::Duplicate`] when its id exists. Jobs are not messages: storing or
    /// finishing one takes no revision.
    async fn insert_job(&self, job: &Job) -> StoreResult<()>;

    async fn get_job(&self, id: &JobId) -> StoreResult<Option<Job>>;

    /// Jobs matching `filter`, newest started first (ties: the last stored first).
    async fn list_jobs(&self, filter: &JobFilter) -> StoreResult<Vec<Job>>;

    /// Compare-and-set: record how a `running` job ended (state, exit code, detail, finish
    /// time). False when it is not running (its end is recorded already; nothing changed): of
    /// concurrent callers exactly one gets true. [`StoreError::NotFound`] for an unknown id;
    /// [`StoreError::IllegalChange`] when `end.state` is `running`.
    async fn finish_job(&self, id: &JobId, end: &JobEnd) -> StoreResult<bool>;

    /// A chat platform adapter's remembered value for `key` (a long-poll cursor, a per-peer
    /// reply token), `None` when never set.
    async fn chatbot_state(&self, chatbot_id: &str, key: &str) -> StoreResult<Option<String>>;

    /// Set (or replace) a chat platform adapter's remembered value. Takes no revision.
    async fn set_chatbot_state(&self, chatbot_id: &str, key: &str, value: &str) -> StoreResult<()>;

    /// Set (or replace) `user`'s grant `name` to `secret`: `created_at` is kept on a
    /// replacement, `updated_at` stamped. [`StoreError::IllegalChange`] for an empty user or a
    /// name that is not `[a-z0-9_-]{1,64}` ([`kesoku_core::check_grant_key`]). Takes no revision.
    async fn set_grant(&self, user: &str, name: &str, secret: &str) -> StoreResult<()>;

    /// The secret of `user`'s grant `name`, `None` when there is none. The only read of a
    /// secret: callers hand it to the one request that needs it.
    async fn grant_secret(&self, user: &str, name: &str) -> StoreResult<Option<String>>;

    /// The grants of `user` (all users' when `None`), by user then name: who, which, when;
    /// never the secrets.
    async fn list_grants(&self, user: Option<&str>) -> StoreResult<Vec<GrantInfo>>;

    /// Remove `user`'s grant `name`; false when there was none.
    async fn remove_grant(&self, user: &str, name: &str) -> StoreResult<bool>;

    /// What this store holds in memory beyond its connections, for the service's metrics.
    fn memory(&self) -> StoreMemory;

    /// The clock this store stamps times with; schedules (cron, follow-ups) read it too, so a
    /// test that moves it moves them.
    fn clock(&self) -> Clock;
}

/// The execution ledger: one durable row per activation.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    /// Record an enqueued activation. Idempotent on the id (a second call changes nothing);
    /// true when this call stored the row, false when a row with its id existed (another
    /// process's intake recorded the same activation first: only the one that stored it
    /// queues it).
    async fn record_enqueued(&self, entry: &LedgerEntry) -> StoreResult<bool>;
    /// Record that the activation started. Like [`Ledger::record_finished`], it leaves a row
    /// that ended with an outcome of its own (anything but `cancelled`) as it is: that outcome is
    /// final, and a second delivery of the same activation (a process killed after finishing it
    /// but before acknowledging it) finds its message taken and must not rewrite it. A
    /// `cancelled` row (closed by recovery, or a run that found its message taken) may still
    /// be rewritten by a run that went further.
    async fn record_started(&self, id: &ActivationId, at: DateTime<Utc>) -> StoreResult<()>;
    async fn record_finished(
        &self,
        id: &ActivationId,
        at: DateTime<Utc>,
        outcome: Outcome,
        error: Option<&str>,
        usage: &Usage,
    ) -> StoreResult<()>;
    async fn get_activation(&self, id: &ActivationId) -> StoreResult<Option<LedgerEntry>>;
    async fn list_activations(&self, filter: &LedgerFilter) -> StoreResult<Vec<LedgerEntry>>;
    /// Rows started but never finished (their process died): for recovery and `/state`.
    async fn unfinished_activations(&self) -> StoreResult<Vec<LedgerEntry>>;

    /// Note that delivering the answer of a turn failed for good: `delivery failed: {reason}` is
    /// added to the `error` of every activation row of `root_message_id` (the user message that
    /// started the turn), after `; ` when the row already has an error. No such row is not an
    /// error (the turn may have left no activation, for example a chat command's answer).
    async fn record_delivery_failure(&self, root_message_id: &MessageId, reason: &str) -> StoreResult<()>;
}

/// Memory one store holds beyond its connections: the history cache of a SQLite store
/// (nothing for PostgreSQL). Bounded; reported so that an operator (and the soak benchmark) can
/// tell a filling pool from a leak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreMemory {
    /// Bytes the history cache keeps (estimated from the decoded messages).
    pub history_cache_bytes: u64,
    /// Sessions the history cache keeps.
    pub history_cache_sessions: u64,
}

/// What the SQLite library has allocated in this process ([`sqlite_library_memory`]): every
/// connection's page cache, schemas and prepared statements. SQLite counts these for the whole
/// process (its high-water mark exists only that way), so this is a fact of the process, not
/// of one store: it is read once per report, never summed over stores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqliteMemory {
    /// Bytes allocated now (`sqlite3_memory_used`).
    pub bytes: u64,
    /// The most allocated at once since the process started (`sqlite3_memory_highwater`).
    pub highwater_bytes: u64,
}

/// Both traits over one backend (one pool).
#[derive(Clone)]
pub struct StoreHandle {
    pub store: Arc<dyn Store>,
    pub ledger: Arc<dyn Ledger>,
}

impl std::fmt::Debug for StoreHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreHandle")
    }
}

impl StoreHandle {
    /// Share one backend as both the store and the ledger.
    pub fn new<B: Store + Ledger>(backend: B) -> Self {
        let backend = Arc::new(backend);
        StoreHandle { store: backend.clone(), ledger: backend }
    }
}

/// Open the store named by `url`, creating it (a new SQLite file, or the tables in an empty
/// PostgreSQL schema) when missing, and migrating an older schema.
///
/// URLs: `sqlite://PATH` (`sqlite:///abs/path.db`, `sqlite://relative.db`), `sqlite::memory:`,
/// `postgres://…` or `postgresql://…` (a `search_path` option chooses the schema).
pub async fn open(url: &str) -> StoreResult<StoreHandle> {
    open_in_mode(url, OpenMode::CreateIfMissing, Footprint::Service, PgPoolSettings::default()).await
}

/// [`open`], with a PostgreSQL store's pool sized and bounded by `pool` (SQLite ignores it).
pub async fn open_pooled(url: &str, pool: PgPoolSettings) -> StoreResult<StoreHandle> {
    open_in_mode(url, OpenMode::CreateIfMissing, Footprint::Service, pool).await
}

/// Like [`open`], but never creates a store: a missing SQLite file or an empty PostgreSQL
/// schema is [`StoreError::Missing`] (for read-only commands such as `kesoku history list`).
pub async fn open_existing(url: &str) -> StoreResult<StoreHandle> {
    open_in_mode(url, OpenMode::MustExist, Footprint::Service, PgPoolSettings::default()).await
}

/// Like [`open_existing`], holding what `footprint` says (a SQLite file only; an in-memory
/// store has one connection anyway, and PostgreSQL opens pooled connections as they are used).
pub async fn open_existing_with(url: &str, footprint: Footprint) -> StoreResult<StoreHandle> {
    open_in_mode(url, OpenMode::MustExist, footprint, PgPoolSettings::default()).await
}

/// [`open_existing_with`], with a PostgreSQL store's pool sized and bounded by `pool`.
pub async fn open_existing_pooled(url: &str, footprint: Footprint, pool: PgPoolSettings) -> StoreResult<StoreHandle> {
    open_in_mode(url, OpenMode::MustExist, footprint, pool).await
}

/// How much a SQLite store holds while open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Footprint {
    /// For the service: the writer thread, two reader threads with a read-only connection each
    /// (reads never wait for writes), and a checkpoint thread with its own connection.
    #[default]
    Service,
    /// For a command holding one conversation (`kesoku chat`): the writer thread and its
    /// connection only. Reads wait behind writes, and SQLite checkpoints inside the commit
    /// that crosses 1,000 pages of log.
    Command,
}

async fn open_in_mode(
    url: &str,
    mode: OpenMode,
    footprint: Footprint,
    pool: PgPoolSettings,
) -> StoreResult<StoreHandle> {
    match Location::parse(url)? {
        Location::SqliteFile(path) => {
            let store = match mode {
                OpenMode::CreateIfMissing => SqliteStore::open(&path).await?,
                OpenMode::MustExist => SqliteStore::open_existing_with(&path, footprint).await?,
            };
            Ok(StoreHandle::new(store))
        }
        Location::SqliteMemory => Ok(StoreHandle::new(SqliteStore::open_in_memory().await?)),
        Location::Postgres(options) => Ok(StoreHandle::new(PgStore::connect_in_mode_with(*options, mode, pool).await?)),
    }
}

/// Where a store URL points.
#[derive(Debug)]
enum Location {
    SqliteFile(PathBuf),
    SqliteMemory,
    Postgres(Box<PgConnectOptions>),
}

impl Location {
    fn parse(url: &str) -> StoreResult<Location> {
        let bad = |reason: &str| StoreError::BadUrl { url: postgres::redact(url), reason: reason.to_owned() };
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Location::Postgres(Box::new(postgres::parse_url(url)?)));
        }
        let Some(rest) = url.strip_prefix("sqlite:") else {
            return Err(bad("unknown scheme"));
        };
        let path = rest.strip_prefix("//").unwrap_or(rest);
        if path == ":memory:" {
            return Ok(Location::SqliteMemory);
        }
        if path.is_empty() {
            return Err(bad("no file path after `sqlite://`"));
        }
        if path.contains('?') {
            return Err(bad("query parameters are not supported for sqlite; give only the path"));
        }
        Ok(Location::SqliteFile(PathBuf::from(path)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_the_backend() {
        assert!(
            matches!(Location::parse("sqlite://data/k.db"), Ok(Location::SqliteFile(p)) if p.as_path() == std::path::Path::new("data/k.db"))
        );
        assert!(
            matches!(Location::parse("sqlite:///abs/k.db"), Ok(Location::SqliteFile(p)) if p.as_path() == std::path::Path::new("/abs/k.db"))
        );
        assert!(
            matches!(Location::parse("sqlite:k.db"), Ok(Location::SqliteFile(p)) if p.as_path() == std::path::Path::new("k.db"))
        );
        assert!(matches!(Location::parse("sqlite::memory:"), Ok(Location::SqliteMemory)));
        assert!(matches!(Location::parse("postgresql://u@h/db"), Ok(Location::Postgres(_))));
        assert!(matches!(Location::parse("sqlite://"), Err(StoreError::BadUrl { .. })));
        assert!(matches!(Location::parse("sqlite://k.db?mode=ro"), Err(StoreError::BadUrl { .. })));
        let error = Location::parse("mysql://root:pw@h/db").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("unknown scheme") && !error.contains("pw@"), "{error}");
    }
}
