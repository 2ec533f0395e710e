-- Statement family: outcomes.
--
-- One statement applies the outcomes of many steps at once (group commit): parallel arrays, one
-- element per outcome, joined to the instance rows by id. Every row is fenced by its claim: it is
-- updated only while it still holds the exact claim token the worker got from its pick (a token
-- is present exactly while the row is executing: the instances_claim constraint). A row whose claim ran out and was reclaimed (by the reaper or another node) does not
-- match, is left untouched, and is missing from RETURNING: the caller reports it as stale and
-- drops it. So a late commit can never rewind a row, overwrite a newer owner's progress, or
-- repeat a terminal side effect.
--
-- Locks: the UPDATE takes the row lock (FOR NO KEY UPDATE strength: no key column changes) on
-- each matched row. Claim tokens are unique per pick, so two committers never contend for a
-- row; the heartbeat skips rows it finds locked (SKIP LOCKED), so it never waits on this
-- statement and the two cannot deadlock.
--
-- Kinds: 1 next, 2 retry, 3 done, 4 failed, 5 released (claim handed back untouched: attempt
-- restored, no error recorded, due after the delay).
--
-- $1 id, $2 claim token, $3 kind, $4 step (NULL keeps), $5 state JSON text (NULL keeps),
-- $6 delay ms (next, retry, released), $7 result JSON text (done), $8 error kind (NULL: none),
-- $9 error text.

-- name: apply_outcomes
WITH u AS (
  SELECT *
  FROM unnest($1::bigint[], $2::text[], $3::smallint[], $4::text[], $5::text[],
              $6::bigint[], $7::text[], $8::text[], $9::text[])
       AS u(id, owner, kind, step, state, delay_ms, result, err_kind, err_msg)
)
UPDATE {schema}.instances AS i
SET status       = (CASE u.kind WHEN 3 THEN 'done' WHEN 4 THEN 'failed' ELSE 'available' END)::{schema}.status,
    step         = coalesce(u.step, i.step),
    state        = coalesce(u.state::jsonb, i.state),
    attempt      = CASE u.kind WHEN 1 THEN 0 WHEN 5 THEN greatest(i.attempt - 1, 0) ELSE i.attempt END,
    scheduled_at = CASE WHEN u.kind IN (1, 2, 5)
                        THEN now() + u.delay_ms * interval '1 millisecond'
                        ELSE i.scheduled_at END,
    locked_by    = NULL,
    locked_until = NULL,
    result       = CASE u.kind WHEN 3 THEN u.result::jsonb ELSE i.result END,
    errors       = CASE WHEN u.err_kind IS NULL THEN i.errors
                        ELSE (CASE WHEN jsonb_array_length(coalesce(i.errors, '[]'::jsonb)) >= 20
                                   THEN i.errors - 0
                                   ELSE coalesce(i.errors, '[]'::jsonb) END)
                             || jsonb_build_array(jsonb_build_object(
                                  'at', now(), 'step', i.step, 'attempt', i.attempt,
                                  'kind', u.err_kind, 'error', u.err_msg))
                   END,
    finalized_at = CASE WHEN u.kind IN (3, 4) THEN now() END,
    updated_at   = now()
FROM u
WHERE i.id = u.id
  -- The token alone is the fence (no "status = 'executing'" here): that predicate would let the
  -- planner read the whole instances_executing index, dead entries and all, instead of looking
  -- the rows up by id.
  AND i.locked_by = u.owner
RETURNING i.id, u.owner;
