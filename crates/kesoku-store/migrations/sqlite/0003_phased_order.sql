-- Kesoku store, schema version 3 (SQLite): a session's history in phased order straight from an
-- index, with no join and no sort. `turn_seq` is the insertion order (`seq`) of the message's
-- turn root; the phased order is (turn_seq, step, phase, seq).

ALTER TABLE messages ADD COLUMN turn_seq INTEGER;

UPDATE messages SET turn_seq = COALESCE((SELECT r.seq FROM messages r WHERE r.id = messages.turn_id), seq);

CREATE INDEX messages_phased ON messages (session_id, turn_seq, step, phase, seq);

-- The history no longer joins on the turn root: its index only cost every insert an update.
DROP INDEX IF EXISTS messages_turn;
