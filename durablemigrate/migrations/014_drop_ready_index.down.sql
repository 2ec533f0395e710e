-- Back to version 13: instances_ready and instances_fair_last are built again (plainly, in the
-- down's transaction: writers wait for the builds, about a second per million runnable rows).
-- Every instance stays.
SET LOCAL lock_timeout = '10s';
CREATE INDEX IF NOT EXISTS instances_ready ON {schema}.instances (queue, priority, fair_tag, scheduled_at, id)
  WHERE status = 'available';
CREATE INDEX IF NOT EXISTS instances_fair_last ON {schema}.instances (fair_key, queue, priority, fair_tag)
  WHERE status = 'available' AND fair_tag IS NOT NULL;
