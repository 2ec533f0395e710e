-- Version 11's indexes, built concurrently on an existing schema (writers are not blocked while
-- they build). They need version 10's columns, hence a step of their own.
--
-- The pick's index from this version on: runnable rows of one queue and priority, those with a
-- fair tag first in tag order, then those without in time order (NULLs sort last), so that a pick
-- walks either part without reading the other. (instances_pick, which the pick no longer reads,
-- stays for the nodes of earlier libraries until a later migration drops it.)
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_ready ON {schema}.instances (queue, priority, fair_tag, scheduled_at, id)
  WHERE status = 'available';
-- A key's last tagged runnable row: where the next row of the key goes in the fair order. Only
-- rows with a fair tag are in it. The key comes first so that no read of a queue's head (which
-- names no key) can take this index for instances_ready when statistics are stale.
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_fair_last ON {schema}.instances (fair_key, queue, priority, fair_tag)
  WHERE status = 'available' AND fair_tag IS NOT NULL;
