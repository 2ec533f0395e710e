-- Statement family: the operator's instance list (CLI `list`, the dashboard). Read-only, no
-- locks. Store.List assembles the statement: list_base, then one fragment per filter given (so
-- the planner sees only real predicates, and a prepared statement is planned for its own filter
-- set), then list_order. Keyset paging: a page is "ids below the last id of the previous page",
-- newest first, never OFFSET, so page 1,000 costs what page 1 does.
--
-- Cost: the primary key walked backwards, stopping after the page is full, so dense filters
-- (a queue, a machine, done rows) are cheap at any depth. Sparse ones have their own index:
-- failed or cancelled (instances_problems), awaiting or joining (instances_parked), a machine's
-- correlation key (instances_correlation), executing (instances_executing), paused (instances_paused). A filter on
-- inserted_at alone is not indexed: it prunes the walk, it does not shorten it.

-- fragment: list_base
SELECT id, machine, step, queue, status::text, attempt, max_attempts, coalesce(correlation_key, ''),
       scheduled_at, inserted_at, updated_at, parent_id, errors -> -1 ->> 'error'
FROM {schema}.instances
WHERE true

-- fragment: list_queue
  AND queue = @queue

-- fragment: list_machine
  AND machine = @machine

-- fragment: list_status
  AND status = ANY(@statuses::{schema}.status[])

-- fragment: list_key
  AND correlation_key = @key

-- fragment: list_since
  AND inserted_at >= @since

-- fragment: list_paused
  AND paused_at IS NOT NULL

-- fragment: list_before
  AND id < @before

-- fragment: list_order
ORDER BY id DESC
LIMIT @limit
