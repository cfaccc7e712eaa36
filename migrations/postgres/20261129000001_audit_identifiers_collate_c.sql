-- Subjects, their kinds and client addresses are identifiers, looked up by
-- equality: they compare bytewise ("C"). Under a login flood every refused
-- login's row goes into the two indexes keyed by them (audit_events_subject,
-- audit_events_ip), and under a linguistic collation (en_US.UTF-8, ICU)
-- each comparison of an index descent is a strcoll() on copies of both
-- strings (in "C" a row costs 0.60x the instructions it does in en_US.UTF-8).
-- The rows are not rewritten; those two indexes are rebuilt, under a lock
-- that holds the writers back meanwhile (the journal keeps their events).
-- Waiting for that lock behind a long query would hold every insert queued
-- behind the wait: give up instead, and the writer migrates again later.
SET LOCAL lock_timeout = '10s';

ALTER TABLE audit_events
    ALTER COLUMN subject_kind TYPE TEXT COLLATE "C",
    ALTER COLUMN subject      TYPE TEXT COLLATE "C",
    ALTER COLUMN ip           TYPE TEXT COLLATE "C";

-- A day's table that a retention cut detached and died before dropping is
-- no partition, so the statement above left it alone; it is attached again
-- when its day is wanted, which needs the same collations.
DO $$
DECLARE
    orphan TEXT;
BEGIN
    FOR orphan IN
        SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND c.relkind = 'r'
           AND c.relname LIKE 'audit\_events\_p%'
           AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
    LOOP
        EXECUTE format('ALTER TABLE %I
            ALTER COLUMN subject_kind TYPE TEXT COLLATE "C",
            ALTER COLUMN subject      TYPE TEXT COLLATE "C",
            ALTER COLUMN ip           TYPE TEXT COLLATE "C"', orphan);
    END LOOP;
END
$$;
