-- Back to version 12: the indexes of version 13 go (the library that knows 12 picks through
-- instances_ready and instances_fair_last). Every instance stays.
SET LOCAL lock_timeout = '10s';
DROP INDEX IF EXISTS {schema}.instances_fair_key;
DROP INDEX IF EXISTS {schema}.instances_ready_tagged;
DROP INDEX IF EXISTS {schema}.instances_ready_untagged;
