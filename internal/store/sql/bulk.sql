-- Statement family: bulk actions (Client.Bulk): retry, cancel or delete the instances a filter
-- matches. Store.BulkBatch assembles the batch statement from bulk_base, one fragment per filter
-- given, and bulk_order; Store.BulkCount wraps the same for the dry run. The batches walk the
-- primary key from a cursor, so a run reads each row once however many batches it takes, and each
-- batch's rows are acted on (by the cancel, retry and delete statements) in one short
-- transaction of their own: an interrupted run leaves each instance changed or untouched.
-- No locks here: the action locks each row itself, and re-checks its status.

-- fragment: bulk_base
SELECT id FROM {schema}.instances
WHERE status = ANY(@statuses::{schema}.status[])
  AND id > @after

-- fragment: bulk_queue
  AND queue = @queue

-- fragment: bulk_machine
  AND machine = @machine

-- fragment: bulk_step
  AND step = @step

-- The last error's text holds @error, case-insensitively (strpos: no pattern characters).
-- fragment: bulk_error
  AND strpos(lower(errors -> -1 ->> 'error'), lower(@error)) > 0

-- fragment: bulk_since
  AND inserted_at >= @since

-- fragment: bulk_until
  AND inserted_at < @until

-- fragment: bulk_key_prefix
  AND starts_with(correlation_key, @key_prefix)

-- fragment: bulk_order
ORDER BY id
LIMIT @limit

-- Delete a batch of finished instances (their inboxes go by the foreign key's cascade), except
-- children whose parent is still live (its join may yet read them). Locks the rows it deletes,
-- re-checking their status.
-- name: bulk_delete
DELETE FROM {schema}.instances AS i
WHERE i.id = ANY(@ids::bigint[])
  AND i.status IN ('done', 'failed', 'cancelled')
  AND NOT EXISTS (SELECT 1 FROM {schema}.instances AS p
                  WHERE p.id = i.parent_id AND p.status NOT IN ('done', 'failed', 'cancelled'))
RETURNING i.id;
