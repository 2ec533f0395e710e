-- Statement family: GC of finished instances (the GC sweep).
--
-- Finished rows (done, failed, cancelled) are kept for a retention period after finalized_at
-- (Client.Get, Await, deduplication scopes that include finished instances, the operator's
-- queries), then deleted. One statement deletes at most a batch, chosen through the
-- instances_finalized index in (finalized_at, id) order: it reads O(batch) index entries, never
-- the whole table, however many rows are finished.
--
-- Within one sweep the caller pages with a keyset cursor ((finalized_at, id) of the last row the
-- previous batch deleted): each batch starts its index scan where the previous one stopped, so it
-- never steps over the entries of rows the sweep already deleted (dead until vacuum removes them)
-- or over the rows it has to keep (children a live parent still needs). The cost of a batch stays
-- the same from the first batch of a sweep to the last.
--
-- Signals: the inbox of a deleted instance goes with it (signals.instance_id is ON DELETE
-- CASCADE). A terminal outcome already cleared it; the cascade takes whatever is left.
--
-- Children: a parent's join step reads the children of its latest wave (pick.sql loads them when
-- join_due is set, and a retried join reads them again). So a finished child is deleted only when
-- its parent is finished or gone, or the child belongs to an older wave than the parent's latest
-- (no join reads an older wave again). A live parent's current wave stays until the parent
-- finishes (and then ages out like any row).
--
-- Locks: the rows it deletes, FOR UPDATE SKIP LOCKED in (finalized_at, id) order, the index's
-- order. Concurrent sweepers on several nodes never wait on each other, never deadlock and never
-- delete a row twice: a row another sweeper holds is skipped (and deleted by that sweeper), a row
-- another sweeper deleted is gone from this statement's snapshot or skipped while its delete is
-- uncommitted. FOR UPDATE (not NO KEY UPDATE) because a delete needs it; it conflicts with the
-- FOR KEY SHARE of a signal insert's foreign-key check, so a finished row being signalled right
-- now (the delivery then stores nothing: the target is finished) is left for the next sweep. The
-- parent check reads the parent row without locking it: a parent seen live keeps its children for
-- this sweep; a parent seen finished never runs a join again.
--
-- @retention_ms retention; @after_at, @after_id the cursor ('-infinity', 0 to start); @batch.
-- Returns how many rows it deleted and the cursor after them (NULL when it deleted none).

-- name: gc_instances
WITH doomed AS (
  SELECT i.id, i.finalized_at
  FROM {schema}.instances AS i
  WHERE i.status IN ('done', 'failed', 'cancelled')
    AND i.finalized_at < now() - @retention_ms::bigint * interval '1 millisecond'
    AND (i.finalized_at, i.id) > (@after_at::timestamptz, @after_id::bigint)
    AND (i.parent_id IS NULL
         OR NOT EXISTS (SELECT 1 FROM {schema}.instances AS p
                        WHERE p.id = i.parent_id
                          AND p.status IN ('available', 'executing', 'awaiting', 'joining')
                          AND (i.parent_wave IS NULL OR p.spawn_wave IS NULL
                               OR i.parent_wave >= p.spawn_wave)))
  ORDER BY i.finalized_at, i.id
  LIMIT @batch
  FOR UPDATE OF i SKIP LOCKED
), gone AS (
  -- By primary key, as an array: a join here could become a merge join over the whole primary
  -- key in a prepared statement's generic plan.
  DELETE FROM {schema}.instances AS i
  WHERE i.id = ANY (ARRAY(SELECT id FROM doomed))
  RETURNING i.id
), last AS (
  SELECT finalized_at, id FROM doomed ORDER BY finalized_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM gone), (SELECT finalized_at FROM last), (SELECT id FROM last);
