-- Kesoku store, schema version 5 (PostgreSQL): a session's history read in phased order from an
-- index, as SQLite has since version 3. The history query joined every message to its turn's root
-- (`turn_id` -> `seq`) and sorted: one primary-key lookup per message (10,000 for a 10,000-message
-- session) and a sort, ~2.5x the time of reading the rows themselves.
--
-- `turn_seq` is the insertion order (`seq`) of the message's turn root, so the phased order is
-- (turn_seq, step, phase, seq) and `messages_phased` serves it. A BEFORE INSERT trigger sets it,
-- for single inserts and batches alike: a row-level BEFORE trigger sees the rows its statement
-- inserted before, so a batch's children find their root. `seq` (an identity) is already
-- assigned when the trigger runs. The backfill rewrites every row once.

ALTER TABLE messages ADD COLUMN turn_seq BIGINT;
UPDATE messages m SET turn_seq = COALESCE((SELECT r.seq FROM messages r WHERE r.id = m.turn_id), m.seq);
ALTER TABLE messages ALTER COLUMN turn_seq SET NOT NULL;

CREATE FUNCTION kesoku_turn_seq() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.turn_seq := COALESCE((SELECT r.seq FROM messages r WHERE r.id = NEW.turn_id), NEW.seq);
    RETURN NEW;
END
$$;
CREATE TRIGGER messages_turn_seq BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION kesoku_turn_seq();

CREATE INDEX messages_phased ON messages (session_id, turn_seq, step, phase, seq);
