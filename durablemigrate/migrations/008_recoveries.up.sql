-- Version 8: crashes are not the step's fault. A claim lost to its worker's crash or stall (its
-- lease ran out, and the reaper or the worker's own restart released it) no longer costs the
-- instance an attempt: the release gives the attempt back and counts a recovery instead, which
-- has a bound of its own (ReaperConfig.MaxRecoveries).
--
-- An expand-only migration (README.md): a column with a constant default, which the library that
-- knows version 7 neither reads nor writes (its reapers keep charging lost claims to attempts
-- until they are replaced).
--
-- Locks: ADD COLUMN with a constant default changes the catalog only (no table rewrite), under a
-- brief ACCESS EXCLUSIVE lock on instances; the lock timeout bounds how long it may wait for one.
SET LOCAL lock_timeout = '10s';

-- How many claims of the current step were lost to a crashed or stalled worker, and released:
-- like attempt, it counts the current step's, and progress resets it.
ALTER TABLE {schema}.instances ADD COLUMN recoveries integer NOT NULL DEFAULT 0 CHECK (recoveries >= 0);
