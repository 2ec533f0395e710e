-- Back to version 6: the index of the paused instances goes. Every instance stays.
SET LOCAL lock_timeout = '10s';
DROP INDEX IF EXISTS {schema}.instances_paused;
