-- After a Retry: attempt kept, due later, the error recorded in the history.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state, errors)
OVERRIDING SYSTEM VALUE
VALUES (301, 'golden', 'step', 'retry_pending', 'available', 5, 1, 20, now() + interval '1 hour', '{"n": 3}',
        '[{"at": "2026-01-02T03:04:05.678901+00:00", "step": "step", "attempt": 1, "kind": "error", "error": "boom"}]');
