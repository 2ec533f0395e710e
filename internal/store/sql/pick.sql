-- Statement family: the pick.
--
-- One statement claims a batch of runnable rows of one queue in urgency order (priority, then
-- scheduled time, then id) and returns what the executor needs to run them.
--
-- Locks: the candidate rows are locked FOR NO KEY UPDATE SKIP LOCKED. SKIP LOCKED lets any number
-- of schedulers on any number of nodes pick from one queue without waiting on each other: a row
-- another pick (or a signal's wake, or an outcome) holds is simply not a candidate this time.
-- NO KEY UPDATE (not UPDATE) is enough for the claim/outcome mutual exclusion and is compatible
-- with the FOR KEY SHARE that foreign-key checks take on the row (a signal's insert naming this
-- row), so such an insert in flight never hides the row from the pick. The UPDATE then turns the
-- chosen rows into claims: status executing, a claim token in locked_by, a lease in
-- locked_until (database clock), attempt + 1.
--
-- Concurrency keys. A row with a key is a candidate only if its key can run now: a key no gate
-- owns (K = 1) only while no row of that key executes; a gated key only while its gate has a free
-- slot (as of this statement's snapshot). The test is part of the scan, before LIMIT, so rows of
-- a saturated key never take the batch's places from the work behind them. Within one batch, a
-- K = 1 key gets its most urgent row only, and a gated key at most as many rows as it has free
-- slots; the rest of the batch's candidates of that key stay available. Two picks on two nodes
-- racing for the same K = 1 key both pass this test; the second to commit fails on the unique
-- index instances_concurrency_active and is retried by the caller. The claims are made in key
-- order (the claim walks chosen's ids sorted by key, in a nested loop: the only join method the
-- pick's settings leave), so the unique index's waits between two picks always go the same way
-- and cannot form a deadlock. Two picks racing for a gate's last slots serialize on the gate's
-- counter row: the second finds it full and claims nothing of that key (the gates CHECK backs
-- this up: over-admission cannot commit).
--
-- The statement also loads, for each claimed row, the inbox of a row that ever received a signal
-- (as of the statement's snapshot: the step sees these signals, and its progress consumes exactly
-- the awaited ones among them; a signal committed later is a latecomer and stays), and for a
-- parent whose join step is due (join_due), the children of its latest wave: the first
-- @claim_rows of each, by id. A row with more has the rest read by claim_inbox_rest and
-- claim_children_rest before its step runs (store.LoadRest): one value aggregated from all of
-- them could pass jsonb's limit of 256 MB (270 unawaited signals of 1 MB, 100,000 children's
-- results of 3 KB), and the statement would fail for the whole batch, at every pick, until the
-- row went: the queue would stall behind it. (If even the first @claim_rows pass the limit, with
-- payloads larger than the caller's MaxPayloadBytes that another client wrote, the caller picks
-- again with 1.)
--
-- @queue, @limit, @owner claim token, @lease ms, @horizon ms (the "_horizon" variants only: rows
-- scheduled up to now() + horizon are due; the test kit's Drain passes a large horizon to collapse
-- delays), @fw_keys, @fw_weights, @fw_default the fairness weights (see the candidate scan). The picks that admit against gates or rate limits also take their configuration
-- (see "Admission" below).
--
-- The statements. Every pick has the same shape, and each variant is made of the parts below
-- (the fragments of this file); store/pick.go declares, in one table, which parts each variant
-- uses, and assembles them once per Store:
--
--   WITH <configuration>,              the gates or limits configured, and the hinted keys
--        candidates AS (<scan>),       due rows in urgency order, each tested by the filters
--        <admission>,                  the rows the rate limits let through (admitted)
--        chosen AS (…),                the rows to claim, each with its gate shard
--        refused AS (…)                what the admission refused, for events
--   <claim>                            the UPDATE that turns the chosen rows into claims
--
-- A variant carries only the machinery its configuration can use: it plans and runs none of what
-- its configuration cannot need.

-- The settings a pick runs under, local to its implicit transaction (the batch that sends the
-- pick): a lock wait of at most $1 (see Store.Pick); no JIT (a pick is a few milliseconds of work,
-- and a row estimate that crosses jit_above_cost would spend tens of milliseconds compiling it);
-- and no sequential scan, hash join or merge join. Every table a pick reads, it reads by an index
-- (the pick index in urgency order, then primary keys, the executing rows of a key, a counter or
-- bucket by key), and the joins it has are between its own few rows; but a plan made while the
-- table was small (a new installation, or stale statistics) would read a tiny table whole or hash
-- it, and Postgres keeps a cached plan until the table is analyzed again, by which time it may
-- hold millions of rows. With these off, the plan is the same at every size.
--
-- Every pick also runs on its cached generic plan from its first execution. Planning is a large
-- share of a pick's cost (about 1 ms against 3 ms of execution for a batch of 100), and Postgres,
-- left to choose, keeps planning a statement whose generic plan's estimates look dearer than its
-- custom plans': the admission picks always (their generic plan guesses a batch of a tenth of
-- the table), the plain pick once the table holds millions of finished rows or many rows
-- scheduled for later (docs/PERFORMANCE.md, "How cost grows with the table"). The generic plan
-- is safe at any size: the candidates are an index scan in the pick index's order stopped by
-- LIMIT, every gate counter and bucket is read by key, and the claim walks an array by primary
-- key (see claim), with the join methods that could read a table whole turned off as above
-- (TestEveryPickClaimsByPrimaryKey checks every variant's generic plan).
--
-- A pick and an outcome batch of its own also carry the engine's statement timeout, 30s, the
-- ceiling of the deadline the client gives them (engine.StatementTimeout), in place of the
-- role's: a role's timeout of a second or less cancelled a large spawn's outcome (thousands of
-- children) every time, and the instance stayed executing for ever
-- (TestSpawnOutlastsTheRolesStatementTimeout).
-- name: pick_settings
SELECT pg_catalog.set_config('lock_timeout', $1, true),
       {{engine_statement_timeout}},
       {{by_key_settings}};

-- fragment: engine_statement_timeout
pg_catalog.set_config('statement_timeout', '30s', true)

-- The planner settings of a transaction whose every read goes by key (above; outcome.sql's
-- outcome_settings too), as set_config calls local to the transaction.
-- fragment: by_key_settings
pg_catalog.set_config('jit', 'off', true),
       pg_catalog.set_config('enable_seqscan', 'off', true),
       pg_catalog.set_config('enable_hashjoin', 'off', true),
       pg_catalog.set_config('enable_mergejoin', 'off', true),
       pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true)

-- The claim: every pick ends with it.
-- fragment: claim
UPDATE {schema}.instances AS i
SET status            = 'executing',
    attempt           = i.attempt + 1,
    locked_by         = @owner,
    locked_until      = now() + @lease::bigint * interval '1 millisecond',
    concurrency_shard = c.shard,
    -- The claim takes the row out of the fair order: a row that becomes runnable again gets a
    -- new place there, or none (outcome.sql).
    fair_tag          = NULL,
    updated_at        = now()
-- The claim walks chosen's rows as arrays (unnested in key order) rather than joining the CTE: a
-- plan cached for every batch size (the plan cache's generic plan) takes the array for a few
-- elements and claims them by primary key in that order, where a join with the CTE would be
-- estimated at a tenth of the table and hash it whole (pick_settings rules out the hash join
-- and the whole-table scan in any case).
FROM (SELECT array_agg(id ORDER BY ckey NULLS FIRST, id) AS ids,
             array_agg(shard ORDER BY ckey NULLS FIRST, id) AS shards FROM chosen) AS a,
     unnest(a.ids, a.shards) AS c(id, shard)
WHERE i.id = c.id
RETURNING i.id, i.machine, i.step, i.state, i.attempt, i.max_attempts, i.priority,
          coalesce(i.correlation_key, ''), i.inserted_at, i.await_names, i.signalled IS TRUE,
          CASE WHEN i.signalled THEN
            (SELECT jsonb_agg(jsonb_build_object('id', s.id, 'name', s.name, 'payload', s.payload,
                                                 'at', s.inserted_at) ORDER BY s.id)
             FROM (SELECT s.id, s.name, s.payload, s.inserted_at FROM {schema}.signals AS s
                   WHERE s.instance_id = i.id ORDER BY s.id LIMIT @claim_rows) AS s)
          END,
          i.parent_id IS NOT NULL,
          CASE WHEN i.join_due THEN
            (SELECT jsonb_agg(jsonb_build_object('id', w.id, 'machine', w.machine, 'status', w.status,
                                                 'result', w.result, 'error', w.errors -> -1 ->> 'error')
                              ORDER BY w.id)
             FROM (SELECT w.id, w.machine, w.status, w.result, w.errors FROM {schema}.instances AS w
                   WHERE w.parent_id = i.id AND w.parent_wave = i.spawn_wave ORDER BY w.id LIMIT @claim_rows) AS w)
          END,
          i.concurrency_key, i.concurrency_shard, i.rate_limit, i.machine_version, i.fair_key, i.recoveries,
          (SELECT count(*) FROM candidates), (SELECT n FROM refused), (SELECT denied FROM refused)

-- The candidate scan. Its filters (the predicates below) go into each of its scans, each as
-- "AND <filter>". It walks the pick indexes one priority at a time (1 to 9, the column's range),
-- each with the priority fixed, so that each walk is bounded: rows scheduled for later are never
-- read. (Ordered by priority and time in one walk, the time would be a mere filter, and an idle
-- pick would read every delayed row of the queue.) The walks run in priority order and only as
-- far as the outer LIMIT pulls: a priority with a full batch due ends the scan.
--
-- The runnable rows are in two indexes: instances_ready_untagged holds those without a fair tag,
-- in time order, and instances_ready_tagged those with one, in tag order. Every pick statement
-- comes in two scans (store/pick.go):
--
-- The plain scan reads the rows without a tag, in time order, and nothing else; and only while
-- the queue holds no tagged runnable row (queue_untagged: one descent of the tagged index).
-- A queue whose rows have no fairness key is picked exactly as without fairness, and its rows
-- are in no index that fairness added. When the queue holds tagged rows the plain scan claims
-- nothing, and the caller picks again with the fair scan (it learns of them from pick_tagged,
-- which every pick sends before its statement in the same round trip).
--
-- The fair scan (docs/fairness.md) reads up to a batch of each part per priority and merges them
-- by tag: an untagged row (one without a key, or one that became due later than it became
-- runnable: a delay, a backoff, a schedule, a wake) gets the tag it would have had on arriving
-- now, within this pick: the later of the queue's head (the first tagged row of the window) and
-- its key's last tagged row, plus its rank among the untagged rows of its key in the window over
-- the key's weight (@fw_keys, @fw_weights, the client's configured weights, @fw_default for any
-- other key and for the rows without one, which share as one key). The batch is the @limit rows
-- first in that order. (Both parts lock the rows of their windows; the ones the merge leaves
-- stay locked until the pick commits, and other picks skip them meanwhile.)
--
-- fragment: scan_plain_begin
candidates AS MATERIALIZED (
  SELECT c.id, c.ckey, c.rkey, c.weight, c.priority, c.scheduled_at
  FROM generate_series(1, 9) AS p(priority),
  LATERAL (
    SELECT i.id, i.concurrency_key AS ckey, i.rate_limit AS rkey, i.weight, i.priority, i.scheduled_at
    FROM {schema}.instances AS i
    WHERE i.status = 'available'
      AND i.queue = @queue
      AND i.priority = p.priority::smallint
      AND i.fair_tag IS NULL
      AND {{queue_untagged}}

-- fragment: scan_plain_end
    ORDER BY i.scheduled_at, i.id
    LIMIT @limit
    FOR NO KEY UPDATE OF i SKIP LOCKED
  ) AS c
  LIMIT @limit
)

-- The queue holds no tagged runnable row, as of the statement's snapshot: one descent of
-- instances_ready_tagged, which a queue without fairness keys leaves empty; evaluated once per
-- statement. (The order is that index's: on a schema at 13, instances_fair_last holds the same
-- rows, and a plan made without statistics could otherwise take it and read all of them.)
-- fragment: queue_untagged
((SELECT x.fair_tag FROM {schema}.instances AS x
  WHERE x.status = 'available' AND x.fair_tag IS NOT NULL AND x.queue = @queue
  ORDER BY x.priority, x.fair_tag LIMIT 1) IS NULL)

-- Whether @queue holds tagged runnable rows (the caller's cue to pick with the fair scan). Sent
-- with each pick, before it, in its round trip, so that learning it never stands between a pick
-- and the running of the rows it claimed (a round trip of its own there once held a half-open
-- connection's claims for its whole statement timeout).
-- name: pick_tagged
SELECT NOT {{queue_untagged}};

-- fragment: scan_begin
candidates AS MATERIALIZED (
  SELECT c.id, c.ckey, c.rkey, c.weight, c.priority, c.scheduled_at
  FROM generate_series(1, 9) AS p(priority),
  LATERAL (
    WITH tagged AS MATERIALIZED (
      SELECT i.id, i.concurrency_key AS ckey, i.rate_limit AS rkey, i.weight, i.priority, i.scheduled_at,
             i.fair_tag AS etag
      FROM {schema}.instances AS i
      WHERE i.status = 'available'
        AND i.queue = @queue
        AND i.priority = p.priority::smallint
        AND i.fair_tag IS NOT NULL

-- fragment: scan_tagged_end
      ORDER BY i.fair_tag, i.scheduled_at, i.id
      LIMIT @limit
      FOR NO KEY UPDATE OF i SKIP LOCKED
    ), untagged AS MATERIALIZED (
      SELECT i.id, i.concurrency_key AS ckey, i.rate_limit AS rkey, i.weight, i.priority, i.scheduled_at,
             i.fair_key AS fkey
      FROM {schema}.instances AS i
      WHERE i.status = 'available'
        AND i.queue = @queue
        AND i.priority = p.priority::smallint
        AND i.fair_tag IS NULL

-- fragment: scan_end
      ORDER BY i.scheduled_at, i.id
      LIMIT @limit
      FOR NO KEY UPDATE OF i SKIP LOCKED
    )
    (SELECT u.id, u.ckey, u.rkey, u.weight, u.priority, u.scheduled_at
     FROM untagged AS u
     WHERE NOT EXISTS (SELECT 1 FROM tagged))
    UNION ALL
    (SELECT m.id, m.ckey, m.rkey, m.weight, m.priority, m.scheduled_at
     FROM (SELECT t.id, t.ckey, t.rkey, t.weight, t.priority, t.scheduled_at, t.etag
           FROM tagged AS t
           UNION ALL
           SELECT r.id, r.ckey, r.rkey, r.weight, r.priority, r.scheduled_at,
                  greatest((SELECT min(t.etag) FROM tagged AS t),
                           (SELECT x.fair_tag FROM {schema}.instances AS x
                            WHERE r.fkey IS NOT NULL AND x.status = 'available' AND x.fair_key = r.fkey
                              AND x.queue = @queue AND x.priority = r.priority AND x.paused_at IS NULL
                            ORDER BY x.fair_tag DESC NULLS LAST LIMIT 1))
                  + r.rk / coalesce((SELECT w.weight FROM unnest(@fw_keys::text[], @fw_weights::double precision[]) AS w(key, weight)
                                     WHERE w.key = r.fkey), @fw_default::double precision)
           FROM (SELECT u.*, row_number() OVER (PARTITION BY u.fkey ORDER BY u.scheduled_at, u.id) AS rk
                 FROM untagged AS u) AS r) AS m
     WHERE EXISTS (SELECT 1 FROM tagged)
     ORDER BY m.etag, m.scheduled_at, m.id
     LIMIT @limit)
  ) AS c
  LIMIT @limit
)

-- Filter: the row is due. In production, due is "scheduled up to now()": a stable function, not a
-- parameter, so the plan cache's generic plan is estimated with the clock's value and chosen
-- after a few runs. (With a parameter there, a table holding many rows scheduled for later made
-- every custom plan look cheaper than the generic one, and the pick was planned on every call:
-- about 1 ms of planning a pick, and a slower plan.) The test kit's Drain, which collapses
-- delays, uses the variants with a horizon (@horizon ms; the "_horizon" statements).

-- fragment: due
i.scheduled_at <= now()

-- fragment: due_within_horizon
i.scheduled_at <= now() + @horizon::bigint * interval '1 millisecond'

-- Filter: the row's machine version is one this node knows: version 1 (every machine's first),
-- or at most the version of its machine this node registers (@mv_names, @mv_versions: the
-- machines registered at a version above 1). A row a newer deploy brought forward is never
-- claimed by a node of an older one.

-- fragment: version_known
(i.machine_version = 1
 OR i.machine_version <= (SELECT m.version FROM unnest(@mv_names::text[], @mv_versions::integer[]) AS m(name, version)
                          WHERE m.name = i.machine))

-- Filter: the row is not paused, nor is its machine (@paused_machines: the machines paused as
-- the client last read the pauses table; a paused queue is not picked at all). A paused row stays
-- in the pick index, and the scan reads past it.

-- fragment: not_paused
(i.paused_at IS NULL AND i.machine <> ALL (coalesce(@paused_machines::text[], '{}')))

-- The K = 1 rule, between transactions: no execution of row i's key runs (an execution that
-- holds a gate slot is not one of a K = 1 key).

-- fragment: key_idle
NOT EXISTS (SELECT 1 FROM {schema}.instances AS x
            WHERE x.concurrency_key = i.concurrency_key AND x.status = 'executing'
              AND x.concurrency_shard IS NULL)

-- The K = 1 rule, within a batch: row c is the most urgent row of its key in the relation named
-- by the parameter (the candidates, or the admitted rows).

-- fragment: first_of_key(rel)
NOT EXISTS (SELECT 1 FROM {{rel}} AS d
            WHERE d.ckey = c.ckey AND (d.priority, d.scheduled_at, d.id) < (c.priority, c.scheduled_at, c.id))

-- Filter: a keyed row only while its key is idle (every key is K = 1: no gate is configured).

-- fragment: key_runnable
(i.concurrency_key IS NULL OR {{key_idle}})

-- Filter: a keyed row only while its gate has a free slot (as of this statement's snapshot), or,
-- for a key no gate owns, while the key is idle.

-- fragment: gate_has_room
(i.concurrency_key IS NULL
 -- A hinted gated key: as read at the start (ghint).
 OR CASE WHEN i.concurrency_key = ANY (CAST((SELECT known FROM ghint) AS text[]))
         THEN i.concurrency_key = ANY (CAST((SELECT roomy FROM ghint) AS text[]))
         -- Any other gated key: its gate has a free slot. (NULL: no gate owns the key;
         -- then K = 1.)
         ELSE coalesce((SELECT cfg.lim > coalesce((SELECT sum(g.held) FROM {schema}.gates AS g
                                                   WHERE g.key = i.concurrency_key), 0)
                        FROM cfg WHERE cfg.name = split_part(i.concurrency_key, ':', 1)),
                       {{key_idle}})
    END)

-- The seconds of refill bucket {{b}} has earned by now(): the time since its last write. Negative
-- when a pick that began before that write (its now() is its transaction's start) reads it after:
-- the balance is then the one the bucket had at the pick's own time, so that no window of pick
-- times is granted more than the burst and the rate allow. A write dated more than a minute
-- ahead of the clock as it reads now (clock_timestamp(), not the transaction's start: no write
-- that committed can be dated after it) was made by a clock that has stepped back since. The
-- bucket then counts as full, as it does after a step forward (a bucket refills up to its
-- burst), and its next write dates it by the new clock (bucket_debit). Counted backwards, it would
-- refuse every grant until the clock caught up again, for as long as it went back.
-- fragment: bucket_refill(b)
(CASE WHEN {{b}}.updated_at > clock_timestamp() + interval '1 minute' THEN 'Infinity'::float8
      ELSE extract(epoch FROM now() - {{b}}.updated_at)::float8 END)

-- Filter: a row with a rate limit only while its bucket holds a token (rows of a limit no
-- configuration here names are not candidates at all).

-- fragment: rate_has_token
(i.rate_limit IS NULL
 -- A hinted limited key: as read at the start (rhint).
 OR CASE WHEN i.rate_limit = ANY (CAST((SELECT known FROM rhint) AS text[]))
         THEN i.rate_limit = ANY (CAST((SELECT affordable FROM rhint) AS text[]))
         -- Any other: its bucket holds a token. (NULL: an unknown limit: not a candidate.)
         ELSE (SELECT coalesce((SELECT least(rc.burst, b.tokens + rc.rate * {{bucket_refill(b)}})
                                FROM {schema}.buckets AS b WHERE b.key = i.rate_limit), rc.burst) >= 1
               FROM rcfg AS rc WHERE rc.name = split_part(i.rate_limit, ':', 1))
    END)

-- Filter: no rate limit is configured, so a row with one stalls (the maintenance sweep reports
-- it).

-- fragment: no_rate_limit
i.rate_limit IS NULL

-- Filters of the lean picks: the row is of the caller's gate lease or rate lane (it passes
-- untested; see lease_held and lane_grant).

-- fragment: lease_key
i.concurrency_key = @l_key

-- fragment: lane_limit
i.rate_limit = @lr_key

-- Admission.
--
-- Gates. A gated key's candidates take its free slots in urgency order, from the emptiest shard
-- first (which spreads a busy key over its shards); a shard with no row yet is empty (its
-- capacity from the configuration). In the common case, a key far from its limit, all of the
-- key's rows in the batch fit in its emptiest shard and go there; only a key whose rows do not
-- fit is ranked and spread over its shards' free slots (the general case, which costs a sort and
-- two window passes the common case does not run). The debit is one upsert per (key, shard) in
-- key order, so picks racing over the same gates lock their counters in the same order and
-- cannot deadlock; racing first debits of a cold shard merge in ON CONFLICT, which applies a
-- debit only while it fits; the CHECK backs that up.
--
-- Rate limits. A row with a rate limit is a candidate only if its bucket holds a token. Each
-- bucket refills to now: min(burst, tokens + rate × elapsed), a missing bucket being full. Its
-- candidates are granted in urgency order while their cumulative weight fits: a heavy row at the
-- head that does not fit yet blocks the lighter rows behind it (strict order, the head of the
-- line keeps its place). In the common case the whole batch of a key fits its balance and is
-- granted without that running sum. The writeback is one upsert per bucket in key order; it
-- recomputes the balance on the locked newest row and applies only while the grant still fits,
-- so picks racing over a bucket never overdraw it (a refused grant claims nothing:
-- rate_limit.contended), and racing first grants of a cold bucket meet on its primary key. A row
-- under both a gate and a limit takes a gate slot only once the limit granted it.
--
-- Hints. The candidate scan must test each row's gate or bucket (so that rows of a saturated key
-- never take the batch's places from the work behind them), and a test per row is a sub-select
-- per row. The caller names the keys it expects (@g_hint, @r_hint: the keys of its last batch);
-- the statement reads each of those once (when the first candidate row with a key or a limit
-- needs it), and tests a row of a hinted key against that answer: the same answer as the
-- row-by-row test, from the same snapshot. Rows of other keys are tested one by one. A hint is
-- only ever a list of what to read first: a wrong or stale one costs nothing but its own reads.
--
-- Locks, besides the candidates: the gate counters and buckets it writes (until commit).
-- Parameters: @g_names, @g_limits, @g_shards, @g_hint (gates); @r_names, @r_rates (tokens per
-- second), @r_bursts, @r_hint (limits).

-- Configuration: the gates, and the hinted keys a gate owns (known) and those of them with a
-- free slot (roomy).

-- fragment: gate_config
cfg AS (
  SELECT * FROM unnest(@g_names::text[], @g_limits::integer[], @g_shards::integer[]) AS g(name, lim, shards)
), ghint AS (
  SELECT coalesce(array_agg(h.key), '{}') AS known,
         coalesce(array_agg(h.key) FILTER (WHERE cfg.lim > coalesce((SELECT sum(g.held) FROM {schema}.gates AS g
                                                                     WHERE g.key = h.key), 0)), '{}') AS roomy
  FROM (SELECT DISTINCT key FROM unnest(@g_hint::text[]) AS u(key)) AS h
  JOIN cfg ON cfg.name = split_part(h.key, ':', 1)
)

-- Configuration: the rate limits, and the hinted keys a configured limit owns (known) and those
-- of them whose bucket holds a token (affordable).

-- fragment: rate_config
rcfg AS (
  SELECT * FROM unnest(@r_names::text[], @r_rates::double precision[], @r_bursts::double precision[])
         AS r(name, rate, burst)
), rhint AS (
  SELECT coalesce(array_agg(h.key), '{}') AS known,
         coalesce(array_agg(h.key) FILTER (WHERE coalesce((SELECT least(rc.burst, b.tokens + rc.rate * {{bucket_refill(b)}})
                                                           FROM {schema}.buckets AS b WHERE b.key = h.key), rc.burst) >= 1),
                  '{}') AS affordable
  FROM (SELECT DISTINCT key FROM unnest(@r_hint::text[]) AS u(key)) AS h
  JOIN rcfg AS rc ON rc.name = split_part(h.key, ':', 1)
)

-- The limited rows the rate limits may grant: all of them but a K = 1 key's rows after its most
-- urgent one in the window, which this pick cannot claim (the key runs one row at a time) and
-- which therefore take no tokens. eligible_ungated: every key is K = 1 (no gates);
-- eligible_gated: a key a gate owns may run several rows.

-- fragment: eligible_ungated
eligible AS MATERIALIZED (
  SELECT c.*
  FROM candidates AS c
  WHERE c.rkey IS NOT NULL
    AND (c.ckey IS NULL OR {{first_of_key(candidates)}})
)

-- fragment: eligible_gated
eligible AS MATERIALIZED (
  SELECT c.*
  FROM candidates AS c
  WHERE c.rkey IS NOT NULL
    AND (c.ckey IS NULL
         OR split_part(c.ckey, ':', 1) = ANY (@g_names::text[])
         OR {{first_of_key(candidates)}})
)

-- The grants: each bucket's, from the eligible rows.

-- fragment: rate_grants
limited AS MATERIALIZED (
  -- Each limited key of the window: the weight of its rows, and its bucket's balance now (read
  -- once per key, by key: a join could hash the whole buckets table).
  SELECT k.rkey, k.w, rc.rate, rc.burst,
         coalesce((SELECT least(rc.burst, b.tokens + rc.rate * {{bucket_refill(b)}})
                   FROM {schema}.buckets AS b WHERE b.key = k.rkey), rc.burst) AS balance
  FROM (SELECT rkey, sum(weight) AS w FROM eligible WHERE rkey IS NOT NULL GROUP BY rkey) AS k
  JOIN rcfg AS rc ON rc.name = split_part(k.rkey, ':', 1)
), rated AS MATERIALIZED (
  -- The general case, run only when some key's rows do not all fit its balance: each row of
  -- such a key with the cumulative weight up to it in its bucket's urgency order.
  SELECT c.*, l.balance,
         sum(c.weight) OVER (PARTITION BY c.rkey ORDER BY c.priority, c.scheduled_at, c.id) AS upto
  FROM eligible AS c
  JOIN limited AS l ON l.rkey = c.rkey AND l.w > l.balance
  WHERE (SELECT bool_or(w > balance) FROM limited)
), granted AS (
  -- Each bucket's grant: all of its rows' weight when it fits, else the prefix that fits (a
  -- prefix in urgency order: its weight is the largest cumulative weight in it).
  SELECT l.rkey, l.w AS weight, l.rate, l.burst, l.balance
  FROM limited AS l
  WHERE l.w <= l.balance
  UNION ALL
  SELECT r.rkey, max(r.upto), l.rate, l.burst, l.balance
  FROM rated AS r
  JOIN limited AS l ON l.rkey = r.rkey
  WHERE r.upto <= r.balance
  GROUP BY r.rkey, l.rate, l.burst, l.balance
)

-- The grant of a rate lane: the weight of all the lane's rows in the window, if a full bucket
-- holds it and none of them has a key (a keyed row is not the lane's to claim: its rows all go
-- to the admission pick, which grants them in order with the key's rule).

-- fragment: lane_grant
granted AS (
  SELECT CAST(@lr_key AS text) AS rkey, w.weight, rc.rate, rc.burst, rc.burst AS balance
  FROM (SELECT sum(c.weight) AS weight, bool_or(c.ckey IS NOT NULL) AS keyed
        FROM candidates AS c WHERE c.rkey = @lr_key) AS w
  JOIN rcfg AS rc ON rc.name = split_part(@lr_key, ':', 1)
  WHERE w.weight <= rc.burst AND NOT w.keyed
)

-- The writeback of each grant (granted: rkey, weight, rate, burst, and balance, the bucket's
-- balance as the pick read it, a full one for a lane, which reads none; a grant is never more
-- than a full bucket holds). Returns the buckets whose grant applied.
--
-- A missing bucket is minted as the balance the pick read less the grant, dated at the pick's
-- now(): exact whether the bucket was missing when the pick read it (a full one) or was deleted
-- by the GC sweep since (a bucket the pick read half empty must not come back full less the
-- grant: that would credit again the refill up to the sweep).
--
-- A write is dated by the pick's now(), or by the clock as it reads now when that is earlier:
-- only when the clock stepped back while the pick ran. Dated by its old clock, the bucket would
-- be ahead of the new one, and the next pick would count it full again.

-- fragment: bucket_debit
rdebit AS (
  INSERT INTO {schema}.buckets (key, tokens, rate, burst, updated_at)
  SELECT g.rkey, greatest(g.balance - g.weight, 0), g.rate, g.burst, least(now(), clock_timestamp())
  FROM granted AS g
  ORDER BY g.rkey
  ON CONFLICT (key) DO UPDATE
    SET tokens = greatest(least(EXCLUDED.burst, buckets.tokens + EXCLUDED.rate * {{bucket_refill(buckets)}})
                          - (SELECT g.weight FROM granted AS g WHERE g.rkey = EXCLUDED.key), 0),
        rate = EXCLUDED.rate, burst = EXCLUDED.burst, updated_at = least(now(), clock_timestamp())
    WHERE least(EXCLUDED.burst, buckets.tokens + EXCLUDED.rate * {{bucket_refill(buckets)}})
          - (SELECT g.weight FROM granted AS g WHERE g.rkey = EXCLUDED.key) >= -1e-9
  RETURNING key
)

-- admitted: the rows the rate limits let through (or that have none).

-- fragment: rate_admitted
admitted AS (
  SELECT c.id, c.ckey, c.rkey, c.weight, c.priority, c.scheduled_at
  FROM candidates AS c
  WHERE c.rkey IS NULL
     OR (c.id IN (SELECT e.id FROM eligible AS e)
         AND c.rkey IN (SELECT d.key FROM rdebit AS d)
         AND (c.rkey NOT IN (SELECT r.rkey FROM rated AS r) OR c.id IN (SELECT r.id FROM rated AS r WHERE r.upto <= r.balance)))
)

-- admitted, with no rate limits configured: every candidate.

-- fragment: admit_all
admitted AS (
  SELECT * FROM candidates
)

-- chosen: rows with no key, and the most urgent row of each key in the relation named by the
-- parameter (every key is K = 1: no gate is configured).

-- fragment: chosen_first_of_key(rel)
chosen AS MATERIALIZED (
  SELECT c.id, c.ckey, NULL::smallint AS shard
  FROM {{rel}} AS c
  WHERE c.ckey IS NULL OR {{first_of_key(rel)}}
)

-- chosen, with gates configured: rows with no key, the most urgent row of each K = 1 key (one no
-- gate owns), and the rows of gated keys whose gate debit applied.

-- fragment: chosen_gate_debit
gated AS MATERIALIZED (
  -- Each gated key of the batch: its gate, and how many of its rows were admitted.
  SELECT k.ckey, cfg.lim, cfg.shards, k.n
  FROM (SELECT c.ckey, count(*) AS n FROM admitted AS c WHERE c.ckey IS NOT NULL GROUP BY c.ckey) AS k
  JOIN cfg ON cfg.name = split_part(k.ckey, ':', 1)
), shards AS MATERIALIZED (
  -- Their shards, each with its capacity and its counter (read by key, shard by shard: a join
  -- could hash the whole gates table).
  SELECT k.ckey, k.n, s.shard,
         k.lim / k.shards + CASE WHEN s.shard < k.lim % k.shards THEN 1 ELSE 0 END AS cap,
         coalesce((SELECT g.held FROM {schema}.gates AS g WHERE g.key = k.ckey AND g.shard = s.shard), 0) AS held
  FROM gated AS k
  CROSS JOIN LATERAL generate_series(0, k.shards - 1) AS s(shard)
), best AS MATERIALIZED (
  -- Each key's emptiest shard (the lowest numbered among equals).
  SELECT DISTINCT ON (ckey) ckey, n, shard, cap, cap - held AS free
  FROM shards
  ORDER BY ckey, cap - held DESC, shard
), ranked AS (
  -- The general case, only for keys whose rows do not fit their emptiest shard: their rows in
  -- urgency order, and each shard's free slots as a range of ranks, emptiest shard first.
  SELECT c.id, c.ckey, row_number() OVER (PARTITION BY c.ckey ORDER BY c.priority, c.scheduled_at, c.id) AS rk
  FROM admitted AS c
  JOIN best AS b ON b.ckey = c.ckey AND b.free < b.n
), ranges AS MATERIALIZED (
  SELECT s.ckey, s.shard, s.cap, greatest(s.cap - s.held, 0) AS free,
         sum(greatest(s.cap - s.held, 0)) OVER (PARTITION BY s.ckey ORDER BY s.cap - s.held DESC, s.shard) AS upto
  FROM shards AS s
  JOIN best AS b ON b.ckey = s.ckey AND b.free < b.n
), spread AS MATERIALIZED (
  SELECT r.id, r.ckey, rg.shard::smallint AS shard, rg.cap
  FROM ranked AS r
  JOIN ranges AS rg ON rg.ckey = r.ckey AND r.rk > rg.upto - rg.free AND r.rk <= rg.upto
  -- (Decided once: in the common case neither ranked nor ranges is ever computed.)
  WHERE (SELECT bool_or(free < n) FROM best)
), debit AS (
  -- A debit that no longer fits (another pick took the slots since this statement's snapshot)
  -- does not apply, and its rows are not claimed: they stay available for the next pick.
  INSERT INTO {schema}.gates (key, shard, held, capacity)
  SELECT d.key, d.shard, d.n, d.cap
  FROM (SELECT b.ckey AS key, b.shard::smallint AS shard, b.n::integer AS n, b.cap FROM best AS b WHERE b.free >= b.n
        UNION ALL
        SELECT s.ckey, s.shard, count(*)::integer, s.cap FROM spread AS s GROUP BY s.ckey, s.shard, s.cap) AS d
  ORDER BY d.key, d.shard
  ON CONFLICT (key, shard) DO UPDATE SET held = gates.held + EXCLUDED.held
    WHERE gates.held + EXCLUDED.held <= gates.capacity
  RETURNING key, shard
), chosen AS MATERIALIZED (
  SELECT c.id, c.ckey, NULL::smallint AS shard
  FROM admitted AS c
  WHERE c.ckey IS NULL
     OR (split_part(c.ckey, ':', 1) <> ALL (@g_names::text[]) AND {{first_of_key(admitted)}})
  UNION ALL
  SELECT c.id, c.ckey, b.shard::smallint
  FROM admitted AS c
  JOIN best AS b ON b.ckey = c.ckey AND b.free >= b.n
  WHERE (b.ckey, b.shard::smallint) IN (SELECT d.key, d.shard FROM debit AS d)
  UNION ALL
  SELECT s.id, s.ckey, s.shard
  FROM spread AS s
  WHERE (s.ckey, s.shard) IN (SELECT d.key, d.shard FROM debit AS d)
)

-- The gate lease a leased pick admits its key's rows against (store/lease.go, lease.sql): the
-- caller asks for no more rows than its lease has free slots, so every row of the key in the
-- window fits.
-- Locks: the lease row FOR KEY SHARE, until commit: the reconciler removes only a lease it can
-- lock, so a lease this pick admits against cannot expire away under it; if it is gone or
-- expired, no row of the key is claimed. Parameters: @l_key, @l_shard, @l_owner.

-- fragment: lease_held
lease AS MATERIALIZED (
  SELECT gl.shard
  FROM {schema}.gate_leases AS gl
  WHERE gl.key = @l_key AND gl.shard = @l_shard AND gl.owner = @l_owner AND gl.expires_at > now()
  FOR KEY SHARE
)

-- chosen, on a gate lease: rows with no key, and the leased key's rows, into the lease's shard
-- with no counter read or written. A row of any other key that its test admitted is left
-- available for the caller's next pick, an admission pick (the caller picks again at once after
-- a short batch).

-- fragment: chosen_lease
chosen AS MATERIALIZED (
  SELECT c.id, c.ckey, NULL::smallint AS shard
  FROM candidates AS c
  WHERE c.ckey IS NULL
  UNION ALL
  SELECT c.id, c.ckey, l.shard
  FROM candidates AS c
  CROSS JOIN lease AS l
  WHERE c.ckey = @l_key
)

-- chosen, on a rate lane (a runner whose last batch was full and held rows of one rate limit and
-- no key): rows with no key or limit, and all of the lane's rows if its one grant applied, or
-- none of them. Rows of any other limit or key that their tests admitted are left available for
-- the caller's next pick, an admission pick, and so are the lane's rows when the bucket cannot
-- afford them all: the admission pick grants the prefix that fits. Parameter: @lr_key.

-- fragment: chosen_lane
chosen AS MATERIALIZED (
  SELECT c.id, c.ckey, NULL::smallint AS shard
  FROM candidates AS c
  WHERE c.ckey IS NULL
    AND (c.rkey IS NULL OR (c.rkey = @lr_key AND EXISTS (SELECT 1 FROM rdebit)))
)

-- refused: n, the buckets whose grant another pick's writeback beat this one to; denied, the
-- limited rows in the window their bucket could not afford (events: rate_limit.contended,
-- rate_limit.throttled).

-- fragment: refused_count
refused AS (
  SELECT (SELECT count(*) FROM granted AS g WHERE NOT EXISTS (SELECT 1 FROM rdebit AS d WHERE d.key = g.rkey)) AS n,
         (SELECT count(*) FROM rated AS r WHERE r.upto > r.balance) AS denied
)

-- refused, for a pick that refuses nothing it reports.

-- fragment: refused_none
refused AS (
  SELECT 0::bigint AS n, 0::bigint AS denied
)

-- The rest of a claimed row's inbox and of its join's children, past the first @claim_rows the
-- pick loaded (see the claim above), oldest first, one row each: streamed, they meet no size
-- limit but the client's memory. The inbox is read as of this statement, so it may hold signals
-- committed after the claim; the step sees them as it sees the others, and its progress consumes
-- the awaited ones it saw, by id. The children of a join are settled, and do not change.
-- Locks: none (plain reads). signals_instance (instance_id, id) from $2 on: O(rest). The children
-- through instances_parent (parent_id, parent_wave), sorted by id: O(children of the wave).
-- name: claim_inbox_rest
SELECT s.id, s.name, s.payload, s.inserted_at
FROM {schema}.signals AS s
WHERE s.instance_id = $1 AND s.id > $2
ORDER BY s.id;

-- name: claim_children_rest
SELECT w.id, w.machine, w.status::text, w.result, coalesce(w.errors -> -1 ->> 'error', '')
FROM {schema}.instances AS w
WHERE w.parent_id = $1 AND w.id > $2
  AND w.parent_wave = (SELECT p.spawn_wave FROM {schema}.instances AS p WHERE p.id = $1)
ORDER BY w.id;
