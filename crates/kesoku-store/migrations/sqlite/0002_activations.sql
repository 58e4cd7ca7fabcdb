-- Kesoku store, schema version 2 (SQLite): the execution ledger, one row per activation.

CREATE TABLE activations (
    id              TEXT    NOT NULL PRIMARY KEY,
    kind            TEXT    NOT NULL,
    lane            TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    message_id      TEXT,
    triggered_by    TEXT    NOT NULL,
    delegation_user TEXT,
    depth           INTEGER NOT NULL,
    enqueued_at     TEXT    NOT NULL,
    started_at      TEXT,
    finished_at     TEXT,
    outcome         TEXT,
    error           TEXT,
    model_calls     INTEGER NOT NULL DEFAULT 0,
    tool_calls      INTEGER NOT NULL DEFAULT 0,
    input_tokens    INTEGER NOT NULL DEFAULT 0,
    output_tokens   INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX activations_session ON activations (session_id);
CREATE INDEX activations_enqueued ON activations (enqueued_at);
CREATE INDEX activations_outcome ON activations (outcome);
