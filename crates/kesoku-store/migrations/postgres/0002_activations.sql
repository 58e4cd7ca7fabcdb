-- Kesoku store, schema version 2 (PostgreSQL): the execution ledger, one row per activation.

CREATE TABLE activations (
    id              TEXT        NOT NULL PRIMARY KEY,
    kind            TEXT        NOT NULL,
    lane            TEXT        NOT NULL,
    session_id      TEXT        NOT NULL,
    message_id      TEXT,
    triggered_by    TEXT        NOT NULL,
    delegation_user TEXT,
    depth           BIGINT      NOT NULL,
    enqueued_at     TIMESTAMPTZ NOT NULL,
    started_at      TIMESTAMPTZ,
    finished_at     TIMESTAMPTZ,
    outcome         TEXT,
    error           TEXT,
    model_calls     BIGINT      NOT NULL DEFAULT 0,
    tool_calls      BIGINT      NOT NULL DEFAULT 0,
    input_tokens    BIGINT      NOT NULL DEFAULT 0,
    output_tokens   BIGINT      NOT NULL DEFAULT 0
);

CREATE INDEX activations_session ON activations (session_id);
CREATE INDEX activations_enqueued ON activations (enqueued_at);
CREATE INDEX activations_outcome ON activations (outcome);
