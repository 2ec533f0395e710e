-- Finished with a result document.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state,
                                result, path, finalized_at, correlation_key)
OVERRIDING SYSTEM VALUE
VALUES (1101, 'golden', 'end', 'done', 'done', 5, 1, 20, now(), '{"n": 11}', '{"n": 12, "seen": ["end"]}',
        '{s0,step,end}', now(), 'order-1101');
