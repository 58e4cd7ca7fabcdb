//! Migrations of the PostgreSQL store: judged and applied one version per transaction, under
//! a per-schema advisory lock so that processes starting together migrate once. The versions
//! themselves (their SQL) are [`crate::migrate`]'s; this module only applies them.

use sqlx::postgres::PgConnection;

use super::PgStore;
use crate::common::OpenMode;
use crate::error::{StoreError, StoreResult};
use crate::migrate::{self, Inspection, VERSION_TABLE, Verdict};

/// First key of the advisory lock held while migrating a schema.
const MIGRATION_KEY: i32 = 0x6b65_7302;

impl PgStore {
    /// Apply pending migrations, one transaction each, under a per-schema advisory lock so
    /// processes starting together migrate once.
    pub(super) async fn migrate(&self, mode: OpenMode) -> StoreResult<()> {
        let what = self.what();
        {
            let mut conn = self.pool.acquire().await?;
            let verdict = migrate::judge(&inspect(&mut conn).await?, &what)?;
            if verdict == Verdict::Empty && mode == OpenMode::MustExist {
                return Err(StoreError::Missing { what: format!("the kesoku store in {what}") });
            }
        }
        loop {
            let mut tx = self.pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
                .bind(MIGRATION_KEY)
                .bind(self.schema_key)
                .execute(&mut *tx)
                .await?;
            let verdict = migrate::judge(&inspect(&mut tx).await?, &what)?;
            let Some(step) = migrate::next(migrate::POSTGRES, verdict) else {
                tx.commit().await?;
                return Ok(());
            };
            sqlx::raw_sql(step.sql).execute(&mut *tx).await.map_err(|error| {
                StoreError::Migration(format!(
                    "schema version {} ({}) could not be applied to {what}: {error}",
                    step.version, step.description
                ))
            })?;
            sqlx::query("INSERT INTO kesoku_schema_version (version, description, applied_at) VALUES ($1, $2, $3)")
                .bind(step.version)
                .bind(step.description)
                .bind(self.clock.now())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            tracing::info!(version = step.version, schema = %self.schema, "postgresql store migrated");
        }
    }
}

/// Tables of the current schema and its kesoku version, read without writing anything.
async fn inspect(conn: &mut PgConnection) -> StoreResult<Inspection> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await?;
    let version = if tables.iter().any(|t| t == VERSION_TABLE) {
        sqlx::query_scalar("SELECT MAX(version) FROM kesoku_schema_version").fetch_one(&mut *conn).await?
    } else {
        None
    };
    Ok(Inspection { tables, version })
}
