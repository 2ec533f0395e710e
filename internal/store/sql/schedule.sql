-- Statement family: durable schedules (migration 3's schedules table). Each statement touches
-- the schedules table, and the instances table only where it says so.

-- The database's clock, and the schedule's row, locked in the caller's transaction so that a
-- declaration, an update, a pause or a trigger never races a fire of the same schedule (the
-- firing loop's claim skips a locked row). No row when there is no such schedule. Row lock on
-- one schedule.
-- name: schedule_lock
SELECT now(), coalesce(declared_by, ''), machine, input, cron, every_ms, time_zone, paused, next_fire_at
FROM {schema}.schedules
WHERE name = @name
FOR UPDATE;

-- The database's clock. No locks.
-- name: schedule_now
SELECT now();

-- A schedule created or rewritten (its when, what and policies); next_fire_at as computed by
-- the caller. Fire history, counters and the paused flag are kept. Row lock on it (held since
-- schedule_lock).
-- name: schedule_upsert
INSERT INTO {schema}.schedules (name, machine, input, cron, every_ms, time_zone, overlap, catch_up_ms, jitter_ms,
                                declared_by, next_fire_at)
VALUES (@name, @machine, @input::jsonb, @cron, @every_ms, @time_zone, @overlap, @catch_up_ms, @jitter_ms,
        @declared_by, @next_fire_at)
ON CONFLICT (name) DO UPDATE
SET machine = excluded.machine, input = excluded.input, cron = excluded.cron, every_ms = excluded.every_ms,
    time_zone = excluded.time_zone, overlap = excluded.overlap, catch_up_ms = excluded.catch_up_ms,
    jitter_ms = excluded.jitter_ms, declared_by = excluded.declared_by, next_fire_at = excluded.next_fire_at,
    updated_at = now();

-- Pause or resume one schedule; a resume sets the next fire time after now, so the times missed
-- while paused are not caught up. Row lock on it.
-- name: schedule_pause
UPDATE {schema}.schedules
SET paused = @paused, next_fire_at = coalesce(@next_fire_at, next_fire_at), updated_at = now()
WHERE name = @name;

-- Remove one schedule. Row lock on it (a fire in progress finishes first).
-- name: schedule_delete
DELETE FROM {schema}.schedules WHERE name = @name;

-- The schedules a service declared that its Config no longer does. Row locks on those.
-- name: schedule_prune
DELETE FROM {schema}.schedules WHERE declared_by = @service AND NOT (name = ANY(@keep::text[]))
RETURNING name;

-- The firing loop's claim: up to @batch due, unpaused schedules (or only the one named @only),
-- oldest fire time first, locked with SKIP LOCKED so that nodes firing at once split them and
-- never wait on each other. With each: the status of the instance it fired last (no lock on
-- it), for the overlap policy.
-- name: schedule_claim
SELECT s.name, s.machine, s.input, s.cron, s.every_ms, s.time_zone, s.overlap, s.catch_up_ms, s.jitter_ms,
       s.next_fire_at, coalesce(s.last_instance_id, 0), coalesce(i.status::text, ''), now()
FROM {schema}.schedules s
LEFT JOIN {schema}.instances i ON i.id = s.last_instance_id
WHERE NOT s.paused AND s.next_fire_at <= now() AND (s.retry_at IS NULL OR s.retry_at <= now())
  AND (@only::text IS NULL OR s.name = @only)
ORDER BY s.next_fire_at
LIMIT @batch
FOR UPDATE OF s SKIP LOCKED;

-- The claimed schedules advanced (parallel arrays, one element per schedule): the next fire
-- time, the last fire and its instance (NULL when none fired), the fires and skips counted, the
-- last skip's report (NULL keeps the one before). Clears the last error. Row locks held since
-- schedule_claim.
-- name: schedule_advance
UPDATE {schema}.schedules s
SET next_fire_at = a.next_fire_at,
    last_fire_at = coalesce(a.last_fire_at, s.last_fire_at),
    last_instance_id = coalesce(a.last_instance_id, s.last_instance_id),
    fired = s.fired + a.fired, skipped = s.skipped + a.skipped,
    last_skip = coalesce(a.last_skip::jsonb, s.last_skip),
    last_error = NULL, last_error_at = NULL, retry_at = NULL
FROM unnest(@names::text[], @next::timestamptz[], @last_fire::timestamptz[], @last_instance::bigint[],
            @fired::bigint[], @skipped::bigint[], @last_skip::text[])
     AS a(name, next_fire_at, last_fire_at, last_instance_id, fired, skipped, last_skip)
WHERE s.name = a.name;

-- A schedule that failed to fire: the error, kept until a fire succeeds, and no new try before
-- @retry_ms (its fire times stay due meanwhile, under the catch-up rule). Its own short
-- transaction; row lock on it.
-- name: schedule_failed
UPDATE {schema}.schedules
SET last_error = @error, last_error_at = now(), retry_at = now() + @retry_ms * interval '1 millisecond'
WHERE name = @name;

-- The earliest time an unpaused schedule is due to fire (or to be tried again), and the
-- database's clock: how long the firing loop may sleep. No locks.
-- name: schedule_next_due
SELECT min(greatest(next_fire_at, retry_at)), now() FROM {schema}.schedules WHERE NOT paused;

-- Every schedule (or the one named), with its last instance's status. No locks.
-- name: schedule_list
SELECT s.name, s.machine, s.input, s.cron, s.every_ms, s.time_zone, s.overlap, s.catch_up_ms, s.jitter_ms,
       coalesce(s.declared_by, ''), s.paused, s.next_fire_at, s.last_fire_at, s.last_instance_id,
       coalesce(i.status::text, ''), s.fired, s.skipped, s.last_skip, coalesce(s.last_error, ''), s.last_error_at,
       s.created_at, s.updated_at
FROM {schema}.schedules s
LEFT JOIN {schema}.instances i ON i.id = s.last_instance_id
WHERE @name::text IS NULL OR s.name = @name
ORDER BY s.name;

-- A manual fire recorded (trigger): the last fire and its instance. Row lock held since
-- schedule_lock.
-- name: schedule_triggered
UPDATE {schema}.schedules
SET last_fire_at = @at, last_instance_id = @instance, fired = fired + 1, updated_at = now()
WHERE name = @name;
