-- Kesoku store, schema version 5 (SQLite): nothing to change. Version 5 gives PostgreSQL the
-- phased-order index SQLite has had since version 3. The backends share version numbers, so this
-- step exists and is empty.

SELECT 1;
