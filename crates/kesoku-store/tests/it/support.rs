//! The per-test database helpers of `kesoku-test-support` (tested here, where a database
//! server is already required).

use kesoku_test_support::db::{pg_schema, temp_sqlite_url};
use sqlx::Connection;

async fn schema_exists(name: &str) -> bool {
    let url = std::env::var(kesoku_test_support::db::POSTGRES_URL_VAR).expect("url is set when a schema was made");
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    let found: Option<String> = sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname = $1")
        .bind(name)
        .fetch_optional(&mut conn)
        .await
        .expect("query");
    conn.close().await.expect("close");
    found.is_some()
}

#[tokio::test]
async fn a_test_schema_is_private_and_goes_away() {
    let Some(db) = pg_schema().await else { return };
    let schema = db.schema().to_owned();
    assert!(schema.starts_with("kesoku_test_"), "{schema}");
    let mut conn = sqlx::PgConnection::connect_with(&db.connect_options()).await.expect("connect");
    let current: String =
        sqlx::query_scalar("SELECT current_schema()::text").fetch_one(&mut conn).await.expect("query");
    assert_eq!(current, schema, "connections use the test schema");
    conn.close().await.expect("close");
    assert!(db.url().contains(&schema));
    db.cleanup().await;
    assert!(!schema_exists(&schema).await, "cleanup drops the schema");

    // A test that panics never calls cleanup: dropping the value drops the schema.
    let db = pg_schema().await.expect("a second schema");
    let schema = db.schema().to_owned();
    assert!(schema_exists(&schema).await);
    drop(db);
    assert!(!schema_exists(&schema).await, "drop removes the schema");
}

#[test]
fn a_temp_sqlite_url_points_into_its_own_directory() {
    let (dir, url) = temp_sqlite_url();
    let path = url.strip_prefix("sqlite://").expect("a sqlite url");
    assert!(std::path::Path::new(path).starts_with(dir.path()));
    assert!(!std::path::Path::new(path).exists(), "the file is not created");
    let kept = dir.path().to_owned();
    drop(dir);
    assert!(!kept.exists(), "the directory goes away with its guard");
}
