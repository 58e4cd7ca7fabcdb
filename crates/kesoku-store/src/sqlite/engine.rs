//! The SQLite store's engine: the writer thread with group commit, the reader threads, and the
//! gate that runs a job on the caller's thread when its connection is idle.
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
//! the largest part of a turn's overhead. So when no job is queued and the connection is free,
//! the caller runs its job itself, in a transaction of its own, holding the connection's lock;
//! under load jobs queue as before and the thread batches them. An inline write never waits for
//! another process: its `BEGIN IMMEDIATE` uses no busy timeout, and on `SQLITE_BUSY` the job
//! goes to the thread, which waits. Large writes (over [`INLINE_BYTES`] of content) always go
//! to the thread. Reads do the same with an idle reader connection.
//!
//! **Durability.** A write is acknowledged only after the commit that holds it returned. With
//! `journal_mode = WAL` and `synchronous = NORMAL`, that commit is in the WAL file: it survives
//! the process being killed at any point; an operating-system crash or power cut may lose the
//! last commits before the next checkpoint (never corrupting the file). A failed commit fails
//! every job of its batch; none of them is visible.
//!
//! **Reads** run on a few reader threads, each with a read-only connection, which WAL lets run
//! beside the writer. An in-memory store has a single connection, and so does a store opened
//! for a command ([`crate::Footprint::Command`]): their reads go to the writer.
//!
//! This module knows no table and no SQL beyond transaction control: jobs are closures over a
//! connection. Checkpoints are the `checkpoint` module's; what the jobs do is the `store` and
//! `ledger` modules'.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::BUSY_TIMEOUT;
use super::checkpoint::{CheckpointWaker, start_checkpointer};
use crate::error::{StoreError, StoreResult};

/// Most jobs committed together.
const MAX_BATCH: usize = 512;
/// Content above which a write always goes to the writer thread (it would hold the caller's
/// thread, an async worker, for a millisecond or more).
const INLINE_BYTES: usize = 64 * 1024;
/// How long after callers found the writer busy [`COLLISIONS_TO_QUEUE`] times within a
/// millisecond they keep queueing, so that under load jobs gather into the writer thread's
/// batches (one commit for many, where taking every free moment inline runs fewer turns per
/// second). A collision or two do not start it: two turns one after the other meet once or
/// twice (one's last writes, the next one's first), and a window opened by that would send
/// every write of the next turn through the thread, two wake-ups each.
const CONTENDED_FOR: Duration = Duration::from_millis(2);
/// Collisions within one millisecond that make writes queue for [`CONTENDED_FOR`].
const COLLISIONS_TO_QUEUE: u64 = 4;

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
pub(super) struct WriterSlot {
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

/// The read-only connections, one per reader thread, borrowed by callers when idle.
struct ReaderSlots {
    /// `None` once closed.
    conns: Vec<Mutex<Option<Connection>>>,
    /// Jobs sent to the threads and not yet run.
    queued: AtomicUsize,
}

/// The threads and the way to reach them. Dropping the last handle ends them.
pub(super) struct Engine {
    writes: Sender<Inbox<WriteJob>>,
    writer: Arc<WriterSlot>,
    /// `None` for an in-memory store and a command's: their reads go to the writer.
    reads: Option<(Sender<Inbox<ReadJob>>, Arc<ReaderSlots>)>,
    /// The file path (or `:memory:`), for errors and logs.
    pub(super) location: Arc<str>,
    /// The checkpoint thread (file stores in WAL mode); it ends after the writer.
    checkpointer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Engine {
    /// Start the writer thread on `writer`, a reader thread on each of `readers` (none: reads
    /// go to the writer) and, given its connection, the checkpoint thread.
    pub(super) fn start(
        writer: Connection,
        readers: Vec<Connection>,
        checkpoints: Option<Connection>,
        location: Arc<str>,
    ) -> Engine {
        let (writes, writer) = start_writer(writer, &location);
        let checkpointer = checkpoints.and_then(|conn| {
            let (wake, handle) = start_checkpointer(conn, &location, Arc::downgrade(&writer));
            if let Some(writable) = lock_writable(&writer).as_mut() {
                writable.checkpoints = Some(wake);
            }
            handle
        });
        let reads = (!readers.is_empty()).then(|| start_readers(readers, &location));
        Engine { writes, writer, reads, location, checkpointer: Mutex::new(checkpointer) }
    }

    /// Close the connections: jobs queued before this finish first; later calls fail.
    pub(super) async fn close(&self) {
        let mut waits = Vec::new();
        let (done, wait) = std::sync::mpsc::channel();
        if self.writes.send(Inbox::Close(done)).is_ok() {
            waits.push(wait);
        }
        if let Some((reads, slots)) = &self.reads {
            for _ in 0..slots.conns.len() {
                let (done, wait) = std::sync::mpsc::channel();
                if reads.send(Inbox::Close(done)).is_ok() {
                    waits.push(wait);
                }
            }
        }
        let checkpointer = self.checkpointer.lock().unwrap_or_else(|p| p.into_inner()).take();
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

    /// Run `work` in a transaction: here when the writer is idle, else in the writer thread's
    /// next batch; its result comes back once its transaction committed.
    pub(super) async fn write<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        match write_inline(&self.writer, work) {
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
        send_counted(&self.writes, &self.writer.queued, job)?;
        answered.await.map_err(|_| closed("the store's writer stopped"))?
    }

    /// Run `work` on a reader connection: here when one is idle, else on a reader thread (the
    /// writer, in memory and for a command).
    pub(super) async fn read<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let Some((reads, slots)) = &self.reads else { return self.write(work).await };
        // Under load (writes waiting for the writer), reads stay on the reader threads too: the
        // async workers then keep to the turns' own work, beside them.
        let work = if self.writer.queued.load(Ordering::Acquire) != 0 {
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

    /// [`Engine::write`], or straight to the writer thread when `content_bytes` is over
    /// [`INLINE_BYTES`].
    pub(super) async fn write_sized<T, F>(&self, content_bytes: usize, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        if content_bytes > INLINE_BYTES { self.write_queued(work).await } else { self.write(work).await }
    }

    /// Run `work` on the writer's connection, waiting for the lock (tests look at it directly).
    #[cfg(test)]
    pub(super) fn with_writer<T>(&self, work: impl FnOnce(&Connection) -> T) -> T {
        let guard = lock_writable(&self.writer);
        work(&guard.as_ref().expect("the store is open").conn)
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

    /// Run `work` on the writer's connection if it is idle (no job queued, the lock free, the
    /// store open); otherwise do nothing. For the checkpoint thread's housekeeping, which must
    /// never hold up a write.
    pub(super) fn with_idle_connection(&self, work: impl FnOnce(&Connection)) {
        if self.queued.load(Ordering::Acquire) != 0 {
            return;
        }
        let Ok(guard) = self.writable.try_lock() else { return };
        let Some(writable) = guard.as_ref() else { return };
        work(&writable.conn);
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
/// statement cache: every write runs a few of them, and parsing each anew costs more than
/// running it.
pub(super) fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
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
pub(super) fn closed(reason: &str) -> StoreError {
    StoreError::Sqlite(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISUSE),
        Some(reason.to_owned()),
    ))
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

    /// A connection holding one table of numbers.
    fn numbers() -> Connection {
        let conn = Connection::open_in_memory().expect("open");
        conn.execute_batch("CREATE TABLE numbers (value INTEGER NOT NULL)").expect("table");
        conn
    }

    /// A write job that inserts `value`, then fails when it is negative.
    fn insert(value: i64) -> impl FnOnce(&Connection) -> StoreResult<i64> {
        move |conn| {
            conn.execute("INSERT INTO numbers (value) VALUES (?1)", [value])?;
            if value < 0 { Err(StoreError::NotFound { what: "number", id: value.to_string() }) } else { Ok(value) }
        }
    }

    fn stored(conn: &Connection) -> Vec<i64> {
        let mut statement = conn.prepare("SELECT value FROM numbers ORDER BY value").expect("select");
        statement.query_map([], |row| row.get(0)).expect("rows").collect::<Result<_, _>>().expect("values")
    }

    /// A batch commits once; a job that fails is rolled back alone (its savepoint) and gets its
    /// error, the others are answered with their results after the commit.
    #[test]
    fn a_failing_job_of_a_batch_is_rolled_back_alone() {
        let conn = numbers();
        let answers = Arc::new(Mutex::new(Vec::new()));
        let jobs: Vec<WriteJob> = [1, -2, 3]
            .into_iter()
            .map(|value| {
                let answers = Arc::clone(&answers);
                let job: WriteJob = Box::new(move |conn| {
                    let result = in_savepoint(conn, insert(value));
                    Box::new(move |commit_error: Option<&rusqlite::Error>| {
                        relock(answers.lock()).push((value, result.is_ok(), commit_error.is_some()));
                    })
                });
                job
            })
            .collect();
        run_batch(&conn, jobs);
        assert_eq!(stored(&conn), [1, 3]);
        assert_eq!(*relock(answers.lock()), [(1, true, false), (-2, false, false), (3, true, false)]);
        assert!(conn.is_autocommit(), "the batch's transaction is still open");
    }

    /// The caller's thread takes an idle writer; a queued job or a held lock sends the caller
    /// to the queue, and a failed inline job leaves nothing behind.
    #[test]
    fn a_write_runs_inline_only_while_the_writer_is_idle() {
        let slot = idle_slot();
        *relock(slot.writable.lock()) = Some(Writable { conn: numbers(), checkpoints: None });
        assert!(matches!(write_inline(&slot, insert(1)), Ok(Ok(1))));
        assert!(matches!(write_inline(&slot, insert(-1)), Ok(Err(StoreError::NotFound { .. }))));

        slot.queued.store(1, Ordering::Release);
        assert!(write_inline(&slot, insert(2)).is_err(), "a queued job must go first");
        slot.queued.store(0, Ordering::Release);

        {
            let _held = relock(slot.writable.lock());
            assert!(write_inline(&slot, insert(3)).is_err(), "a busy connection must not be waited for");
        }
        let guard = lock_writable(&slot);
        let conn = &guard.as_ref().expect("open").conn;
        assert_eq!(stored(conn), [1]);
        assert!(conn.is_autocommit());
    }
}
