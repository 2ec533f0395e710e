-- Back to version 4: the finished counts and their triggers go (QueueStats counts finished rows
-- by scanning the table again). Every instance stays.
SET LOCAL lock_timeout = '10s';
DROP TRIGGER instances_count_finished_insert ON {schema}.instances;
DROP TRIGGER instances_count_finished_update ON {schema}.instances;
DROP TRIGGER instances_count_finished_delete ON {schema}.instances;
DROP TRIGGER instances_count_finished_truncate ON {schema}.instances;
DROP FUNCTION {schema}.count_finished();
DROP TABLE {schema}.finished_counts;
