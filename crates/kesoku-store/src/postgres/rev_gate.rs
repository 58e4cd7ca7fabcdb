//! The rev gate: how the PostgreSQL store hands out revisions so that a reader following
//! [`crate::Store::changes_since`] never skips a change.
//!
//! Revisions come from the sequence `kesoku_message_rev`, so writers never wait on each other.
//! A sequence hands numbers out in call order, not commit order: a reader could see revision 11
//! committed while 10 is still in flight and skip it for good. To prevent that, every
//! statement that takes a revision first takes a *shared* advisory lock (the rev gate, held to
//! the end of its transaction): the `gate` CTE, which the row producing `nextval` depends on.
//! A catch-up read briefly takes the same lock *exclusively*, which waits for every writer in
//! flight, reads the sequence's last value, and then only returns revisions up to it: all of
//! those are committed (or rolled back) by then, and anything later gets a higher revision.
//! The gate is keyed by schema, so stores in other schemas do not wait on each other.
//!
//! This module writes no rows; the statements that take revisions are the `store` module's.

use sqlx::postgres::PgArguments;
use sqlx::{AssertSqlSafe, Postgres};

use super::PgStore;
use crate::error::StoreResult;

/// First key of the rev gate's advisory lock (the second is the schema's hash).
pub(super) const REV_GATE_KEY: i32 = 0x6b65_7301;
/// The rev gate, shared: the first CTE of every statement that takes revisions. Its keys are
/// `$1` and `$2`.
pub(super) const GATE: &str = "WITH gate AS (SELECT pg_advisory_xact_lock_shared($1::int4, $2::int4))";

impl PgStore {
    /// A statement taking revisions, with the rev gate's keys bound as `$1`, `$2`.
    pub(super) fn gated(&self, sql: String) -> sqlx::query::Query<'static, Postgres, PgArguments> {
        sqlx::query(AssertSqlSafe(sql)).bind(REV_GATE_KEY).bind(self.schema_key)
    }

    /// A revision at or below which every change is final (committed or rolled back): waits
    /// for the writers in flight.
    pub(super) async fn stable_rev(&self) -> StoreResult<i64> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
            .bind(REV_GATE_KEY)
            .bind(self.schema_key)
            .execute(&mut *tx)
            .await?;
        let rev: i64 =
            sqlx::query_scalar("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM kesoku_message_rev")
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok(rev)
    }
}

/// The rev gate's keys as the first two arguments of a statement.
pub(super) fn gate_args(schema_key: i32) -> Result<PgArguments, sqlx::Error> {
    use sqlx::Arguments;
    let mut args = PgArguments::default();
    args.add(REV_GATE_KEY).map_err(sqlx::Error::Encode)?;
    args.add(schema_key).map_err(sqlx::Error::Encode)?;
    Ok(args)
}

#[cfg(test)]
mod tests {
    use kesoku_test_support::db::pg_schema;
    use sqlx::Row;

    use super::*;

    /// A statement that takes a revision through the gate holds it (shared) until its
    /// transaction ends, so the exclusive lock of a catch-up read cannot be had while that
    /// revision is in flight; and once it is committed, the stable revision covers it.
    /// PostgreSQL skips a CTE that nothing depends on, which is why the revision's row is
    /// produced `FROM gate`.
    #[tokio::test]
    async fn a_revision_in_flight_holds_the_gate_until_its_transaction_ends() {
        let Some(db) = pg_schema().await else { return };
        let store = PgStore::connect_with(db.connect_options()).await.expect("connect");
        let gate_is_free = || async {
            let mut reader = store.pool.begin().await.expect("begin a reader");
            let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, $2)")
                .bind(REV_GATE_KEY)
                .bind(store.schema_key)
                .fetch_one(&mut *reader)
                .await
                .expect("try the gate");
            reader.rollback().await.expect("end the reader");
            free
        };
        assert!(gate_is_free().await, "nothing is in flight yet");

        let mut writer = store.pool.begin().await.expect("begin a writer");
        let rev: i64 = store
            .gated(format!("{GATE}, r AS (SELECT nextval('kesoku_message_rev') AS rev FROM gate) SELECT r.rev FROM r"))
            .fetch_one(&mut *writer)
            .await
            .expect("take a revision")
            .try_get(0)
            .expect("the revision");
        assert!(!gate_is_free().await, "revision {rev} is in flight: a catch-up read must wait for it");
        writer.commit().await.expect("commit");

        assert!(gate_is_free().await, "the gate is released with the transaction");
        assert!(store.stable_rev().await.expect("stable revision") >= rev);
        store.close().await;
        db.cleanup().await;
    }
}
