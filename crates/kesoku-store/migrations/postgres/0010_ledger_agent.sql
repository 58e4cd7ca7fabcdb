-- Kesoku store, schema version 10 (PostgreSQL): the ledger records which configured agent
-- (`[[agents]]` name) ran an activation; NULL for the default agent.
ALTER TABLE activations ADD COLUMN agent TEXT;
