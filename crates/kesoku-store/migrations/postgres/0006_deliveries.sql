-- Kesoku store, schema version 6 (PostgreSQL): delivery records, one row per part of a message
-- sent to a platform, and an index for the ledger's delivery-failure note.
--
-- The first record of a part is kept (the store inserts with ON CONFLICT DO NOTHING): a retried
-- delivery that sent the part again under the same idempotency key got the same platform message.
-- No foreign key to `messages`: a record describes what a platform holds, and stays true even if
-- its message is ever removed from the store.

CREATE TABLE deliveries (
    message_id          TEXT        NOT NULL,
    part                BIGINT      NOT NULL,
    platform_message_id TEXT        NOT NULL,
    recorded_at         TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (message_id, part)
);

-- A failed delivery is noted on the activation rows of the turn's root message.
CREATE INDEX activations_message ON activations (message_id);
