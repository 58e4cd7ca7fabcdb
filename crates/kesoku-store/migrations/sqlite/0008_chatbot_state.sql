-- Kesoku store, schema version 8 (SQLite): what a chat platform adapter must remember across
-- restarts that is not a message (a long-poll cursor, the latest per-peer reply token), as
-- small text values keyed by (chatbot_id, key). Not secrets: tokens people paste live outside
-- the store. Writing a value takes no revision.

CREATE TABLE chatbot_state (
    chatbot_id TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (chatbot_id, key)
);
