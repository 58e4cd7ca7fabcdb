//! The store's typed errors. Text is lowercase, says what failed and what to do.

use kesoku_core::IllegalTransition;

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL names no backend we have, or is malformed.
    #[error("unsupported store url `{url}`: {reason} (use `sqlite://PATH` or `postgres://USER@HOST/DB`)")]
    BadUrl { url: String, reason: String },

    /// The store does not exist yet and was opened in a mode that must not create it.
    #[error("{what} does not exist: run `kesoku init` to create it")]
    Missing { what: String },

    /// The file or database is not a Kesoku store, or its schema is newer/unknown.
    #[error("{what} is not a usable kesoku store: {reason}")]
    Foreign { what: String, reason: String },

    /// Applying migrations failed; nothing was changed by the failed step.
    #[error("migrating the store failed: {0}")]
    Migration(String),

    #[error("{what} `{id}` already exists")]
    Duplicate { what: &'static str, id: String },

    #[error("{what} `{id}` not found")]
    NotFound { what: &'static str, id: String },

    #[error("message `{id}`: {source}")]
    IllegalTransition {
        id: String,
        #[source]
        source: IllegalTransition,
    },

    /// A change asked for a state no change may lead to (settling a follow-up back to
    /// `pending`, finishing a job as `running`): a mistake of the caller; nothing changed.
    #[error("{what} `{id}`: {reason}")]
    IllegalChange { what: &'static str, id: String, reason: String },

    /// A compare-and-set kept losing to concurrent changes of the same row.
    #[error("message `{id}` kept changing while its status was being updated: try again")]
    Contention { id: String },

    /// A row read back holds a value this version cannot understand (an unknown status string,
    /// broken metadata JSON): the row is reported, never silently altered.
    #[error("corrupt row in {table} (id `{id}`): {reason}")]
    Corrupt { table: &'static str, id: String, reason: String },

    /// The database failed (connection, I/O, disk full, …).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),

    /// The SQLite database failed (I/O, disk full, locked by another process past the busy
    /// timeout, the store was closed, …).
    #[error("sqlite error: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

impl StoreError {
    /// Whether trying again later may succeed (connection trouble, busy database).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Database(error) => matches!(
                error,
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed
            ),
            StoreError::Sqlite(error) => matches!(
                error.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            StoreError::Contention { .. } => true,
            StoreError::BadUrl { .. }
            | StoreError::Missing { .. }
            | StoreError::Foreign { .. }
            | StoreError::Migration(_)
            | StoreError::Duplicate { .. }
            | StoreError::NotFound { .. }
            | StoreError::IllegalTransition { .. }
            | StoreError::IllegalChange { .. }
            | StoreError::Corrupt { .. } => false,
        }
    }
}
