-- Failed with its attempts exhausted and a full error history (kinds error, lease, outcome).
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state,
                                errors, path, finalized_at)
OVERRIDING SYSTEM VALUE
VALUES (901, 'golden', 'step', 'failed', 'failed', 5, 3, 3, now(), '{"n": 9}',
        '[{"at": "2026-01-02T03:04:05+00:00", "step": "step", "attempt": 1, "kind": "error", "error": "e1"},
          {"at": "2026-01-02T03:04:06+00:00", "step": "step", "attempt": 2, "kind": "lease", "error": "lease expired: worker w#1 stopped heartbeating"},
          {"at": "2026-01-02T03:04:07+00:00", "step": "step", "attempt": 3, "kind": "outcome", "error": "outcome: Next(\"x\"): no such step"}]',
        '{s0,step}', now());
