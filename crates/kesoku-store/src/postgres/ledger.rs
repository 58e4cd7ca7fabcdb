//! The PostgreSQL store's [`Ledger`] implementation: one row per activation, as statements on
//! the pool. It holds no logic beyond its statements (the conformance suite in `tests/it`
//! checks them on every backend).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use kesoku_core::{ActivationId, LedgerEntry, MessageId, Outcome, Usage};
use sqlx::AssertSqlSafe;

use super::{PgStore, bind, decode_all};
use crate::clock::truncate;
use crate::common::{delivery_failure_note, not_found};
use crate::decode;
use crate::error::StoreResult;
use crate::sql::{Arg, ERROR_WITH_NOTE, LEDGER_COLUMNS, Query};
use crate::{Ledger, LedgerFilter};

impl PgStore {
    async fn activation_exists(&self, id: &ActivationId) -> StoreResult<bool> {
        let row =
            sqlx::query("SELECT 1 FROM activations WHERE id = $1").bind(id.as_str()).fetch_optional(&self.pool).await?;
        Ok(row.is_some())
    }
}

#[async_trait]
impl Ledger for PgStore {
    async fn record_enqueued(&self, entry: &LedgerEntry) -> StoreResult<bool> {
        let done = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO activations ({LEDGER_COLUMNS}) VALUES \
             ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18) \
             ON CONFLICT (id) DO NOTHING"
        )))
        .bind(entry.id.as_str())
        .bind(entry.kind.as_str())
        .bind(entry.lane.as_str())
        .bind(entry.session_id.as_str())
        .bind(entry.message_id.as_ref().map(MessageId::as_str))
        .bind(&entry.triggered_by)
        .bind(entry.delegation_user.as_deref())
        .bind(i64::from(entry.depth))
        .bind(truncate(entry.enqueued_at))
        .bind(entry.started_at.map(truncate))
        .bind(entry.finished_at.map(truncate))
        .bind(entry.outcome.map(Outcome::as_str))
        .bind(entry.error.as_deref())
        .bind(decode::count(entry.usage.model_calls))
        .bind(decode::count(entry.usage.tool_calls))
        .bind(decode::count(entry.usage.input_tokens))
        .bind(decode::count(entry.usage.output_tokens))
        .bind(entry.agent.as_deref())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn record_started(&self, id: &ActivationId, at: DateTime<Utc>) -> StoreResult<()> {
        let done = sqlx::query(
            "UPDATE activations SET started_at = $2 WHERE id = $1 AND (outcome IS NULL OR outcome = 'cancelled')",
        )
        .bind(id.as_str())
        .bind(truncate(at))
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 && !self.activation_exists(id).await? {
            return Err(not_found("activation", id.as_str()));
        }
        Ok(())
    }

    async fn record_finished(
        &self,
        id: &ActivationId,
        at: DateTime<Utc>,
        outcome: Outcome,
        error: Option<&str>,
        usage: &Usage,
    ) -> StoreResult<()> {
        let done = sqlx::query(
            "UPDATE activations SET finished_at = $2, outcome = $3, error = $4, model_calls = $5, tool_calls = $6, \
             input_tokens = $7, output_tokens = $8 WHERE id = $1 AND (outcome IS NULL OR outcome = 'cancelled')",
        )
        .bind(id.as_str())
        .bind(truncate(at))
        .bind(outcome.as_str())
        .bind(error)
        .bind(decode::count(usage.model_calls))
        .bind(decode::count(usage.tool_calls))
        .bind(decode::count(usage.input_tokens))
        .bind(decode::count(usage.output_tokens))
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 && !self.activation_exists(id).await? {
            return Err(not_found("activation", id.as_str()));
        }
        Ok(())
    }

    async fn get_activation(&self, id: &ActivationId) -> StoreResult<Option<LedgerEntry>> {
        let row = sqlx::query(AssertSqlSafe(format!("SELECT {LEDGER_COLUMNS} FROM activations WHERE id = $1")))
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(decode::ledger_entry).transpose()
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
        let rows = bind(query).fetch_all(&self.pool).await?;
        decode_all(&rows, decode::ledger_entry)
    }

    async fn unfinished_activations(&self) -> StoreResult<Vec<LedgerEntry>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {LEDGER_COLUMNS} FROM activations WHERE started_at IS NOT NULL AND finished_at IS NULL \
             ORDER BY enqueued_at, id"
        )))
        .fetch_all(&self.pool)
        .await?;
        decode_all(&rows, decode::ledger_entry)
    }

    async fn record_delivery_failure(&self, root_message_id: &MessageId, reason: &str) -> StoreResult<()> {
        sqlx::query(AssertSqlSafe(format!("UPDATE activations SET error = {ERROR_WITH_NOTE} WHERE message_id = $1")))
            .bind(root_message_id.as_str())
            .bind(delivery_failure_note(reason))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
