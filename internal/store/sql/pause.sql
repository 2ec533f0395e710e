-- Statement family: pauses (migration 6). A paused queue or machine is a row of the pauses table,
-- which every running client reads every half second and its picks obey; a paused instance is
-- one whose paused_at is set, which every pick filters out (pick.sql: not_paused).

-- Pause a queue or a machine. Pausing what is already paused keeps the first pause's time, and
-- its reason unless this one gives one. Returns whether this call paused it. Locks the pause row.
-- name: pause_set
INSERT INTO {schema}.pauses (kind, name, reason, paused_by)
VALUES (@kind, @name, @reason, @by)
ON CONFLICT (kind, name) DO UPDATE
SET reason = CASE WHEN excluded.reason <> '' THEN excluded.reason ELSE pauses.reason END
RETURNING (xmax = 0);

-- Resume a queue or a machine. Returns a row if it was paused. Locks the pause row.
-- name: pause_clear
DELETE FROM {schema}.pauses WHERE kind = @kind AND name = @name RETURNING name;

-- Every pause, for the clients' picks and for the operators' tools. No locks.
-- name: pauses_list
SELECT kind, name, reason, paused_by, paused_at FROM {schema}.pauses ORDER BY kind, name;

-- Pause one live instance (not a finished one). Returns its status, queue and whether it was
-- already paused; no row if there is no instance of that id. Locks the instance's row (a step's
-- outcome in flight commits before or after, and the instance is paused either way: its next
-- step waits).
-- name: instance_pause
UPDATE {schema}.instances AS i
SET paused_at = coalesce(i.paused_at, now())
FROM (SELECT id, paused_at IS NOT NULL AS was FROM {schema}.instances WHERE id = @id FOR NO KEY UPDATE) AS o
WHERE i.id = o.id AND i.status IN ('available', 'executing', 'awaiting', 'joining')
RETURNING i.status::text, i.queue, o.was;

-- Resume one instance. Returns its status, queue and whether it was paused; no row if there is
-- no instance of that id. Locks the instance's row.
-- name: instance_resume
UPDATE {schema}.instances AS i
SET paused_at = NULL
FROM (SELECT id, paused_at IS NOT NULL AS was FROM {schema}.instances WHERE id = @id FOR NO KEY UPDATE) AS o
WHERE i.id = o.id
RETURNING i.status::text, i.queue, o.was;

-- Whether an instance exists, and its status (to tell "no such instance" from "finished"). No locks.
-- name: instance_status
SELECT status::text FROM {schema}.instances WHERE id = @id;

-- The queues and machines some node registered (live or not), for telling a name nobody knows
-- from one no node runs right now. No locks.
-- name: registered_names
SELECT coalesce((SELECT array_agg(DISTINCT q) FROM {schema}.nodes, unnest(queues) AS q), '{}'),
       coalesce((SELECT array_agg(DISTINCT m.key) FROM {schema}.nodes, jsonb_each(machines) AS m), '{}');

-- Whether a queue holds available rows (through the indexes of the untagged and the tagged ones)
-- or ever finished one (the finished counts): a queue no node works may still be worth pausing.
-- No locks.
-- name: queue_has_rows
SELECT EXISTS (SELECT 1 FROM {schema}.instances WHERE status = 'available' AND fair_tag IS NULL AND queue = @queue)
    OR EXISTS (SELECT 1 FROM {schema}.instances WHERE status = 'available' AND fair_tag IS NOT NULL AND queue = @queue)
    OR EXISTS (SELECT 1 FROM {schema}.finished_counts WHERE queue = @queue);
