//! SQL text both backends share: column lists and the builder for filtered queries.
//!
//! Both engines accept `$n` placeholders, so a query assembled here runs on either; values
//! travel as [`Arg`]s that each backend binds in its own types (SQLite stores times as text,
//! PostgreSQL as `timestamptz`). Only placeholders carry values: nothing a caller passes is
//! ever spliced into SQL text. Backend-specific statements live with their backend.

use chrono::{DateTime, Utc};
use kesoku_core::{FollowUpFilter, JobFilter, MessageFilter, Role, SessionId, Status};

/// Message columns read back by every message query (unqualified).
pub(crate) const MESSAGE_COLUMNS: &str = "id, session_id, parent_id, chatbot_id, channel_id, sender, role, type, \
     content, status, metadata, step, created_at, updated_at, rev, created_rev";

/// [`MESSAGE_COLUMNS`] qualified with the alias `m`, for joins.
pub(crate) const MESSAGE_COLUMNS_M: &str = "m.id, m.session_id, m.parent_id, m.chatbot_id, m.channel_id, m.sender, \
     m.role, m.type, m.content, m.status, m.metadata, m.step, m.created_at, m.updated_at, m.rev, m.created_rev";

pub(crate) const SESSION_COLUMNS: &str = "id, chatbot_id, channel_id, title, created_at, updated_at";

pub(crate) const SESSION_COLUMNS_S: &str = "s.id, s.chatbot_id, s.channel_id, s.title, s.created_at, s.updated_at";

pub(crate) const LEDGER_COLUMNS: &str = "id, kind, lane, session_id, message_id, triggered_by, delegation_user, \
     depth, enqueued_at, started_at, finished_at, outcome, error, model_calls, tool_calls, input_tokens, \
     output_tokens, agent";

pub(crate) const DELIVERY_COLUMNS: &str = "message_id, part, platform_message_id, recorded_at";

pub(crate) const FOLLOWUP_COLUMNS: &str =
    "id, session_id, chatbot_id, channel_id, task, due_at, created_at, created_by, state, settled_at";

pub(crate) const JOB_COLUMNS: &str = "id, session_id, chatbot_id, channel_id, message_id, command, pid, stdout_path, \
     stderr_path, state, exit_code, detail, started_at, finished_at";

/// The `error` of an activation row with the note `$2` added: the note alone when the row has
/// no error, else after `; `. Both engines take this text (`||` concatenates in each).
pub(crate) const ERROR_WITH_NOTE: &str =
    "CASE WHEN error IS NULL OR error = '' THEN CAST($2 AS TEXT) ELSE error || '; ' || CAST($2 AS TEXT) END";

/// The statuses of waiting and running work, word for word the condition of the partial index
/// `messages_open` (migration 4: `WHERE status IN` this). A query that also names it literally
/// lets the planner use that index although its own statuses are bound parameters.
pub(crate) const OPEN_STATUSES: &str = "('pending_agent', 'processing')";

/// A value bound to a placeholder.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    Text(String),
    Int(i64),
    Time(DateTime<Utc>),
}

/// SQL text with numbered placeholders and the values that go with them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query {
    pub text: String,
    pub args: Vec<Arg>,
}

impl Query {
    pub fn new(text: &str) -> Self {
        Query { text: text.to_owned(), args: Vec::new() }
    }

    /// Text that already holds placeholders `$1..$n` for `args`.
    pub fn with_args(text: &str, args: Vec<Arg>) -> Self {
        Query { text: text.to_owned(), args }
    }

    pub fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Append a placeholder for `arg`.
    pub fn arg(&mut self, arg: Arg) -> &mut Self {
        self.args.push(arg);
        self.text.push('$');
        self.text.push_str(&self.args.len().to_string());
        self
    }

    /// ` AND column = $n`.
    pub fn and_eq(&mut self, column: &str, arg: Arg) -> &mut Self {
        self.push(" AND ").push(column).push(" = ").arg(arg)
    }

    /// ` AND column IN ($n, …)`; nothing when `values` is empty (an empty list means "any").
    pub fn and_in(&mut self, column: &str, values: impl IntoIterator<Item = &'static str>) -> &mut Self {
        let mut values = values.into_iter().peekable();
        if values.peek().is_none() {
            return self;
        }
        self.push(" AND ").push(column).push(" IN (");
        let mut first = true;
        for value in values {
            if !first {
                self.push(", ");
            }
            first = false;
            self.arg(Arg::Text(value.to_owned()));
        }
        self.push(")")
    }

    /// The conditions of a message filter (not its limit), on columns qualified by `prefix`.
    pub fn message_filter(&mut self, filter: &MessageFilter, prefix: &str) -> &mut Self {
        let column = |name: &str| format!("{prefix}{name}");
        if let Some(session_id) = &filter.session_id {
            self.and_eq(&column("session_id"), Arg::Text(session_id.as_str().to_owned()));
        }
        if let Some(chatbot_id) = &filter.chatbot_id {
            self.and_eq(&column("chatbot_id"), Arg::Text(chatbot_id.clone()));
        }
        if let Some(channel_id) = &filter.channel_id {
            self.and_eq(&column("channel_id"), Arg::Text(channel_id.clone()));
        }
        self.and_in(&column("status"), filter.statuses.iter().map(|s| s.as_str()));
        if !filter.statuses.is_empty()
            && filter.statuses.iter().all(|s| matches!(s, Status::PendingAgent | Status::Processing))
        {
            // Lets the planner use the partial index `messages_open` (see OPEN_STATUSES).
            self.push(" AND ").push(&column("status")).push(" IN ").push(OPEN_STATUSES);
        }
        self.and_in(&column("role"), filter.roles.iter().map(|r| r.as_str()));
        self.and_in(&column("type"), filter.types.iter().map(|t| t.as_str()));
        self
    }

    /// ` LIMIT $n` when there is a limit.
    pub fn limit(&mut self, limit: Option<u32>) -> &mut Self {
        match limit {
            Some(limit) => self.push(" LIMIT ").arg(Arg::Int(i64::from(limit))),
            None => self,
        }
    }
}

/// The query of `Store::list_messages`.
pub(crate) fn list_query(filter: &MessageFilter) -> Query {
    let mut query = Query::new(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE 1 = 1"));
    query.message_filter(filter, "").push(" ORDER BY seq").limit(filter.limit);
    query
}

/// The query of `Store::recent_messages`: the newest `limit` matches, read back oldest first.
pub(crate) fn recent_query(filter: &MessageFilter, limit: u32) -> Query {
    let mut query =
        Query::new(&format!("SELECT {MESSAGE_COLUMNS} FROM (SELECT {MESSAGE_COLUMNS}, seq FROM messages WHERE 1 = 1"));
    query.message_filter(filter, "").push(" ORDER BY seq DESC").limit(Some(limit)).push(") AS recent ORDER BY seq");
    query
}

/// The query of `Store::list_followups`: soonest due first, ties in the order they were stored.
pub(crate) fn followups_query(filter: &FollowUpFilter) -> Query {
    let mut query = Query::new(&format!("SELECT {FOLLOWUP_COLUMNS} FROM followups WHERE 1 = 1"));
    if let Some(session_id) = &filter.session_id {
        query.and_eq("session_id", Arg::Text(session_id.as_str().to_owned()));
    }
    if let Some(state) = filter.state {
        query.and_eq("state", Arg::Text(state.as_str().to_owned()));
    }
    if let Some(due_by) = filter.due_by {
        query.push(" AND due_at <= ").arg(Arg::Time(due_by));
    }
    query.push(" ORDER BY due_at, seq").limit(filter.limit);
    query
}

/// The query of `Store::list_jobs`: newest started first, ties newest stored first.
pub(crate) fn jobs_query(filter: &JobFilter) -> Query {
    let mut query = Query::new(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE 1 = 1"));
    if let Some(session_id) = &filter.session_id {
        query.and_eq("session_id", Arg::Text(session_id.as_str().to_owned()));
    }
    if let Some(state) = filter.state {
        query.and_eq("state", Arg::Text(state.as_str().to_owned()));
    }
    query.push(" ORDER BY started_at DESC, seq DESC").limit(filter.limit);
    query
}

/// The query of `Store::newest_per_channel`: the last row (by `seq`) per channel of a chatbot's
/// messages of one role since a time.
pub(crate) fn newest_per_channel_query(chatbot_id: &str, role: Role, since: DateTime<Utc>) -> Query {
    Query::with_args(
        &format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE seq IN (SELECT MAX(seq) FROM messages \
             WHERE chatbot_id = $1 AND role = $2 AND created_at >= $3 GROUP BY channel_id) ORDER BY seq"
        ),
        vec![Arg::Text(chatbot_id.to_owned()), Arg::Text(role.as_str().to_owned()), Arg::Time(since)],
    )
}

/// The query of `Store::orphaned_tool_calls`: tool calls without a result (of one session, or
/// all). It names `r.type = 'tool_result'`, the condition of the partial index
/// `messages_result_of`.
pub(crate) fn orphaned_calls_query(session_id: Option<&SessionId>) -> Query {
    let mut query = Query::new(&format!(
        "SELECT {MESSAGE_COLUMNS_M} FROM messages m WHERE m.type = 'tool_call' \
         AND NOT EXISTS (SELECT 1 FROM messages r WHERE r.parent_id = m.id AND r.type = 'tool_result')"
    ));
    if let Some(session_id) = session_id {
        query.and_eq("m.session_id", Arg::Text(session_id.as_str().to_owned()));
    }
    query.push(" ORDER BY m.seq");
    query
}

#[cfg(test)]
mod tests {
    use kesoku_core::{Role, SessionId, Status};

    use super::*;

    #[test]
    fn filter_becomes_placeholders_only() {
        let filter = MessageFilter::session(&SessionId::from("s'; DROP TABLE messages; --"))
            .with_statuses(&[Status::Pending, Status::Responded])
            .with_roles(&[Role::Tool])
            .with_types(&[])
            .with_limit(5);
        let mut query = Query::new("SELECT 1 FROM messages m WHERE 1 = 1");
        query.message_filter(&filter, "m.").limit(filter.limit);
        assert_eq!(
            query.text,
            "SELECT 1 FROM messages m WHERE 1 = 1 AND m.session_id = $1 AND m.status IN ($2, $3) \
             AND m.role IN ($4) LIMIT $5"
        );
        assert_eq!(query.args.len(), 5);
        assert_eq!(query.args[0], Arg::Text("s'; DROP TABLE messages; --".to_owned()));
        assert_eq!(query.args[4], Arg::Int(5));
    }

    #[test]
    fn filters_on_open_work_name_the_open_work_index_condition() {
        let open = MessageFilter::default().with_statuses(&[Status::PendingAgent]);
        let mut query = Query::new("SELECT 1 FROM messages WHERE 1 = 1");
        query.message_filter(&open, "");
        assert_eq!(
            query.text,
            "SELECT 1 FROM messages WHERE 1 = 1 AND status IN ($1) AND status IN ('pending_agent', 'processing')"
        );
        // Any other status may be outside the index: no condition added.
        let mixed = MessageFilter::default().with_statuses(&[Status::Processing, Status::Processed]);
        let mut query = Query::new("SELECT 1 FROM messages WHERE 1 = 1");
        query.message_filter(&mixed, "");
        assert!(!query.text.contains(OPEN_STATUSES), "{}", query.text);
        // The condition is the index's, word for word, and names the statuses' stored names.
        for migration in [
            include_str!("../migrations/sqlite/0004_open_work_index.sql"),
            include_str!("../migrations/postgres/0004_open_work_index.sql"),
        ] {
            assert!(migration.contains(&format!("WHERE status IN {OPEN_STATUSES};")), "{migration}");
        }
        assert_eq!(OPEN_STATUSES, format!("('{}', '{}')", Status::PendingAgent.as_str(), Status::Processing.as_str()));
    }
}
