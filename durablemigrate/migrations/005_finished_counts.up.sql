-- Version 5: finished instances counted as they finish, so that counting them costs a bounded
-- read whatever the size of the history.
--
-- An expand-only migration (README.md): a new table, filled by triggers on instances that every
-- library writing to the schema fires, the one that knows version 4 included.
--
-- Locks: CREATE TRIGGER takes SHARE ROW EXCLUSIVE on instances, which waits for the writers in
-- flight and holds new ones back until this step commits; the backfill below then counts the
-- finished rows while no one can change them (one scan of the table: about a second per ten
-- million rows, the time writers wait).
SET LOCAL lock_timeout = '10s';

-- Changes to the number of finished instances by queue and status: every statement that moves
-- instances into or out of a finished status (or deletes finished ones) adds one row per (queue,
-- status) whose count it changed, with the change (negative for rows that left the status). Nothing ever updates a row here, so writers
-- never wait on each other for it; a count is the sum of its rows. The reaper folds the rows into
-- one per (queue, status) every round (store: compact_finished_counts), so that a read sums a
-- few rows per queue and status.
CREATE TABLE {schema}.finished_counts (
  id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue  text              NOT NULL,
  status {schema}.status   NOT NULL CHECK (status IN ('done', 'failed', 'cancelled')),
  n      bigint            NOT NULL
);

-- One function for the triggers below: TG_LEVEL and TG_OP say which rows it sees. UPDATE and
-- DELETE run it once per statement, over the statement's transition tables (a statement that
-- moves no row into or out of a finished status adds nothing); INSERT once per finished row
-- inserted, which no library statement does (so inserts pay nothing); TRUNCATE clears the counts.
CREATE FUNCTION {schema}.count_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_LEVEL = 'ROW' THEN
    INSERT INTO {schema}.finished_counts (queue, status, n) VALUES (NEW.queue, NEW.status, 1);
  ELSIF TG_OP = 'UPDATE' THEN
    INSERT INTO {schema}.finished_counts (queue, status, n)
    SELECT queue, status, sum(d) FROM (
      SELECT queue, status, 1 AS d FROM new_rows WHERE status IN ('done', 'failed', 'cancelled')
      UNION ALL
      SELECT queue, status, -1 FROM old_rows WHERE status IN ('done', 'failed', 'cancelled')) AS c
    GROUP BY 1, 2
    HAVING sum(d) <> 0;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO {schema}.finished_counts (queue, status, n)
    SELECT queue, status, -count(*) FROM old_rows
    WHERE status IN ('done', 'failed', 'cancelled')
    GROUP BY 1, 2;
  ELSE
    DELETE FROM {schema}.finished_counts;
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER instances_count_finished_insert AFTER INSERT ON {schema}.instances
  FOR EACH ROW WHEN (NEW.status IN ('done', 'failed', 'cancelled'))
  EXECUTE FUNCTION {schema}.count_finished();
CREATE TRIGGER instances_count_finished_update AFTER UPDATE ON {schema}.instances
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION {schema}.count_finished();
CREATE TRIGGER instances_count_finished_delete AFTER DELETE ON {schema}.instances
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION {schema}.count_finished();
CREATE TRIGGER instances_count_finished_truncate AFTER TRUNCATE ON {schema}.instances
  FOR EACH STATEMENT EXECUTE FUNCTION {schema}.count_finished();

-- The rows finished before this step, counted while the triggers' lock holds writers back.
INSERT INTO {schema}.finished_counts (queue, status, n)
SELECT queue, status, count(*) FROM {schema}.instances
WHERE status IN ('done', 'failed', 'cancelled')
GROUP BY 1, 2;
