-- Version 13: the indexes of 013_split_ready_index.pre.sql (the runnable rows without a fair tag,
-- in time order; those with one, in fair order; a key's runnable rows by tag), which the migrator
-- builds before this step. Nothing else changes.
-- readers: 11
-- (The library that knows version 11 runs against it: instances_ready and instances_fair_last,
-- which it reads, stay until version 14.)
SELECT 1;
