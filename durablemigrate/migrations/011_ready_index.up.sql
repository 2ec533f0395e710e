-- Version 11: the indexes of 011_ready_index.pre.sql (the pick's, with the fair order; a key's
-- last tagged row), which the migrator builds before this step. Nothing else changes.
-- readers: 9
-- (The library that knows version 9 runs against it: it neither reads nor writes what 10 and 11
-- add.)
SELECT 1;
