-- Allow and block list entries added at run time (admin API and console),
-- shared by every instance; the config file's own entries are not stored.
CREATE TABLE list_entries (
    id            TEXT PRIMARY KEY,
    list          TEXT NOT NULL,  -- allow | block
    kind          TEXT NOT NULL,  -- ip | phone | user
    value         TEXT NOT NULL,  -- normalised: a CIDR, an E.164 number or a '+digits*' prefix, a user name
    note          TEXT NOT NULL DEFAULT '',
    created_at_ms BIGINT NOT NULL,
    UNIQUE (list, kind, value)
);
