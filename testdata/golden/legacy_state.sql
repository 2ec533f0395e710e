-- The legacy double encoding: the state is a jsonb string holding the JSON text of the object.
-- A struct state reads it as the object.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state)
OVERRIDING SYSTEM VALUE
VALUES (701, 'golden', 'step', 'legacy_state', 'available', 5, 0, 20, now(), to_jsonb('{"n": 41, "seen": ["old"]}'::text));
