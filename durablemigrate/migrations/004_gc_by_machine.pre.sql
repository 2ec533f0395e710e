-- Version 4's index, built concurrently on an existing schema (writers are not blocked while it
-- builds): finished rows by machine, in the order GC removes them, so that GC sweeps each
-- machine under its own retention by a range of this index, whatever the other machines keep.
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_finished_by_machine ON {schema}.instances (machine, finalized_at, id)
  WHERE status IN ('done', 'failed', 'cancelled');
