-- Back to version 2: the schedules go. The instances they fired stay.
SET LOCAL lock_timeout = '10s';
DROP TABLE {schema}.schedules;
