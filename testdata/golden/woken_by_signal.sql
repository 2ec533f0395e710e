-- Woken by a signal it awaited: available, the await names kept until the woken step's outcome,
-- the inbox holding the awaited signal (payload: a jsonb object) and one it did not await.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state,
                                await_names, await_deadline, signalled, path)
OVERRIDING SYSTEM VALUE
VALUES (401, 'golden', 'step', 'woken_by_signal', 'available', 5, 0, 20, now(), '{"n": 4}',
        '{go,stop}', now() + interval '1 hour', true, '{s0}');
INSERT INTO {schema}.signals (instance_id, name, payload) VALUES
  (401, 'note', NULL),
  (401, 'go', '{"v": "a"}');
