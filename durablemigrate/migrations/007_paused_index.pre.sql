-- Version 7's index, built concurrently on an existing schema (writers are not blocked while it
-- builds): the paused instances, for listing them (List's Paused filter, `gendurable list
-- --paused`). It holds only rows paused now, so it stays tiny and costs a write only when a
-- pause or resume changes paused_at. (It needs version 6's column, hence a step of its own.)
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_paused ON {schema}.instances (id)
  WHERE paused_at IS NOT NULL;
