-- Version 7: the index of 007_paused_index.pre.sql (the paused instances), which the migrator
-- builds before this step. Nothing else changes.
SELECT 1;
