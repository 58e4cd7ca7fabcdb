//! Rules both backends apply before and after their SQL: stamping, claim validation, error
//! mapping. Nothing here talks to a database.

use chrono::{DateTime, Utc};
use kesoku_core::{FollowUpId, FollowUpState, JobEnd, JobId, JobState, Message, MessageId, Status};

use crate::MessageEvent;
use crate::clock::truncate;
use crate::decode::StoredMessage;
use crate::error::{StoreError, StoreResult};

/// How many times a status compare-and-set that lost to a concurrent change is retried.
pub(crate) const CAS_ATTEMPTS: usize = 8;

/// Whether opening may create a new, empty store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenMode {
    CreateIfMissing,
    MustExist,
}

/// The message as it will be stored: times filled in where unset, all cut to microseconds.
pub(crate) fn stamp(message: &Message, now: DateTime<Utc>) -> Message {
    let mut stamped = message.clone();
    stamped.created_at = Some(truncate(message.created_at.unwrap_or(now)));
    stamped.updated_at = Some(truncate(message.updated_at.unwrap_or(now)));
    stamped
}

/// The first id that appears twice in a batch.
pub(crate) fn first_repeated_id(messages: &[Message]) -> Option<&str> {
    let mut seen = std::collections::HashSet::with_capacity(messages.len());
    messages.iter().map(|m| m.id.as_str()).find(|id| !seen.insert(*id))
}

/// A claim must be legal from every status it expects.
pub(crate) fn check_claim(id: &MessageId, to: Status, expected: &[Status]) -> StoreResult<()> {
    for from in expected {
        from.check_transition(to)
            .map_err(|source| StoreError::IllegalTransition { id: id.as_str().to_owned(), source })?;
    }
    Ok(())
}

/// A follow-up is settled once, from `pending` to `fired` or `cancelled`; never back.
pub(crate) fn check_settle(id: &FollowUpId, to: FollowUpState) -> StoreResult<()> {
    match to {
        FollowUpState::Fired | FollowUpState::Cancelled => Ok(()),
        FollowUpState::Pending => Err(StoreError::IllegalChange {
            what: "follow-up",
            id: id.as_str().to_owned(),
            reason: "cannot be settled to `pending`: settle it to `fired` or `cancelled`".to_owned(),
        }),
    }
}

/// A job's end is recorded once, from `running` to `exited`, `lost` or `cancelled`.
pub(crate) fn check_finish(id: &JobId, end: &JobEnd) -> StoreResult<()> {
    match end.state {
        JobState::Exited | JobState::Lost | JobState::Cancelled => Ok(()),
        JobState::Running => Err(StoreError::IllegalChange {
            what: "job",
            id: id.as_str().to_owned(),
            reason: "cannot finish as `running`: record how it ended (`exited`, `lost` or `cancelled`)".to_owned(),
        }),
    }
}

/// The event of a change that produced `stored`. In catch-up reads, `created` says whether the
/// message was created after the reader's revision.
pub(crate) fn event(stored: StoredMessage, created: bool) -> MessageEvent {
    MessageEvent { rev: stored.rev, created, message: stored.message }
}

/// What a failed delivery adds to an activation row's `error` (after `; ` when it has one).
pub(crate) fn delivery_failure_note(reason: &str) -> String {
    format!("delivery failed: {reason}")
}

/// A grant key the store refuses (empty user, bad name), before anything is written.
pub(crate) fn check_grant(user: &str, name: &str) -> Result<(), StoreError> {
    kesoku_core::check_grant_key(user, name).map_err(|error| StoreError::IllegalChange {
        what: "grant",
        id: format!("{user}/{name}"),
        reason: error.to_string(),
    })
}

pub(crate) fn not_found(what: &'static str, id: &str) -> StoreError {
    StoreError::NotFound { what, id: id.to_owned() }
}

/// A failed insert: a unique violation means the id exists.
pub(crate) fn insert_error(error: sqlx::Error, what: &'static str, id: &str) -> StoreError {
    if error.as_database_error().is_some_and(|db| db.is_unique_violation()) {
        StoreError::Duplicate { what, id: id.to_owned() }
    } else {
        StoreError::Database(error)
    }
}

/// A failed write that referenced a session: a foreign key violation means it does not exist.
pub(crate) fn session_reference_error(error: sqlx::Error, session_id: &str) -> StoreError {
    if error.as_database_error().is_some_and(|db| db.is_foreign_key_violation()) {
        not_found("session", session_id)
    } else {
        StoreError::Database(error)
    }
}
