-- Cancelled by an operator while parked: the cancel reason in the history, await fields cleared.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state,
                                errors, path, finalized_at)
OVERRIDING SYSTEM VALUE
VALUES (1001, 'golden', 'step', 'cancelled', 'cancelled', 5, 0, 20, now(), '{"n": 10}',
        '[{"at": "2026-01-02T03:04:05+00:00", "step": "step", "attempt": 0, "kind": "cancel", "error": "no longer needed"}]',
        '{s0}', now());
