-- Statement family: bulk upgrades (Client.Upgrade, gendurable upgrade). A batch brings a
-- machine's live rows that no worker holds forward to a newer version of it: one transaction
-- locks a batch, the client computes each row's new step and state, and the same transaction
-- writes them. Short transactions, SKIP LOCKED: a row being claimed, signalled or cancelled is
-- left to the next batch (or to the claim, which upgrades it anyway).

-- A batch of @machine's rows below @version, not claimed (available, due or not, awaiting or
-- joining), with ids above @after, oldest first. Walks the primary key from @after (the batches
-- of one upgrade walk it once between them) and locks the batch's rows (FOR UPDATE SKIP LOCKED: a pick or a signal holding one
-- is skipped, never waited for).
-- name: upgrade_batch
SELECT id, step, state, machine_version
FROM {schema}.instances
WHERE machine = @machine AND machine_version < @version AND id > @after
  AND status IN ('available', 'awaiting', 'joining')
ORDER BY id
LIMIT @batch
FOR UPDATE SKIP LOCKED;

-- Writes a locked batch's upgrades: step, state (JSON text) and version, and the upgrade recorded on the row
-- as an upgrade on claim records it, by @by. The rows are locked by upgrade_batch in the same
-- transaction; the machine_version guard keeps a row from being upgraded twice.
-- name: upgrade_apply
UPDATE {schema}.instances AS i
SET step            = u.step,
    state           = u.state::jsonb,
    machine_version = @version,
    upgrades        = coalesce(i.upgrades, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                        'from', i.machine_version, 'to', @version::integer, 'at', now(),
                        'step_from', i.step, 'step_to', u.step, 'by', @by::text)),
    updated_at      = now()
FROM unnest(@ids::bigint[], @steps::text[], @states::text[]) AS u(id, step, state)
WHERE i.id = u.id AND i.machine_version < @version
RETURNING i.id, i.queue, i.status = 'available' AND i.scheduled_at <= now();

-- An operator's request for a bulk upgrade of @machine (gendurable upgrade). No locks.
-- name: upgrade_request
INSERT INTO {schema}.upgrade_requests (machine) VALUES (@machine) RETURNING id;

-- Takes the oldest open request for one of this node's machines (@names at @versions, parallel)
-- that no other node holds, for @lease_ms, when no running node (seen within @live_ms) registers
-- a newer version of that machine: the node that knows the newest version does the work. Locks
-- the request's row (SKIP LOCKED: another node taking it is not waited for).
-- name: upgrade_take
UPDATE {schema}.upgrade_requests AS r
SET taken_by = @by, taken_until = now() + @lease_ms * interval '1 millisecond', version = m.version
FROM unnest(@names::text[], @versions::integer[]) AS m(name, version)
WHERE r.machine = m.name
  AND r.id = (SELECT q.id FROM {schema}.upgrade_requests AS q
              WHERE q.finished_at IS NULL AND q.machine = ANY(@names::text[])
                AND (q.taken_until IS NULL OR q.taken_until < now())
              ORDER BY q.id
              LIMIT 1
              FOR UPDATE SKIP LOCKED)
  AND NOT EXISTS (SELECT 1 FROM {schema}.nodes AS n
                  WHERE n.seen_at >= now() - @live_ms * interval '1 millisecond'
                    AND (n.machines -> r.machine ->> 'version')::integer > m.version)
RETURNING r.id, r.machine;

-- Extends a taken request's lease and records its progress. Locks the request's row.
-- name: upgrade_progress
UPDATE {schema}.upgrade_requests
SET taken_until = now() + @lease_ms * interval '1 millisecond', upgraded = @upgraded, blocked = @blocked
WHERE id = @id AND taken_by = @by;

-- Finishes a taken request with its counts and error ('' for none). Locks the request's row.
-- name: upgrade_finish
UPDATE {schema}.upgrade_requests
SET finished_at = now(), taken_until = NULL, upgraded = @upgraded, blocked = @blocked, error = nullif(@error, '')
WHERE id = @id AND taken_by = @by;

-- A request as the operator's tool reads it. No locks.
-- name: upgrade_status
SELECT id, machine, requested_at, coalesce(taken_by, ''), finished_at, coalesce(version, 0), upgraded, blocked,
       coalesce(error, '')
FROM {schema}.upgrade_requests
WHERE id = @id;
