-- Kesoku store, schema version 1 (SQLite): messages, sessions, the channel -> active session map.
-- Timestamps are UTC text `YYYY-MM-DDTHH:MM:SS.ffffffZ` (fixed width, so text order is time order);
-- metadata is JSON text. Enum columns hold the spec's wire names.

CREATE TABLE kesoku_schema_version (
    version     INTEGER NOT NULL PRIMARY KEY,
    description TEXT    NOT NULL,
    applied_at  TEXT    NOT NULL
);

CREATE TABLE messages (
    -- Insertion order; the rowid.
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT    NOT NULL UNIQUE,
    session_id  TEXT    NOT NULL,
    parent_id   TEXT,
    chatbot_id  TEXT    NOT NULL,
    channel_id  TEXT    NOT NULL,
    sender      TEXT    NOT NULL,
    role        TEXT    NOT NULL,
    type        TEXT    NOT NULL,
    content     TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    metadata    TEXT    NOT NULL DEFAULT '{}',
    step        INTEGER NOT NULL DEFAULT 0,
    created_at  TEXT    NOT NULL,
    updated_at  TEXT    NOT NULL,
    -- The root message of the turn: the parent's turn_id (same session), else the message itself.
    turn_id     TEXT    NOT NULL,
    -- Order inside a model step (kesoku_core::Phase).
    phase       INTEGER NOT NULL,
    -- Revision of the latest change, and of the insert.
    rev         INTEGER NOT NULL,
    created_rev INTEGER NOT NULL,
    claimed_by  TEXT,
    claimed_at  TEXT
);

CREATE INDEX messages_session_seq ON messages (session_id, seq);
CREATE INDEX messages_status ON messages (status);
CREATE UNIQUE INDEX messages_rev ON messages (rev);
CREATE INDEX messages_turn ON messages (turn_id);
CREATE INDEX messages_parent ON messages (parent_id);
CREATE INDEX messages_chatbot_status ON messages (chatbot_id, status);

CREATE TABLE sessions (
    id         TEXT NOT NULL PRIMARY KEY,
    chatbot_id TEXT NOT NULL,
    channel_id TEXT NOT NULL,
    title      TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE INDEX sessions_created ON sessions (created_at);
CREATE INDEX sessions_channel ON sessions (chatbot_id, channel_id, created_at);

CREATE TABLE channel_sessions (
    chatbot_id TEXT NOT NULL,
    channel_id TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    PRIMARY KEY (chatbot_id, channel_id)
);
