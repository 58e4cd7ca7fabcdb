//! The SQLite backend: one file in WAL mode, the embedded default.
//!
//! **Writes: one writer thread with group commit.** Every write is a job sent to a thread that
//! holds the only read-write connection. The thread takes every job waiting in its inbox (up to
//! [`MAX_BATCH`]), runs them in one `BEGIN IMMEDIATE` transaction, each inside a savepoint of
//! its own (a job that fails is rolled back alone and gets its error), commits once, and only
//! then answers each caller. Many small concurrent writes thus cost one commit, and no writer
//! of ours ever meets `SQLITE_BUSY`; another process writing the same file waits for the lock
//! (busy timeout).
//!
//! **The caller's thread when nothing waits.** Handing a job to another thread and its answer
//! back costs two wake-ups, and on a virtual machine a wake-up that crosses to an idle vCPU is
//! the largest part of a turn's overhead (measured: the whole turn runs twice as fast pinned to
//! one CPU). So when no job is queued and the connection is free, the caller runs its job
//! itself, in a transaction of its own, holding the connection's lock; under load jobs queue as
//! before and the thread batches them. An inline write never waits for another process: its
//! `BEGIN IMMEDIATE` uses no busy timeout, and on `SQLITE_BUSY` the job goes to the thread,
//! which waits. Large writes (over [`INLINE_BYTES`] of content) always go to the thread. Reads
//! do the same with an idle reader connection.
//!
//! **Durability.** A write is acknowledged only after the commit that holds it returned. With
//! `journal_mode = WAL` and `synchronous = NORMAL`, that commit is in the WAL file: it survives
//! the process being killed at any point; an operating-system crash or power cut may lose the
//! last commits before the next checkpoint (never corrupting the file). A failed commit fails
//! every job of its batch; none of them is visible.
//!
//! **Revisions.** Writes are serialised, so a revision is `MAX(rev) + 1` read by the writing
//! statement itself, inside the write lock: revisions are handed out in commit order (across
//! processes too), which is what lets [`Store::changes_since`] readers never skip a change.
//!
//! **Reads** run on a few reader threads, each with a read-only connection, which WAL lets run
//! beside the writer. An in-memory store has a single connection, and so does a store opened
//! for a command ([`Footprint::Command`]): their reads go to the writer. Status changes and
//! claims read the row inside their write job (a corrupt row is refused before anything is
//! written, and no compare-and-set retry is ever needed).
//!
//! Opening never changes a file that is not ours: the file is inspected first (read only, no
//! journal-mode change), and only an empty database or a Kesoku store is migrated.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use kesoku_core::{
    ActivationId, LedgerEntry, Message, MessageFilter, MessageId, Metadata, Outcome, Session, SessionId, Status, Usage,
};
use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params, params_from_iter};
use tokio::sync::oneshot;

use crate::clock::{Clock, truncate};
use crate::common::{OpenMode, check_claim, event, first_repeated_id, not_found, stamp};
use crate::decode::{self, BackendRow, Cells, StoredMessage};
use crate::error::{StoreError, StoreResult};
use crate::history_cache::{HistoryCache, PhasedKey, RowReader};
use crate::migrate::{self, Inspection, VERSION_TABLE, Verdict};
use crate::sql::{
    Arg, LEDGER_COLUMNS, MESSAGE_COLUMNS, OPEN_STATUSES, Query, SESSION_COLUMNS, SESSION_COLUMNS_S, list_query,
    orphaned_calls_query,
};
use crate::{Claim, Footprint, Ledger, LedgerFilter, MessageEvent, SessionFilter, Store};

/// The revision of a change made by one statement (which holds the write lock while reading it).
const NEXT_REV: &str = "(SELECT COALESCE(MAX(rev), 0) + 1 FROM messages)";
/// Reader threads (each with a read-only connection) beside the writer.
const READERS: usize = 2;
/// Most jobs committed together.
const MAX_BATCH: usize = 512;
/// How long a statement waits for another process's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Content above which a write always goes to the writer thread (it would hold the caller's
/// thread, an async worker, for a millisecond or more).
const INLINE_BYTES: usize = 64 * 1024;
/// How long after callers found the writer busy [`COLLISIONS_TO_QUEUE`] times within a
/// millisecond they keep queueing, so that under load jobs gather into the writer thread's
/// batches (one commit for many; taking every free moment inline instead ran 15 % fewer turns
/// per second with 1,000 sessions).
/// A collision or two do not start it: two turns one after the other meet once or twice (one's
/// last writes, the next one's first), and a window opened by that sent every write of the
/// next turn through the thread, two wake-ups each (a plain turn 0.75 → 1.03 ms on a 2-vCPU
/// machine).
const CONTENDED_FOR: Duration = Duration::from_millis(2);
/// Collisions within one millisecond that make writes queue for [`CONTENDED_FOR`].
const COLLISIONS_TO_QUEUE: u64 = 4;
/// How long the checkpointer lets writes gather after being woken before it checkpoints.
const CHECKPOINT_DELAY: Duration = Duration::from_millis(200);
/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 128;

/// Columns of the row lists below, in the order of the `*_COLUMNS` lists of [`crate::sql`].
const MESSAGE_NAMES: &[&str] = &[
    "id",
    "session_id",
    "parent_id",
    "chatbot_id",
    "channel_id",
    "sender",
    "role",
    "type",
    "content",
    "status",
    "metadata",
    "step",
    "created_at",
    "updated_at",
    "rev",
    "created_rev",
];
const SESSION_NAMES: &[&str] = &["id", "chatbot_id", "channel_id", "title", "created_at", "updated_at"];
const LEDGER_NAMES: &[&str] = &[
    "id",
    "kind",
    "lane",
    "session_id",
    "message_id",
    "triggered_by",
    "delegation_user",
    "depth",
    "enqueued_at",
    "started_at",
    "finished_at",
    "outcome",
    "error",
    "model_calls",
    "tool_calls",
    "input_tokens",
    "output_tokens",
];
const CLAIM_NAMES: &[&str] = &["id", "status", "claimed_by", "claimed_at"];

/// What a write job hands back once it ran: called with the batch's commit error, if any.
type Completion = Box<dyn FnOnce(Option<&rusqlite::Error>) + Send>;
type WriteJob = Box<dyn FnOnce(&Connection) -> Completion + Send>;
type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

enum Inbox<J> {
    Job(J),
    /// Finish what is queued before this, close the connection, then say so.
    Close(std::sync::mpsc::Sender<()>),
}

/// The read-write connection, shared by the writer thread and callers that find it idle.
struct WriterSlot {
    /// `None` once the store is closed.
    writable: Mutex<Option<Writable>>,
    /// Jobs sent to the thread and not yet committed: while any waits, callers queue behind.
    queued: AtomicUsize,
    /// When callers last found the writer busy often (microseconds since `epoch`): for
    /// [`CONTENDED_FOR`] after that, writes go to the thread, whose batches commit many at once.
    contended_at: AtomicU64,
    /// Collisions in the current millisecond: `millisecond << 16 | count`.
    collisions: AtomicU64,
    epoch: Instant,
}

struct Writable {
    conn: Connection,
    /// Wakes the checkpoint thread after commits (dropped on close, which ends that thread).
    checkpoints: Option<CheckpointWaker>,
}

/// The writer's side of the checkpoint thread: a commit wakes it only when no checkpoint is
/// already due. A wake-up is a system call and, on an idle machine, a trip to another CPU; the
/// commits of a turn all fall inside one checkpoint's delay, so they cost one wake-up, not one
/// each (as they did when every commit sent on the channel: the thread, waiting out its delay,
/// woke at each one to wait again).
struct CheckpointWaker {
    due: Arc<AtomicBool>,
    wake: SyncSender<()>,
}

impl CheckpointWaker {
    fn committed(&self) {
        if !self.due.swap(true, Ordering::AcqRel) {
            // Full means already woken.
            let _ = self.wake.try_send(());
        }
    }
}

/// The read-only connections, one per reader thread, borrowed by callers when idle.
struct ReaderSlots {
    /// `None` once closed.
    conns: Vec<Mutex<Option<Connection>>>,
    /// Jobs sent to the threads and not yet run.
    queued: AtomicUsize,
}

/// The threads and the way to reach them. Dropping the last handle ends them.
struct Engine {
    writes: Sender<Inbox<WriteJob>>,
    writer: Arc<WriterSlot>,
    /// `None` for an in-memory store and a command's: their reads go to the writer.
    reads: Option<(Sender<Inbox<ReadJob>>, Arc<ReaderSlots>)>,
    /// The file path (or `:memory:`), for errors and logs.
    location: Arc<str>,
    /// Long sessions' decoded histories, brought forward by revision on each read.
    history: Arc<HistoryCache>,
    /// The checkpoint thread (file stores in WAL mode); it ends after the writer.
    checkpointer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// A store in one SQLite file (or in memory). Clones share the connections.
#[derive(Clone)]
pub struct SqliteStore {
    engine: Arc<Engine>,
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
        let location: Arc<str> = Arc::from(":memory:");
        let (writes, writer) = start_writer(conn, &location);
        let engine =
            Engine { writes, writer, reads: None, location, history: Arc::default(), checkpointer: Mutex::new(None) };
        Ok(SqliteStore { engine: Arc::new(engine), clock })
    }

    /// Use `clock` for every timestamp this store writes and for orphan ages.
    pub fn with_clock(mut self, clock: impl Into<Clock>) -> Self {
        self.clock = clock.into();
        self
    }

    /// Close the connections: jobs queued before this finish first; later calls on any clone
    /// fail.
    pub async fn close(&self) {
        let mut waits = Vec::new();
        let (done, wait) = std::sync::mpsc::channel();
        if self.engine.writes.send(Inbox::Close(done)).is_ok() {
            waits.push(wait);
        }
        if let Some((reads, slots)) = &self.engine.reads {
            for _ in 0..slots.conns.len() {
                let (done, wait) = std::sync::mpsc::channel();
                if reads.send(Inbox::Close(done)).is_ok() {
                    waits.push(wait);
                }
            }
        }
        let checkpointer = self.engine.checkpointer.lock().unwrap_or_else(|p| p.into_inner()).take();
        let _ = tokio::task::spawn_blocking(move || {
            for wait in waits {
                let _ = wait.recv();
            }
            // The writer is gone: the checkpoint thread does a last checkpoint and ends.
            if let Some(handle) = checkpointer {
                let _ = handle.join();
            }
        })
        .await;
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
        let (writes, writer) = start_writer(writer, &location);
        let checkpointer = checkpointer.and_then(|conn| {
            let (wake, handle) = start_checkpointer(conn, &location, Arc::downgrade(&writer));
            if let Some(writable) = lock_writable(&writer).as_mut() {
                writable.checkpoints = Some(wake);
            }
            handle
        });
        let reads = (!readers.is_empty()).then(|| start_readers(readers, &location));
        let history = Arc::default();
        let checkpointer = Mutex::new(checkpointer);
        Ok(SqliteStore { engine: Arc::new(Engine { writes, writer, reads, location, history, checkpointer }), clock })
    }

    /// Run `work` in a transaction: here when the writer is idle, else in the writer thread's
    /// next batch; its result comes back once its transaction committed.
    async fn write<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        match write_inline(&self.engine.writer, work) {
            Ok(result) => result,
            Err(work) => self.write_queued(work).await,
        }
    }

    /// Run `work` in the writer thread's next batch.
    async fn write_queued<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        let job: WriteJob = Box::new(move |conn| {
            let result = in_savepoint(conn, work);
            Box::new(move |commit_error: Option<&rusqlite::Error>| {
                let result = match commit_error {
                    None => result,
                    Some(error) => Err(StoreError::Sqlite(copy_error(error))),
                };
                let _ = answer.send(result);
            })
        });
        send_counted(&self.engine.writes, &self.engine.writer.queued, job)?;
        answered.await.map_err(|_| closed("the store's writer stopped"))?
    }

    /// Run `work` on a reader connection: here when one is idle, else on a reader thread (the
    /// writer, in memory and for a command).
    async fn read<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let Some((reads, slots)) = &self.engine.reads else { return self.write(work).await };
        // Under load (writes waiting for the writer), reads stay on the reader threads too: the
        // async workers then keep to the turns' own work, beside them.
        let work = if self.engine.writer.queued.load(Ordering::Acquire) != 0 {
            work
        } else {
            match read_inline(slots, work) {
                Ok(result) => return result,
                Err(work) => work,
            }
        };
        let (answer, answered) = oneshot::channel();
        let job: ReadJob = Box::new(move |conn| {
            let _ = answer.send(work(conn));
        });
        send_counted(reads, &slots.queued, job)?;
        answered.await.map_err(|_| closed("the store's reader stopped"))?
    }

    /// [`SqliteStore::write`], or straight to the writer thread when `content_bytes` is over
    /// [`INLINE_BYTES`].
    async fn write_sized<T, F>(&self, content_bytes: usize, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        if content_bytes > INLINE_BYTES { self.write_queued(work).await } else { self.write(work).await }
    }

    /// Messages returned by `query` (columns of [`MESSAGE_COLUMNS`]), on a reader.
    async fn read_messages(&self, query: Query) -> StoreResult<Vec<StoredMessage>> {
        self.read(move |conn| messages_in(conn, &query)).await
    }

    /// The recovery of orphans, with "now" given (the trait method passes the clock's).
    async fn recover_orphans_before(
        &self,
        threshold: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<MessageId>> {
        self.write(move |conn| {
            let ids: Vec<String> = {
                let mut statement = conn.prepare_cached(&orphans_sql())?;
                let rows = statement.query_map(params![time_text(threshold)], |row| row.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            let mut rev = next_rev(conn)?;
            let mut recovered = Vec::with_capacity(ids.len());
            for id in ids {
                let done = conn
                    .prepare_cached(
                        "UPDATE messages SET status = 'pending_agent', updated_at = ?2, rev = ?3, claimed_by = NULL, \
                         claimed_at = NULL WHERE id = ?1 AND status = 'processing'",
                    )?
                    .execute(params![id, time_text(now), rev])?;
                if done == 1 {
                    rev += 1;
                    recovered.push(MessageId::from(id));
                }
            }
            Ok(recovered)
        })
        .await
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
    // Checkpoints move the log back into the database file and sync it: milliseconds that,
    // left automatic, land inside whichever commit crosses 1,000 pages (the slowest turns).
    // A connection of their own does them beside the writer instead; without it they stay
    // automatic. A command's store leaves them automatic: its few writes seldom reach 1,000
    // pages, and a thread and a connection more would be most of what it holds.
    let checkpointer = if journal.eq_ignore_ascii_case("wal") && footprint == Footprint::Service {
        match Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            // Never waits: a passive checkpoint skips what is busy.
            .and_then(|conn| conn.busy_timeout(Duration::ZERO).map(|()| conn))
            .and_then(|conn| {
                conn.execute_batch("PRAGMA journal_size_limit = 16777216; PRAGMA synchronous = NORMAL;").map(|()| conn)
            })
            .and_then(|conn| writer.execute_batch("PRAGMA wal_autocheckpoint = 0").map(|()| conn))
        {
            Ok(conn) => Some(conn),
            Err(error) => {
                tracing::warn!(%error, store = what, "no checkpoint connection; checkpoints stay automatic");
                None
            }
        }
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
        // A burst can grow the log far past its usual size (66 MB after 2,000 turns at once);
        // SQLite reuses the file from its start afterwards but never shrinks it unless told.
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

fn start_writer(conn: Connection, location: &Arc<str>) -> (Sender<Inbox<WriteJob>>, Arc<WriterSlot>) {
    let (sender, inbox) = std::sync::mpsc::channel();
    let slot = Arc::new(WriterSlot {
        writable: Mutex::new(Some(Writable { conn, checkpoints: None })),
        queued: AtomicUsize::new(0),
        contended_at: AtomicU64::new(0),
        collisions: AtomicU64::new(0),
        epoch: Instant::now(),
    });
    let name = format!("kesoku-sqlite-writer {location}");
    let thread_slot = Arc::clone(&slot);
    let spawned = std::thread::Builder::new().name(name).spawn(move || writer_loop(&thread_slot, &inbox));
    if let Err(error) = spawned {
        // The inbox is dropped with the closure: queued writes fail with "the store is closed".
        // Inline writes would still work, half a store: close it instead.
        tracing::error!(%error, "cannot start the sqlite writer thread");
        *lock_writable(&slot) = None;
    }
    (sender, slot)
}

fn start_readers(readers: Vec<Connection>, location: &Arc<str>) -> (Sender<Inbox<ReadJob>>, Arc<ReaderSlots>) {
    let (sender, inbox) = std::sync::mpsc::channel::<Inbox<ReadJob>>();
    let slots = Arc::new(ReaderSlots {
        conns: readers.into_iter().map(|conn| Mutex::new(Some(conn))).collect(),
        queued: AtomicUsize::new(0),
    });
    // One inbox shared by the readers; the lock is held only while taking a job.
    let inbox = Arc::new(Mutex::new(inbox));
    for index in 0..slots.conns.len() {
        let inbox = Arc::clone(&inbox);
        let thread_slots = Arc::clone(&slots);
        let name = format!("kesoku-sqlite-reader-{index} {location}");
        let spawned = std::thread::Builder::new().name(name).spawn(move || reader_loop(&thread_slots, index, &inbox));
        if let Err(error) = spawned {
            // Its connection stays for inline reads; queued reads go to the other threads.
            tracing::error!(%error, "cannot start a sqlite reader thread");
        }
    }
    (sender, slots)
}

/// A lock whose holder panicked: the data is still good (see [`lock_writable`]).
fn relock<'a, T>(result: Result<MutexGuard<'a, T>, std::sync::PoisonError<MutexGuard<'a, T>>>) -> MutexGuard<'a, T> {
    result.unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The writer's connection, locked. After a panic inside a job (the lock is then poisoned), a
/// transaction the job left open is rolled back: none of its writes was acknowledged.
fn lock_writable(slot: &WriterSlot) -> MutexGuard<'_, Option<Writable>> {
    heal(slot, relock(slot.writable.lock()))
}

/// The guard of the writer's lock, once a transaction left open by a job that panicked (the
/// lock is then poisoned) is rolled back.
fn heal<'a>(slot: &WriterSlot, guard: MutexGuard<'a, Option<Writable>>) -> MutexGuard<'a, Option<Writable>> {
    if slot.writable.is_poisoned() {
        if let Some(writable) = guard.as_ref()
            && !writable.conn.is_autocommit()
        {
            let _ = writable.conn.execute_batch("ROLLBACK");
        }
        slot.writable.clear_poison();
    }
    guard
}

/// Queue `job`, counted in `queued` until its thread has run it.
fn send_counted<J>(inbox: &Sender<Inbox<J>>, queued: &AtomicUsize, job: J) -> StoreResult<()> {
    queued.fetch_add(1, Ordering::AcqRel);
    if inbox.send(Inbox::Job(job)).is_err() {
        queued.fetch_sub(1, Ordering::AcqRel);
        return Err(closed("the store is closed"));
    }
    Ok(())
}

impl WriterSlot {
    fn now_micros(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A caller found the writer busy (or jobs queued) just now; the
    /// [`COLLISIONS_TO_QUEUE`]th time within a millisecond, writes queue from now on for
    /// [`CONTENDED_FOR`].
    fn contended(&self) {
        let now = self.now_micros().max(1);
        let millisecond = now / 1_000;
        // This collision added to `packed` (a count of an earlier millisecond starts over).
        let counted = |packed: u64| {
            let count = if packed >> 16 == millisecond { (packed & 0xffff).saturating_add(1).min(0xffff) } else { 1 };
            millisecond << 16 | count
        };
        let previous = match self.collisions.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some(counted(p))) {
            Ok(previous) | Err(previous) => previous,
        };
        if counted(previous) & 0xffff >= COLLISIONS_TO_QUEUE {
            self.contended_at.store(now, Ordering::Relaxed);
        }
    }

    /// Whether writes queue for the thread: callers found the writer busy often lately.
    fn recently_contended(&self) -> bool {
        let at = self.contended_at.load(Ordering::Relaxed);
        let window = u64::try_from(CONTENDED_FOR.as_micros()).unwrap_or(u64::MAX);
        at != 0 && self.now_micros().saturating_sub(at) < window
    }
}

/// Run `work` on the caller's thread if the writer is idle: no job queued, the connection
/// free, and no contention lately. `Err(work)` when not (the caller queues it).
fn write_inline<T, F>(slot: &WriterSlot, work: F) -> Result<StoreResult<T>, F>
where
    F: FnOnce(&Connection) -> StoreResult<T>,
{
    if slot.queued.load(Ordering::Acquire) != 0 {
        slot.contended();
        return Err(work);
    }
    if slot.recently_contended() {
        return Err(work);
    }
    let guard = match slot.writable.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => heal(slot, poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => {
            slot.contended();
            return Err(work);
        }
    };
    // Closed (the queue then says so), or a job queued since the first look: it goes first.
    let Some(writable) = guard.as_ref() else { return Err(work) };
    if slot.queued.load(Ordering::Acquire) != 0 {
        slot.contended();
        return Err(work);
    }
    let conn = &writable.conn;
    // Never wait here for another process's lock: the writer thread does that.
    if conn.busy_timeout(Duration::ZERO).is_err() {
        return Err(work);
    }
    let begun = control(conn, "BEGIN IMMEDIATE");
    if let Err(error) = conn.busy_timeout(BUSY_TIMEOUT) {
        tracing::warn!(%error, "could not restore the sqlite busy timeout");
    }
    if begun.is_err() {
        return Err(work);
    }
    let result = match work(conn) {
        Ok(value) => match control(conn, "COMMIT") {
            Ok(()) => Ok(value),
            Err(error) => {
                tracing::error!(%error, "a write could not be committed; it fails");
                let _ = control(conn, "ROLLBACK");
                Err(StoreError::Sqlite(error))
            }
        },
        Err(error) => {
            let _ = control(conn, "ROLLBACK");
            Err(error)
        }
    };
    if let Some(checkpoints) = &writable.checkpoints {
        checkpoints.committed();
    }
    Ok(result)
}

/// Run `work` on the caller's thread on an idle reader connection, if no read is queued.
fn read_inline<T, F>(slots: &ReaderSlots, work: F) -> Result<StoreResult<T>, F>
where
    F: FnOnce(&Connection) -> StoreResult<T>,
{
    if slots.queued.load(Ordering::Acquire) != 0 {
        return Err(work);
    }
    for slot in &slots.conns {
        let guard = match slot.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => continue,
        };
        if let Some(conn) = guard.as_ref() {
            return Ok(work(conn));
        }
    }
    Err(work)
}

fn reader_loop(slots: &ReaderSlots, index: usize, inbox: &Mutex<Receiver<Inbox<ReadJob>>>) {
    let Some(slot) = slots.conns.get(index) else { return };
    loop {
        let next = relock(inbox.lock()).recv();
        match next {
            Ok(Inbox::Job(job)) => {
                {
                    let guard = relock(slot.lock());
                    // Closed: the job is dropped, and its caller told the reader stopped.
                    if let Some(conn) = guard.as_ref() {
                        job(conn);
                    }
                }
                slots.queued.fetch_sub(1, Ordering::AcqRel);
            }
            Ok(Inbox::Close(done)) => {
                *relock(slot.lock()) = None;
                let _ = done.send(());
                return;
            }
            Err(_) => return,
        }
    }
}

/// The checkpoint thread: woken by the writer after its commits, it waits
/// [`CHECKPOINT_DELAY`] for more, then runs a passive checkpoint on a connection of its own
/// (which never blocks the writer or the readers) and, when that moved the whole log, starts
/// the log over ([`start_log_over`]) on the writer's connection. It ends when the writer does.
/// An idle store wakes nobody.
fn start_checkpointer(
    conn: Connection,
    location: &Arc<str>,
    writer: std::sync::Weak<WriterSlot>,
) -> (CheckpointWaker, Option<std::thread::JoinHandle<()>>) {
    let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
    let due = Arc::new(AtomicBool::new(false));
    let waker = CheckpointWaker { due: Arc::clone(&due), wake };
    let name = format!("kesoku-sqlite-checkpoint {location}");
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        while woken.recv().is_ok() {
            // Let writes gather (they do not wake this thread meanwhile), unless the writer
            // ends first (then checkpoint and stop).
            let deadline = std::time::Instant::now() + CHECKPOINT_DELAY;
            let ended = loop {
                match woken.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
                    Ok(()) => {}
                    Err(RecvTimeoutError::Timeout) => break false,
                    Err(RecvTimeoutError::Disconnected) => break true,
                }
            };
            // Commits from now on are not in this checkpoint for sure: they wake the next one.
            due.store(false, Ordering::Release);
            let result: Result<(i64, i64, i64), _> =
                conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)));
            match result {
                Ok((_, log, moved)) if log > 0 && moved == log && !ended => {
                    if let Some(slot) = writer.upgrade() {
                        start_log_over(&slot);
                    }
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "a background checkpoint failed; the next write tries again"),
            }
            if ended {
                return;
            }
        }
    });
    match spawned {
        Ok(handle) => (waker, Some(handle)),
        Err(error) => {
            // The log then grows until the last connection closes (SQLite checkpoints it there).
            tracing::error!(%error, "cannot start the sqlite checkpoint thread");
            (waker, None)
        }
    }
}

/// After a checkpoint that moved the whole log into the database file, the next write starts
/// the log over from its beginning, and starting over syncs the log's new header (SQLite does
/// so even with `synchronous = NORMAL`, to keep the file sound). That fsync (about 1 ms here,
/// far more on slow disks) would land in the first write after every quiet moment: a turn's
/// first write after its model call, a user's message after a pause. The checkpoint thread
/// takes it instead, with a write that changes nothing (the header's `user_version`, set to
/// what it holds) but starts the log over.
///
/// The write goes through the writer's own connection, taken only if idle (if a write holds
/// it, or waits, that write starts the log over itself). A write from another connection
/// would change the log under the writer's, which then drops every page it had cached and
/// reads them again in its next write: measured after a 200 ms pause, the `BEGIN IMMEDIATE`
/// of a turn's next write took 31-35 µs instead of 10-16 µs, before its reads of the pages.
fn start_log_over(slot: &WriterSlot) {
    if slot.queued.load(Ordering::Acquire) != 0 {
        return;
    }
    let Ok(guard) = slot.writable.try_lock() else { return };
    let Some(writable) = guard.as_ref() else { return };
    let conn = &writable.conn;
    // Never wait for another process's lock while holding the writer's.
    if conn.busy_timeout(Duration::ZERO).is_err() {
        return;
    }
    let result = control(conn, "BEGIN IMMEDIATE").and_then(|()| {
        let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        conn.execute_batch(&format!("PRAGMA user_version = {version}"))?;
        control(conn, "COMMIT")
    });
    if let Err(error) = result {
        if !conn.is_autocommit() {
            let _ = control(conn, "ROLLBACK");
        }
        if error.sqlite_error_code() != Some(ErrorCode::DatabaseBusy) {
            tracing::debug!(%error, "could not start the log over after a checkpoint; the next write will");
        }
    }
    if let Err(error) = conn.busy_timeout(BUSY_TIMEOUT) {
        tracing::warn!(%error, "could not restore the sqlite busy timeout");
    }
}

fn writer_loop(slot: &WriterSlot, inbox: &Receiver<Inbox<WriteJob>>) {
    loop {
        let first = match inbox.recv() {
            Ok(Inbox::Job(job)) => job,
            Ok(Inbox::Close(done)) => {
                // Dropping the connection and the checkpoint sender (which ends that thread).
                *lock_writable(slot) = None;
                let _ = done.send(());
                return;
            }
            Err(_) => return,
        };
        let mut jobs = vec![first];
        let mut closing = None;
        while jobs.len() < MAX_BATCH {
            match inbox.try_recv() {
                Ok(Inbox::Job(job)) => jobs.push(job),
                Ok(Inbox::Close(done)) => {
                    closing = Some(done);
                    break;
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let count = jobs.len();
        {
            let mut guard = lock_writable(slot);
            // Closed: the jobs are dropped, and their callers told the writer stopped.
            if let Some(writable) = guard.as_ref() {
                run_batch(&writable.conn, jobs);
                if let Some(checkpoints) = &writable.checkpoints {
                    checkpoints.committed();
                }
            }
            if closing.is_some() {
                *guard = None;
            }
        }
        slot.queued.fetch_sub(count, Ordering::AcqRel);
        if let Some(done) = closing {
            let _ = done.send(());
            return;
        }
    }
}

/// Run `jobs` in one transaction and answer them after its commit. If the transaction cannot
/// be begun (another process holds the lock past the busy timeout), each job runs on its own.
fn run_batch(conn: &Connection, jobs: Vec<WriteJob>) {
    let in_transaction = match control(conn, "BEGIN IMMEDIATE") {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, "could not begin a batch transaction; running its writes one by one");
            false
        }
    };
    let completions: Vec<Completion> = jobs.into_iter().map(|job| job(conn)).collect();
    let commit_error = if in_transaction {
        match control(conn, "COMMIT") {
            Ok(()) => None,
            Err(error) => {
                tracing::error!(%error, "a batch of writes could not be committed; each of them fails");
                let _ = control(conn, "ROLLBACK");
                Some(error)
            }
        }
    } else {
        None
    };
    for completion in completions {
        completion(commit_error.as_ref());
    }
}

/// Run a transaction control statement (`BEGIN IMMEDIATE`, `COMMIT`, a savepoint's) from the
/// statement cache: every write runs a few of them, and parsing each anew showed in profiles.
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Run `work` inside a savepoint: kept when it succeeds, rolled back (alone) when it fails.
fn in_savepoint<T>(conn: &Connection, work: impl FnOnce(&Connection) -> StoreResult<T>) -> StoreResult<T> {
    control(conn, "SAVEPOINT kesoku_job")?;
    let result = work(conn);
    let closed = match &result {
        Ok(_) => control(conn, "RELEASE kesoku_job"),
        Err(_) => control(conn, "ROLLBACK TO kesoku_job").and_then(|()| control(conn, "RELEASE kesoku_job")),
    };
    match (result, closed) {
        (Ok(value), Ok(_)) => Ok(value),
        (Ok(_), Err(error)) => Err(StoreError::Sqlite(error)),
        (Err(error), _) => Err(error),
    }
}

/// The same error again (rusqlite errors cannot be cloned; a batch's commit error goes to
/// every job of the batch).
fn copy_error(error: &rusqlite::Error) -> rusqlite::Error {
    if let rusqlite::Error::SqliteFailure(code, message) = error {
        rusqlite::Error::SqliteFailure(*code, message.clone())
    } else {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR), Some(error.to_string()))
    }
}

/// The error of a store whose threads are gone.
fn closed(reason: &str) -> StoreError {
    StoreError::Sqlite(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISUSE),
        Some(reason.to_owned()),
    ))
}

/// A row read through the column list of its query.
struct SqlRow<'r, 's> {
    row: &'r rusqlite::Row<'s>,
    columns: &'static [&'static str],
    /// Where the next column is looked for first: decoders read columns in query order.
    next: std::cell::Cell<usize>,
}

impl<'r, 's> SqlRow<'r, 's> {
    fn new(row: &'r rusqlite::Row<'s>, columns: &'static [&'static str]) -> Self {
        SqlRow { row, columns, next: std::cell::Cell::new(0) }
    }

    fn value(&self, column: &'static str) -> Result<ValueRef<'_>, String> {
        let hint = self.next.get();
        let index = if self.columns.get(hint) == Some(&column) {
            hint
        } else {
            self.columns
                .iter()
                .position(|name| *name == column)
                .ok_or_else(|| format!("the query has no column `{column}`"))?
        };
        self.next.set(index + 1);
        self.row.get_ref(index).map_err(|error| error.to_string())
    }
}

impl BackendRow for SqlRow<'_, '_> {
    fn opt_text(&self, column: &'static str) -> Result<Option<String>, String> {
        match self.value(column)? {
            ValueRef::Null => Ok(None),
            ValueRef::Text(bytes) => String::from_utf8(bytes.to_vec())
                .map(Some)
                .map_err(|_| format!("`{}` is not UTF-8 text", decode::excerpt(&String::from_utf8_lossy(bytes)))),
            ValueRef::Integer(value) => Err(format!("holds the integer {value}, not text")),
            ValueRef::Real(value) => Err(format!("holds the number {value}, not text")),
            ValueRef::Blob(_) => Err("holds a blob, not text".to_owned()),
        }
    }

    fn opt_int(&self, column: &'static str) -> Result<Option<i64>, String> {
        match self.value(column)? {
            ValueRef::Null => Ok(None),
            ValueRef::Integer(value) => Ok(Some(value)),
            ValueRef::Text(bytes) => {
                Err(format!("holds the text `{}`, not an integer", decode::excerpt(&String::from_utf8_lossy(bytes))))
            }
            ValueRef::Real(value) => Err(format!("holds the number {value}, not an integer")),
            ValueRef::Blob(_) => Err("holds a blob, not an integer".to_owned()),
        }
    }

    fn opt_str(&self, column: &'static str) -> Result<Option<std::borrow::Cow<'_, str>>, String> {
        match self.value(column)? {
            ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => Ok(Some(std::borrow::Cow::Borrowed(text))),
                Err(_) => self.opt_text(column).map(|text| text.map(std::borrow::Cow::Owned)),
            },
            ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_) | ValueRef::Blob(_) => {
                self.opt_text(column).map(|text| text.map(std::borrow::Cow::Owned))
            }
        }
    }

    fn opt_time(&self, column: &'static str) -> Result<Option<DateTime<Utc>>, String> {
        self.opt_str(column)?.map(|text| decode::parse_time_text(&text)).transpose()
    }

    fn opt_metadata(&self, column: &'static str) -> Result<Option<kesoku_core::Metadata>, String> {
        self.opt_str(column)?.map(|text| decode::parse_metadata_text(&text)).transpose()
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

/// Running messages whose claim was last renewed before `?1`.
fn orphans_sql() -> String {
    format!(
        "SELECT id FROM messages WHERE status = 'processing' AND status IN {OPEN_STATUSES} \
         AND COALESCE(claimed_at, updated_at) < ?1 ORDER BY seq"
    )
}

/// A shared query's text for SQLite (`$n` → `?n`, explicit positions) and its values.
fn sqlite_query(query: &Query) -> (String, Vec<SqlValue>) {
    let text = query.text.replace('$', "?");
    let values = query
        .args
        .iter()
        .map(|arg| match arg {
            Arg::Text(text) => SqlValue::Text(text.clone()),
            Arg::Int(value) => SqlValue::Integer(*value),
            Arg::Time(at) => SqlValue::Text(time_text(*at)),
        })
        .collect();
    (text, values)
}

fn messages_in(conn: &Connection, query: &Query) -> StoreResult<Vec<StoredMessage>> {
    let (text, values) = sqlite_query(query);
    let mut statement = conn.prepare_cached(&text)?;
    let mut rows = statement.query(params_from_iter(values.iter()))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode::message(&SqlRow::new(row, MESSAGE_NAMES))?);
    }
    Ok(out)
}

fn fetch_message(conn: &Connection, id: &str) -> StoreResult<Option<StoredMessage>> {
    let mut statement = conn.prepare_cached(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?1"))?;
    let mut rows = statement.query(params![id])?;
    match rows.next()? {
        Some(row) => Ok(Some(decode::message(&SqlRow::new(row, MESSAGE_NAMES))?)),
        None => Ok(None),
    }
}

/// Run an `UPDATE … RETURNING {MESSAGE_COLUMNS}` and read the row it changed, if any.
fn update_returning(conn: &Connection, sql: &str, values: &[SqlValue]) -> StoreResult<Option<StoredMessage>> {
    let mut statement = conn.prepare_cached(sql)?;
    let mut rows = statement.query(params_from_iter(values.iter()))?;
    let row = match rows.next()? {
        Some(row) => Some(decode::message(&SqlRow::new(row, MESSAGE_NAMES))?),
        None => None,
    };
    Ok(row)
}

/// The revision the next change gets (inside the write transaction, so nobody else takes it).
fn next_rev(conn: &Connection) -> StoreResult<i64> {
    Ok(conn.prepare_cached(&format!("SELECT {NEXT_REV}"))?.query_row([], |row| row.get(0))?)
}

/// Insert one message with revision `rev`, or the next one when `None`. A message that opens
/// its turn (no parent in its session) gets its own `seq` as `turn_seq`.
fn insert_in(conn: &Connection, stored: &Message, rev: Option<i64>) -> StoreResult<MessageEvent> {
    let sql = format!(
        "INSERT INTO messages (id, session_id, parent_id, chatbot_id, channel_id, sender, role, type, content, \
         status, metadata, step, created_at, updated_at, turn_id, turn_seq, phase, rev, created_rev) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
         COALESCE((SELECT p.turn_id FROM messages p WHERE p.id = ?3 AND p.session_id = ?2), ?1), \
         (SELECT p.turn_seq FROM messages p WHERE p.id = ?3 AND p.session_id = ?2), ?15, \
         COALESCE(?16, {NEXT_REV}), COALESCE(?16, {NEXT_REV})) RETURNING rev, seq, turn_seq"
    );
    let (rev, seq, turn_seq): (i64, i64, Option<i64>) = conn
        .prepare_cached(&sql)?
        .query_row(
            params![
                stored.id.as_str(),
                stored.session_id.as_str(),
                stored.parent_id.as_ref().map(MessageId::as_str),
                stored.chatbot_id,
                stored.channel_id,
                stored.sender,
                stored.role.as_str(),
                stored.message_type.as_str(),
                stored.content,
                stored.status.as_str(),
                stored.metadata.to_value().to_string(),
                i64::from(stored.step),
                stored.created_at.map(time_text),
                stored.updated_at.map(time_text),
                stored.phase() as i64,
                rev,
            ],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .map_err(|error| insert_error(error, "message", stored.id.as_str()))?;
    if turn_seq.is_none() {
        conn.prepare_cached("UPDATE messages SET turn_seq = seq WHERE seq = ?1")?.execute(params![seq])?;
    }
    Ok(MessageEvent { rev, created: true, message: stored.clone() })
}

/// A session's rows with their phased keys, for the history cache.
struct HistoryRows;

impl HistoryRows {
    fn rows(conn: &Connection, sql: &str, values: &[SqlValue]) -> StoreResult<Vec<(PhasedKey, Message)>> {
        let mut statement = conn.prepare_cached(sql)?;
        let mut rows = statement.query(params_from_iter(values.iter()))?;
        let mut out = Vec::new();
        let extra = MESSAGE_NAMES.len();
        while let Some(row) = rows.next()? {
            let message = decode::message(&SqlRow::new(row, MESSAGE_NAMES))?.message;
            let turn_seq: Option<i64> = row.get(extra)?;
            let key = (turn_seq.unwrap_or(i64::MIN), row.get(extra + 1)?, row.get(extra + 2)?, row.get(extra + 3)?);
            out.push((key, message));
        }
        Ok(out)
    }
}

impl RowReader for HistoryRows {
    fn all(&self, conn: &Connection, session_id: &SessionId) -> StoreResult<Vec<(PhasedKey, Message)>> {
        // Read in the order of the `messages_phased` index: no join, no sort.
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS}, turn_seq, step, phase, seq FROM messages WHERE session_id = ?1 \
             ORDER BY turn_seq, step, phase, seq"
        );
        Self::rows(conn, &sql, &[SqlValue::Text(session_id.as_str().to_owned())])
    }

    fn changed_since(
        &self,
        conn: &Connection,
        session_id: &SessionId,
        rev: i64,
    ) -> StoreResult<Vec<(PhasedKey, Message)>> {
        // Through the revision index: the rows changed since, of every session, filtered.
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS}, turn_seq, step, phase, seq FROM messages INDEXED BY messages_rev \
             WHERE rev > ?2 AND session_id = ?1"
        );
        Self::rows(conn, &sql, &[SqlValue::Text(session_id.as_str().to_owned()), SqlValue::Integer(rev)])
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

/// A failed insert: a unique violation means the id exists.
fn insert_error(error: rusqlite::Error, what: &'static str, id: &str) -> StoreError {
    if let rusqlite::Error::SqliteFailure(code, _) = &error
        && code.code == ErrorCode::ConstraintViolation
        && matches!(
            code.extended_code,
            rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
        )
    {
        return StoreError::Duplicate { what, id: id.to_owned() };
    }
    StoreError::Sqlite(error)
}

/// A failed write that referenced a session: a foreign key violation means it does not exist.
fn session_reference_error(error: rusqlite::Error, session_id: &str) -> StoreError {
    if let rusqlite::Error::SqliteFailure(code, _) = &error
        && code.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY
    {
        return not_found("session", session_id);
    }
    StoreError::Sqlite(error)
}

/// A status change's statement: `?1` id, `?2` new status, `?3` now, `?4` the status it must have.
fn status_update_sql() -> String {
    format!(
        "UPDATE messages SET status = ?2, updated_at = ?3, rev = {NEXT_REV}, \
         claimed_by = CASE WHEN ?2 = 'processing' THEN NULL ELSE claimed_by END, \
         claimed_at = CASE WHEN ?2 = 'processing' THEN ?3 ELSE claimed_at END \
         WHERE id = ?1 AND status = ?4 RETURNING {MESSAGE_COLUMNS}"
    )
}

#[async_trait]
impl Store for SqliteStore {
    async fn insert_message(&self, message: &Message) -> StoreResult<MessageEvent> {
        let stored = stamp(message, self.clock.now());
        self.write_sized(message.content.len(), move |conn| insert_in(conn, &stored, None)).await
    }

    async fn insert_messages(&self, messages: &[Message]) -> StoreResult<Vec<MessageEvent>> {
        if let Some(id) = first_repeated_id(messages) {
            return Err(StoreError::Duplicate { what: "message", id: id.to_owned() });
        }
        let now = self.clock.now();
        let stored: Vec<Message> = messages.iter().map(|message| stamp(message, now)).collect();
        let content_bytes = messages.iter().map(|message| message.content.len()).sum();
        self.write_sized(content_bytes, move |conn| {
            let first = next_rev(conn)?;
            stored.iter().zip(first..).map(|(message, rev)| insert_in(conn, message, Some(rev))).collect()
        })
        .await
    }

    async fn get_message(&self, id: &MessageId) -> StoreResult<Option<Message>> {
        let id = id.as_str().to_owned();
        Ok(self.read(move |conn| fetch_message(conn, &id)).await?.map(|stored| stored.message))
    }

    async fn list_messages(&self, filter: &MessageFilter) -> StoreResult<Vec<Message>> {
        Ok(self.read_messages(list_query(filter)).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn update_status(&self, id: &MessageId, to: Status) -> StoreResult<MessageEvent> {
        let id = id.as_str().to_owned();
        let now = time_text(self.clock.now());
        self.write(move |conn| {
            // Read inside the write lock: what is read is what the update sees.
            let Some(current) = fetch_message(conn, &id)? else { return Err(not_found("message", &id)) };
            let from = current.message.status;
            from.check_transition(to).map_err(|source| StoreError::IllegalTransition { id: id.clone(), source })?;
            let values = [
                SqlValue::Text(id.clone()),
                SqlValue::Text(to.as_str().to_owned()),
                SqlValue::Text(now),
                SqlValue::Text(from.as_str().to_owned()),
            ];
            match update_returning(conn, &status_update_sql(), &values)? {
                Some(stored) => Ok(event(stored, false)),
                None => Err(StoreError::Contention { id }),
            }
        })
        .await
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
        let id = id.as_str().to_owned();
        let expected = expected.to_vec();
        self.write(move |conn| {
            // A corrupt row is refused before anything is written.
            let Some(current) = fetch_message(conn, &id)? else { return Err(not_found("message", &id)) };
            if !expected.contains(&current.message.status) {
                return Ok(None);
            }
            let (text, values) = sqlite_query(&query);
            Ok(update_returning(conn, &text, &values)?.map(|stored| event(stored, false)))
        })
        .await
    }

    async fn renew_claim(&self, id: &MessageId, claimed_by: &str) -> StoreResult<bool> {
        let (id, claimed_by, now) = (id.as_str().to_owned(), claimed_by.to_owned(), time_text(self.clock.now()));
        self.write(move |conn| {
            let done = conn
                .prepare_cached(
                    "UPDATE messages SET claimed_at = ?1 WHERE id = ?2 AND status = 'processing' AND claimed_by = ?3",
                )?
                .execute(params![now, id, claimed_by])?;
            Ok(done == 1)
        })
        .await
    }

    async fn claim_of(&self, id: &MessageId) -> StoreResult<Option<Claim>> {
        let id = id.as_str().to_owned();
        self.read(move |conn| {
            let mut statement =
                conn.prepare_cached("SELECT id, status, claimed_by, claimed_at FROM messages WHERE id = ?1")?;
            let mut rows = statement.query(params![id])?;
            let Some(row) = rows.next()? else { return Err(not_found("message", &id)) };
            let row = SqlRow::new(row, CLAIM_NAMES);
            let cells = Cells::new(&row, "messages")?;
            cells.claim()
        })
        .await
    }

    async fn update_metadata(&self, id: &MessageId, metadata: &Metadata) -> StoreResult<MessageEvent> {
        let id = id.as_str().to_owned();
        let values = vec![
            SqlValue::Text(id.clone()),
            SqlValue::Text(metadata.to_value().to_string()),
            SqlValue::Text(time_text(self.clock.now())),
        ];
        self.write(move |conn| {
            // Read first, so a row we cannot understand is refused before it is changed.
            if fetch_message(conn, &id)?.is_none() {
                return Err(not_found("message", &id));
            }
            let sql = format!(
                "UPDATE messages SET metadata = ?2, updated_at = ?3, rev = {NEXT_REV} WHERE id = ?1 \
                 RETURNING {MESSAGE_COLUMNS}"
            );
            match update_returning(conn, &sql, &values)? {
                Some(stored) => Ok(event(stored, false)),
                None => Err(not_found("message", &id)),
            }
        })
        .await
    }

    async fn session_history(&self, session_id: &SessionId) -> StoreResult<Vec<Message>> {
        let cache = Arc::clone(&self.engine.history);
        let session_id = session_id.clone();
        self.read(move |conn| cache.read(conn, &session_id, &HistoryRows)).await
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
        Ok(self
            .read_messages(orphaned_calls_query(session_id))
            .await?
            .into_iter()
            .map(|stored| stored.message)
            .collect())
    }

    async fn changes_since(&self, after: i64, filter: &MessageFilter, limit: u32) -> StoreResult<Vec<MessageEvent>> {
        let mut query =
            Query::with_args(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE rev > $1"), vec![Arg::Int(after)]);
        query.message_filter(filter, "").push(" ORDER BY rev").limit(Some(limit));
        let stored = self.read_messages(query).await?;
        Ok(stored
            .into_iter()
            .map(|s| {
                let created = s.created_rev > after;
                event(s, created)
            })
            .collect())
    }

    async fn current_rev(&self) -> StoreResult<i64> {
        self.read(|conn| {
            Ok(conn.prepare_cached("SELECT COALESCE(MAX(rev), 0) FROM messages")?.query_row([], |row| row.get(0))?)
        })
        .await
    }

    async fn create_session(&self, session: &Session) -> StoreResult<()> {
        let session = session.clone();
        self.write(move |conn| insert_session(conn, &session)).await
    }

    async fn get_session(&self, id: &SessionId) -> StoreResult<Option<Session>> {
        let id = id.as_str().to_owned();
        self.read(move |conn| {
            let mut statement =
                conn.prepare_cached(&format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1"))?;
            let mut rows = statement.query(params![id])?;
            match rows.next()? {
                Some(row) => Ok(Some(decode::session(&SqlRow::new(row, SESSION_NAMES))?)),
                None => Ok(None),
            }
        })
        .await
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
        self.read(move |conn| {
            let (text, values) = sqlite_query(&query);
            let mut statement = conn.prepare_cached(&text)?;
            let mut rows = statement.query(params_from_iter(values.iter()))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                out.push(decode::session(&SqlRow::new(row, SESSION_NAMES))?);
            }
            Ok(out)
        })
        .await
    }

    async fn set_session_title(&self, id: &SessionId, title: &str) -> StoreResult<()> {
        let (id, title, now) = (id.as_str().to_owned(), title.to_owned(), time_text(self.clock.now()));
        self.write(move |conn| {
            let done = conn
                .prepare_cached("UPDATE sessions SET title = ?2, updated_at = ?3 WHERE id = ?1")?
                .execute(params![id, title, now])?;
            if done == 0 {
                return Err(not_found("session", &id));
            }
            Ok(())
        })
        .await
    }

    async fn active_session(&self, chatbot_id: &str, channel_id: &str) -> StoreResult<Option<SessionId>> {
        let (chatbot_id, channel_id) = (chatbot_id.to_owned(), channel_id.to_owned());
        self.read(move |conn| {
            let id: Option<String> = conn
                .prepare_cached("SELECT session_id FROM channel_sessions WHERE chatbot_id = ?1 AND channel_id = ?2")?
                .query_row(params![chatbot_id, channel_id], |row| row.get(0))
                .optional()?;
            Ok(id.map(SessionId::from))
        })
        .await
    }

    async fn set_active_session(&self, chatbot_id: &str, channel_id: &str, session_id: &SessionId) -> StoreResult<()> {
        let (chatbot_id, channel_id, session_id) =
            (chatbot_id.to_owned(), channel_id.to_owned(), session_id.as_str().to_owned());
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO channel_sessions (chatbot_id, channel_id, session_id) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (chatbot_id, channel_id) DO UPDATE SET session_id = excluded.session_id",
            )?
            .execute(params![chatbot_id, channel_id, session_id])
            .map_err(|error| session_reference_error(error, &session_id))?;
            Ok(())
        })
        .await
    }

    async fn resolve_session(&self, chatbot_id: &str, channel_id: &str) -> StoreResult<Session> {
        let (chatbot, channel) = (chatbot_id.to_owned(), channel_id.to_owned());
        if let Some(session) = self.read(move |conn| active_in(conn, &chatbot, &channel)).await? {
            return Ok(session);
        }
        // The write job holds SQLite's write lock, so checking again and creating is atomic
        // against every other writer, in this process or another.
        let (chatbot, channel) = (chatbot_id.to_owned(), channel_id.to_owned());
        let fresh = Session::new(chatbot_id, channel_id, self.clock.now());
        self.write(move |conn| {
            if let Some(session) = active_in(conn, &chatbot, &channel)? {
                return Ok(session);
            }
            insert_session(conn, &fresh)?;
            conn.prepare_cached(
                "INSERT INTO channel_sessions (chatbot_id, channel_id, session_id) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![chatbot, channel, fresh.id.as_str()])?;
            Ok(fresh)
        })
        .await
    }
}

fn insert_session(conn: &Connection, session: &Session) -> StoreResult<()> {
    conn.prepare_cached(&format!("INSERT INTO sessions ({SESSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"))?
        .execute(params![
            session.id.as_str(),
            session.chatbot_id,
            session.channel_id,
            session.title.as_deref(),
            time_text(session.created_at),
            time_text(session.updated_at),
        ])
        .map_err(|error| insert_error(error, "session", session.id.as_str()))?;
    Ok(())
}

fn active_in(conn: &Connection, chatbot_id: &str, channel_id: &str) -> StoreResult<Option<Session>> {
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {SESSION_COLUMNS_S} FROM channel_sessions c JOIN sessions s ON s.id = c.session_id \
         WHERE c.chatbot_id = ?1 AND c.channel_id = ?2"
    ))?;
    let mut rows = statement.query(params![chatbot_id, channel_id])?;
    match rows.next()? {
        Some(row) => Ok(Some(decode::session(&SqlRow::new(row, SESSION_NAMES))?)),
        None => Ok(None),
    }
}

fn ledger_rows(conn: &Connection, text: &str, values: &[SqlValue]) -> StoreResult<Vec<LedgerEntry>> {
    let mut statement = conn.prepare_cached(text)?;
    let mut rows = statement.query(params_from_iter(values.iter()))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode::ledger_entry(&SqlRow::new(row, LEDGER_NAMES))?);
    }
    Ok(out)
}

#[async_trait]
impl Ledger for SqliteStore {
    async fn record_enqueued(&self, entry: &LedgerEntry) -> StoreResult<()> {
        let entry = entry.clone();
        self.write(move |conn| {
            conn.prepare_cached(&format!(
                "INSERT INTO activations ({LEDGER_COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17) \
                 ON CONFLICT (id) DO NOTHING"
            ))?
            .execute(params![
                entry.id.as_str(),
                entry.kind.as_str(),
                entry.lane.as_str(),
                entry.session_id.as_str(),
                entry.message_id.as_ref().map(MessageId::as_str),
                entry.triggered_by,
                entry.delegation_user.as_deref(),
                i64::from(entry.depth),
                time_text(entry.enqueued_at),
                entry.started_at.map(time_text),
                entry.finished_at.map(time_text),
                entry.outcome.map(Outcome::as_str),
                entry.error.as_deref(),
                decode::count(entry.usage.model_calls),
                decode::count(entry.usage.tool_calls),
                decode::count(entry.usage.input_tokens),
                decode::count(entry.usage.output_tokens),
            ])?;
            Ok(())
        })
        .await
    }

    async fn record_started(&self, id: &ActivationId, at: DateTime<Utc>) -> StoreResult<()> {
        let (id, at) = (id.as_str().to_owned(), time_text(at));
        self.write(move |conn| {
            let done = conn
                .prepare_cached("UPDATE activations SET started_at = ?2 WHERE id = ?1")?
                .execute(params![id, at])?;
            if done == 0 {
                return Err(not_found("activation", &id));
            }
            Ok(())
        })
        .await
    }

    async fn record_finished(
        &self,
        id: &ActivationId,
        at: DateTime<Utc>,
        outcome: Outcome,
        error: Option<&str>,
        usage: &Usage,
    ) -> StoreResult<()> {
        let (id, at, error, usage) = (id.as_str().to_owned(), time_text(at), error.map(str::to_owned), *usage);
        self.write(move |conn| {
            let done = conn
                .prepare_cached(
                    "UPDATE activations SET finished_at = ?2, outcome = ?3, error = ?4, model_calls = ?5, \
                     tool_calls = ?6, input_tokens = ?7, output_tokens = ?8 WHERE id = ?1",
                )?
                .execute(params![
                    id,
                    at,
                    outcome.as_str(),
                    error,
                    decode::count(usage.model_calls),
                    decode::count(usage.tool_calls),
                    decode::count(usage.input_tokens),
                    decode::count(usage.output_tokens),
                ])?;
            if done == 0 {
                return Err(not_found("activation", &id));
            }
            Ok(())
        })
        .await
    }

    async fn get_activation(&self, id: &ActivationId) -> StoreResult<Option<LedgerEntry>> {
        let id = id.as_str().to_owned();
        self.read(move |conn| {
            let text = format!("SELECT {LEDGER_COLUMNS} FROM activations WHERE id = ?1");
            Ok(ledger_rows(conn, &text, &[SqlValue::Text(id)])?.into_iter().next())
        })
        .await
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
        self.read(move |conn| {
            let (text, values) = sqlite_query(&query);
            ledger_rows(conn, &text, &values)
        })
        .await
    }

    async fn unfinished_activations(&self) -> StoreResult<Vec<LedgerEntry>> {
        self.read(|conn| {
            let text = format!(
                "SELECT {LEDGER_COLUMNS} FROM activations WHERE started_at IS NOT NULL AND finished_at IS NULL \
                 ORDER BY enqueued_at, id"
            );
            ledger_rows(conn, &text, &[])
        })
        .await
    }
}

/// `(bytes allocated now, most allocated at once)` by SQLite in this process.
#[allow(unsafe_code)]
pub(crate) fn sqlite_memory() -> (u64, u64) {
    // SAFETY: both functions take no pointers and only read SQLite's global counters (kept
    // under its own mutex since the library is built with SQLITE_DEFAULT_MEMSTATUS on); they
    // are callable at any time, before or after any connection opens; the argument 0 asks not
    // to reset the high-water mark.
    let (used, highwater) =
        unsafe { (rusqlite::ffi::sqlite3_memory_used(), rusqlite::ffi::sqlite3_memory_highwater(0)) };
    (u64::try_from(used).unwrap_or(0), u64::try_from(highwater).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle_slot() -> WriterSlot {
        WriterSlot {
            writable: Mutex::new(None),
            queued: AtomicUsize::new(0),
            contended_at: AtomicU64::new(0),
            collisions: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    #[test]
    fn a_few_collisions_keep_writes_inline_and_many_make_them_queue_for_a_while() {
        let slot = idle_slot();
        // Two turns meeting (one's last writes, the next one's first) collide once or twice.
        for _ in 1..COLLISIONS_TO_QUEUE {
            slot.contended();
        }
        assert!(!slot.recently_contended(), "fewer than {COLLISIONS_TO_QUEUE} collisions must not make writes queue");

        // Load: collisions one after the other (a millisecond may turn over once in between).
        let mut calls = 0;
        while !slot.recently_contended() && calls < 2 * COLLISIONS_TO_QUEUE {
            slot.contended();
            calls += 1;
        }
        assert!(slot.recently_contended(), "{calls} collisions in a row did not make writes queue");

        std::thread::sleep(CONTENDED_FOR + Duration::from_millis(1));
        assert!(!slot.recently_contended(), "writes must go back inline once the collisions stop");
    }

    /// The lookups of waiting and running work (intake, recovery, the interrupt and steer
    /// checks of every turn) read the small partial index `messages_open`, a session's
    /// messages come from `messages_phased`, and a call's result from `messages_result_of`.
    #[tokio::test]
    async fn open_work_and_sessions_are_read_through_indexes() {
        use kesoku_core::{Role, SessionId};

        let store = SqliteStore::open_in_memory().await.expect("open");
        let plan = |sql: &str, values: Vec<SqlValue>| -> String {
            let guard = lock_writable(&store.engine.writer);
            let conn = &guard.as_ref().expect("open").conn;
            let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).expect("explain");
            let rows = statement
                .query_map(params_from_iter(values), |row| row.get::<_, String>(3))
                .expect("plan")
                .collect::<Result<Vec<_>, _>>()
                .expect("plan rows");
            rows.join("; ")
        };
        let listed = |filter: &MessageFilter| {
            let (sql, values) = sqlite_query(&list_query(filter));
            plan(&sql, values)
        };
        let session = SessionId::from("sess_plan");
        let newer = MessageFilter::session(&session)
            .with_channel("c")
            .with_statuses(&[Status::PendingAgent])
            .with_roles(&[Role::User]);
        let open = listed(&newer);
        assert!(open.contains("USING INDEX messages_open (status=? AND session_id=?)"), "{open}");
        let running = listed(&MessageFilter::status(Status::Processing));
        assert!(running.contains("USING INDEX messages_open (status=?)"), "{running}");
        let orphans = plan(&orphans_sql(), vec![SqlValue::Text(time_text(Utc::now()))]);
        assert!(orphans.contains("USING INDEX messages_open (status=?)"), "{orphans}");
        let whole = listed(&MessageFilter::session(&session));
        assert!(whole.contains("USING INDEX messages_phased (session_id=?)"), "{whole}");
        // A call's result is found through the partial index of tool results.
        let (sql, values) = sqlite_query(&orphaned_calls_query(Some(&session)));
        let unanswered = plan(&sql, values);
        assert!(unanswered.contains("INDEX messages_result_of (parent_id=?)"), "{unanswered}");
        for shown in [open, running, orphans, whole] {
            assert!(!shown.contains("SCAN messages"), "{shown}");
        }
    }

    /// The service's metrics see a kept long history and SQLite's own allocations.
    #[tokio::test]
    async fn a_kept_history_and_sqlites_memory_are_reported() {
        use kesoku_core::SessionId;

        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(&dir.path().join("kesoku.db")).await.expect("create");
        let session = SessionId::from("sess_reported");
        let messages: Vec<Message> = (0..crate::history_cache::MIN_MESSAGES + 10)
            .map(|index| Message::user_text(&session, "cli", "local", "Chii", format!("message {index}")))
            .collect();
        store.insert_messages(&messages).await.expect("write a long session");
        // Kept from its second read on (admission), counted while kept.
        for _ in 0..2 {
            assert_eq!(store.session_history(&session).await.expect("history").len(), messages.len());
        }
        let usage = crate::memory_usage();
        // Other tests of this process may keep histories too: at least this one is counted.
        assert!(usage.history_cache_sessions >= 1, "{usage:?}");
        let least = messages.len() * (std::mem::size_of::<Message>() + "message 100".len());
        assert!(usage.history_cache_bytes >= least as u64, "{usage:?}: fewer than {least} bytes");
        assert!(usage.sqlite_bytes > 0, "{usage:?}");
        assert!(usage.sqlite_highwater_bytes >= usage.sqlite_bytes, "{usage:?}");
    }

    /// The checkpoint thread starts the log over through the writer's own connection: a write
    /// from any other connection would make the writer drop its page cache (SQLite's
    /// `data_version` counts exactly those writes) and read every page again in its next write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_is_started_over_without_emptying_the_writers_cache() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kesoku.db");
        let store = SqliteStore::open(&path).await.expect("create");
        let message = Message::user_text(&kesoku_core::SessionId::from("sess_cache"), "cli", "local", "Chii", "hello");
        store.insert_message(&message).await.expect("a write");
        let data_version = || -> i64 {
            let guard = lock_writable(&store.engine.writer);
            let writable = guard.as_ref().expect("open");
            writable.conn.query_row("PRAGMA data_version", [], |row| row.get(0)).expect("data_version")
        };
        let before = data_version();
        // Bytes 12..24 of the log's header (checkpoint sequence, salts) change when it starts over.
        let wal = path.with_extension("db-wal");
        let header = || std::fs::read(&wal).ok().and_then(|bytes| bytes.get(12..24).map(<[u8]>::to_vec));
        let written = header().expect("a log header");
        let deadline = Instant::now() + Duration::from_secs(10);
        while header().as_ref() == Some(&written) {
            assert!(Instant::now() < deadline, "the log was not started over within 10 s of the write");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(data_version(), before, "another connection wrote: the writer's page cache was dropped");
        store.close().await;
    }
}
