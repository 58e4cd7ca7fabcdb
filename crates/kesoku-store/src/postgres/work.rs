//! The PostgreSQL statements of work that outlives a turn: follow-ups and background jobs
//! (schema version 7). They are plain rows: nothing here takes a message revision, so nothing
//! here goes through the rev gate.
//!
//! A state moves once: the row's state is read first (a row that is missing, settled already
//! or unreadable is answered before anything is written), then changed by
//! `UPDATE … WHERE state = <the one state it may leave>`. When callers race, PostgreSQL
//! re-checks that condition on the newest row version, so exactly one update changes the row
//! and the others change nothing. Whether a change is allowed at all is `common`'s; decoding
//! rows is `decode`'s.

use std::str::FromStr;

use kesoku_core::{FollowUp, FollowUpState, Job, JobEnd, JobState, MessageId, UnknownValue};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPool;

use super::{bind, decode_all};
use crate::clock::truncate;
use crate::common::{insert_error, not_found};
use crate::decode::{self, Cells};
use crate::error::StoreResult;
use crate::sql::{FOLLOWUP_COLUMNS, JOB_COLUMNS, Query};

pub(super) async fn insert_followup(pool: &PgPool, followup: &FollowUp) -> StoreResult<()> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO followups ({FOLLOWUP_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
    )))
    .bind(followup.id.as_str())
    .bind(followup.session_id.as_str())
    .bind(&followup.chatbot_id)
    .bind(&followup.channel_id)
    .bind(&followup.task)
    .bind(truncate(followup.due_at))
    .bind(truncate(followup.created_at))
    .bind(followup.created_by.as_ref().map(MessageId::as_str))
    .bind(followup.state.as_str())
    .bind(followup.settled_at.map(truncate))
    .execute(pool)
    .await
    .map_err(|error| insert_error(error, "follow-up", followup.id.as_str()))?;
    Ok(())
}

/// The follow-ups `query` returns (columns of [`FOLLOWUP_COLUMNS`]).
pub(super) async fn followups(pool: &PgPool, query: Query) -> StoreResult<Vec<FollowUp>> {
    let rows = bind(query).fetch_all(pool).await?;
    decode_all(&rows, decode::followup)
}

/// Move a pending follow-up to `to` (checked by the caller), stamping `settled_at`.
pub(super) async fn settle_followup(
    pool: &PgPool,
    id: &str,
    to: FollowUpState,
    settled_at: chrono::DateTime<chrono::Utc>,
) -> StoreResult<bool> {
    match state_of::<FollowUpState>(pool, "followups", id).await? {
        None => Err(not_found("follow-up", id)),
        Some(FollowUpState::Fired | FollowUpState::Cancelled) => Ok(false),
        Some(FollowUpState::Pending) => {
            let done =
                sqlx::query("UPDATE followups SET state = $2, settled_at = $3 WHERE id = $1 AND state = 'pending'")
                    .bind(id)
                    .bind(to.as_str())
                    .bind(truncate(settled_at))
                    .execute(pool)
                    .await?;
            Ok(done.rows_affected() == 1)
        }
    }
}

pub(super) async fn insert_job(pool: &PgPool, job: &Job) -> StoreResult<()> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO jobs ({JOB_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
    )))
    .bind(job.id.as_str())
    .bind(job.session_id.as_str())
    .bind(&job.chatbot_id)
    .bind(&job.channel_id)
    .bind(job.message_id.as_str())
    .bind(&job.command)
    .bind(job.pid.map(i64::from))
    .bind(&job.stdout_path)
    .bind(&job.stderr_path)
    .bind(job.state.as_str())
    .bind(job.exit_code.map(i64::from))
    .bind(job.detail.as_deref())
    .bind(truncate(job.started_at))
    .bind(job.finished_at.map(truncate))
    .execute(pool)
    .await
    .map_err(|error| insert_error(error, "job", job.id.as_str()))?;
    Ok(())
}

/// The jobs `query` returns (columns of [`JOB_COLUMNS`]).
pub(super) async fn jobs(pool: &PgPool, query: Query) -> StoreResult<Vec<Job>> {
    let rows = bind(query).fetch_all(pool).await?;
    decode_all(&rows, decode::job)
}

/// Record the end (checked by the caller) of a running job.
pub(super) async fn finish_job(pool: &PgPool, id: &str, end: &JobEnd) -> StoreResult<bool> {
    match state_of::<JobState>(pool, "jobs", id).await? {
        None => Err(not_found("job", id)),
        Some(JobState::Exited | JobState::Lost | JobState::Cancelled) => Ok(false),
        Some(JobState::Running) => {
            let done = sqlx::query(
                "UPDATE jobs SET state = $2, exit_code = $3, detail = $4, finished_at = $5 \
                 WHERE id = $1 AND state = 'running'",
            )
            .bind(id)
            .bind(end.state.as_str())
            .bind(end.exit_code.map(i64::from))
            .bind(end.detail.as_deref())
            .bind(truncate(end.finished_at))
            .execute(pool)
            .await?;
            Ok(done.rows_affected() == 1)
        }
    }
}

/// The state of row `id` of `table` (`followups` or `jobs`), or `None` when there is no such
/// row; a state this build does not know is a corrupt row.
async fn state_of<T: FromStr<Err = UnknownValue>>(
    pool: &PgPool,
    table: &'static str,
    id: &str,
) -> StoreResult<Option<T>> {
    let row = sqlx::query(AssertSqlSafe(format!("SELECT id, state FROM {table} WHERE id = $1")))
        .bind(id)
        .fetch_optional(pool)
        .await?;
    match row {
        Some(row) => Ok(Some(Cells::new(&row, table)?.parse("state")?)),
        None => Ok(None),
    }
}
