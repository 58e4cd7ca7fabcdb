-- Kesoku store, schema version 4 (SQLite): fewer index pages written per message.
--
-- Every insert and status change writes one page per index it touches (to the log, then back to
-- the file). Two indexes served few queries:
-- - `messages_status` (status) held every message, but only waiting and running work
--   (`pending_agent`, `processing`) is ever looked up by status alone or by session and status
--   (intake, recovery, interrupt and steer checks). A partial index holds just those rows, so
--   thoughts, tool calls, results and answers never touch it. Queries name its condition
--   literally (`sql::OPEN_STATUSES`) so that SQLite may use it with bound parameters.
-- - `messages_session_seq` (session_id, seq): the history reads `messages_phased`, which also
--   leads with the session; a session's messages in insertion order are sorted from it.
-- Measured: a turn with one tool call, framework overhead p50 0.83 -> 0.73 ms.

DROP INDEX IF EXISTS messages_session_seq;
DROP INDEX IF EXISTS messages_status;
CREATE INDEX messages_open ON messages (status, session_id) WHERE status IN ('pending_agent', 'processing');
