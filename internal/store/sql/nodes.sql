-- Statement family: the node registry (migration 2's nodes table): the running clients and what
-- each can run, for the operators' tools to tell which rows no running node can run (blocked).
-- Every statement touches the nodes table only (a row lock on the client's own row, or none).

-- A client's row at Start, or its refresh (seen_at) while it runs; the manifest is rewritten
-- too, so that a row deleted by mistake comes back whole. @machines is JSON text (a text
-- parameter, so that every exec mode sends it as text). It returns the schema's version and
-- readers (meta), so that a running client learns of a migration that left its schema behind.
-- Locks the client's own row; reads meta.
-- name: node_upsert
INSERT INTO {schema}.nodes (id, client, host, queues, machines)
VALUES (@id, @client, @host, @queues::text[], @machines::jsonb)
ON CONFLICT (id) DO UPDATE
SET client = excluded.client, host = excluded.host, queues = excluded.queues,
    machines = excluded.machines, seen_at = now()
RETURNING (SELECT value::int FROM {schema}.meta WHERE key = 'version'),
          (SELECT value::int FROM {schema}.meta WHERE key = 'readers');

-- A client's row at Stop. Locks that row.
-- name: node_delete
DELETE FROM {schema}.nodes WHERE id = @id;

-- Rows of nodes not seen for @gone_ms (killed processes never delete theirs). Locks those rows.
-- name: node_forget
DELETE FROM {schema}.nodes WHERE seen_at < now() - @gone_ms * interval '1 millisecond';

-- The nodes seen within @live_ms: the running ones. No locks.
-- name: nodes_live
SELECT id, client, host, queues, machines, started_at, seen_at
FROM {schema}.nodes
WHERE seen_at >= now() - @live_ms * interval '1 millisecond'
ORDER BY id;

-- The live rows grouped by what a node needs to run them: queue, machine, machine version and
-- step, for the blocked check. Reads every available, awaiting and joining row, through their
-- partial indexes (one arm each: a list of statuses would match none of them, and read the
-- whole table) with a heap visit each: O(live rows). No locks.
-- name: live_groups
SELECT queue, machine, machine_version, step, count(*), min(scheduled_at), min(id)
FROM (SELECT queue, machine, machine_version, step, scheduled_at, id FROM {schema}.instances
      WHERE status = 'available' AND fair_tag IS NULL
      UNION ALL
      SELECT queue, machine, machine_version, step, scheduled_at, id FROM {schema}.instances
      WHERE status = 'available' AND fair_tag IS NOT NULL
      UNION ALL
      SELECT queue, machine, machine_version, step, scheduled_at, id FROM {schema}.instances
      WHERE status IN ('awaiting', 'joining')) AS l
GROUP BY 1, 2, 3, 4
ORDER BY 1, 2, 3, 4;
