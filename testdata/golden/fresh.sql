-- A freshly inserted instance: available, attempt 0, state as a jsonb object.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state)
OVERRIDING SYSTEM VALUE
VALUES (101, 'golden', 'step', 'fresh', 'available', 5, 0, 20, now(), '{"n": 1}');
