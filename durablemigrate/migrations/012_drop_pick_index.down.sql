-- Back to version 11: instances_pick is built again (plainly, in the down's transaction: writers
-- wait for the build, about a second per million runnable rows). Every instance stays.
SET LOCAL lock_timeout = '10s';
CREATE INDEX IF NOT EXISTS instances_pick ON {schema}.instances (queue, priority, scheduled_at, id)
  WHERE status = 'available';
