-- Statement family: outcomes.
--
-- One statement applies the outcomes of many steps at once (group commit): parallel arrays, one
-- element per outcome, joined to the instance rows by id. Every row is fenced by its claim: it is
-- updated only while it still holds the exact claim token the worker got from its pick (a token
-- is present exactly while the row is executing: the instances_claim constraint). A row whose
-- claim ran out and was reclaimed (by the reaper or another node) does not match, is left
-- untouched, and is missing from the result: the caller reports it as stale and drops it. So a
-- late commit can never rewind a row, overwrite a newer owner's progress, or repeat a side
-- effect (consuming signals, clearing an inbox, spawning children, settling a parent's join).
--
-- The statement is assembled from the fragments below (Store.ApplyOutcomes): outcome_update
-- always; outcome_consume, outcome_spawn, outcome_settle and outcome_credit only for batches that
-- need them, so the common batch is one plain UPDATE. Parameters are named (@name).
--
-- Locks: the UPDATE takes the row lock (FOR NO KEY UPDATE strength: no key column changes) on
-- each matched row. Claim tokens are unique per pick, so two committers never contend for an
-- outcome row; the heartbeat skips rows it finds locked (SKIP LOCKED), so it never waits on this
-- statement and the two cannot deadlock. A signal delivery holds the row lock from its first
-- statement to its commit, so it and an outcome of the same row are strictly ordered.
-- outcome_settle also locks each parent it decrements, in parent id order; committers racing to
-- settle children of the same parents serialize on the parent row and re-read its newest count.
-- outcome_credit locks the gate counters it credits, in (key, shard) order (see there).
--
-- The caller sends the outcome statement, then (in the same implicit transaction, one round
-- trip) purge_terminal_inboxes for rows that finished with signals in their inbox (as of the
-- pick), recheck_parked for rows that parked, and recount_spawned for parents that spawned; each
-- of those runs with a snapshot taken after the outcome statement holds its row locks. The
-- statement returns each applied row's signalled flag as of its commit: a row that finished and
-- received its first signal while its step ran is purged by a follow-up statement.
--
-- A batch that is its own transaction (not a caller's), or the outcome of a step committed in the
-- step's own top-level transaction right after it (store.EndingTx), runs under outcome_settings
-- (or, when its statement joins its own sets, outcome_settings_joined), sent first in the same
-- round trip.
--
-- Kinds (store.OutcomeKind): next, retry, done, failed, released (claim handed back untouched:
-- attempt restored, due after the delay; with an error kind, a recovery: the error recorded and
-- one more recovery counted), await (park on signal names, step =
-- the step to run on wake), spawn (park on children, step = the join step; with no children it
-- is runnable at once), upgrade (the row brought forward to a newer version of its machine by
-- the node that claimed it, before its step ran: step and state as the upgrade made them, the
-- claim handed back like released, due at once, the upgrade recorded in upgrades).
--
-- @ids, @owners claim; @kinds; @steps (NULL keeps); @states JSON text (NULL keeps); @delays ms
-- (next, retry, released); @results JSON text (done); @err_kinds (NULL: none), @err_msgs;
-- @await_names joined by the unit separator U+001F (names are printable); @await_ms timeout
-- (NULL: none); @spawned children count (spawn); @key_changes ('set' to @ckeys, 'release', or ''
-- to keep the concurrency key);
-- @rate_limits, @weights the next step's rate limit (next); @cr_keys, @cr_shards the gate slot the
-- execution held (see outcome_credit); @versions the machine version an upgrade brings the row to;
-- @fair_sets, @fair_keys the fairness key a Next sets; @fair_ranks, @fair_weights the row's rank
-- and its key's weight in the fair order (see fair_tag). An array whose every element would be its
-- default (NULL, 0 delay or children, no key change, weight 1, no version: only an upgrade's is
-- set) comes as NULL, which unnest reads as NULLs: a batch of jobs finishing sends three arrays
-- of the nineteen (ids, owners, kinds).

-- fragment: outcome_update
UPDATE {schema}.instances AS i
SET {{outcome_set}}
FROM {{outcome_input}}
{{outcome_match}}

-- The same, for a batch with a fairness key to set or a fair tag to give (@fair_sets, @fair_keys,
-- @fair_ranks, @fair_weights, joined by id): the other batches leave both columns as they are (the
-- claim cleared the tag).
-- fragment: outcome_update_fair
UPDATE {schema}.instances AS i
SET {{outcome_set}},
    -- Next may set the fairness key. A row runnable at once with a key gets its place in its
    -- queue's fair order (@fair_ranks, computed by the caller per queue, priority and key in the
    -- batch; NULL: no tag, which every other row gets: see insert.sql's fair_base).
    fair_key         = CASE WHEN fr.fair_set THEN fr.fair_key ELSE i.fair_key END,
    fair_tag         = CASE WHEN fr.fair_rank IS NOT NULL THEN
                         (SELECT {{fair_base(f)}} + fr.fair_rank / fr.fair_weight
                          FROM (SELECT i.queue, i.priority,
                                       CASE WHEN fr.fair_set THEN fr.fair_key ELSE i.fair_key END AS fair_key) AS f)
                       END
FROM {{outcome_input}}
JOIN unnest(@ids::bigint[], @fair_sets::boolean[], @fair_keys::text[], @fair_ranks::integer[],
            @fair_weights::double precision[]) AS fr(id, fair_set, fair_key, fair_rank, fair_weight) ON fr.id = u.id
{{outcome_match}}

-- The outcomes, one row each.
-- fragment: outcome_input
unnest(@ids::bigint[], @owners::text[], @kinds::text[], @steps::text[], @states::text[],
            @delays::bigint[], @results::text[], @err_kinds::text[], @err_msgs::text[],
            @await_names::text[], @await_ms::bigint[], @spawned::integer[], @key_changes::text[],
            @ckeys::text[], @rate_limits::text[], @weights::integer[], @cr_keys::text[], @cr_shards::smallint[],
            @versions::integer[])
     AS u(id, owner, kind, step, state, delay_ms, result, err_kind, err_msg, await_names, await_ms, spawned,
          key_change, ckey, rate_limit, weight, cr_key, cr_shard, version)

-- The assignments of every outcome.
-- fragment: outcome_set
status           = (CASE u.kind WHEN 'done' THEN 'done' WHEN 'failed' THEN 'failed' WHEN 'await' THEN 'awaiting'
                                    WHEN 'spawn' THEN (CASE WHEN coalesce(u.spawned, 0) > 0 THEN 'joining' ELSE 'available' END)
                                    ELSE 'available' END)::{schema}.status,
    step             = coalesce(u.step, i.step),
    state            = coalesce(u.state::jsonb, i.state),
    attempt          = CASE WHEN u.kind IN ('next', 'await', 'spawn') THEN 0
                            WHEN u.kind IN ('released', 'upgrade') THEN greatest(i.attempt - 1, 0)
                            ELSE i.attempt END,
    -- A hand-back with a reason (err_kind) is a recovery: the claim was lost, not spent.
    recoveries       = CASE WHEN u.kind IN ('next', 'await', 'spawn') THEN 0
                            WHEN u.kind = 'released' AND u.err_kind IS NOT NULL THEN i.recoveries + 1
                            ELSE i.recoveries END,
    scheduled_at     = CASE WHEN u.kind IN ('next', 'retry', 'released', 'upgrade') THEN now() + coalesce(u.delay_ms, 0) * interval '1 millisecond'
                            WHEN u.kind = 'spawn' THEN now()
                            ELSE i.scheduled_at END,
    locked_by        = NULL,
    locked_until     = NULL,
    result           = CASE u.kind WHEN 'done' THEN u.result::jsonb ELSE i.result END,
    errors           = CASE WHEN u.err_kind IS NULL THEN i.errors
                            ELSE (CASE WHEN jsonb_array_length(coalesce(i.errors, '[]'::jsonb)) >= 20
                                       THEN i.errors - 0
                                       ELSE coalesce(i.errors, '[]'::jsonb) END)
                                 || jsonb_build_array(jsonb_build_object(
                                      'at', now(), 'step', i.step, 'attempt', i.attempt,
                                      'kind', u.err_kind, 'error', u.err_msg))
                       END,
    -- Await names live until the woken step's outcome: a retry of that step still needs them.
    await_names      = CASE WHEN u.kind = 'await' THEN string_to_array(u.await_names, E'\x1f')
                            WHEN u.kind IN ('retry', 'released', 'upgrade') THEN i.await_names
                            ELSE NULL END,
    await_deadline   = CASE WHEN u.kind = 'await' AND u.await_ms IS NOT NULL
                            THEN now() + u.await_ms * interval '1 millisecond' END,
    -- A spawn opens a new wave of children; the join step (and its retries) sees that wave.
    pending_children = CASE WHEN u.kind = 'spawn' THEN coalesce(u.spawned, 0) ELSE i.pending_children END,
    spawn_wave       = CASE WHEN u.kind = 'spawn' THEN coalesce(i.spawn_wave, 0) + 1 ELSE i.spawn_wave END,
    join_due         = CASE WHEN u.kind = 'spawn' THEN true WHEN u.kind IN ('retry', 'released', 'upgrade') THEN i.join_due END,
    -- Next may set or release the concurrency key ('' keeps it). Every outcome ends the
    -- execution, so the gate shard it held is no longer the row's.
    concurrency_key  = CASE u.key_change WHEN 'set' THEN u.ckey WHEN 'release' THEN NULL ELSE i.concurrency_key END,
    concurrency_shard = NULL,
    -- A rate limit is per transition: the step a Next leads to runs under the limit that Next
    -- names (or none); a retried or released step keeps its own.
    rate_limit       = CASE WHEN u.kind IN ('retry', 'released', 'upgrade') THEN i.rate_limit ELSE u.rate_limit END,
    weight           = CASE WHEN u.kind IN ('retry', 'released', 'upgrade') THEN i.weight ELSE coalesce(u.weight, 1) END,
    machine_version  = CASE WHEN u.kind = 'upgrade' THEN u.version ELSE i.machine_version END,
    upgrades         = CASE WHEN u.kind = 'upgrade'
                            THEN coalesce(i.upgrades, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                                   'from', i.machine_version, 'to', u.version, 'at', now(),
                                   'step_from', i.step, 'step_to', u.step, 'by', u.owner))
                            ELSE i.upgrades END,
    finalized_at     = CASE WHEN u.kind IN ('done', 'failed') THEN now() END,
    -- The step that just ran joins the path when it moved the instance on or finished it.
    path             = CASE WHEN u.kind IN ('next', 'done', 'failed', 'await', 'spawn')
                            THEN (coalesce(i.path, '{}') || i.step)[greatest(cardinality(i.path) - 48, 1):]
                            ELSE i.path END,
    updated_at       = now()

-- The fence, and what an applied outcome returns.
-- fragment: outcome_match
WHERE i.id = u.id
  -- The token alone is the fence (no "status = 'executing'" here): that predicate would let the
  -- planner read the whole instances_executing index, dead entries and all, instead of looking
  -- the rows up by id.
  AND i.locked_by = u.owner
RETURNING i.id, u.owner, i.signalled IS TRUE AS signalled, u.kind, i.parent_id, i.spawn_wave, u.cr_key, u.cr_shard

-- Progress (next, await, spawn) consumes exactly the awaited signals the step saw (its
-- Ctx.Awaited): (@seen_inst, @seen_sig) pairs of (instance id, signal id) from the pick's inbox
-- load (and, for a large inbox, the executor's read of the rest, store.LoadRest). Signals it saw
-- but did not await stay in the inbox (an instance can await them later); latecomers stay too. Retry and released consume nothing.
-- Locks: the deleted signal rows.

-- fragment: outcome_consume
DELETE FROM {schema}.signals AS s
USING unnest(@seen_inst::bigint[], @seen_sig::bigint[]) AS c(instance_id, signal_id), upd
WHERE s.id = c.signal_id
  AND c.instance_id = upd.id
  AND upd.kind IN ('next', 'await', 'spawn')

-- A spawn's children, inserted only for parents whose outcome applied, in (machine,
-- correlation_key) order like every insert. A child whose key is taken by a live instance of its
-- machine is not inserted (recount_spawned then counts only the children that were).
-- Locks: the new rows and the unique index's insertion lock on each new key. A key whose live
-- instance another transaction is finishing right now (its status leaves the index's scope, not
-- yet committed) makes the insert wait for that transaction. So the statement inserts the
-- children right after the outcome_update, before it settles any join (outcome_settle) or
-- credits any gate slot (outcome_credit): holding a parent or a counter while waiting here
-- would deadlock with that transaction settling the same parent or crediting the same counter
-- (ApplyOutcomes makes the main query read this CTE between the two; PostgreSQL runs a
-- data-modifying CTE no one reads only after the whole query).
-- @c_parent, @c_machine, @c_step, @c_state, @c_queue, @c_priority, @c_scheduled_at, @c_delay,
-- @c_max_attempts, @c_key, @c_ord, @c_ckey, @c_rate, @c_weight, @c_version: one element per child.

-- A child with a fairness key joins the fair order without a tag (the pick places it: see pick.sql).
-- fragment: outcome_spawn
INSERT INTO {schema}.instances (machine, step, state, queue, priority, scheduled_at, max_attempts,
                                correlation_key, concurrency_key, rate_limit, weight, parent_id, parent_wave,
                                machine_version, fair_key)
SELECT c.machine, c.step, c.state::jsonb, c.queue, c.priority,
       coalesce(c.scheduled_at, now() + c.delay_ms * interval '1 millisecond'),
       c.max_attempts, c.correlation_key, c.concurrency_key, c.rate_limit, c.weight, upd.id, upd.spawn_wave,
       c.machine_version, c.fair_key
FROM unnest(@c_parent::bigint[], @c_machine::text[], @c_step::text[], @c_state::text[], @c_queue::text[],
            @c_priority::smallint[], @c_scheduled_at::timestamptz[], @c_delay::bigint[],
            @c_max_attempts::integer[], @c_key::text[], @c_ord::integer[], @c_ckey::text[], @c_rate::text[],
            @c_weight::integer[], @c_version::integer[], @c_fair_key::text[])
     AS c(parent, machine, step, state, queue, priority, scheduled_at, delay_ms, max_attempts, correlation_key,
          ord, concurrency_key, rate_limit, weight, machine_version, fair_key)
JOIN upd ON upd.id = c.parent
ORDER BY c.machine, c.correlation_key NULLS LAST, c.ord
ON CONFLICT (machine, correlation_key)
  WHERE correlation_key IS NOT NULL AND status IN ('available', 'executing', 'awaiting', 'joining')
  DO NOTHING
RETURNING 1

-- The join barrier: every child that finished here (the statement's "finished" relation: one
-- row per finished child, with its parent_id) decrements its parent's count of unsettled
-- children, and the decrement that reaches zero makes the parent runnable, in this statement.
-- Only a joining parent counts: a parent that was cancelled or failed meanwhile is left alone,
-- and its children's completion wakes nobody. A CHECK keeps the count from going below zero.
-- Used by the outcome statement and by the reaper (release_expired in maintenance.sql).
-- Locks: each parent row, in parent id order. The sub-select d takes them: its locking step runs
-- after its sort. (Left to the join, the order would be the scan's, which is the heap's: every
-- update that is not HOT moves a parent's row, so two committers settling the same parents
-- could lock them in opposite orders and deadlock.)

-- fragment: outcome_settle
UPDATE {schema}.instances AS p
SET pending_children = p.pending_children - d.n,
    status           = CASE WHEN p.pending_children - d.n = 0 THEN 'available'::{schema}.status
                            ELSE p.status END,
    scheduled_at     = CASE WHEN p.pending_children - d.n = 0 THEN now() ELSE p.scheduled_at END,
    updated_at       = now()
FROM (SELECT l.id, f.n
      FROM (SELECT parent_id, count(*)::integer AS n FROM finished GROUP BY parent_id) AS f
      JOIN {schema}.instances AS l ON l.id = f.parent_id
      WHERE l.status = 'joining'
      ORDER BY l.id
      FOR NO KEY UPDATE OF l) AS d
WHERE p.id = d.id
  AND p.status = 'joining'
RETURNING p.id, p.queue, p.status = 'available' AS woke

-- Gate credits: every applied outcome of an execution that held a gate slot gives it back to the
-- shard it debited (@cr_keys, @cr_shards in outcome_update's arrays: the key and shard as the pick
-- claimed them, NULL for an execution that held none; an applied row returns them). A counter
-- never goes below zero here: should it have drifted low, the reconciler (maintenance.sql) sets it from
-- the executing rows.
-- Locks: the gate counter rows, in (key, shard) order, like the pick's debit: the sub-select c
-- takes them after its sort (a join would take them in its scan's order, the heap's).

-- fragment: outcome_credit
UPDATE {schema}.gates AS g
SET held = greatest(g.held - c.n, 0)
FROM (SELECT l.key, l.shard, x.n
      FROM (SELECT upd.cr_key AS key, upd.cr_shard AS shard, count(*)::integer AS n
            FROM upd
            WHERE upd.cr_shard IS NOT NULL
            GROUP BY 1, 2) AS x
      JOIN {schema}.gates AS l ON l.key = x.key AND l.shard = x.shard
      ORDER BY l.key, l.shard
      FOR NO KEY UPDATE OF l) AS c
WHERE g.key = c.key AND g.shard = c.shard

-- The rest of the assembled statement (ApplyOutcomes): the children that finished here (for
-- outcome_settle), and the statement's result: the applied rows, then the parents it woke. A
-- branch that reads kids (and returns nothing) makes the children's insert run right after the
-- outcome_update: PostgreSQL runs a data-modifying CTE no branch reads only after the whole
-- query (see outcome_spawn for why the order matters).

-- fragment: outcome_finished
SELECT parent_id FROM upd WHERE kind IN ('done', 'failed') AND parent_id IS NOT NULL

-- fragment: outcome_applied
SELECT id, owner, signalled, kind, NULL::text AS queue FROM upd

-- fragment: outcome_kids_first
SELECT NULL, NULL, NULL, NULL, NULL FROM (SELECT count(*) AS n FROM kids) AS k WHERE k.n < 0

-- fragment: outcome_woken
SELECT id, NULL, NULL, NULL, queue FROM settled WHERE woke

-- The settings an outcome batch runs under, local to its implicit transaction: no sequential
-- scan, hash join or merge join, and no JIT. Every statement of a plain batch reads rows by key
-- (the outcomes' ids by primary key, signals by instance, parked rows by id); but a table never
-- analyzed (a new installation) or grown much since, and an array of a few hundred ids, made
-- Postgres hash the whole table instead: 300 outcomes on a table of 30,000 rows took 17 ms
-- instead of 6 (TestOutcomeBatchesReadRowsByKey). No JIT: with the scans off, a statement left
-- no other way carries their penalty cost, far above jit_above_cost. And the cached generic plan
-- from the first run, which with these settings is the plan by key at any size: planned on every
-- run, the settings cost a single outcome's batch 0.3 ms (`bench --scenario await` p50).
-- (The pick's, pick.sql's by_key_settings.) And the engine's own statement timeout (pick.sql's
-- engine_statement_timeout; see pick_settings).
-- name: outcome_settings
SELECT {{engine_statement_timeout}},
       {{by_key_settings}};

-- The same for a batch whose statement joins its own sets (the children or the consumed signals
-- to the applied outcomes, upd): those have no index, and a nested loop between them costs their
-- product (300 spawns of two children: 53 ms instead of 13), so hash and merge joins stay on, and
-- the statement is planned for its sets' sizes on every run (a generic plan guesses ten rows
-- each, and loops).
-- name: outcome_settings_joined
SELECT {{engine_statement_timeout}},
       pg_catalog.set_config('jit', 'off', true),
       pg_catalog.set_config('enable_seqscan', 'off', true);

-- The inboxes of instances that just finished: a terminal outcome clears the whole inbox,
-- latecomers included. A fresh snapshot (after the outcome statement took the row locks) sees
-- every signal whose delivery committed before; a delivery after it finds the instance finished
-- and stores nothing. Only rows that really are finished are touched (an id whose outcome was
-- stale belongs to another owner).
-- Each signal's instance is looked up by primary key (a scalar sub-select, which the planner
-- cannot turn into a join): as a join, a plan made without statistics (a new schema) hashed every
-- finished row of the table for each purge of a few inboxes.
-- Locks: the deleted signal rows.
-- $1 ids.

-- name: purge_terminal_inboxes
DELETE FROM {schema}.signals AS s
WHERE s.instance_id = ANY($1::bigint[])
  AND (SELECT i.status FROM {schema}.instances AS i WHERE i.id = s.instance_id)
      IN ('done', 'failed', 'cancelled');

-- The park's re-check: wake at once the instances that just parked but already have a signal
-- they await (one delivered while the step ran, after the pick's inbox load). With the delivery's
-- own flip (see signal.sql) this closes the lost-wakeup race under READ COMMITTED: whichever
-- takes the row lock second sees the other's committed work.
-- Locks: the row lock of each instance it wakes.
-- $1 ids. Returns the woken ids and their queues.

-- name: recheck_parked
UPDATE {schema}.instances AS i
SET status = 'available', scheduled_at = now(), updated_at = now()
WHERE i.id = ANY($1::bigint[])
  AND i.status = 'awaiting'
  AND EXISTS (SELECT 1 FROM {schema}.signals AS s
              WHERE s.instance_id = i.id AND s.name = ANY(i.await_names))
RETURNING i.id, i.queue;

-- A spawn's count, made true: the parents this transaction just parked on children (their
-- updated_at is this transaction's now()) count exactly the children of their new wave that were
-- inserted (a child whose correlation key was taken was not); a parent left with none is
-- runnable at once. The children are still invisible to every other transaction, so none of
-- them can have settled yet.
-- Locks: the row lock of each parent whose count it corrects.
-- $1 parent ids. Returns the parents it made runnable.

-- name: recount_spawned
UPDATE {schema}.instances AS p
SET pending_children = k.n,
    status           = CASE WHEN k.n = 0 THEN 'available'::{schema}.status ELSE p.status END,
    scheduled_at     = CASE WHEN k.n = 0 THEN now() ELSE p.scheduled_at END
FROM (SELECT q.id, (SELECT count(*)::integer FROM {schema}.instances AS c
                    WHERE c.parent_id = q.id AND c.parent_wave = q.spawn_wave) AS n
      FROM {schema}.instances AS q
      WHERE q.id = ANY($1::bigint[]) AND q.status = 'joining' AND q.updated_at = now()) AS k
WHERE p.id = k.id
  AND p.pending_children <> k.n
RETURNING p.id, p.queue;
