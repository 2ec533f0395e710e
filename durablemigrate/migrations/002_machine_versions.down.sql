-- Back to version 1: the registry, the requests and the version columns go. Every instance stays;
-- those that were brought forward keep the step and state they were brought to.
SET LOCAL lock_timeout = '10s';
DROP TABLE {schema}.upgrade_requests;
DROP TABLE {schema}.nodes;
ALTER TABLE {schema}.instances
  DROP CONSTRAINT instances_machine_version,
  DROP COLUMN upgrades,
  DROP COLUMN machine_version;
