//! The SQLite statements of work that outlives a turn: follow-ups and background jobs
//! (schema version 7). They are plain rows: nothing here takes a message revision.
//!
//! A state moves once: the row's state is read inside the write job (a row that is missing,
//! settled already or unreadable is answered before anything is written), then changed by
//! `UPDATE … WHERE state = <the one state it may leave>`. Writes hold the engine's write lock,
//! so what was read is what the update sees. Whether a change is allowed at all is `common`'s;
//! decoding rows is `decode`'s.

use std::str::FromStr;

use kesoku_core::{FollowUp, FollowUpState, Job, JobEnd, JobState, MessageId, UnknownValue};
use rusqlite::{Connection, params};

use super::rows::{FOLLOWUP_NAMES, JOB_NAMES, SqlRow, decoded_rows, time_text};
use super::store::insert_error;
use crate::common::not_found;
use crate::decode::{self, Cells};
use crate::error::StoreResult;
use crate::sql::{FOLLOWUP_COLUMNS, JOB_COLUMNS, Query};

pub(super) fn insert_followup(conn: &Connection, followup: &FollowUp) -> StoreResult<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO followups ({FOLLOWUP_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
    ))?
    .execute(params![
        followup.id.as_str(),
        followup.session_id.as_str(),
        followup.chatbot_id,
        followup.channel_id,
        followup.task,
        time_text(followup.due_at),
        time_text(followup.created_at),
        followup.created_by.as_ref().map(MessageId::as_str),
        followup.state.as_str(),
        followup.settled_at.map(time_text),
    ])
    .map_err(|error| insert_error(error, "follow-up", followup.id.as_str()))?;
    Ok(())
}

/// The follow-ups `query` returns (columns of [`FOLLOWUP_COLUMNS`]).
pub(super) fn followups(conn: &Connection, query: &Query) -> StoreResult<Vec<FollowUp>> {
    decoded_rows(conn, query, FOLLOWUP_NAMES, |row| decode::followup(row))
}

/// Move a pending follow-up to `to` (checked by the caller), stamping `settled_at`.
pub(super) fn settle_followup(conn: &Connection, id: &str, to: FollowUpState, settled_at: &str) -> StoreResult<bool> {
    match state_of::<FollowUpState>(conn, "followups", id)? {
        None => Err(not_found("follow-up", id)),
        Some(FollowUpState::Fired | FollowUpState::Cancelled) => Ok(false),
        Some(FollowUpState::Pending) => {
            let done = conn
                .prepare_cached("UPDATE followups SET state = ?2, settled_at = ?3 WHERE id = ?1 AND state = 'pending'")?
                .execute(params![id, to.as_str(), settled_at])?;
            Ok(done == 1)
        }
    }
}

pub(super) fn insert_job(conn: &Connection, job: &Job) -> StoreResult<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO jobs ({JOB_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
    ))?
    .execute(params![
        job.id.as_str(),
        job.session_id.as_str(),
        job.chatbot_id,
        job.channel_id,
        job.message_id.as_str(),
        job.command,
        job.pid,
        job.stdout_path,
        job.stderr_path,
        job.state.as_str(),
        job.exit_code,
        job.detail,
        time_text(job.started_at),
        job.finished_at.map(time_text),
    ])
    .map_err(|error| insert_error(error, "job", job.id.as_str()))?;
    Ok(())
}

/// The jobs `query` returns (columns of [`JOB_COLUMNS`]).
pub(super) fn jobs(conn: &Connection, query: &Query) -> StoreResult<Vec<Job>> {
    decoded_rows(conn, query, JOB_NAMES, |row| decode::job(row))
}

/// Record the end (checked by the caller) of a running job.
pub(super) fn finish_job(conn: &Connection, id: &str, end: &JobEnd) -> StoreResult<bool> {
    match state_of::<JobState>(conn, "jobs", id)? {
        None => Err(not_found("job", id)),
        Some(JobState::Exited | JobState::Lost | JobState::Cancelled) => Ok(false),
        Some(JobState::Running) => {
            let done = conn
                .prepare_cached(
                    "UPDATE jobs SET state = ?2, exit_code = ?3, detail = ?4, finished_at = ?5 \
                     WHERE id = ?1 AND state = 'running'",
                )?
                .execute(params![id, end.state.as_str(), end.exit_code, end.detail, time_text(end.finished_at)])?;
            Ok(done == 1)
        }
    }
}

/// The state of row `id` of `table` (`followups` or `jobs`), or `None` when there is no such
/// row; a state this build does not know is a corrupt row.
fn state_of<T: FromStr<Err = UnknownValue>>(
    conn: &Connection,
    table: &'static str,
    id: &str,
) -> StoreResult<Option<T>> {
    let mut statement = conn.prepare_cached(&format!("SELECT id, state FROM {table} WHERE id = ?1"))?;
    let mut rows = statement.query(params![id])?;
    match rows.next()? {
        Some(row) => Ok(Some(Cells::new(&SqlRow::new(row, &["id", "state"]), table)?.parse("state")?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use kesoku_core::{FollowUpFilter, JobFilter, SessionId};

    use super::*;
    use crate::sql::{followups_query, jobs_query};
    use crate::sqlite::SqliteStore;
    use crate::sqlite::rows::sqlite_query;

    /// The scheduler's question (pending follow-ups due by now) and recovery's (running jobs)
    /// are answered through an index, already in order: no scan, no sort, however many settled
    /// rows pile up.
    #[tokio::test]
    async fn work_is_listed_through_indexes_in_index_order() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        let plan = |query: &Query| -> String {
            let (sql, values) = sqlite_query(query);
            store.query_plan(&sql, values)
        };
        let due = plan(&followups_query(&FollowUpFilter {
            state: Some(FollowUpState::Pending),
            due_by: Some(Utc::now()),
            limit: Some(100),
            ..Default::default()
        }));
        assert!(due.contains("USING INDEX followups_state_due (state=? AND due_at<?)"), "{due}");
        let session = SessionId::from("sess_plan");
        let of_session =
            plan(&followups_query(&FollowUpFilter { session_id: Some(session.clone()), ..Default::default() }));
        assert!(of_session.contains("USING INDEX followups_session_due (session_id=?)"), "{of_session}");
        let running = plan(&jobs_query(&JobFilter { state: Some(JobState::Running), ..Default::default() }));
        assert!(running.contains("USING INDEX jobs_state_started (state=?)"), "{running}");
        let jobs_of_session = plan(&jobs_query(&JobFilter { session_id: Some(session), ..Default::default() }));
        assert!(jobs_of_session.contains("USING INDEX jobs_session_started (session_id=?)"), "{jobs_of_session}");
        for shown in [due, of_session, running, jobs_of_session] {
            assert!(!shown.contains("SCAN") && !shown.contains("TEMP B-TREE"), "{shown}");
        }
    }
}
