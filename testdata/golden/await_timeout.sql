-- Parked past its await deadline: the reaper (FireTimeouts) wakes it with nothing awaited.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state,
                                await_names, await_deadline, path)
OVERRIDING SYSTEM VALUE
VALUES (501, 'golden', 'step', 'await_timeout', 'awaiting', 5, 0, 20, now() - interval '1 hour', '{"n": 5}',
        '{go}', now() - interval '1 second', '{s0}');
