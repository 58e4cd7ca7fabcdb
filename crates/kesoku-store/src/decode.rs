//! Rows read from disk turned into Kesoku values, every surprise a typed error.
//!
//! A row may hold anything an operator or another program wrote: an unknown status, metadata
//! that is not JSON, a negative step. Each becomes [`StoreError::Corrupt`] naming the table, the
//! row's id and the bad value; nothing here panics or guesses. Writing is not done here.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use kesoku_core::{LedgerEntry, Message, Metadata, Session, UnknownValue, Usage};
use serde_json::Value;

use crate::error::{StoreError, StoreResult};

/// The longest excerpt of a bad value quoted in an error.
const EXCERPT_CHARS: usize = 80;

/// A message row: the message and its two revisions.
#[derive(Debug, Clone)]
pub(crate) struct StoredMessage {
    pub message: Message,
    pub rev: i64,
    pub created_rev: i64,
}

/// How a backend reads one cell. Errors are the reason, in words; [`Cells`] adds the table
/// and row id.
pub(crate) trait BackendRow {
    fn opt_text(&self, column: &'static str) -> Result<Option<String>, String>;
    /// Like [`BackendRow::opt_text`], borrowed when the backend can (for values that are parsed
    /// rather than kept: enum names, times).
    fn opt_str(&self, column: &'static str) -> Result<Option<std::borrow::Cow<'_, str>>, String> {
        self.opt_text(column).map(|text| text.map(std::borrow::Cow::Owned))
    }
    fn opt_int(&self, column: &'static str) -> Result<Option<i64>, String>;
    fn opt_time(&self, column: &'static str) -> Result<Option<DateTime<Utc>>, String>;
    fn opt_json(&self, column: &'static str) -> Result<Option<Value>, String>;
}

/// One row being read, with what errors need to name it.
pub(crate) struct Cells<'r, R> {
    row: &'r R,
    table: &'static str,
    id: String,
}

impl<'r, R: BackendRow> Cells<'r, R> {
    /// The claim of a `(status, claimed_by, claimed_at)` row: only a `processing` message has one.
    pub fn claim(&self) -> StoreResult<Option<crate::Claim>> {
        let status: kesoku_core::Status = self.parse("status")?;
        let claimed_by = self.opt_text("claimed_by")?;
        let claimed_at = self.opt_time("claimed_at")?;
        Ok(match (status, claimed_by, claimed_at) {
            (kesoku_core::Status::Processing, Some(claimed_by), Some(claimed_at)) => {
                Some(crate::Claim { claimed_by, claimed_at })
            }
            _ => None,
        })
    }

    /// Start reading a row of `table`; its `id` column comes first, for the errors.
    pub fn new(row: &'r R, table: &'static str) -> StoreResult<Self> {
        let corrupt = |reason: String| StoreError::Corrupt { table, id: "?".to_owned(), reason };
        let id = row
            .opt_text("id")
            .map_err(|reason| corrupt(format!("column `id` cannot be read: {reason}")))?
            .ok_or_else(|| corrupt("column `id` is null".to_owned()))?;
        Ok(Cells { row, table, id })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn corrupt(&self, reason: String) -> StoreError {
        StoreError::Corrupt { table: self.table, id: self.id.clone(), reason }
    }

    fn cell<T>(&self, column: &'static str, read: Result<Option<T>, String>) -> StoreResult<Option<T>> {
        read.map_err(|reason| self.corrupt(format!("column `{column}` cannot be read: {reason}")))
    }

    fn required<T>(&self, column: &'static str, value: Option<T>) -> StoreResult<T> {
        value.ok_or_else(|| self.corrupt(format!("column `{column}` is null")))
    }

    pub fn opt_text(&self, column: &'static str) -> StoreResult<Option<String>> {
        self.cell(column, self.row.opt_text(column))
    }

    pub fn text(&self, column: &'static str) -> StoreResult<String> {
        let value = self.opt_text(column)?;
        self.required(column, value)
    }

    pub fn int(&self, column: &'static str) -> StoreResult<i64> {
        let value = self.cell(column, self.row.opt_int(column))?;
        self.required(column, value)
    }

    pub fn opt_time(&self, column: &'static str) -> StoreResult<Option<DateTime<Utc>>> {
        self.cell(column, self.row.opt_time(column))
    }

    pub fn time(&self, column: &'static str) -> StoreResult<DateTime<Utc>> {
        let value = self.opt_time(column)?;
        self.required(column, value)
    }

    /// A column holding one of an enum's wire names.
    pub fn parse<T: FromStr<Err = UnknownValue>>(&self, column: &'static str) -> StoreResult<T> {
        let text = self.cell(column, self.row.opt_str(column))?;
        let text = self.required(column, text)?;
        text.parse().map_err(|error: UnknownValue| self.corrupt(format!("column `{column}`: {error}")))
    }

    pub fn opt_parse<T: FromStr<Err = UnknownValue>>(&self, column: &'static str) -> StoreResult<Option<T>> {
        self.opt_text(column)?
            .map(|t| t.parse().map_err(|error: UnknownValue| self.corrupt(format!("column `{column}`: {error}"))))
            .transpose()
    }

    /// An integer column that must fit `T` (counts, steps, depths).
    pub fn unsigned<T: TryFrom<i64>>(&self, column: &'static str) -> StoreResult<T> {
        let value = self.int(column)?;
        T::try_from(value).map_err(|_| self.corrupt(format!("column `{column}` holds {value}, out of range")))
    }

    fn metadata(&self) -> StoreResult<Metadata> {
        let Some(value) = self.cell("metadata", self.row.opt_json("metadata"))? else {
            return Ok(Metadata::default());
        };
        if value.as_object().is_some_and(serde_json::Map::is_empty) {
            return Ok(Metadata::default());
        }
        let excerpt = excerpt(&value.to_string());
        Metadata::from_value(value).map_err(|error| {
            self.corrupt(format!("column `metadata` does not fit kesoku metadata ({error}): `{excerpt}`"))
        })
    }
}

/// Parse a stored UTC time text (SQLite).
pub(crate) fn parse_time_text(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|error| format!("`{}` is not a time ({error})", excerpt(text)))
}

/// Parse stored metadata JSON text (SQLite).
pub(crate) fn parse_json_text(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|error| format!("`{}` is not JSON ({error})", excerpt(text)))
}

/// The start of a bad value, for an error message.
pub(crate) fn excerpt(text: &str) -> String {
    if text.chars().count() <= EXCERPT_CHARS {
        text.to_owned()
    } else {
        let mut cut: String = text.chars().take(EXCERPT_CHARS).collect();
        cut.push('…');
        cut
    }
}

/// Read a message row (the columns of [`crate::sql::MESSAGE_COLUMNS`]).
pub(crate) fn message<R: BackendRow>(row: &R) -> StoreResult<StoredMessage> {
    let cells = Cells::new(row, "messages")?;
    let message = Message {
        id: cells.id().into(),
        session_id: cells.text("session_id")?.into(),
        parent_id: cells.opt_text("parent_id")?.map(Into::into),
        chatbot_id: cells.text("chatbot_id")?,
        channel_id: cells.text("channel_id")?,
        sender: cells.text("sender")?,
        role: cells.parse("role")?,
        message_type: cells.parse("type")?,
        content: cells.text("content")?,
        status: cells.parse("status")?,
        metadata: cells.metadata()?,
        step: cells.unsigned("step")?,
        created_at: Some(cells.time("created_at")?),
        updated_at: Some(cells.time("updated_at")?),
    };
    Ok(StoredMessage { message, rev: cells.int("rev")?, created_rev: cells.int("created_rev")? })
}

/// Read a session row.
pub(crate) fn session<R: BackendRow>(row: &R) -> StoreResult<Session> {
    let cells = Cells::new(row, "sessions")?;
    Ok(Session {
        id: cells.id().into(),
        chatbot_id: cells.text("chatbot_id")?,
        channel_id: cells.text("channel_id")?,
        title: cells.opt_text("title")?,
        created_at: cells.time("created_at")?,
        updated_at: cells.time("updated_at")?,
    })
}

/// Read a ledger row.
pub(crate) fn ledger_entry<R: BackendRow>(row: &R) -> StoreResult<LedgerEntry> {
    let cells = Cells::new(row, "activations")?;
    Ok(LedgerEntry {
        id: cells.id().into(),
        kind: cells.parse("kind")?,
        lane: cells.parse("lane")?,
        session_id: cells.text("session_id")?.into(),
        message_id: cells.opt_text("message_id")?.map(Into::into),
        triggered_by: cells.text("triggered_by")?,
        delegation_user: cells.opt_text("delegation_user")?,
        depth: cells.unsigned("depth")?,
        enqueued_at: cells.time("enqueued_at")?,
        started_at: cells.opt_time("started_at")?,
        finished_at: cells.opt_time("finished_at")?,
        outcome: cells.opt_parse("outcome")?,
        error: cells.opt_text("error")?,
        usage: Usage {
            model_calls: cells.unsigned("model_calls")?,
            tool_calls: cells.unsigned("tool_calls")?,
            input_tokens: cells.unsigned("input_tokens")?,
            output_tokens: cells.unsigned("output_tokens")?,
        },
    })
}

/// A count for an integer column: values beyond `i64::MAX` (never reached in practice) are
/// stored as `i64::MAX` rather than failing the write.
pub(crate) fn count(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
