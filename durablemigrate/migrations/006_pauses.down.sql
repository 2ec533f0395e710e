-- Back to version 5: nothing is paused any more (every paused queue, machine and instance runs
-- again under the library that knows version 5). Every instance stays.
SET LOCAL lock_timeout = '10s';
ALTER TABLE {schema}.instances DROP COLUMN paused_at;
DROP TABLE {schema}.pauses;
