-- Statement family: signals.
--
-- Delivery is one statement. Its UPDATE of the target row comes first: it takes the row lock
-- (waiting for an outcome or a park of that row in flight), re-reads the row's newest version,
-- and decides there, in its SET, whether this signal wakes a parked instance (status awaiting
-- and the name among await_names: back to available, due now). The flip is never decided in a
-- WHERE over an older snapshot: with the park's re-check (recheck_parked in outcome.sql) this is
-- what makes a signal racing a park unable to strand it. The signal is stored only for a live
-- target the UPDATE matched; a finished or missing target gets nothing stored and no row
-- returned (ErrNoTarget).
--
-- Locks: the target instance row (the UPDATE's lock, held to commit; the signal insert's
-- foreign-key check then needs nothing more), the new signal row.
--
-- $1 target id (NULL: by key), $2 machine, $3 correlation key, $4 name, $5 payload JSON text.
-- Returns the signal id, the instance id, whether this signal made it runnable, and its queue.

-- name: deliver_signal
WITH target AS (
  UPDATE {schema}.instances AS i
  SET status       = CASE WHEN {{wakes}} THEN 'available'::{schema}.status ELSE i.status END,
      scheduled_at = CASE WHEN {{wakes}} THEN now() ELSE i.scheduled_at END,
      signalled    = true,
      updated_at   = now()
  WHERE i.id = {{signal_target}}
    AND i.status IN ('available', 'executing', 'awaiting', 'joining')
  -- A flip sets scheduled_at to this transaction's now(); nothing else does that to a live row.
  RETURNING i.id, i.queue, i.status = 'available' AND i.scheduled_at = now() AS woke
), stored AS (
  INSERT INTO {schema}.signals (instance_id, name, payload)
  SELECT id, $4::text, $5::text::jsonb FROM target
  RETURNING id, instance_id
)
SELECT stored.id, stored.instance_id, target.woke, target.queue
FROM stored JOIN target ON target.id = stored.instance_id;

-- Delivery that also claims the instance it wakes, for a client that can run it at once (Signal
-- on a client working the target's queue, with a slot reserved there): the step starts as the
-- call returns, without a poke, a pick or the pick's row version. It is deliver_signal with the
-- claim folded into the flip, decided on the same locked newest version: a woken row goes
-- straight to executing under the client's claim token (attempt + 1, a lease), as a pick would
-- claim it, when all of these hold:
--   - its queue is one the client reserved a slot in ($6 queues, $7 their claim tokens);
--   - it has no concurrency key, rate limit or fairness key (those are admitted by the picks);
--   - it is not paused, and its machine is one the client runs at a version it knows ($8 names,
--     $9 versions: every machine the client registered and has not seen paused);
--   - nothing more urgent is due in its queue (clear, below);
--   - the version locked is the one the statement's snapshot reads (the same ctid): the inbox it
--     returns is read in that snapshot, and is the row's only if no transaction changed the row
--     since. An outcome that consumed signals and parked the row, committed while this statement
--     waited for the row's lock, would otherwise leave the consumed signals in the returned
--     inbox, and the step would see them twice (TestNoLostWakeupsUnderRacingSignals). Such a
--     wake is a plain one.
-- Otherwise the flip is the plain one (available, due now) and the caller pokes the queue.
--
-- clear: no untagged row of a strictly more urgent priority is due in the queue, and no tagged
-- row of the same priority or a more urgent one is runnable (one descent each of the pick
-- indexes, as insert_claim's test, on the snapshot's row: its queue and priority do not change
-- while it lives). A woken instance is a continuation of work already started, so it does not
-- queue behind due rows of its own priority: within a priority, a wake on a client with a free
-- slot goes first. The test reads without locking; a row that becomes due meanwhile can at worst
-- start after the woken one.
--
-- Locks: as deliver_signal (the target row, to commit; the new signal row). The wait for the
-- target's row lock is bounded (deliver_signal_claim_settings, sent first in the same round trip):
-- the caller holds executor slots for it meanwhile, and a claim made after a long wait would
-- start with its lease already spent. Past the bound nothing is stored, and the caller delivers
-- with deliver_signal.
--
-- $1 target id (NULL: by key), $2 machine, $3 correlation key, $4 name, $5 payload JSON text,
-- $6 queues, $7 claim tokens, $8 machine names, $9 machine versions, $10 paused machines, $11 the
-- lease in ms, $12 how many signals of the inbox to return.
-- Returns deliver_signal's columns, whether the row was claimed, and for a claimed row what a
-- pick returns (the inbox as of the statement's snapshot, without this signal, up to $12
-- signals), and the new signal's payload as stored and its time.

-- The lock wait's bound, $1, local to the implicit transaction of the round trip.
-- name: deliver_signal_claim_settings
SELECT pg_catalog.set_config('lock_timeout', $1, true);

-- name: deliver_signal_claim
WITH t AS MATERIALIZED (
  SELECT k.id, k.queue, k.priority, k.ctid
  FROM {schema}.instances AS k
  WHERE k.id = {{signal_target}}
), c AS MATERIALIZED (
  SELECT t.id, t.ctid,
         NOT EXISTS (SELECT 1 FROM generate_series(1, t.priority - 1) AS p(priority),
                     LATERAL (SELECT x.scheduled_at <= now() AS due
                              FROM {schema}.instances AS x
                              WHERE x.status = 'available' AND x.fair_tag IS NULL AND x.queue = t.queue
                                AND x.priority = p.priority::smallint
                              ORDER BY x.scheduled_at, x.id
                              LIMIT 1) AS first
                     WHERE first.due)
         AND (SELECT x.fair_tag FROM {schema}.instances AS x
              WHERE x.status = 'available' AND x.fair_tag IS NOT NULL AND x.queue = t.queue
                AND x.priority <= t.priority
              ORDER BY x.priority, x.fair_tag LIMIT 1) IS NULL AS clear
  FROM t
), target AS (
  UPDATE {schema}.instances AS i
  SET status       = CASE WHEN NOT {{wakes}} THEN i.status
                          WHEN {{wake_claims}} THEN 'executing'::{schema}.status
                          ELSE 'available'::{schema}.status END,
      scheduled_at = CASE WHEN {{wakes}} THEN now() ELSE i.scheduled_at END,
      attempt      = CASE WHEN {{wakes}} AND {{wake_claims}} THEN i.attempt + 1 ELSE i.attempt END,
      locked_by    = CASE WHEN {{wakes}} AND {{wake_claims}}
                          THEN (SELECT o.owner FROM unnest($6::text[], $7::text[]) AS o(queue, owner)
                                WHERE o.queue = i.queue)
                          ELSE i.locked_by END,
      locked_until = CASE WHEN {{wakes}} AND {{wake_claims}}
                          THEN now() + $11::bigint * interval '1 millisecond'
                          ELSE i.locked_until END,
      signalled    = true,
      updated_at   = now()
  FROM c
  WHERE i.id = c.id
    AND i.status IN ('available', 'executing', 'awaiting', 'joining')
  RETURNING i.id, i.queue,
            i.status = 'available' AND i.scheduled_at = now() AS woke,
            i.status = 'executing' AND i.scheduled_at = now() AND i.locked_by = ANY($7::text[]) AS claimed,
            i.machine, i.step, i.state, i.attempt, i.max_attempts, i.priority,
            coalesce(i.correlation_key, '') AS correlation_key, i.inserted_at, i.await_names,
            i.parent_id IS NOT NULL AS child, i.machine_version, i.recoveries, i.locked_by
), stored AS (
  INSERT INTO {schema}.signals (instance_id, name, payload)
  SELECT id, $4::text, $5::text::jsonb FROM target
  RETURNING id, instance_id, inserted_at, payload
)
SELECT stored.id, stored.instance_id, target.woke, target.queue, target.claimed,
       target.machine, target.step, target.state, target.attempt, target.max_attempts, target.priority,
       target.correlation_key, target.inserted_at, target.await_names, target.child,
       target.machine_version, target.recoveries, target.locked_by,
       -- The inbox in the statement's snapshot: without the signal stored above.
       CASE WHEN target.claimed THEN
         (SELECT jsonb_agg(jsonb_build_object('id', s.id, 'name', s.name, 'payload', s.payload,
                                              'at', s.inserted_at) ORDER BY s.id)
          FROM (SELECT s.id, s.name, s.payload, s.inserted_at FROM {schema}.signals AS s
                WHERE s.instance_id = target.id ORDER BY s.id LIMIT $12::integer) AS s)
       END,
       stored.payload::text, stored.inserted_at
FROM stored JOIN target ON target.id = stored.instance_id;

-- The target's id: $1, else the live instance of machine $2 with correlation key $3.
-- fragment: signal_target
coalesce($1::bigint,
         (SELECT k.id FROM {schema}.instances AS k
          WHERE k.machine = $2::text AND k.correlation_key = $3::text
            AND k.status IN ('available', 'executing', 'awaiting', 'joining')))

-- Whether this signal ($4) wakes the locked row i: it awaits that name. Decided in SET, on the
-- newest version (see deliver_signal).
-- fragment: wakes
(i.status = 'awaiting' AND $4::text = ANY(i.await_names))

-- Whether the locked row i, awaiting the signal, can be claimed by the delivering client (see
-- deliver_signal_claim).
-- fragment: wake_claims
(c.clear AND i.ctid = c.ctid AND i.queue = ANY($6::text[]) AND i.concurrency_key IS NULL AND i.rate_limit IS NULL
 AND i.fair_key IS NULL AND i.paused_at IS NULL AND i.machine <> ALL($10::text[])
 AND (i.machine_version <= (SELECT m.version FROM unnest($8::text[], $9::integer[]) AS m(name, version)
                            WHERE m.name = i.machine)) IS TRUE)
