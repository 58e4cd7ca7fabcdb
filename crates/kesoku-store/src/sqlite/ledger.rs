//! The SQLite store's [`Ledger`] implementation: one row per activation, written and read as
//! jobs on the engine. It holds no logic beyond its statements (the conformance suite in
//! `tests/it` checks them on every backend); rows are decoded by the `rows` module.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use kesoku_core::{ActivationId, LedgerEntry, MessageId, Outcome, Usage};
use rusqlite::params;
use rusqlite::types::Value as SqlValue;

use super::SqliteStore;
use super::rows::{ledger_rows, sqlite_query, time_text};
use crate::common::{delivery_failure_note, not_found};
use crate::decode;
use crate::error::StoreResult;
use crate::sql::{Arg, ERROR_WITH_NOTE, LEDGER_COLUMNS, Query};
use crate::{Ledger, LedgerFilter};

#[async_trait]
impl Ledger for SqliteStore {
    async fn record_enqueued(&self, entry: &LedgerEntry) -> StoreResult<bool> {
        let entry = entry.clone();
        self.engine
            .write(move |conn| {
                let stored = conn
                    .prepare_cached(&format!(
                        "INSERT INTO activations ({LEDGER_COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18) \
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
                        entry.agent.as_deref(),
                    ])?;
                Ok(stored == 1)
            })
            .await
    }

    async fn record_started(&self, id: &ActivationId, at: DateTime<Utc>) -> StoreResult<()> {
        let (id, at) = (id.as_str().to_owned(), time_text(at));
        self.engine
            .write(move |conn| {
                let done = conn
                    .prepare_cached("UPDATE activations SET started_at = ?2 WHERE id = ?1 AND (outcome IS NULL OR outcome = 'cancelled')")?
                    .execute(params![id, at])?;
                if done == 0 && !activation_exists(conn, &id)? {
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
        self.engine
            .write(move |conn| {
                let done = conn
                    .prepare_cached(
                        "UPDATE activations SET finished_at = ?2, outcome = ?3, error = ?4, model_calls = ?5, \
                     tool_calls = ?6, input_tokens = ?7, output_tokens = ?8 WHERE id = ?1 \
                     AND (outcome IS NULL OR outcome = 'cancelled')",
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
                if done == 0 && !activation_exists(conn, &id)? {
                    return Err(not_found("activation", &id));
                }
                Ok(())
            })
            .await
    }

    async fn get_activation(&self, id: &ActivationId) -> StoreResult<Option<LedgerEntry>> {
        let id = id.as_str().to_owned();
        self.engine
            .read(move |conn| {
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
        if let Some(kind) = filter.kind {
            query.and_eq("kind", Arg::Text(kind.as_str().to_owned()));
        }
        if let Some(lane) = filter.lane {
            query.and_eq("lane", Arg::Text(lane.as_str().to_owned()));
        }
        query.push(" ORDER BY enqueued_at DESC, id DESC").limit(filter.limit);
        self.engine
            .read(move |conn| {
                let (text, values) = sqlite_query(&query);
                ledger_rows(conn, &text, &values)
            })
            .await
    }

    async fn unfinished_activations(&self) -> StoreResult<Vec<LedgerEntry>> {
        self.engine
            .read(|conn| {
                let text = format!(
                    "SELECT {LEDGER_COLUMNS} FROM activations WHERE started_at IS NOT NULL AND finished_at IS NULL \
                 ORDER BY enqueued_at, id"
                );
                ledger_rows(conn, &text, &[])
            })
            .await
    }

    async fn record_delivery_failure(&self, root_message_id: &MessageId, reason: &str) -> StoreResult<()> {
        let query = Query::with_args(
            &format!("UPDATE activations SET error = {ERROR_WITH_NOTE} WHERE message_id = $1"),
            vec![Arg::Text(root_message_id.as_str().to_owned()), Arg::Text(delivery_failure_note(reason))],
        );
        self.engine
            .write(move |conn| {
                let (text, values) = sqlite_query(&query);
                conn.prepare_cached(&text)?.execute(rusqlite::params_from_iter(values))?;
                Ok(())
            })
            .await
    }
}

/// Whether a ledger row with this id exists (a write that changed no row either found none or
/// found it final).
fn activation_exists(conn: &rusqlite::Connection, id: &str) -> StoreResult<bool> {
    let found = conn.prepare_cached("SELECT 1 FROM activations WHERE id = ?1")?.exists(params![id])?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The delivery-failure note finds a turn's rows through `activations_message` (migration
    /// 6), not by reading the whole ledger.
    #[tokio::test]
    async fn a_delivery_failure_finds_its_rows_through_an_index() {
        let store = SqliteStore::open_in_memory().await.expect("open");
        let text = format!("EXPLAIN QUERY PLAN UPDATE activations SET error = {ERROR_WITH_NOTE} WHERE message_id = ?1")
            .replace('$', "?");
        let plan = store.engine.with_writer(|conn| {
            let mut statement = conn.prepare(&text).expect("explain");
            let rows = statement
                .query_map(params!["msg_root", "delivery failed: x"], |row| row.get::<_, String>(3))
                .expect("plan")
                .collect::<Result<Vec<_>, _>>()
                .expect("plan rows");
            rows.join("; ")
        });
        assert!(plan.contains("USING INDEX activations_message (message_id=?)"), "{plan}");
        store.close().await;
    }
}
