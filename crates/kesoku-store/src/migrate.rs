//! Versioned schema migrations, shared judgement of what an opened database is.
//!
//! Each backend has its own numbered SQL files under `migrations/<backend>/`, embedded in the
//! binary. The applied versions are rows of `kesoku_schema_version` (created by migration 1).
//! We run them ourselves rather than with `sqlx::migrate!` because opening must first decide,
//! without writing anything, whether a database is ours: an empty database is initialised, a
//! database with tables but no version table belongs to another application, and a version
//! newer than this build is refused. (sqlx's migrator would create its bookkeeping table in any
//! database it is pointed at, and its table name is shared by every sqlx application.)
//!
//! The backends execute the steps; this module holds the migration lists and the verdict.

use crate::error::{StoreError, StoreResult};

/// One schema step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    pub version: i64,
    pub description: &'static str,
    pub sql: &'static str,
}

/// The table listing applied versions.
pub(crate) const VERSION_TABLE: &str = "kesoku_schema_version";

pub(crate) const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        description: "messages and sessions",
        sql: include_str!("../migrations/sqlite/0001_messages_sessions.sql"),
    },
    Migration {
        version: 2,
        description: "activations ledger",
        sql: include_str!("../migrations/sqlite/0002_activations.sql"),
    },
    Migration {
        version: 3,
        description: "phased order index",
        sql: include_str!("../migrations/sqlite/0003_phased_order.sql"),
    },
    Migration {
        version: 4,
        description: "open work index",
        sql: include_str!("../migrations/sqlite/0004_open_work_index.sql"),
    },
    Migration {
        version: 5,
        description: "phased order index (postgresql)",
        sql: include_str!("../migrations/sqlite/0005_phased_index.sql"),
    },
    Migration {
        version: 6,
        description: "delivery records",
        sql: include_str!("../migrations/sqlite/0006_deliveries.sql"),
    },
    Migration {
        version: 7,
        description: "follow-ups and background jobs",
        sql: include_str!("../migrations/sqlite/0007_work.sql"),
    },
    Migration {
        version: 8,
        description: "chatbot state",
        sql: include_str!("../migrations/sqlite/0008_chatbot_state.sql"),
    },
    Migration { version: 9, description: "grants", sql: include_str!("../migrations/sqlite/0009_grants.sql") },
    Migration {
        version: 10,
        description: "ledger agent",
        sql: include_str!("../migrations/sqlite/0010_ledger_agent.sql"),
    },
];

pub(crate) const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        description: "messages and sessions",
        sql: include_str!("../migrations/postgres/0001_messages_sessions.sql"),
    },
    Migration {
        version: 2,
        description: "activations ledger",
        sql: include_str!("../migrations/postgres/0002_activations.sql"),
    },
    Migration {
        version: 3,
        description: "phased order index",
        sql: include_str!("../migrations/postgres/0003_phased_order.sql"),
    },
    Migration {
        version: 4,
        description: "open work index",
        sql: include_str!("../migrations/postgres/0004_open_work_index.sql"),
    },
    Migration {
        version: 5,
        description: "phased order index (postgresql)",
        sql: include_str!("../migrations/postgres/0005_phased_index.sql"),
    },
    Migration {
        version: 6,
        description: "delivery records",
        sql: include_str!("../migrations/postgres/0006_deliveries.sql"),
    },
    Migration {
        version: 7,
        description: "follow-ups and background jobs",
        sql: include_str!("../migrations/postgres/0007_work.sql"),
    },
    Migration {
        version: 8,
        description: "chatbot state",
        sql: include_str!("../migrations/postgres/0008_chatbot_state.sql"),
    },
    Migration { version: 9, description: "grants", sql: include_str!("../migrations/postgres/0009_grants.sql") },
    Migration {
        version: 10,
        description: "ledger agent",
        sql: include_str!("../migrations/postgres/0010_ledger_agent.sql"),
    },
];

/// The newest schema version this build knows (both backends move in step).
pub const SCHEMA_VERSION: i64 = 10;

/// What an opened database holds, as far as migrations care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspection {
    /// Tables in the database (or schema), without the engine's own.
    pub tables: Vec<String>,
    /// The highest applied version, when the version table exists and has rows.
    pub version: Option<i64>,
}

/// What to do with an inspected database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing there: initialise from version 1.
    Empty,
    /// Ours, at this version (possibly older than [`SCHEMA_VERSION`]).
    Ours(i64),
}

/// Decide whether the database described by `inspection` is a Kesoku store we may use.
/// `what` names it in errors (a path, a schema).
pub(crate) fn judge(inspection: &Inspection, what: &str) -> StoreResult<Verdict> {
    let has_version_table = inspection.tables.iter().any(|t| t == VERSION_TABLE);
    match (has_version_table, inspection.version) {
        (false, _) if inspection.tables.is_empty() => Ok(Verdict::Empty),
        (false, _) | (true, None) => {
            let mut names: Vec<&str> = inspection.tables.iter().map(String::as_str).take(5).collect();
            if inspection.tables.len() > names.len() {
                names.push("…");
            }
            Err(StoreError::Foreign {
                what: what.to_owned(),
                reason: format!(
                    "it has tables ({}) but no kesoku schema version: it belongs to another application; \
                     point kesoku at a new file or an empty database",
                    names.join(", ")
                ),
            })
        }
        (true, Some(version)) if version > SCHEMA_VERSION => Err(StoreError::Foreign {
            what: what.to_owned(),
            reason: format!(
                "its schema version {version} is newer than this kesoku knows (up to {SCHEMA_VERSION}): \
                 upgrade kesoku"
            ),
        }),
        (true, Some(version)) if version < 1 => Err(StoreError::Foreign {
            what: what.to_owned(),
            reason: format!("its schema version {version} is not one kesoku ever wrote"),
        }),
        (true, Some(version)) => Ok(Verdict::Ours(version)),
    }
}

/// The next migration to apply after `verdict`, if any.
pub(crate) fn next(migrations: &'static [Migration], verdict: Verdict) -> Option<&'static Migration> {
    let current = match verdict {
        Verdict::Empty => 0,
        Verdict::Ours(version) => version,
    };
    migrations.iter().find(|m| m.version > current)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inspection(tables: &[&str], version: Option<i64>) -> Inspection {
        Inspection { tables: tables.iter().map(|t| (*t).to_owned()).collect(), version }
    }

    #[test]
    fn lists_are_numbered_in_order_and_end_at_the_schema_version() {
        for list in [SQLITE, POSTGRES] {
            let versions: Vec<i64> = list.iter().map(|m| m.version).collect();
            let expected: Vec<i64> = (1..=SCHEMA_VERSION).collect();
            assert_eq!(versions, expected);
        }
    }

    #[test]
    fn verdicts() {
        assert_eq!(judge(&inspection(&[], None), "x").ok(), Some(Verdict::Empty));
        assert_eq!(judge(&inspection(&[VERSION_TABLE, "messages"], Some(1)), "x").ok(), Some(Verdict::Ours(1)));
        let foreign = judge(&inspection(&["users"], None), "x").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(foreign.contains("another application"), "{foreign}");
        let newer = judge(&inspection(&[VERSION_TABLE], Some(SCHEMA_VERSION + 1)), "x").err().map(|e| e.to_string());
        assert!(newer.unwrap_or_default().contains("newer than this kesoku"));
        assert_eq!(next(SQLITE, Verdict::Ours(SCHEMA_VERSION)).map(|m| m.version), None);
        assert_eq!(next(SQLITE, Verdict::Empty).map(|m| m.version), Some(1));
    }
}
