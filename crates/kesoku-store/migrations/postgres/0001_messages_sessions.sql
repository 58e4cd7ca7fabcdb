-- Kesoku store, schema version 1 (PostgreSQL): messages, sessions, the channel -> active session map.
-- Tables are created in the first schema of the connection's search_path.

CREATE TABLE kesoku_schema_version (
    version     BIGINT      NOT NULL PRIMARY KEY,
    description TEXT        NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL
);

-- Revisions of message changes. CACHE 1 keeps `last_value` exact, which catch-up reads rely on.
CREATE SEQUENCE kesoku_message_rev AS BIGINT START 1 CACHE 1;

CREATE TABLE messages (
    id          TEXT        NOT NULL PRIMARY KEY,
    -- Insertion order.
    seq         BIGINT      GENERATED ALWAYS AS IDENTITY UNIQUE,
    session_id  TEXT        NOT NULL,
    parent_id   TEXT,
    chatbot_id  TEXT        NOT NULL,
    channel_id  TEXT        NOT NULL,
    sender      TEXT        NOT NULL,
    role        TEXT        NOT NULL,
    type        TEXT        NOT NULL,
    content     TEXT        NOT NULL,
    status      TEXT        NOT NULL,
    metadata    JSONB       NOT NULL DEFAULT '{}'::jsonb,
    step        BIGINT      NOT NULL DEFAULT 0,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    -- The root message of the turn: the parent's turn_id (same session), else the message itself.
    turn_id     TEXT        NOT NULL,
    -- Order inside a model step (kesoku_core::Phase).
    phase       BIGINT      NOT NULL,
    -- Revision of the latest change, and of the insert.
    rev         BIGINT      NOT NULL,
    created_rev BIGINT      NOT NULL,
    claimed_by  TEXT,
    claimed_at  TIMESTAMPTZ
);

CREATE INDEX messages_session_seq ON messages (session_id, seq);
CREATE INDEX messages_status ON messages (status);
CREATE UNIQUE INDEX messages_rev ON messages (rev);
CREATE INDEX messages_turn ON messages (turn_id);
CREATE INDEX messages_parent ON messages (parent_id);
CREATE INDEX messages_chatbot_status ON messages (chatbot_id, status);

CREATE TABLE sessions (
    id         TEXT        NOT NULL PRIMARY KEY,
    chatbot_id TEXT        NOT NULL,
    channel_id TEXT        NOT NULL,
    title      TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);

CREATE INDEX sessions_created ON sessions (created_at);
CREATE INDEX sessions_channel ON sessions (chatbot_id, channel_id, created_at);

CREATE TABLE channel_sessions (
    chatbot_id TEXT NOT NULL,
    channel_id TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    PRIMARY KEY (chatbot_id, channel_id)
);
