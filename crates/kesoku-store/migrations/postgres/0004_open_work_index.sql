-- Kesoku store, schema version 4 (PostgreSQL): `messages_status` (status) held every message,
-- but only waiting and running work (`pending_agent`, `processing`) is ever looked up by status
-- alone or by session and status. A partial index holds just those rows, so thoughts, tool
-- calls, results and answers never touch it. Queries name its condition literally
-- (`sql::OPEN_STATUSES`), which lets the planner use it with bound parameters.
-- `messages_parent` (parent_id, every row) is only looked up for a tool call's result: a partial
-- index of tool results (`messages_result_of`) serves it, and no other message touches it.
-- (`messages_session_seq` stays: PostgreSQL reads a session's history through it.)

DROP INDEX IF EXISTS messages_status;
CREATE INDEX messages_open ON messages (status, session_id) WHERE status IN ('pending_agent', 'processing');
DROP INDEX IF EXISTS messages_parent;
CREATE INDEX messages_result_of ON messages (parent_id) WHERE type = 'tool_result';
