-- Back to version 7: recoveries are no longer counted (lost claims cost attempts again under the
-- library that knows version 7). Every instance stays.
SET LOCAL lock_timeout = '10s';
ALTER TABLE {schema}.instances DROP COLUMN recoveries;
