//! Rows read from disk turned into Kesoku values, every surprise a typed error.
//!
//! A row may hold anything an operator or another program wrote: an unknown status, metadata
//! that is not JSON, a negative step. Each becomes [`StoreError::Corrupt`] naming the table, the
//! row's id and the bad value; nothing here panics or guesses. Writing is not done here.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use kesoku_core::{DeliveryRecord, FollowUp, Job, LedgerEntry, Message, Metadata, Session, UnknownValue, Usage};
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
    /// A metadata column (SQLite: JSON text, parsed straight into [`Metadata`]; PostgreSQL:
    /// `jsonb`, through [`metadata_from_value`]).
    fn opt_metadata(&self, column: &'static str) -> Result<Option<Metadata>, String>;
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
        Self::keyed(row, table, "id")
    }

    /// Start reading a row of `table` named in errors by `key_column` (which comes first).
    pub fn keyed(row: &'r R, table: &'static str, key_column: &'static str) -> StoreResult<Self> {
        let corrupt = |reason: String| StoreError::Corrupt { table, id: "?".to_owned(), reason };
        let id = row
            .opt_text(key_column)
            .map_err(|reason| corrupt(format!("column `{key_column}` cannot be read: {reason}")))?
            .ok_or_else(|| corrupt(format!("column `{key_column}` is null")))?;
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

    /// A nullable integer column that must fit `T` when set (pids, exit codes).
    pub fn opt_narrow<T: TryFrom<i64>>(&self, column: &'static str) -> StoreResult<Option<T>> {
        self.cell(column, self.row.opt_int(column))?
            .map(|value| {
                T::try_from(value).map_err(|_| self.corrupt(format!("column `{column}` holds {value}, out of range")))
            })
            .transpose()
    }

    fn metadata(&self) -> StoreResult<Metadata> {
        Ok(self.cell("metadata", self.row.opt_metadata("metadata"))?.unwrap_or_default())
    }
}

/// Parse a stored UTC time text (SQLite): the fixed-width form the store writes
/// (`YYYY-MM-DDTHH:MM:SS.ffffffZ`) directly, anything else as RFC 3339.
pub(crate) fn parse_time_text(text: &str) -> Result<DateTime<Utc>, String> {
    if let Some(at) = parse_fixed_time(text.as_bytes()) {
        return Ok(at);
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|error| format!("`{}` is not a time ({error})", excerpt(text)))
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ`, or `None` for any other shape (or an impossible date).
fn parse_fixed_time(text: &[u8]) -> Option<DateTime<Utc>> {
    if text.len() != 27
        || text[4] != b'-'
        || text[7] != b'-'
        || text[10] != b'T'
        || text[13] != b':'
        || text[16] != b':'
        || text[19] != b'.'
        || text[26] != b'Z'
    {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<u32> {
        text[range]
            .iter()
            .try_fold(0u32, |total, &digit| digit.is_ascii_digit().then(|| total * 10 + u32::from(digit - b'0')))
    };
    let date = chrono::NaiveDate::from_ymd_opt(i32::try_from(number(0..4)?).ok()?, number(5..7)?, number(8..10)?)?;
    let time =
        chrono::NaiveTime::from_hms_micro_opt(number(11..13)?, number(14..16)?, number(17..19)?, number(20..26)?)?;
    Some(date.and_time(time).and_utc())
}

/// Parse stored metadata JSON text straight into [`Metadata`] (SQLite).
pub(crate) fn parse_metadata_text(text: &str) -> Result<Metadata, String> {
    if text == "{}" || text == "null" {
        return Ok(Metadata::default());
    }
    serde_json::from_str(text).map_err(|error| match serde_json::from_str::<Value>(text) {
        Ok(value) => misfit(&error, &value),
        Err(_) => format!("`{}` is not JSON ({error})", excerpt(text)),
    })
}

/// A stored metadata value read as [`Metadata`] (PostgreSQL).
pub(crate) fn metadata_from_value(value: Value) -> Result<Metadata, String> {
    if value.is_null() || value.as_object().is_some_and(serde_json::Map::is_empty) {
        return Ok(Metadata::default());
    }
    // Read from a borrow, so the value is still there to quote when it does not fit.
    serde::Deserialize::deserialize(&value).map_err(|error| misfit(&error, &value))
}

/// The reason given for JSON that is not kesoku metadata.
fn misfit(error: &serde_json::Error, value: &Value) -> String {
    format!("does not fit kesoku metadata ({error}): `{}`", excerpt(&value.to_string()))
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
        agent: cells.opt_text("agent")?,
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

/// Read a delivery record row (the columns of [`crate::sql::DELIVERY_COLUMNS`]).
pub(crate) fn delivery_record<R: BackendRow>(row: &R) -> StoreResult<DeliveryRecord> {
    let cells = Cells::keyed(row, "deliveries", "message_id")?;
    Ok(DeliveryRecord {
        message_id: cells.id().into(),
        part: cells.unsigned("part")?,
        platform_message_id: cells.text("platform_message_id")?,
        recorded_at: cells.time("recorded_at")?,
    })
}

/// Read a follow-up row (the columns of [`crate::sql::FOLLOWUP_COLUMNS`]).
pub(crate) fn followup<R: BackendRow>(row: &R) -> StoreResult<FollowUp> {
    let cells = Cells::new(row, "followups")?;
    Ok(FollowUp {
        id: cells.id().into(),
        session_id: cells.text("session_id")?.into(),
        chatbot_id: cells.text("chatbot_id")?,
        channel_id: cells.text("channel_id")?,
        task: cells.text("task")?,
        due_at: cells.time("due_at")?,
        created_at: cells.time("created_at")?,
        created_by: cells.opt_text("created_by")?.map(Into::into),
        state: cells.parse("state")?,
        settled_at: cells.opt_time("settled_at")?,
    })
}

/// Read a background job row (the columns of [`crate::sql::JOB_COLUMNS`]).
pub(crate) fn job<R: BackendRow>(row: &R) -> StoreResult<Job> {
    let cells = Cells::new(row, "jobs")?;
    Ok(Job {
        id: cells.id().into(),
        session_id: cells.text("session_id")?.into(),
        chatbot_id: cells.text("chatbot_id")?,
        channel_id: cells.text("channel_id")?,
        message_id: cells.text("message_id")?.into(),
        command: cells.text("command")?,
        pid: cells.opt_narrow("pid")?,
        stdout_path: cells.text("stdout_path")?,
        stderr_path: cells.text("stderr_path")?,
        state: cells.parse("state")?,
        exit_code: cells.opt_narrow("exit_code")?,
        detail: cells.opt_text("detail")?,
        started_at: cells.time("started_at")?,
        finished_at: cells.opt_time("finished_at")?,
    })
}

/// A count for an integer column: values beyond `i64::MAX` (never reached in practice) are
/// stored as `i64::MAX` rather than failing the write.
pub(crate) fn count(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn stored_times_parse_on_the_fast_path_and_others_still_parse() {
        let at = Utc.with_ymd_and_hms(2026, 12, 3, 14, 5, 9).single().expect("a time")
            + chrono::Duration::microseconds(123_456);
        assert_eq!(parse_fixed_time(b"2026-12-03T14:05:09.123456Z"), Some(at));
        assert_eq!(parse_time_text("2026-12-03T14:05:09.123456Z"), Ok(at));
        // Other RFC 3339 shapes (another writer, an older version) take the general parser.
        assert_eq!(parse_fixed_time(b"2026-12-03T15:05:09.123456+01:00"), None);
        assert_eq!(parse_time_text("2026-12-03T15:05:09.123456+01:00"), Ok(at));
        // Impossible dates and stray characters are errors, not panics or guesses.
        assert_eq!(parse_fixed_time(b"2026-02-30T14:05:09.123456Z"), None);
        assert!(parse_time_text("2026-02-30T14:05:09.123456Z").is_err());
        assert!(parse_time_text("2026-12-03T14:05:0x.123456Z").is_err());
        assert!(parse_time_text("2026-12-03T24:05:09.123456Z").is_err());
    }

    #[test]
    fn metadata_text_keeps_known_and_unknown_keys() {
        let metadata = parse_metadata_text(
            r#"{"tool_name":"read_file","tool_arguments":{"path":"a"},"tool_error":null,"wechat_cronjob":true}"#,
        )
        .expect("metadata");
        assert_eq!(metadata.tool_name.as_deref(), Some("read_file"));
        assert_eq!(metadata.tool_arguments, Some(serde_json::json!({"path": "a"})));
        assert_eq!(metadata.tool_error, None);
        assert_eq!(metadata.extra.get("wechat_cronjob"), Some(&Value::Bool(true)));
        // The same text through a JSON value gives the same metadata.
        let via_value = Metadata::from_value(serde_json::json!({
            "tool_name": "read_file", "tool_arguments": {"path": "a"}, "tool_error": null, "wechat_cronjob": true
        }))
        .expect("metadata");
        assert_eq!(metadata, via_value);
        assert_eq!(parse_metadata_text("{}"), Ok(Metadata::default()));
        let wrong_type = parse_metadata_text(r#"{"tool_name":7}"#).expect_err("a number is not a tool name");
        assert!(wrong_type.contains("does not fit kesoku metadata"), "{wrong_type}");
        let not_json = parse_metadata_text("{oops").expect_err("not JSON");
        assert!(not_json.contains("is not JSON"), "{not_json}");
    }
}
