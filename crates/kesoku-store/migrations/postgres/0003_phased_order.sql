-- Kesoku store, schema version 3 (PostgreSQL): nothing to change. Version 3 gives SQLite an index
-- in phased order (`turn_seq`); PostgreSQL keeps ordering by its join. The backends share version
-- numbers, so this step exists and is empty.

SELECT 1;
