-- Kesoku store, schema version 9 (PostgreSQL): grants, a person's connections to outside
-- services (a token set with `kesoku grants set USER NAME`), keyed by (user_id, name). Tools
-- read a secret at call time for the activation's delegation user; listings show names and
-- times only. Writing a grant takes no revision (it is not a message).

CREATE TABLE grants (
    user_id    TEXT        NOT NULL,
    name       TEXT        NOT NULL,
    secret     TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (user_id, name)
);
