//! Reading SQLite rows: binding a shared query, running it, and decoding each row through the
//! backend-neutral decoders of [`crate::decode`] (messages, sessions, ledger rows, claims,
//! and a history's rows with their phased keys).
//!
//! It is also where the SQLite store's encoding of times is defined ([`time_text`]). It decides
//! nothing about what a value means (that is `decode`'s) and runs no writes of its own.

use chrono::{DateTime, Utc};
use kesoku_core::{DeliveryRecord, LedgerEntry, Message, SessionId};
use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{Connection, params, params_from_iter};

use crate::clock::truncate;
use crate::decode::{self, BackendRow, StoredMessage};
use crate::error::StoreResult;
use crate::sql::{Arg, MESSAGE_COLUMNS, Query};

use super::history_cache::{PhasedKey, RowReader};

/// Columns of the row lists below, in the order of the `*_COLUMNS` lists of [`crate::sql`].
pub(super) const MESSAGE_NAMES: &[&str] = &[
    "id",
    "session_id",
    "parent_id",
    "chatbot_id",
    "channel_id",
    "sender",
    "role",
    "type",
    "content",
    "status",
    "metadata",
    "step",
    "created_at",
    "updated_at",
    "rev",
    "created_rev",
];
pub(super) const SESSION_NAMES: &[&str] = &["id", "chatbot_id", "channel_id", "title", "created_at", "updated_at"];
pub(super) const LEDGER_NAMES: &[&str] = &[
    "id",
    "kind",
    "lane",
    "session_id",
    "message_id",
    "triggered_by",
    "delegation_user",
    "depth",
    "enqueued_at",
    "started_at",
    "finished_at",
    "outcome",
    "error",
    "model_calls",
    "tool_calls",
    "input_tokens",
    "output_tokens",
    "agent",
];
pub(super) const CLAIM_NAMES: &[&str] = &["id", "status", "claimed_by", "claimed_at"];
pub(super) const DELIVERY_NAMES: &[&str] = &["message_id", "part", "platform_message_id", "recorded_at"];
pub(super) const FOLLOWUP_NAMES: &[&str] = &[
    "id",
    "session_id",
    "chatbot_id",
    "channel_id",
    "task",
    "due_at",
    "created_at",
    "created_by",
    "state",
    "settled_at",
];
pub(super) const JOB_NAMES: &[&str] = &[
    "id",
    "session_id",
    "chatbot_id",
    "channel_id",
    "message_id",
    "command",
    "pid",
    "stdout_path",
    "stderr_path",
    "state",
    "exit_code",
    "detail",
    "started_at",
    "finished_at",
];

/// A row read through the column list of its query.
pub(super) struct SqlRow<'r, 's> {
    row: &'r rusqlite::Row<'s>,
    columns: &'static [&'static str],
    /// Where the next column is looked for first: decoders read columns in query order.
    next: std::cell::Cell<usize>,
}

impl<'r, 's> SqlRow<'r, 's> {
    pub(super) fn new(row: &'r rusqlite::Row<'s>, columns: &'static [&'static str]) -> Self {
        SqlRow { row, columns, next: std::cell::Cell::new(0) }
    }

    fn value(&self, column: &'static str) -> Result<ValueRef<'_>, String> {
        let hint = self.next.get();
        let index = if self.columns.get(hint) == Some(&column) {
            hint
        } else {
            self.columns
                .iter()
                .position(|name| *name == column)
                .ok_or_else(|| format!("the query has no column `{column}`"))?
        };
        self.next.set(index + 1);
        self.row.get_ref(index).map_err(|error| error.to_string())
    }
}

impl BackendRow for SqlRow<'_, '_> {
    fn opt_text(&self, column: &'static str) -> Result<Option<String>, String> {
        match self.value(column)? {
            ValueRef::Null => Ok(None),
            ValueRef::Text(bytes) => String::from_utf8(bytes.to_vec())
                .map(Some)
                .map_err(|_| format!("`{}` is not UTF-8 text", decode::excerpt(&String::from_utf8_lossy(bytes)))),
            ValueRef::Integer(value) => Err(format!("holds the integer {value}, not text")),
            ValueRef::Real(value) => Err(format!("holds the number {value}, not text")),
            ValueRef::Blob(_) => Err("holds a blob, not text".to_owned()),
        }
    }

    fn opt_int(&self, column: &'static str) -> Result<Option<i64>, String> {
        match self.value(column)? {
            ValueRef::Null => Ok(None),
            ValueRef::Integer(value) => Ok(Some(value)),
            ValueRef::Text(bytes) => {
                Err(format!("holds the text `{}`, not an integer", decode::excerpt(&String::from_utf8_lossy(bytes))))
            }
            ValueRef::Real(value) => Err(format!("holds the number {value}, not an integer")),
            ValueRef::Blob(_) => Err("holds a blob, not an integer".to_owned()),
        }
    }

    fn opt_str(&self, column: &'static str) -> Result<Option<std::borrow::Cow<'_, str>>, String> {
        match self.value(column)? {
            ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => Ok(Some(std::borrow::Cow::Borrowed(text))),
                Err(_) => self.opt_text(column).map(|text| text.map(std::borrow::Cow::Owned)),
            },
            ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_) | ValueRef::Blob(_) => {
                self.opt_text(column).map(|text| text.map(std::borrow::Cow::Owned))
            }
        }
    }

    fn opt_time(&self, column: &'static str) -> Result<Option<DateTime<Utc>>, String> {
        self.opt_str(column)?.map(|text| decode::parse_time_text(&text)).transpose()
    }

    fn opt_metadata(&self, column: &'static str) -> Result<Option<kesoku_core::Metadata>, String> {
        self.opt_str(column)?.map(|text| decode::parse_metadata_text(&text)).transpose()
    }
}

/// How times are stored: fixed-width UTC text to the microsecond, so text order is time order.
pub(super) fn time_text(at: DateTime<Utc>) -> String {
    truncate(at).format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// A shared query's text for SQLite (`$n` → `?n`, explicit positions) and its values.
pub(super) fn sqlite_query(query: &Query) -> (String, Vec<SqlValue>) {
    let text = query.text.replace('$', "?");
    let values = query
        .args
        .iter()
        .map(|arg| match arg {
            Arg::Text(text) => SqlValue::Text(text.clone()),
            Arg::Int(value) => SqlValue::Integer(*value),
            Arg::Time(at) => SqlValue::Text(time_text(*at)),
        })
        .collect();
    (text, values)
}

pub(super) fn messages_in(conn: &Connection, query: &Query) -> StoreResult<Vec<StoredMessage>> {
    let (text, values) = sqlite_query(query);
    let mut statement = conn.prepare_cached(&text)?;
    let mut rows = statement.query(params_from_iter(values.iter()))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode::message(&SqlRow::new(row, MESSAGE_NAMES))?);
    }
    Ok(out)
}

pub(super) fn fetch_message(conn: &Connection, id: &str) -> StoreResult<Option<StoredMessage>> {
    let mut statement = conn.prepare_cached(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?1"))?;
    let mut rows = statement.query(params![id])?;
    match rows.next()? {
        Some(row) => Ok(Some(decode::message(&SqlRow::new(row, MESSAGE_NAMES))?)),
        None => Ok(None),
    }
}

/// Run an `UPDATE … RETURNING {MESSAGE_COLUMNS}` and read the row it changed, if any.
pub(super) fn update_returning(
    conn: &Connection,
    sql: &str,
    values: &[SqlValue],
) -> StoreResult<Option<StoredMessage>> {
    let mut statement = conn.prepare_cached(sql)?;
    let mut rows = statement.query(params_from_iter(values.iter()))?;
    let row = match rows.next()? {
        Some(row) => Some(decode::message(&SqlRow::new(row, MESSAGE_NAMES))?),
        None => None,
    };
    Ok(row)
}

pub(super) fn ledger_rows(conn: &Connection, text: &str, values: &[SqlValue]) -> StoreResult<Vec<LedgerEntry>> {
    let mut statement = conn.prepare_cached(text)?;
    let mut rows = statement.query(params_from_iter(values.iter()))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode::ledger_entry(&SqlRow::new(row, LEDGER_NAMES))?);
    }
    Ok(out)
}

pub(super) fn delivery_rows(conn: &Connection, text: &str, values: &[SqlValue]) -> StoreResult<Vec<DeliveryRecord>> {
    let mut statement = conn.prepare_cached(text)?;
    let mut rows = statement.query(params_from_iter(values.iter()))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode::delivery_record(&SqlRow::new(row, DELIVERY_NAMES))?);
    }
    Ok(out)
}

/// Every row of `query`, read through the column list `names` by `decode`.
pub(super) fn decoded_rows<T>(
    conn: &Connection,
    query: &Query,
    names: &'static [&'static str],
    decode: impl Fn(&SqlRow<'_, '_>) -> StoreResult<T>,
) -> StoreResult<Vec<T>> {
    let (text, values) = sqlite_query(query);
    let mut statement = conn.prepare_cached(&text)?;
    let mut rows = statement.query(params_from_iter(values.iter()))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode(&SqlRow::new(row, names))?);
    }
    Ok(out)
}

/// A session's rows with their phased keys, for the history cache.
pub(super) struct HistoryRows;

impl HistoryRows {
    fn rows(conn: &Connection, sql: &str, values: &[SqlValue]) -> StoreResult<Vec<(PhasedKey, Message)>> {
        let mut statement = conn.prepare_cached(sql)?;
        let mut rows = statement.query(params_from_iter(values.iter()))?;
        let mut out = Vec::new();
        let extra = MESSAGE_NAMES.len();
        while let Some(row) = rows.next()? {
            let message = decode::message(&SqlRow::new(row, MESSAGE_NAMES))?.message;
            let turn_seq: Option<i64> = row.get(extra)?;
            let key = (turn_seq.unwrap_or(i64::MIN), row.get(extra + 1)?, row.get(extra + 2)?, row.get(extra + 3)?);
            out.push((key, message));
        }
        Ok(out)
    }
}

impl RowReader for HistoryRows {
    fn all(&self, conn: &Connection, session_id: &SessionId) -> StoreResult<Vec<(PhasedKey, Message)>> {
        // Read in the order of the `messages_phased` index: no join, no sort.
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS}, turn_seq, step, phase, seq FROM messages WHERE session_id = ?1 \
             ORDER BY turn_seq, step, phase, seq"
        );
        Self::rows(conn, &sql, &[SqlValue::Text(session_id.as_str().to_owned())])
    }

    fn changed_since(
        &self,
        conn: &Connection,
        session_id: &SessionId,
        rev: i64,
    ) -> StoreResult<Vec<(PhasedKey, Message)>> {
        // Through the revision index: the rows changed since, of every session, filtered.
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS}, turn_seq, step, phase, seq FROM messages INDEXED BY messages_rev \
             WHERE rev > ?2 AND session_id = ?1"
        );
        Self::rows(conn, &sql, &[SqlValue::Text(session_id.as_str().to_owned()), SqlValue::Integer(rev)])
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    /// What `read` returns for the one row of `select`, read through the column list `names`.
    fn with_row<T>(select: &str, names: &'static [&'static str], read: impl FnOnce(&SqlRow<'_, '_>) -> T) -> T {
        let conn = Connection::open_in_memory().expect("open");
        let mut statement = conn.prepare(select).expect("prepare");
        let mut rows = statement.query([]).expect("query");
        let row = rows.next().expect("step").expect("a row");
        read(&SqlRow::new(row, names))
    }

    const NAMES: &[&str] = &["text", "number", "nothing", "time"];
    const SELECT: &str = "SELECT 'hello', 42, NULL, '2026-01-02T03:04:05.123456Z'";

    #[test]
    fn columns_are_found_by_name_in_any_order() {
        with_row(SELECT, NAMES, |row| {
            // In query order, then backwards, then a column read twice.
            assert_eq!(row.opt_text("text"), Ok(Some("hello".to_owned())));
            assert_eq!(row.opt_int("number"), Ok(Some(42)));
            assert_eq!(row.opt_text("nothing"), Ok(None));
            let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).single().expect("a time")
                + chrono::Duration::microseconds(123_456);
            assert_eq!(row.opt_time("time"), Ok(Some(at)));
            assert_eq!(row.opt_int("number"), Ok(Some(42)));
            assert_eq!(row.opt_text("text"), Ok(Some("hello".to_owned())));
            assert_eq!(row.opt_text("absent"), Err("the query has no column `absent`".to_owned()));
        });
    }

    /// A cell of the wrong kind is an error naming what it holds (the decoders turn it into a
    /// `Corrupt` row error), never a panic or a silent conversion.
    #[test]
    fn a_cell_of_the_wrong_kind_says_what_it_holds() {
        with_row("SELECT 7, 'seven', 1.5, x'00'", &["a", "b", "c", "d"], |row| {
            assert_eq!(row.opt_text("a"), Err("holds the integer 7, not text".to_owned()));
            assert_eq!(row.opt_int("b"), Err("holds the text `seven`, not an integer".to_owned()));
            assert_eq!(row.opt_int("c"), Err("holds the number 1.5, not an integer".to_owned()));
            assert_eq!(row.opt_text("d"), Err("holds a blob, not text".to_owned()));
        });
    }

    #[test]
    fn a_shared_query_gets_positional_parameters_and_stored_times() {
        let at = Utc.with_ymd_and_hms(2026, 5, 6, 7, 8, 9).single().expect("a time")
            + chrono::Duration::nanoseconds(1_234_567);
        let query = Query::with_args(
            "SELECT id FROM messages WHERE session_id = $1 AND rev > $2 AND created_at < $3",
            vec![Arg::Text("sess_1".to_owned()), Arg::Int(5), Arg::Time(at)],
        );
        let (text, values) = sqlite_query(&query);
        assert_eq!(text, "SELECT id FROM messages WHERE session_id = ?1 AND rev > ?2 AND created_at < ?3");
        assert_eq!(
            values,
            [
                SqlValue::Text("sess_1".to_owned()),
                SqlValue::Integer(5),
                SqlValue::Text("2026-05-06T07:08:09.001234Z".to_owned())
            ]
        );
    }

    #[test]
    fn stored_times_sort_as_text_in_time_order() {
        let start = Utc.with_ymd_and_hms(1999, 12, 31, 23, 59, 59).single().expect("a time");
        let times: Vec<DateTime<Utc>> = [0, 1, 999_999, 1_000_000, 86_400_000_000]
            .into_iter()
            .map(|micros| start + chrono::Duration::microseconds(micros))
            .collect();
        let texts: Vec<String> = times.iter().copied().map(time_text).collect();
        assert!(texts.windows(2).all(|pair| pair[0] < pair[1]), "{texts:?}");
        assert!(texts.iter().all(|text| text.len() == texts[0].len()), "{texts:?}");
        for (text, at) in texts.iter().zip(&times) {
            assert_eq!(decode::parse_time_text(text).as_ref(), Ok(at));
        }
    }
}
