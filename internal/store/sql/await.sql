-- Statement family: the await bridge. Read-only, no locks: an answer is a snapshot of the row.

-- The watcher's probe: one statement per tick for every waiter on the node. $1 the ids waited
-- on, $2 whether a parked (awaiting) row is an answer for that id, $3 whether the row is wanted
-- whatever its status (a waiter's last read, at its deadline) (parallel arrays). It returns the
-- rows that settled (terminal, or parked where that counts), the rows wanted whole and, with a
-- NULL id, the ids that do not exist. An index probe per id on the primary key.
-- name: await_probe
SELECT w.id, i.id, i.machine, i.step, i.queue, i.status::text, i.priority, i.attempt, i.max_attempts, i.recoveries,
       i.scheduled_at, coalesce(i.locked_by, ''), i.locked_until, i.state, i.result, i.errors,
       coalesce(i.correlation_key, ''), i.await_names, i.await_deadline, i.parent_id, i.inserted_at,
       i.updated_at, i.finalized_at, i.path, i.machine_version, i.upgrades
FROM unnest($1::bigint[], $2::bool[], $3::bool[]) AS w(id, parked, whole)
LEFT JOIN {schema}.instances i ON i.id = w.id
WHERE i.id IS NULL
   OR w.whole
   OR i.status IN ('done', 'failed', 'cancelled')
   OR (w.parked AND i.status = 'awaiting');
