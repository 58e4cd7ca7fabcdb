//! The conformance harness: a fresh place per test (a SQLite file, a PostgreSQL schema), a store
//! opened on it with a hand-moved clock, raw SQL access for setting up bad data, and the
//! `backend_tests!` macro that instantiates each case once per backend.

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use kesoku_core::{Message, MessageId, MessageType, Role, SessionId, Status};
use kesoku_store::{Ledger, ManualClock, PgStore, SqliteStore, Store, StoreResult};
use kesoku_test_support::db::{PgTestDb, pg_schema, temp_sqlite_path};
use sqlx::Connection;
use tempfile::TempDir;

/// Instantiate each `async fn case(backend: &Backend)` once for SQLite and once for PostgreSQL
/// (which skips, saying so, when no server is configured).
#[macro_export]
macro_rules! backend_tests {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    let backend = $crate::harness::Backend::open($crate::harness::Place::sqlite()).await;
                    super::$case(&backend).await;
                    backend.cleanup().await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    let Some(place) = $crate::harness::Place::postgres().await else { return };
                    let backend = $crate::harness::Backend::open(place).await;
                    super::$case(&backend).await;
                    backend.cleanup().await;
                }
            }
        )*
    };
}

/// Instantiate each `async fn case(place: Place)` once per backend, for cases that set the
/// database up before (or instead of) opening a store.
#[macro_export]
macro_rules! place_tests {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$case($crate::harness::Place::sqlite()).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    let Some(place) = $crate::harness::Place::postgres().await else { return };
                    super::$case(place).await;
                }
            }
        )*
    };
}

/// Where the store's clock starts in every test.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 5, 27, 12, 0, 0).single().expect("a valid fixed time")
}

/// An empty place for a store.
pub enum Place {
    Sqlite { _dir: TempDir, path: PathBuf },
    Postgres(PgTestDb),
}

/// A store opened on a place, as its concrete type.
pub enum Opened {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

impl Opened {
    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            Opened::Sqlite(store) => Arc::new(store.clone()),
            Opened::Postgres(store) => Arc::new(store.clone()),
        }
    }

    pub fn ledger(&self) -> Arc<dyn Ledger> {
        match self {
            Opened::Sqlite(store) => Arc::new(store.clone()),
            Opened::Postgres(store) => Arc::new(store.clone()),
        }
    }

    pub async fn close(&self) {
        match self {
            Opened::Sqlite(store) => store.close().await,
            Opened::Postgres(store) => store.close().await,
        }
    }
}

impl Place {
    pub fn sqlite() -> Place {
        let (dir, path) = temp_sqlite_path();
        Place::Sqlite { _dir: dir, path }
    }

    pub async fn postgres() -> Option<Place> {
        pg_schema().await.map(Place::Postgres)
    }

    pub fn is_sqlite(&self) -> bool {
        matches!(self, Place::Sqlite { .. })
    }

    /// Open (creating or migrating) a store here, on the system clock.
    pub async fn open(&self) -> StoreResult<Opened> {
        match self {
            Place::Sqlite { path, .. } => Ok(Opened::Sqlite(SqliteStore::open(path).await?)),
            Place::Postgres(db) => Ok(Opened::Postgres(PgStore::connect_with(db.connect_options()).await?)),
        }
    }

    /// Open a store here with `clock`.
    pub async fn open_with_clock(&self, clock: &ManualClock) -> StoreResult<Opened> {
        Ok(match self.open().await? {
            Opened::Sqlite(store) => Opened::Sqlite(store.with_clock(clock.clone())),
            Opened::Postgres(store) => Opened::Postgres(store.with_clock(clock.clone())),
        })
    }

    /// The URL `kesoku_store::open` takes for this place.
    pub fn url(&self) -> String {
        match self {
            Place::Sqlite { path, .. } => format!("sqlite://{}", path.display()),
            Place::Postgres(db) => db.url().to_owned(),
        }
    }

    /// Run SQL (one or more statements) on a connection of its own, bypassing the store.
    pub async fn raw(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Place::Sqlite { path, .. } => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path).create_if_missing(true);
                let mut conn = sqlx::SqliteConnection::connect_with(&options).await.expect("raw sqlite connection");
                sqlx::raw_sql(sql).execute(&mut conn).await.expect("raw sqlite statement");
                conn.close().await.expect("close raw sqlite connection");
            }
            Place::Postgres(db) => {
                let mut conn =
                    sqlx::PgConnection::connect_with(&db.connect_options()).await.expect("raw postgres connection");
                sqlx::raw_sql(sql).execute(&mut conn).await.expect("raw postgres statement");
                conn.close().await.expect("close raw postgres connection");
            }
        }
    }

    /// One text column of every row a query returns, on a connection of its own.
    pub async fn raw_strings(&self, sql: &str) -> Vec<String> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Place::Sqlite { path, .. } => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut conn = sqlx::SqliteConnection::connect_with(&options).await.expect("raw sqlite connection");
                let rows = sqlx::query_scalar(sql).fetch_all(&mut conn).await.expect("raw sqlite query");
                conn.close().await.expect("close raw sqlite connection");
                rows
            }
            Place::Postgres(db) => {
                let mut conn =
                    sqlx::PgConnection::connect_with(&db.connect_options()).await.expect("raw postgres connection");
                let rows = sqlx::query_scalar(sql).fetch_all(&mut conn).await.expect("raw postgres query");
                conn.close().await.expect("close raw postgres connection");
                rows
            }
        }
    }

    /// Tables in the place (without SQLite's own).
    pub async fn tables(&self) -> Vec<String> {
        match self {
            Place::Sqlite { .. } => {
                self.raw_strings(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
                )
                .await
            }
            Place::Postgres(_) => {
                self.raw_strings(
                    "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() \
                     ORDER BY 1",
                )
                .await
            }
        }
    }

    pub async fn cleanup(self) {
        if let Place::Postgres(db) = self {
            db.cleanup().await;
        }
    }
}

/// A store under test: both traits over one backend, its clock, and where it lives.
pub struct Backend {
    pub store: Arc<dyn Store>,
    pub ledger: Arc<dyn Ledger>,
    pub clock: ManualClock,
    pub place: Place,
    opened: Opened,
}

impl Backend {
    pub async fn open(place: Place) -> Backend {
        let clock = ManualClock::new(t0());
        let opened = place.open_with_clock(&clock).await.expect("open a store on a fresh place");
        Backend { store: opened.store(), ledger: opened.ledger(), clock, place, opened }
    }

    pub fn is_sqlite(&self) -> bool {
        self.place.is_sqlite()
    }

    pub async fn cleanup(self) {
        self.opened.close().await;
        self.place.cleanup().await;
    }
}

/// A message with the given id and shape; other fields plain.
pub fn message(
    id: &str,
    session: &str,
    parent: Option<&str>,
    role: Role,
    message_type: MessageType,
    status: Status,
) -> Message {
    Message {
        id: MessageId::from(id),
        session_id: SessionId::from(session),
        parent_id: parent.map(MessageId::from),
        chatbot_id: "cli".to_owned(),
        channel_id: "cli".to_owned(),
        sender: match role {
            Role::User => "User".to_owned(),
            Role::Assistant | Role::Tool => "Kesoku".to_owned(),
            Role::System => "System".to_owned(),
        },
        role,
        message_type,
        content: format!("content of {id}"),
        status,
        metadata: Default::default(),
        step: 0,
        created_at: None,
        updated_at: None,
    }
}

/// A user prompt waiting for the agent.
pub fn prompt(id: &str, session: &str) -> Message {
    message(id, session, None, Role::User, MessageType::Text, Status::PendingAgent)
}

/// The same message without the times the store stamps.
pub fn without_times(mut message: Message) -> Message {
    message.created_at = None;
    message.updated_at = None;
    message
}
