-- Kesoku store, schema version 4 (SQLite): fewer index pages written per message.
--
-- Every insert and status change writes one page per index it touches (to the log, then back to
-- the file). Three indexes served few queries:
-- - `messages_status` (status) held every message, but only waiting and running work
--   (`pending_agent`, `processing`) is ever looked up by status alone or by session and status
--   (intake, recovery, interrupt and steer checks). A partial index holds just those rows, so
--   thoughts, tool calls, results and answers never touch it. Queries name its condition
--   literally (`sql::OPEN_STATUSES`) so that SQLite may use it with bound parameters.
-- - `messages_session_seq` (session_id, seq): the history reads `messages_phased`, which also
--   leads with the session; a session's messages in insertion order are sorted from it.
-- - `messages_parent` (parent_id, every row) is only looked up for a tool call's result: a
--   partial index of tool results (`messages_result_of`) serves that lookup, and no other
--   message touches it.
-- Measured: a turn with one tool call, framework overhead p50 0.83 -> 0.73 ms (the first two).

DROP INDEX IF EXISTS messages_session_seq;
DROP INDEX IF EXISTS messages_status;
CREATE INDEX messages_open ON messages (status, session_id) WHERE status IN ('pending_agent', 'processing');
DROP INDEX IF EXISTS messages_parent;
CREATE INDEX messages_result_of ON messages (parent_id) WHERE type = 'tool_result';
