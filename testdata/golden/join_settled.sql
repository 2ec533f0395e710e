-- A parent whose last child settled: runnable at its join step with its wave's children, one
-- done with a result, one failed with an error history.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state,
                                pending_children, spawn_wave, join_due, path)
OVERRIDING SYSTEM VALUE
VALUES (601, 'golden', 'step', 'join_settled', 'available', 5, 0, 20, now(), '{"n": 6}', 0, 1, true, '{s0}');
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state,
                                result, errors, parent_id, parent_wave, path, finalized_at)
OVERRIDING SYSTEM VALUE
VALUES (602, 'golden-child', 'perform', 'join_settled_children', 'done', 5, 1, 20, now(), '"c1"', '{"v": "c1"}', NULL, 601, 1,
        '{perform}', now()),
       (603, 'golden-child', 'perform', 'join_settled_children', 'failed', 5, 2, 2, now(), '"c2"', NULL,
        '[{"at": "2026-01-02T03:04:05+00:00", "step": "perform", "attempt": 1, "kind": "error", "error": "first"},
          {"at": "2026-01-02T03:04:06+00:00", "step": "perform", "attempt": 2, "kind": "error", "error": "no luck"}]',
        601, 1, '{perform}', now());
