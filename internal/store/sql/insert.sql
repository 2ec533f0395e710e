-- Statement family: inserts.
--
-- Every insert, single or batch, is one statement over parallel arrays (unnest), so a batch has
-- no 65,535-parameter ceiling. Rows are inserted in (machine, correlation_key) order, the order
-- of the unique index that arbitrates deduplication: two batches racing over the same new keys
-- wait on each other in the same order and cannot deadlock. Ids are therefore assigned in key
-- order; unkeyed rows (which take no key lock) follow, in input order whatever their machine, so
-- that the caller can hand their ids back by position.
--
-- Deduplication: a keyed row is not inserted if an instance of the same machine and key exists
-- in its scope: always the live statuses (enforced by the unique partial index through ON
-- CONFLICT DO NOTHING, which also waits for an uncommitted racing insert and honours its
-- outcome), plus the finished statuses named by the scope mask (1 done, 2 failed, 4 cancelled),
-- checked against the statement's snapshot.
--
-- Locks: none beyond the inserted rows and the unique index's insertion lock on each new key.
--
-- $1 machine, $2 step, $3 state JSON text, $4 queue, $5 priority, $6 scheduled_at (NULL: now
-- plus $7), $7 delay ms, $8 max attempts, $9 correlation key (NULL: none), $10 scope mask,
-- $11 input position, $12 concurrency key (NULL: none), $13 rate limit (NULL: none), $14 weight,
-- $15 the version of the machine (the inserting client's), $16 fairness key (NULL: none), $17 the
-- row's rank among the rows of its queue, priority and fairness key that the statement makes
-- runnable at once (NULL: none, the row gets no fair tag), $18 the key's fairness weight.

-- name: insert_many
WITH input AS ({{input_many}})
{{insert_rows}};

-- The same, for a batch with rows that get a fair tag (see insert_rows_fair).
-- name: insert_many_fair
WITH input AS ({{input_many}})
{{insert_rows_fair}};

-- The same insert of one row, its parameters scalars in the same order. A statement over arrays
-- is planned anew on every execution when it inserts one row (the custom plan, which knows the
-- arrays' length, always looks cheaper than the generic plan's guess of ten rows), and planning
-- costs more than executing; this one's generic plan is exact, so it is planned once per
-- connection.
-- name: insert_one
WITH input AS ({{input_one}})
{{insert_rows}};

-- The same, for a row that gets a fair tag: a statement of its own, so that insert_one's generic
-- plan stays exact.
-- name: insert_one_fair
WITH input AS ({{input_one}})
{{insert_rows_fair}};

-- An Insert that its own client runs at once: one row with no correlation key, concurrency key
-- or rate limit, due now, of a queue the inserting client works and has a free executor slot
-- for. The row is inserted already claimed by that client (as a pick would claim it: executing,
-- the claim token @owner, a lease, attempt 1), which saves the pick's round trip and its row
-- version; the client hands it to an executor as soon as the statement returns. It is claimed
-- only if no due row of its queue is ahead of it (as urgent or more: a row inserted now is
-- behind every due row of its priority); otherwise it is inserted available, like any other, and
-- waits its turn. A claim whose client dies before running it is released by the reaper when
-- its lease runs out, like a pick's.
--
-- Locks: none beyond the inserted row. (The test for rows ahead reads the pick index without
-- locking: an insert racing with it can at worst start before an older row of its priority.)
-- The test reads the first untagged row (instances_ready_untagged, in time order) at each
-- priority up to $5, with the priority fixed, so that rows scheduled for later are never read (a
-- range on the priority would leave the time as a mere filter, and read every delayed row of the
-- queue); and whether any tagged row (each one due) is there, one descent of
-- instances_ready_tagged. OFFSET 0 keeps the test one subquery, run once: pulled up, it would
-- run for each of the four columns that read its answer.
--
-- $1 machine, $2 step, $3 state JSON text, $4 queue, $5 priority, $6 max attempts, $7 the claim
-- token, $8 the lease in ms, $9 the machine's version.
-- name: insert_claim
INSERT INTO {schema}.instances (machine, step, state, queue, priority, max_attempts,
                                status, attempt, locked_by, locked_until, machine_version)
SELECT $1::text, $2::text, $3::text::jsonb, $4::text, $5::smallint, $6::integer,
       (CASE WHEN a.clear THEN 'executing' ELSE 'available' END)::{schema}.status,
       CASE WHEN a.clear THEN 1 ELSE 0 END,
       CASE WHEN a.clear THEN $7::text END,
       CASE WHEN a.clear THEN now() + $8::bigint * interval '1 millisecond' END,
       $9::integer
FROM (SELECT NOT EXISTS (SELECT 1 FROM generate_series(1, $5::integer) AS p(priority),
                         LATERAL (SELECT x.scheduled_at <= now() AS due
                                  FROM {schema}.instances AS x
                                  WHERE x.status = 'available' AND x.fair_tag IS NULL AND x.queue = $4::text
                                    AND x.priority = p.priority::smallint
                                  ORDER BY x.scheduled_at, x.id
                                  LIMIT 1) AS first
                         WHERE first.due)
             AND (SELECT x.fair_tag FROM {schema}.instances AS x
                  WHERE x.status = 'available' AND x.fair_tag IS NOT NULL AND x.queue = $4::text
                    AND x.priority <= $5::smallint
                  ORDER BY x.priority, x.fair_tag LIMIT 1) IS NULL
      OFFSET 0) AS a(clear)
RETURNING id, status = 'executing', state, inserted_at;

-- fragment: insert_rows
{{insert_into}}
       u.fair_key, NULL::double precision
FROM input AS u
{{insert_dedup}}

-- The input rows, from the parameters' arrays (above), or from scalars for one row.
-- fragment: input_many
  SELECT *
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::smallint[],
              $6::timestamptz[], $7::bigint[], $8::integer[], $9::text[], $10::smallint[], $11::integer[],
              $12::text[], $13::text[], $14::integer[], $15::integer[], $16::text[], $17::integer[],
              $18::double precision[])
       AS u(machine, step, state, queue, priority, scheduled_at, delay_ms, max_attempts,
            correlation_key, scope_mask, ord, concurrency_key, rate_limit, weight, machine_version,
            fair_key, fair_rank, fair_weight)

-- fragment: input_one
  SELECT $1::text AS machine, $2::text AS step, $3::text AS state, $4::text AS queue,
         $5::smallint AS priority, $6::timestamptz AS scheduled_at, $7::bigint AS delay_ms,
         $8::integer AS max_attempts, $9::text AS correlation_key, $10::smallint AS scope_mask,
         $11::integer AS ord, $12::text AS concurrency_key, $13::text AS rate_limit, $14::integer AS weight,
         $15::integer AS machine_version, $16::text AS fair_key, $17::integer AS fair_rank,
         $18::double precision AS fair_weight

-- The same, giving a row runnable at once with a fairness key its fair tag (see fair_base).
-- fragment: insert_rows_fair
{{insert_into}}
       u.fair_key, fb.base + u.fair_rank / u.fair_weight
FROM input AS u
LEFT JOIN LATERAL (SELECT {{fair_base(u)}} AS base WHERE u.fair_rank IS NOT NULL) AS fb ON true
{{insert_dedup}}

-- The insert's columns, and the input's values for all but the fair tag (which ends the list).
-- fragment: insert_into
INSERT INTO {schema}.instances (machine, step, state, queue, priority, scheduled_at, max_attempts, correlation_key,
                                concurrency_key, rate_limit, weight, machine_version, fair_key, fair_tag)
SELECT u.machine, u.step, u.state::jsonb, u.queue, u.priority,
       coalesce(u.scheduled_at, now() + u.delay_ms * interval '1 millisecond'),
       u.max_attempts, u.correlation_key, u.concurrency_key, u.rate_limit, u.weight, u.machine_version,

-- Deduplication (see the top of this file), and the inserted rows.
-- fragment: insert_dedup
WHERE u.correlation_key IS NULL
   OR NOT EXISTS (
        SELECT 1 FROM {schema}.instances AS e
        WHERE e.machine = u.machine AND e.correlation_key = u.correlation_key
          AND (e.status IN ('available', 'executing', 'awaiting', 'joining')
               OR (e.status = 'done' AND u.scope_mask & 1 <> 0)
               OR (e.status = 'failed' AND u.scope_mask & 2 <> 0)
               OR (e.status = 'cancelled' AND u.scope_mask & 4 <> 0)))
ORDER BY u.correlation_key IS NULL, CASE WHEN u.correlation_key IS NULL THEN u.ord END,
         u.machine, u.correlation_key, u.ord
ON CONFLICT (machine, correlation_key)
  WHERE correlation_key IS NOT NULL AND status IN ('available', 'executing', 'awaiting', 'joining')
  DO NOTHING
RETURNING id, machine, coalesce(correlation_key, '')

-- The instances that keyed rows deduplicated against: for each input position, the live
-- instance of that machine and key, else the newest finished one in the row's scope.
-- Read-only; a fresh statement, so it sees what a racing insert committed.
--
-- $1 machine, $2 correlation key, $3 scope mask, $4 input position.

-- name: insert_find_existing
SELECT DISTINCT ON (u.ord) u.ord, e.id
FROM unnest($1::text[], $2::text[], $3::smallint[], $4::integer[]) AS u(machine, correlation_key, scope_mask, ord)
JOIN {schema}.instances AS e ON e.machine = u.machine AND e.correlation_key = u.correlation_key
WHERE e.status IN ('available', 'executing', 'awaiting', 'joining')
   OR (e.status = 'done' AND u.scope_mask & 1 <> 0)
   OR (e.status = 'failed' AND u.scope_mask & 2 <> 0)
   OR (e.status = 'cancelled' AND u.scope_mask & 4 <> 0)
ORDER BY u.ord, (e.status IN ('available', 'executing', 'awaiting', 'joining')) DESC, e.id DESC;

-- Where the next row of a fairness key goes in its queue's fair order (start-time fair queueing):
-- the later of the queue's head at the row's priority (the first tagged runnable row that is not
-- paused) and the key's last tagged runnable row that is not paused, or 0 in an empty queue; its tag is that plus
-- its rank over its key's weight. Read without locks, through instances_ready_tagged and
-- instances_fair_key (a key's rows, tagged ones first: NULL when it has none): rows of one key inserted by transactions that have not committed yet do
-- not see each other, so they can share a place in the order (docs/fairness.md). The parameter
-- names the relation whose row this is (queue, priority, fair_key).
-- fragment: fair_base(r)
greatest((SELECT x.fair_tag FROM {schema}.instances AS x
          WHERE x.status = 'available' AND x.queue = {{r}}.queue AND x.priority = {{r}}.priority
            AND x.fair_tag IS NOT NULL AND x.paused_at IS NULL
          ORDER BY x.fair_tag, x.scheduled_at, x.id LIMIT 1),
         (SELECT x.fair_tag FROM {schema}.instances AS x
          WHERE x.status = 'available' AND x.fair_key = {{r}}.fair_key AND x.queue = {{r}}.queue
            AND x.priority = {{r}}.priority AND x.paused_at IS NULL
          ORDER BY x.fair_tag DESC NULLS LAST LIMIT 1),
         0)
