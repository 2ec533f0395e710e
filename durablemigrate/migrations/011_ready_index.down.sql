-- Back to version 10: the indexes of version 11 go (the library that knows version 10 picks
-- through instances_pick). Every instance stays.
SET LOCAL lock_timeout = '10s';
DROP INDEX IF EXISTS {schema}.instances_fair_last;
DROP INDEX IF EXISTS {schema}.instances_ready;
