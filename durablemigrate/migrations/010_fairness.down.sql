-- Back to version 9: the fairness keys and tags go (every instance runs again in time order under
-- the library that knows version 9). Every instance stays.
SET LOCAL lock_timeout = '10s';
ALTER TABLE {schema}.instances DROP COLUMN fair_tag;
ALTER TABLE {schema}.instances DROP COLUMN fair_key;
