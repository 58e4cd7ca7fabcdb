//! The SQLite store's [`Store`] implementation: messages, claims, sessions, the channel map,
//! delivery records and work rows (whose statements are in `work`), each a job on the engine
//! (writes in a transaction, reads on a reader connection).
//!
//! **Revisions.** Writes are serialised, so a revision is `MAX(rev) + 1` read by the writing
//! statement itself, inside the write lock: revisions are handed out in commit order (across
//! processes too), which is what lets [`Store::changes_since`] readers never skip a change.
//! Status changes and claims read the row inside their write job (a corrupt row is refused
//! before anything is written, and no compare-and-set retry is ever needed).
//!
//! How a job reaches the connection is the engine's business; how a row is decoded is the
//! `rows` module's. The ledger's statements are in `ledger`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use kesoku_core::{
    DeliveryRecord, FollowUp, FollowUpFilter, FollowUpId, FollowUpState, GrantInfo, Job, JobEnd, JobFilter, JobId,
    Message, MessageFilter, MessageId, Metadata, Role, Session, SessionId, Status,
};
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, ErrorCode, OptionalExtension, params, params_from_iter};

use super::SqliteStore;
use super::rows::{
    CLAIM_NAMES, HistoryRows, SESSION_NAMES, SqlRow, delivery_rows, fetch_message, messages_in, sqlite_query,
    time_text, update_returning,
};
use super::work;
use crate::common::{check_claim, check_finish, check_grant, check_settle, event, first_repeated_id, not_found, stamp};
use crate::decode::{self, Cells, StoredMessage, parse_time_text};
use crate::error::{StoreError, StoreResult};
use crate::sql::{
    Arg, DELIVERY_COLUMNS, FOLLOWUP_COLUMNS, JOB_COLUMNS, MESSAGE_COLUMNS, OPEN_STATUSES, Query, SESSION_COLUMNS,
    SESSION_COLUMNS_S, followups_query, jobs_query, list_query, newest_per_channel_query, orphaned_calls_query,
    recent_query,
};
use crate::{Claim, MessageEvent, SessionFilter, Store, StoreMemory};

/// The revision of a change made by one statement (which holds the write lock while reading it).
const NEXT_REV: &str = "(SELECT COALESCE(MAX(rev), 0) + 1 FROM messages)";

impl SqliteStore {
    /// Messages returned by `query` (columns of [`MESSAGE_COLUMNS`]), on a reader.
    async fn read_messages(&self, query: Query) -> StoreResult<Vec<StoredMessage>> {
        self.engine.read(move |conn| messages_in(conn, &query)).await
    }

    /// The recovery of orphans, with "now" given (the trait method passes the clock's).
    async fn recover_orphans_before(
        &self,
        threshold: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<MessageId>> {
        self.engine
            .write(move |conn| {
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

/// Running messages whose claim was last renewed before `?1`.
fn orphans_sql() -> String {
    format!(
        "SELECT id FROM messages WHERE status = 'processing' AND status IN {OPEN_STATUSES} \
         AND COALESCE(claimed_at, updated_at) < ?1 ORDER BY seq"
    )
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

/// A failed insert: a unique violation means the id exists.
pub(super) fn insert_error(error: rusqlite::Error, what: &'static str, id: &str) -> StoreError {
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
        self.engine.write_sized(message.content.len(), move |conn| insert_in(conn, &stored, None)).await
    }

    async fn insert_messages(&self, messages: &[Message]) -> StoreResult<Vec<MessageEvent>> {
        if let Some(id) = first_repeated_id(messages) {
            return Err(StoreError::Duplicate { what: "message", id: id.to_owned() });
        }
        let now = self.clock.now();
        let stored: Vec<Message> = messages.iter().map(|message| stamp(message, now)).collect();
        let content_bytes = messages.iter().map(|message| message.content.len()).sum();
        self.engine
            .write_sized(content_bytes, move |conn| {
                let first = next_rev(conn)?;
                stored.iter().zip(first..).map(|(message, rev)| insert_in(conn, message, Some(rev))).collect()
            })
            .await
    }

    async fn get_message(&self, id: &MessageId) -> StoreResult<Option<Message>> {
        let id = id.as_str().to_owned();
        Ok(self.engine.read(move |conn| fetch_message(conn, &id)).await?.map(|stored| stored.message))
    }

    async fn list_messages(&self, filter: &MessageFilter) -> StoreResult<Vec<Message>> {
        Ok(self.read_messages(list_query(filter)).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn recent_messages(&self, filter: &MessageFilter, limit: u32) -> StoreResult<Vec<Message>> {
        Ok(self.read_messages(recent_query(filter, limit)).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn newest_per_channel(
        &self,
        chatbot_id: &str,
        role: Role,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<Message>> {
        let query = newest_per_channel_query(chatbot_id, role, since);
        Ok(self.read_messages(query).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn update_status(&self, id: &MessageId, to: Status) -> StoreResult<MessageEvent> {
        let id = id.as_str().to_owned();
        let now = time_text(self.clock.now());
        self.engine
            .write(move |conn| {
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
        self.engine
            .write(move |conn| {
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
        self.engine
            .write(move |conn| {
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
        self.engine
            .read(move |conn| {
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
        self.engine
            .write(move |conn| {
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
        let cache = Arc::clone(&self.history);
        let session_id = session_id.clone();
        self.engine.read(move |conn| cache.read(conn, &session_id, &HistoryRows)).await
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
        self.engine
            .read(|conn| {
                Ok(conn
                    .prepare_cached("SELECT COALESCE(MAX(rev), 0) FROM messages")?
                    .query_row([], |row| row.get(0))?)
            })
            .await
    }

    async fn create_session(&self, session: &Session) -> StoreResult<()> {
        let session = session.clone();
        self.engine.write(move |conn| insert_session(conn, &session)).await
    }

    async fn get_session(&self, id: &SessionId) -> StoreResult<Option<Session>> {
        let id = id.as_str().to_owned();
        self.engine
            .read(move |conn| {
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
        self.engine
            .read(move |conn| {
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
        self.engine
            .write(move |conn| {
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
        self.engine
            .read(move |conn| {
                let id: Option<String> = conn
                    .prepare_cached(
                        "SELECT session_id FROM channel_sessions WHERE chatbot_id = ?1 AND channel_id = ?2",
                    )?
                    .query_row(params![chatbot_id, channel_id], |row| row.get(0))
                    .optional()?;
                Ok(id.map(SessionId::from))
            })
            .await
    }

    async fn set_active_session(&self, chatbot_id: &str, channel_id: &str, session_id: &SessionId) -> StoreResult<()> {
        let (chatbot_id, channel_id, session_id) =
            (chatbot_id.to_owned(), channel_id.to_owned(), session_id.as_str().to_owned());
        self.engine
            .write(move |conn| {
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
        if let Some(session) = self.engine.read(move |conn| active_in(conn, &chatbot, &channel)).await? {
            return Ok(session);
        }
        // The write job holds SQLite's write lock, so checking again and creating is atomic
        // against every other writer, in this process or another.
        let (chatbot, channel) = (chatbot_id.to_owned(), channel_id.to_owned());
        let fresh = Session::new(chatbot_id, channel_id, self.clock.now());
        self.engine
            .write(move |conn| {
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

    async fn record_delivery(&self, record: &DeliveryRecord) -> StoreResult<()> {
        let (message_id, part, platform_message_id, recorded_at) = (
            record.message_id.as_str().to_owned(),
            i64::from(record.part),
            record.platform_message_id.clone(),
            time_text(record.recorded_at),
        );
        self.engine
            .write(move |conn| {
                conn.prepare_cached(&format!(
                    "INSERT INTO deliveries ({DELIVERY_COLUMNS}) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (message_id, part) DO NOTHING"
                ))?
                .execute(params![message_id, part, platform_message_id, recorded_at])?;
                Ok(())
            })
            .await
    }

    async fn delivery_records(&self, message_id: &MessageId) -> StoreResult<Vec<DeliveryRecord>> {
        let message_id = message_id.as_str().to_owned();
        self.engine
            .read(move |conn| {
                let text = format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE message_id = ?1 ORDER BY part");
                delivery_rows(conn, &text, &[SqlValue::Text(message_id)])
            })
            .await
    }

    async fn insert_followup(&self, followup: &FollowUp) -> StoreResult<()> {
        let followup = followup.clone();
        self.engine.write(move |conn| work::insert_followup(conn, &followup)).await
    }

    async fn get_followup(&self, id: &FollowUpId) -> StoreResult<Option<FollowUp>> {
        let query = Query::with_args(
            &format!("SELECT {FOLLOWUP_COLUMNS} FROM followups WHERE id = $1"),
            vec![Arg::Text(id.as_str().to_owned())],
        );
        Ok(self.engine.read(move |conn| work::followups(conn, &query)).await?.into_iter().next())
    }

    async fn list_followups(&self, filter: &FollowUpFilter) -> StoreResult<Vec<FollowUp>> {
        let query = followups_query(filter);
        self.engine.read(move |conn| work::followups(conn, &query)).await
    }

    async fn settle_followup(&self, id: &FollowUpId, to: FollowUpState, at: DateTime<Utc>) -> StoreResult<bool> {
        check_settle(id, to)?;
        let (id, at) = (id.as_str().to_owned(), time_text(at));
        self.engine.write(move |conn| work::settle_followup(conn, &id, to, &at)).await
    }

    async fn insert_job(&self, job: &Job) -> StoreResult<()> {
        let job = job.clone();
        self.engine.write(move |conn| work::insert_job(conn, &job)).await
    }

    async fn get_job(&self, id: &JobId) -> StoreResult<Option<Job>> {
        let query = Query::with_args(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"),
            vec![Arg::Text(id.as_str().to_owned())],
        );
        Ok(self.engine.read(move |conn| work::jobs(conn, &query)).await?.into_iter().next())
    }

    async fn list_jobs(&self, filter: &JobFilter) -> StoreResult<Vec<Job>> {
        let query = jobs_query(filter);
        self.engine.read(move |conn| work::jobs(conn, &query)).await
    }

    async fn finish_job(&self, id: &JobId, end: &JobEnd) -> StoreResult<bool> {
        check_finish(id, end)?;
        let (id, end) = (id.as_str().to_owned(), end.clone());
        self.engine.write(move |conn| work::finish_job(conn, &id, &end)).await
    }

    fn clock(&self) -> crate::Clock {
        self.clock.clone()
    }

    async fn chatbot_state(&self, chatbot_id: &str, key: &str) -> StoreResult<Option<String>> {
        let (chatbot_id, key) = (chatbot_id.to_owned(), key.to_owned());
        self.engine
            .read(move |conn| {
                let value = conn
                    .prepare_cached("SELECT value FROM chatbot_state WHERE chatbot_id = ?1 AND key = ?2")?
                    .query_row(params![chatbot_id, key], |row| row.get::<_, String>(0))
                    .optional()?;
                Ok(value)
            })
            .await
    }

    async fn set_chatbot_state(&self, chatbot_id: &str, key: &str, value: &str) -> StoreResult<()> {
        let (chatbot_id, key, value) = (chatbot_id.to_owned(), key.to_owned(), value.to_owned());
        let now = time_text(self.clock.now());
        self.engine
            .write(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO chatbot_state (chatbot_id, key, value, updated_at) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (chatbot_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                )?
                .execute(params![chatbot_id, key, value, now])?;
                Ok(())
            })
            .await
    }

    async fn set_grant(&self, user: &str, name: &str, secret: &str) -> StoreResult<()> {
        check_grant(user, name)?;
        let (user, name, secret) = (user.to_owned(), name.to_owned(), secret.to_owned());
        let now = time_text(self.clock.now());
        self.engine
            .write(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO grants (user_id, name, secret, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?4) \
                     ON CONFLICT (user_id, name) DO UPDATE SET secret = excluded.secret, updated_at = excluded.updated_at",
                )?
                .execute(params![user, name, secret, now])?;
                Ok(())
            })
            .await
    }

    async fn grant_secret(&self, user: &str, name: &str) -> StoreResult<Option<String>> {
        let (user, name) = (user.to_owned(), name.to_owned());
        self.engine
            .read(move |conn| {
                let secret = conn
                    .prepare_cached("SELECT secret FROM grants WHERE user_id = ?1 AND name = ?2")?
                    .query_row(params![user, name], |row| row.get::<_, String>(0))
                    .optional()?;
                Ok(secret)
            })
            .await
    }

    async fn list_grants(&self, user: Option<&str>) -> StoreResult<Vec<GrantInfo>> {
        let user = user.map(str::to_owned);
        self.engine
            .read(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT user_id, name, created_at, updated_at FROM grants \
                     WHERE ?1 IS NULL OR user_id = ?1 ORDER BY user_id, name",
                )?;
                let rows = statement.query_map(params![user], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                    ))
                })?;
                let mut grants = Vec::new();
                for row in rows {
                    let (user_id, name, created_at, updated_at) = row?;
                    let time = |text: &str| {
                        parse_time_text(text).map_err(|reason| StoreError::Corrupt {
                            table: "grants",
                            id: format!("{user_id}/{name}"),
                            reason,
                        })
                    };
                    let (created_at, updated_at) = (time(&created_at)?, time(&updated_at)?);
                    grants.push(GrantInfo { user_id, name, created_at, updated_at });
                }
                Ok(grants)
            })
            .await
    }

    async fn remove_grant(&self, user: &str, name: &str) -> StoreResult<bool> {
        let (user, name) = (user.to_owned(), name.to_owned());
        self.engine
            .write(move |conn| {
                let removed = conn
                    .prepare_cached("DELETE FROM grants WHERE user_id = ?1 AND name = ?2")?
                    .execute(params![user, name])?;
                Ok(removed == 1)
            })
            .await
    }

    fn memory(&self) -> StoreMemory {
        let (bytes, sessions) = self.history.kept();
        StoreMemory { history_cache_bytes: bytes as u64, history_cache_sessions: sessions as u64 }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The lookups of waiting and running work (intake, recovery, the interrupt and steer
    /// checks of every turn) read the small partial index `messages_open`, a session's
    /// messages come from `messages_phased`, and a call's result from `messages_result_of`.
    #[tokio::test]
    async fn open_work_and_sessions_are_read_through_indexes() {
        use kesoku_core::{Role, SessionId};

        let store = SqliteStore::open_in_memory().await.expect("open");
        let plan = |sql: &str, values: Vec<SqlValue>| store.query_plan(sql, values);
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

    /// A long session written to `store` and read twice (kept from its second read on), with
    /// `count` messages of about `size` bytes each.
    async fn read_long_session(store: &SqliteStore, id: &str, count: usize, size: usize) -> Vec<Message> {
        let session = SessionId::from(id);
        let messages: Vec<Message> = (0..count)
            .map(|index| Message::user_text(&session, "cli", "local", "Chii", format!("{index:0size$}")))
            .collect();
        store.insert_messages(&messages).await.expect("write a long session");
        for _ in 0..2 {
            assert_eq!(store.session_history(&session).await.expect("history").len(), messages.len());
        }
        messages
    }

    /// The service's metrics see a kept long history.
    #[tokio::test]
    async fn a_kept_history_is_reported() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("kesoku.db")).await.expect("create");
        assert_eq!(store.memory(), StoreMemory::default());
        let count = super::super::history_cache::MIN_MESSAGES + 10;
        let messages = read_long_session(&store, "sess_reported", count, 12).await;
        let memory = store.memory();
        assert_eq!(memory.history_cache_sessions, 1, "{memory:?}");
        let least = messages.len() * (std::mem::size_of::<Message>() + 12);
        assert!(memory.history_cache_bytes >= least as u64, "{memory:?}: fewer than {least} bytes");
        store.close().await;
    }

    /// Two stores in one process each report what they keep, not a sum over the process.
    #[tokio::test]
    async fn each_store_reports_its_own_history_cache() {
        let dir = tempfile::tempdir().expect("temp dir");
        let small = SqliteStore::open(dir.path().join("small.db")).await.expect("create");
        let large = SqliteStore::open(dir.path().join("large.db")).await.expect("create");
        let idle = SqliteStore::open(dir.path().join("idle.db")).await.expect("create");
        let count = super::super::history_cache::MIN_MESSAGES + 10;
        read_long_session(&small, "sess_small", count, 10).await;
        read_long_session(&large, "sess_large_1", count, 4_000).await;
        read_long_session(&large, "sess_large_2", count, 4_000).await;
        let (small_memory, large_memory) = (small.memory(), large.memory());
        assert_eq!(small_memory.history_cache_sessions, 1, "{small_memory:?}");
        assert_eq!(large_memory.history_cache_sessions, 2, "{large_memory:?}");
        assert!(
            large_memory.history_cache_bytes > 2 * count as u64 * 4_000,
            "{large_memory:?}: less than the content it keeps"
        );
        assert!(
            small_memory.history_cache_bytes < large_memory.history_cache_bytes / 4,
            "small {small_memory:?}, large {large_memory:?}"
        );
        assert_eq!(idle.memory(), StoreMemory::default());
        // A clone shares its store's cache, and reports the same.
        assert_eq!(large.clone().memory(), large_memory);
        for store in [small, large, idle] {
            store.close().await;
        }
    }
}
