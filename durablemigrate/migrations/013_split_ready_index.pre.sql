-- Version 13's indexes, built concurrently on an existing schema (writers are not blocked while
-- they build).
--
-- The runnable rows, split by whether they carry a fair tag, so that a queue whose rows have no
-- fairness key pays nothing for fairness. instances_ready (version 11) held both kinds in one
-- index, the untagged rows with a NULL tag column in every entry, and a pick had to probe it at
-- each priority to learn that a queue held no tagged row. Now the untagged rows are in
-- instances_pick's old shape, in time order; the tagged rows, in fair order, are in an index of
-- their own that a queue without keys leaves empty, so that one descent answers "any tagged row
-- in this queue?".
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_ready_untagged ON {schema}.instances (queue, priority, scheduled_at, id)
  WHERE status = 'available' AND fair_tag IS NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_ready_tagged ON {schema}.instances (queue, priority, fair_tag, scheduled_at, id)
  WHERE status = 'available' AND fair_tag IS NOT NULL;
-- A key's runnable rows, latest tag first (untagged ones last): where the key's next row goes in
-- the fair order. It replaces instances_fair_last, whose predicate (tagged rows) the probe of a
-- key's last row shared with instances_ready_tagged: on a table without statistics the planner
-- could take either, and through instances_ready_tagged the probe reads every tagged row of the
-- queue. The probe reads the key's rows whatever their tag (NULLS LAST), so only this index
-- answers it, and no read of the queue's tagged rows (which names no key) can take it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_fair_key ON {schema}.instances (fair_key, queue, priority, fair_tag DESC NULLS LAST)
  WHERE status = 'available' AND fair_key IS NOT NULL;
