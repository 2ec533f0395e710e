-- After a Next: attempt reset, the path of steps taken, a nested state.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state, path,
                                correlation_key)
OVERRIDING SYSTEM VALUE
VALUES (201, 'golden', 'step', 'after_next', 'available', 2, 0, 20, now(),
        '{"n": 5, "seen": ["x"], "sub": {"deep": [1, 2.5, {"k": "v"}], "big": 9007199254740993}}', '{s0}', 'order-201');
