-- Jobs: arguments of scalar and array shapes. A string argument whose text reads as JSON is a
-- string (it is not the legacy encoding for a string target); an array argument in the legacy
-- encoding reads as the array.
INSERT INTO {schema}.instances (id, machine, step, queue, status, priority, attempt, max_attempts, scheduled_at, state)
OVERRIDING SYSTEM VALUE
VALUES (801, 'golden-text', 'perform', 'job_args', 'available', 5, 0, 20, now(), '"hello"'),
       (802, 'golden-text', 'perform', 'job_args', 'available', 5, 0, 20, now(), to_jsonb('{"a": 1}'::text)),
       (803, 'golden-ints', 'perform', 'job_args', 'available', 5, 0, 20, now(), '[1, 2, 3]'),
       (804, 'golden-ints', 'perform', 'job_args', 'available', 5, 0, 20, now(), to_jsonb('[4, 5]'::text)),
       (805, 'golden-ints', 'perform', 'job_args', 'available', 5, 0, 20, now(), 'null');
