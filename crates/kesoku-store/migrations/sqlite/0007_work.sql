-- Kesoku store, schema version 7 (SQLite): work that outlives a turn. Follow-ups the agent
-- scheduled (`schedule_followup`) and background jobs (`run_shell_command` with `background`),
-- one row each, so both survive restarts. Neither is a message: no revision is taken.
--
-- `seq` is the order rows were stored in (the rowid), which breaks ties of equal times. A
-- state moves once, from `pending` (follow-ups) or `running` (jobs), by compare-and-set.

CREATE TABLE followups (
    seq        INTEGER PRIMARY KEY,
    id         TEXT    NOT NULL UNIQUE,
    session_id TEXT    NOT NULL,
    chatbot_id TEXT    NOT NULL,
    channel_id TEXT    NOT NULL,
    task       TEXT    NOT NULL,
    due_at     TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    -- The root message of the turn that scheduled it.
    created_by TEXT,
    -- pending | fired | cancelled
    state      TEXT    NOT NULL,
    settled_at TEXT
);

-- The scheduler's question: pending follow-ups due by now, soonest first.
CREATE INDEX followups_state_due ON followups (state, due_at, seq);
CREATE INDEX followups_session_due ON followups (session_id, due_at, seq);

CREATE TABLE jobs (
    seq         INTEGER PRIMARY KEY,
    id          TEXT    NOT NULL UNIQUE,
    session_id  TEXT    NOT NULL,
    chatbot_id  TEXT    NOT NULL,
    channel_id  TEXT    NOT NULL,
    -- The root message of the turn that started it.
    message_id  TEXT    NOT NULL,
    command     TEXT    NOT NULL,
    pid         INTEGER,
    stdout_path TEXT    NOT NULL,
    stderr_path TEXT    NOT NULL,
    -- running | exited | lost | cancelled
    state       TEXT    NOT NULL,
    exit_code   INTEGER,
    detail      TEXT,
    started_at  TEXT    NOT NULL,
    finished_at TEXT
);

-- Listing a session's jobs and the running ones (recovery after a restart), newest first.
CREATE INDEX jobs_session_started ON jobs (session_id, started_at, seq);
CREATE INDEX jobs_state_started ON jobs (state, started_at, seq);
