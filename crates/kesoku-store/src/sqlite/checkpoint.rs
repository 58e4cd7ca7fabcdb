//! Checkpoints of the SQLite store's log, on a thread and a connection of their own.
//!
//! Checkpoints move the log back into the database file and sync it: milliseconds that, left
//! automatic, land inside whichever commit crosses 1,000 pages of log (the slowest turns). A
//! service's store does them beside the writer instead (`wal_autocheckpoint = 0` on the
//! writer): a commit wakes this thread only when no checkpoint is due yet, and it runs a
//! passive checkpoint [`CHECKPOINT_DELAY`] later, which never blocks the writer or the readers.
//! An idle store wakes nobody. When a checkpoint moved the whole log, the thread also starts
//! the log over ([`start_log_over`]), so that the next write does not pay for the log's header
//! sync.
//!
//! This module does not write messages and decides nothing about when a write runs: that is
//! the engine's. A command's store ([`crate::Footprint::Command`]) has no checkpoint thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, SyncSender};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::BUSY_TIMEOUT;
use super::engine::{WriterSlot, control};

/// How long the checkpointer lets writes gather after being woken before it checkpoints.
const CHECKPOINT_DELAY: Duration = Duration::from_millis(200);

/// The checkpoint thread's connection to `path`, with the writer (`writer`) switched to
/// manual checkpoints; `None` (checkpoints stay automatic) when it cannot be had.
pub(super) fn open_checkpoint_connection(
    path: &std::path::Path,
    writer: &Connection,
    what: &str,
) -> Option<Connection> {
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
}

/// The writer's side of the checkpoint thread: a commit wakes it only when no checkpoint is
/// already due. A wake-up is a system call and, on an idle machine, a trip to another CPU; the
/// commits of a turn all fall inside one checkpoint's delay, so they cost one wake-up, not one
/// each.
pub(super) struct CheckpointWaker {
    due: Arc<AtomicBool>,
    wake: SyncSender<()>,
}

impl CheckpointWaker {
    pub(super) fn committed(&self) {
        if !self.due.swap(true, Ordering::AcqRel) {
            // Full means already woken.
            let _ = self.wake.try_send(());
        }
    }
}

/// The checkpoint thread: woken by the writer after its commits, it waits
/// [`CHECKPOINT_DELAY`] for more, then runs a passive checkpoint on a connection of its own
/// (which never blocks the writer or the readers) and, when that moved the whole log, starts
/// the log over ([`start_log_over`]) on the writer's connection. It ends when the writer does.
/// An idle store wakes nobody.
pub(super) fn start_checkpointer(
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
/// so even with `synchronous = NORMAL`, to keep the file sound). That fsync would land in the
/// first write after every quiet moment: a turn's first write after its model call, a user's
/// message after a pause. The checkpoint thread takes it instead, with a write that changes
/// nothing (the header's `user_version`, set to what it holds) but starts the log over.
///
/// The write goes through the writer's own connection, taken only if idle (if a write holds
/// it, or waits, that write starts the log over itself). A write from another connection
/// would change the log under the writer's, which then drops every page it had cached and
/// reads them again in its next write.
fn start_log_over(slot: &WriterSlot) {
    slot.with_idle_connection(|conn| {
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
    });
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use kesoku_core::Message;

    use super::*;
    use crate::{SqliteStore, Store};

    /// The commits of a turn wake the checkpoint thread once: while a checkpoint is due, a
    /// commit sends nothing; once the thread took the due checkpoint, the next commit wakes it.
    #[test]
    fn commits_wake_the_checkpoint_thread_once_per_checkpoint() {
        let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
        let due = Arc::new(AtomicBool::new(false));
        let waker = CheckpointWaker { due: Arc::clone(&due), wake };
        for _ in 0..5 {
            waker.committed();
        }
        assert!(woken.try_recv().is_ok(), "the first commit wakes the thread");
        assert!(woken.try_recv().is_err(), "later commits while due must not send again");
        due.store(false, Ordering::Release);
        waker.committed();
        assert!(woken.try_recv().is_ok(), "a commit after the checkpoint wakes the thread again");
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
            store
                .engine
                .with_writer(|conn| conn.query_row("PRAGMA data_version", [], |row| row.get(0)))
                .expect("data_version")
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
