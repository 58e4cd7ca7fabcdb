//! The PostgreSQL store's [`Store`] implementation: messages, claims, sessions, the channel
//! map, delivery records and work rows (whose statements are in `work`), as statements on the
//! pool.
//!
//! Status changes read the row first (so a corrupt row is refused before anything is written),
//! check the transition table, then apply a compare-and-set `UPDATE … WHERE status = <what was
//! read>`, retried when a concurrent change got there first. A claim is one
//! `UPDATE … WHERE status IN (…)`, which PostgreSQL re-checks on the newest row version when
//! claimants race, so exactly one wins. Every statement that takes a revision goes through the
//! rev gate (`rev_gate`); the ledger's statements are in `ledger`.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use kesoku_core::{
    DeliveryRecord, FollowUp, FollowUpFilter, FollowUpId, FollowUpState, GrantInfo, Job, JobEnd, JobFilter, JobId,
    Message, MessageFilter, MessageId, Metadata, Role, Session, SessionId, Status,
};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Postgres, Row};

use super::rev_gate::{GATE, REV_GATE_KEY, gate_args};
use super::work;
use super::{PgStore, bind, decode_all};
use crate::clock::truncate;
use crate::common::{
    CAS_ATTEMPTS, check_claim, check_finish, check_grant, check_settle, event, first_repeated_id, insert_error,
    not_found, session_reference_error, stamp,
};
use crate::decode::{self, Cells, StoredMessage};
use crate::error::{StoreError, StoreResult};
use crate::sql::{
    Arg, DELIVERY_COLUMNS, FOLLOWUP_COLUMNS, JOB_COLUMNS, MESSAGE_COLUMNS, OPEN_STATUSES, Query, SESSION_COLUMNS,
    SESSION_COLUMNS_S, followups_query, jobs_query, list_query, newest_per_channel_query, orphaned_calls_query,
    recent_query,
};
use crate::{Claim, MessageEvent, SessionFilter, Store, StoreMemory};

/// How often a session resolution that lost a race re-reads the winner.
const RESOLVE_ATTEMPTS: usize = 3;

impl PgStore {
    async fn insert_one(&self, message: &Message, now: DateTime<Utc>) -> StoreResult<MessageEvent> {
        let stored = stamp(message, now);
        let row = self
            .gated(format!(
                "{GATE}, r AS (SELECT nextval('kesoku_message_rev') AS rev FROM gate) \
                 INSERT INTO messages (id, session_id, parent_id, chatbot_id, channel_id, sender, role, type, content, \
                 status, metadata, step, created_at, updated_at, turn_id, phase, rev, created_rev) \
                 SELECT $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                 COALESCE((SELECT p.turn_id FROM messages p WHERE p.id = $5 AND p.session_id = $4), $3), $17, \
                 r.rev, r.rev FROM r RETURNING rev"
            ))
            .bind(stored.id.as_str())
            .bind(stored.session_id.as_str())
            .bind(stored.parent_id.as_ref().map(MessageId::as_str))
            .bind(stored.chatbot_id.clone())
            .bind(stored.channel_id.clone())
            .bind(stored.sender.clone())
            .bind(stored.role.as_str())
            .bind(stored.message_type.as_str())
            .bind(stored.content.clone())
            .bind(stored.status.as_str())
            .bind(stored.metadata.to_value())
            .bind(i64::from(stored.step))
            .bind(stored.created_at)
            .bind(stored.updated_at)
            .bind(stored.phase() as i64)
            .fetch_one(&self.pool)
            .await
            .map_err(|error| insert_error(error, "message", stored.id.as_str()))?;
        let rev: i64 = row.try_get("rev")?;
        Ok(MessageEvent { rev, created: true, message: stored })
    }

    /// Write stamped messages (no id repeated) with one statement, in order, inside `tx`;
    /// returns their revisions.
    ///
    /// A message's turn is its parent's turn when the parent is stored in the same session. For
    /// a parent written earlier in this batch that is known here; the statement cannot see rows
    /// it inserts itself, so such messages carry the parent's own lookup instead.
    async fn insert_batch(&self, tx: &mut PgConnection, messages: &[Message]) -> Result<Vec<i64>, sqlx::Error> {
        let mut turn_of: HashMap<&str, (&str, Option<&str>, &str)> = HashMap::with_capacity(messages.len());
        let mut lookups: Vec<Option<String>> = Vec::with_capacity(messages.len());
        let mut fallbacks: Vec<String> = Vec::with_capacity(messages.len());
        for message in messages {
            let session = message.session_id.as_str();
            let parent = message.parent_id.as_ref().map(MessageId::as_str);
            let (lookup, fallback) = match parent.and_then(|p| turn_of.get(p)) {
                Some((parent_session, lookup, fallback)) if *parent_session == session => (*lookup, *fallback),
                Some(_) | None => (parent, message.id.as_str()),
            };
            turn_of.insert(message.id.as_str(), (session, lookup, fallback));
            lookups.push(lookup.map(str::to_owned));
            fallbacks.push(fallback.to_owned());
        }
        let count = i64::try_from(messages.len()).unwrap_or(i64::MAX);
        let mut revs: Vec<i64> = sqlx::query_scalar_with(
            AssertSqlSafe(format!(
                "{GATE} SELECT nextval('kesoku_message_rev') FROM gate, generate_series(1, $3::int8)"
            )),
            gate_args(self.schema_key)?,
        )
        .bind(count)
        .fetch_all(&mut *tx)
        .await?;
        revs.sort_unstable();
        let texts = |f: &dyn Fn(&Message) -> String| messages.iter().map(f).collect::<Vec<String>>();
        sqlx::query(
            "INSERT INTO messages (id, session_id, parent_id, chatbot_id, channel_id, sender, role, type, content, \
             status, metadata, step, created_at, updated_at, turn_id, phase, rev, created_rev) \
             SELECT u.id, u.session_id, u.parent_id, u.chatbot_id, u.channel_id, u.sender, u.role, u.type, \
             u.content, u.status, u.metadata, u.step, u.created_at, u.updated_at, \
             COALESCE((SELECT p.turn_id FROM messages p WHERE p.id = u.turn_lookup AND p.session_id = u.session_id), \
             u.turn_fallback), u.phase, u.rev, u.rev \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
             $8::text[], $9::text[], $10::text[], $11::jsonb[], $12::int8[], $13::timestamptz[], \
             $14::timestamptz[], $15::text[], $16::text[], $17::int8[], $18::int8[]) WITH ORDINALITY \
             AS u(id, session_id, parent_id, chatbot_id, channel_id, sender, role, type, content, status, \
             metadata, step, created_at, updated_at, turn_lookup, turn_fallback, phase, rev, ord) \
             ORDER BY u.ord",
        )
        .bind(texts(&|m| m.id.as_str().to_owned()))
        .bind(texts(&|m| m.session_id.as_str().to_owned()))
        .bind(messages.iter().map(|m| m.parent_id.as_ref().map(|p| p.as_str().to_owned())).collect::<Vec<_>>())
        .bind(texts(&|m| m.chatbot_id.clone()))
        .bind(texts(&|m| m.channel_id.clone()))
        .bind(texts(&|m| m.sender.clone()))
        .bind(texts(&|m| m.role.as_str().to_owned()))
        .bind(texts(&|m| m.message_type.as_str().to_owned()))
        .bind(texts(&|m| m.content.clone()))
        .bind(texts(&|m| m.status.as_str().to_owned()))
        .bind(messages.iter().map(|m| m.metadata.to_value()).collect::<Vec<_>>())
        .bind(messages.iter().map(|m| i64::from(m.step)).collect::<Vec<_>>())
        .bind(messages.iter().map(|m| m.created_at).collect::<Vec<_>>())
        .bind(messages.iter().map(|m| m.updated_at).collect::<Vec<_>>())
        .bind(lookups)
        .bind(fallbacks)
        .bind(messages.iter().map(|m| m.phase() as i64).collect::<Vec<_>>())
        .bind(revs.clone())
        .execute(&mut *tx)
        .await?;
        Ok(revs)
    }

    async fn fetch_message(&self, id: &MessageId) -> StoreResult<Option<StoredMessage>> {
        let row = sqlx::query(AssertSqlSafe(format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = $1")))
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(decode::message).transpose()
    }

    async fn messages(&self, query: Query) -> StoreResult<Vec<StoredMessage>> {
        let rows = bind(query).fetch_all(&self.pool).await?;
        decode_all(&rows, decode::message)
    }

    async fn recover_orphans_before(
        &self,
        threshold: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<MessageId>> {
        // SKIP LOCKED: a row locked right now is being changed by a live worker, not orphaned.
        let mut rows: Vec<(String, i64)> = sqlx::query_as_with(
            AssertSqlSafe(format!(
                "{GATE} UPDATE messages SET status = 'pending_agent', updated_at = $4, \
                 rev = nextval('kesoku_message_rev'), claimed_by = NULL, claimed_at = NULL FROM gate \
                 WHERE messages.id IN (SELECT o.id FROM messages o WHERE o.status = 'processing' \
                 AND o.status IN {OPEN_STATUSES} AND COALESCE(o.claimed_at, o.updated_at) < $3 FOR UPDATE SKIP LOCKED) \
                 AND messages.status = 'processing' RETURNING messages.id, messages.seq"
            )),
            gate_args(self.schema_key)?,
        )
        .bind(threshold)
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.sort_by_key(|(_, seq)| *seq);
        Ok(rows.into_iter().map(|(id, _)| MessageId::from(id)).collect())
    }
}

#[async_trait]
impl Store for PgStore {
    async fn insert_message(&self, message: &Message) -> StoreResult<MessageEvent> {
        self.insert_one(message, self.clock.now()).await
    }

    async fn insert_messages(&self, messages: &[Message]) -> StoreResult<Vec<MessageEvent>> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(id) = first_repeated_id(messages) {
            return Err(StoreError::Duplicate { what: "message", id: id.to_owned() });
        }
        let stamped: Vec<Message> = {
            let now = self.clock.now();
            messages.iter().map(|m| stamp(m, now)).collect()
        };
        let mut tx = self.pool.begin().await?;
        match self.insert_batch(&mut tx, &stamped).await {
            Ok(revs) => {
                tx.commit().await?;
                Ok(revs
                    .into_iter()
                    .zip(stamped)
                    .map(|(rev, message)| MessageEvent { rev, created: true, message })
                    .collect())
            }
            Err(error) if error.as_database_error().is_some_and(|db| db.is_unique_violation()) => {
                tx.rollback().await?;
                let existing: Vec<String> = sqlx::query_scalar("SELECT id FROM messages WHERE id = ANY($1)")
                    .bind(stamped.iter().map(|m| m.id.as_str().to_owned()).collect::<Vec<_>>())
                    .fetch_all(&self.pool)
                    .await?;
                match stamped.iter().find(|m| existing.iter().any(|e| e == m.id.as_str())) {
                    Some(message) => Err(StoreError::Duplicate { what: "message", id: message.id.as_str().to_owned() }),
                    None => Err(StoreError::Database(error)),
                }
            }
            Err(error) => Err(StoreError::Database(error)),
        }
    }

    async fn get_message(&self, id: &MessageId) -> StoreResult<Option<Message>> {
        Ok(self.fetch_message(id).await?.map(|stored| stored.message))
    }

    async fn list_messages(&self, filter: &MessageFilter) -> StoreResult<Vec<Message>> {
        Ok(self.messages(list_query(filter)).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn recent_messages(&self, filter: &MessageFilter, limit: u32) -> StoreResult<Vec<Message>> {
        Ok(self.messages(recent_query(filter, limit)).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn newest_per_channel(
        &self,
        chatbot_id: &str,
        role: Role,
        since: DateTime<Utc>,
    ) -> StoreResult<Vec<Message>> {
        let query = newest_per_channel_query(chatbot_id, role, since);
        Ok(self.messages(query).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn update_status(&self, id: &MessageId, to: Status) -> StoreResult<MessageEvent> {
        for _ in 0..CAS_ATTEMPTS {
            let Some(current) = self.fetch_message(id).await? else { return Err(not_found("message", id.as_str())) };
            let from = current.message.status;
            from.check_transition(to)
                .map_err(|source| StoreError::IllegalTransition { id: id.as_str().to_owned(), source })?;
            let row = self
                .gated(format!(
                    "{GATE} UPDATE messages SET status = $4, updated_at = $5, rev = nextval('kesoku_message_rev'), \
                     claimed_by = CASE WHEN $4 = 'processing' THEN NULL ELSE claimed_by END, \
                     claimed_at = CASE WHEN $4 = 'processing' THEN $5 ELSE claimed_at END \
                     FROM gate WHERE id = $3 AND status = $6 RETURNING {MESSAGE_COLUMNS}"
                ))
                .bind(id.as_str().to_owned())
                .bind(to.as_str())
                .bind(self.clock.now())
                .bind(from.as_str())
                .fetch_optional(&self.pool)
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
        // Look first: a corrupt row is refused before anything is written, and most losers of
        // a race stop here. The UPDATE below stays the only authority.
        let Some(current) = self.fetch_message(id).await? else { return Err(not_found("message", id.as_str())) };
        if !expected.contains(&current.message.status) {
            return Ok(None);
        }
        let mut query = Query::with_args(
            &format!(
                "{GATE} UPDATE messages SET status = $3, updated_at = $4, rev = nextval('kesoku_message_rev'), \
                 claimed_by = CASE WHEN $3 = 'processing' THEN $5 ELSE claimed_by END, \
                 claimed_at = CASE WHEN $3 = 'processing' THEN $4 ELSE claimed_at END \
                 FROM gate WHERE id = $6"
            ),
            vec![
                Arg::Int(i64::from(REV_GATE_KEY)),
                Arg::Int(i64::from(self.schema_key)),
                Arg::Text(to.as_str().to_owned()),
                Arg::Time(self.clock.now()),
                Arg::Text(claimed_by.to_owned()),
                Arg::Text(id.as_str().to_owned()),
            ],
        );
        query.and_in("status", expected.iter().map(|s| s.as_str())).push(&format!(" RETURNING {MESSAGE_COLUMNS}"));
        let row = bind(query).fetch_optional(&self.pool).await?;
        row.map(|row| decode::message(&row).map(|stored| event(stored, false))).transpose()
    }

    async fn renew_claim(&self, id: &MessageId, claimed_by: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE messages SET claimed_at = $1 WHERE id = $2 AND status = 'processing' AND claimed_by = $3",
        )
        .bind(self.clock.now())
        .bind(id.as_str())
        .bind(claimed_by)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn claim_of(&self, id: &MessageId) -> StoreResult<Option<Claim>> {
        let row = sqlx::query("SELECT id, status, claimed_by, claimed_at FROM messages WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Err(not_found("message", id.as_str())) };
        let cells = Cells::new(&row, "messages")?;
        cells.claim()
    }

    async fn update_metadata(&self, id: &MessageId, metadata: &Metadata) -> StoreResult<MessageEvent> {
        // Read first, so a row we cannot understand is refused before it is changed.
        if self.fetch_message(id).await?.is_none() {
            return Err(not_found("message", id.as_str()));
        }
        let row = self
            .gated(format!(
                "{GATE} UPDATE messages SET metadata = $4, updated_at = $5, rev = nextval('kesoku_message_rev') \
                 FROM gate WHERE id = $3 RETURNING {MESSAGE_COLUMNS}"
            ))
            .bind(id.as_str().to_owned())
            .bind(metadata.to_value())
            .bind(self.clock.now())
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Err(not_found("message", id.as_str())) };
        Ok(event(decode::message(&row)?, false))
    }

    async fn session_history(&self, session_id: &SessionId) -> StoreResult<Vec<Message>> {
        // `messages_phased` is in this order (schema version 5): no join, no sort.
        let query = Query::with_args(
            &format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = $1 ORDER BY turn_seq, step, phase, seq"
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
        Ok(self.messages(orphaned_calls_query(session_id)).await?.into_iter().map(|stored| stored.message).collect())
    }

    async fn changes_since(&self, after: i64, filter: &MessageFilter, limit: u32) -> StoreResult<Vec<MessageEvent>> {
        let stable = self.stable_rev().await?;
        let mut query = Query::with_args(
            &format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE rev > $1 AND rev <= $2"),
            vec![Arg::Int(after), Arg::Int(stable)],
        );
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
        let stable = self.stable_rev().await?;
        Ok(sqlx::query_scalar("SELECT COALESCE(MAX(rev), 0) FROM messages WHERE rev <= $1")
            .bind(stable)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn create_session(&self, session: &Session) -> StoreResult<()> {
        insert_session(&self.pool, session).await
    }

    async fn get_session(&self, id: &SessionId) -> StoreResult<Option<Session>> {
        let row = sqlx::query(AssertSqlSafe(format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1")))
            .bind(id.as_str())
            .fetch_optional(&self.pool)
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
        let rows = bind(query).fetch_all(&self.pool).await?;
        decode_all(&rows, decode::session)
    }

    async fn set_session_title(&self, id: &SessionId, title: &str) -> StoreResult<()> {
        let done = sqlx::query("UPDATE sessions SET title = $2, updated_at = $3 WHERE id = $1")
            .bind(id.as_str())
            .bind(title)
            .bind(self.clock.now())
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("session", id.as_str()));
        }
        Ok(())
    }

    async fn active_session(&self, chatbot_id: &str, channel_id: &str) -> StoreResult<Option<SessionId>> {
        let id: Option<String> =
            sqlx::query_scalar("SELECT session_id FROM channel_sessions WHERE chatbot_id = $1 AND channel_id = $2")
                .bind(chatbot_id)
                .bind(channel_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(id.map(SessionId::from))
    }

    async fn set_active_session(&self, chatbot_id: &str, channel_id: &str, session_id: &SessionId) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO channel_sessions (chatbot_id, channel_id, session_id) VALUES ($1, $2, $3) \
             ON CONFLICT (chatbot_id, channel_id) DO UPDATE SET session_id = excluded.session_id",
        )
        .bind(chatbot_id)
        .bind(channel_id)
        .bind(session_id.as_str())
        .execute(&self.pool)
        .await
        .map_err(|error| session_reference_error(error, session_id.as_str()))?;
        Ok(())
    }

    async fn resolve_session(&self, chatbot_id: &str, channel_id: &str) -> StoreResult<Session> {
        for _ in 0..RESOLVE_ATTEMPTS {
            if let Some(session) = active_in(&self.pool, chatbot_id, channel_id).await? {
                return Ok(session);
            }
            // Create and activate in one transaction. A concurrent creator makes our insert of
            // the pair wait for its commit and then do nothing; we roll back (dropping our
            // session) and read the winner.
            let mut tx = self.pool.begin().await?;
            let session = Session::new(chatbot_id, channel_id, self.clock.now());
            insert_session(&mut *tx, &session).await?;
            let won: Option<String> = sqlx::query_scalar(
                "INSERT INTO channel_sessions (chatbot_id, channel_id, session_id) VALUES ($1, $2, $3) \
                 ON CONFLICT (chatbot_id, channel_id) DO NOTHING RETURNING session_id",
            )
            .bind(chatbot_id)
            .bind(channel_id)
            .bind(session.id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            if won.is_some() {
                tx.commit().await?;
                return Ok(session);
            }
            tx.rollback().await?;
        }
        Err(not_found("active session of", &format!("{chatbot_id}/{channel_id}")))
    }

    async fn record_delivery(&self, record: &DeliveryRecord) -> StoreResult<()> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO deliveries ({DELIVERY_COLUMNS}) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (message_id, part) DO NOTHING"
        )))
        .bind(record.message_id.as_str())
        .bind(i64::from(record.part))
        .bind(&record.platform_message_id)
        .bind(truncate(record.recorded_at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn delivery_records(&self, message_id: &MessageId) -> StoreResult<Vec<DeliveryRecord>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE message_id = $1 ORDER BY part"
        )))
        .bind(message_id.as_str())
        .fetch_all(&self.pool)
        .await?;
        decode_all(&rows, decode::delivery_record)
    }

    async fn insert_followup(&self, followup: &FollowUp) -> StoreResult<()> {
        work::insert_followup(&self.pool, followup).await
    }

    async fn get_followup(&self, id: &FollowUpId) -> StoreResult<Option<FollowUp>> {
        let query = Query::with_args(
            &format!("SELECT {FOLLOWUP_COLUMNS} FROM followups WHERE id = $1"),
            vec![Arg::Text(id.as_str().to_owned())],
        );
        Ok(work::followups(&self.pool, query).await?.into_iter().next())
    }

    async fn list_followups(&self, filter: &FollowUpFilter) -> StoreResult<Vec<FollowUp>> {
        work::followups(&self.pool, followups_query(filter)).await
    }

    async fn settle_followup(&self, id: &FollowUpId, to: FollowUpState, at: DateTime<Utc>) -> StoreResult<bool> {
        check_settle(id, to)?;
        work::settle_followup(&self.pool, id.as_str(), to, at).await
    }

    async fn insert_job(&self, job: &Job) -> StoreResult<()> {
        work::insert_job(&self.pool, job).await
    }

    async fn get_job(&self, id: &JobId) -> StoreResult<Option<Job>> {
        let query = Query::with_args(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"),
            vec![Arg::Text(id.as_str().to_owned())],
        );
        Ok(work::jobs(&self.pool, query).await?.into_iter().next())
    }

    async fn list_jobs(&self, filter: &JobFilter) -> StoreResult<Vec<Job>> {
        work::jobs(&self.pool, jobs_query(filter)).await
    }

    async fn finish_job(&self, id: &JobId, end: &JobEnd) -> StoreResult<bool> {
        check_finish(id, end)?;
        work::finish_job(&self.pool, id.as_str(), end).await
    }

    fn clock(&self) -> crate::Clock {
        self.clock.clone()
    }

    async fn chatbot_state(&self, chatbot_id: &str, key: &str) -> StoreResult<Option<String>> {
        let value: Option<(String,)> =
            sqlx::query_as("SELECT value FROM chatbot_state WHERE chatbot_id = $1 AND key = $2")
                .bind(chatbot_id)
                .bind(key)
                .fetch_optional(&self.pool)
                .await?;
        Ok(value.map(|(value,)| value))
    }

    async fn set_chatbot_state(&self, chatbot_id: &str, key: &str, value: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO chatbot_state (chatbot_id, key, value, updated_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (chatbot_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
        )
        .bind(chatbot_id)
        .bind(key)
        .bind(value)
        .bind(truncate(self.clock.now()))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn set_grant(&self, user: &str, name: &str, secret: &str) -> StoreResult<()> {
        check_grant(user, name)?;
        sqlx::query(
            "INSERT INTO grants (user_id, name, secret, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (user_id, name) DO UPDATE SET secret = excluded.secret, updated_at = excluded.updated_at",
        )
        .bind(user)
        .bind(name)
        .bind(secret)
        .bind(truncate(self.clock.now()))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn grant_secret(&self, user: &str, name: &str) -> StoreResult<Option<String>> {
        let secret: Option<(String,)> = sqlx::query_as("SELECT secret FROM grants WHERE user_id = $1 AND name = $2")
            .bind(user)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(secret.map(|(secret,)| secret))
    }

    async fn list_grants(&self, user: Option<&str>) -> StoreResult<Vec<GrantInfo>> {
        let rows: Vec<(String, String, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
            "SELECT user_id, name, created_at, updated_at FROM grants \
             WHERE $1::TEXT IS NULL OR user_id = $1 ORDER BY user_id, name",
        )
        .bind(user)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(user_id, name, created_at, updated_at)| GrantInfo { user_id, name, created_at, updated_at })
            .collect())
    }

    async fn remove_grant(&self, user: &str, name: &str) -> StoreResult<bool> {
        let removed = sqlx::query("DELETE FROM grants WHERE user_id = $1 AND name = $2")
            .bind(user)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(removed.rows_affected() == 1)
    }

    /// A PostgreSQL store keeps nothing in memory beyond its pool's connections.
    fn memory(&self) -> StoreMemory {
        StoreMemory::default()
    }
}

async fn insert_session<'e, E>(executor: E, session: &Session) -> StoreResult<()>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    sqlx::query(AssertSqlSafe(format!("INSERT INTO sessions ({SESSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)")))
        .bind(session.id.as_str())
        .bind(&session.chatbot_id)
        .bind(&session.channel_id)
        .bind(session.title.as_deref())
        .bind(truncate(session.created_at))
        .bind(truncate(session.updated_at))
        .execute(executor)
        .await
        .map_err(|error| insert_error(error, "session", session.id.as_str()))?;
    Ok(())
}

async fn active_in<'e, E>(executor: E, chatbot_id: &str, channel_id: &str) -> StoreResult<Option<Session>>
where
    E: sqlx::Executor<'e, Database = Postgres>,
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
