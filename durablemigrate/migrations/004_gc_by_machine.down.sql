-- Back to version 3: the retentions and the index by machine go (GC keeps every machine's
-- finished instances for its own retention again). Every instance stays.
SET LOCAL lock_timeout = '10s';
DROP TABLE {schema}.retention;
DROP INDEX IF EXISTS {schema}.instances_finished_by_machine;
