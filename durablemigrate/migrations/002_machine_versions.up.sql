-- Version 2: machine versions, and the registry of running nodes.
--
-- An expand-only migration (README.md): the library that knows version 1 runs against it, its
-- inserts taking the defaults. Nothing here rewrites the instances table or scans it while
-- holding its lock: the new columns have a constant default or none, and the CHECK applies to
-- rows written from now on (NOT VALID; every row before has the default, which passes it).
SET LOCAL lock_timeout = '10s';

-- The version of its machine an instance was last brought to (1: every instance written before
-- machines had versions), and the upgrades applied to it, oldest first: {"from", "to", "at",
-- "step_from", "step_to", "by"}. A node claims a row only if it knows the row's machine at the
-- row's version or later, and brings it forward to its own version before its step runs.
ALTER TABLE {schema}.instances
  ADD COLUMN machine_version integer NOT NULL DEFAULT 1,
  ADD COLUMN upgrades jsonb;
ALTER TABLE {schema}.instances
  ADD CONSTRAINT instances_machine_version CHECK (machine_version >= 1) NOT VALID;

-- The running clients that work queues, and what each can run: its queues and, per machine, its
-- version, its steps and the older versions it can bring forward ({"<machine>": {"version": 2,
-- "steps": [...], "upgrades": {"1": {"steps": {"old": "new"}}}}}). Each client writes its row at
-- start and refreshes seen_at while it runs; a row not refreshed for a while is a node that is
-- gone. The operator's tools read it to tell which rows no running node can run (blocked).
CREATE TABLE {schema}.nodes (
  id         text        PRIMARY KEY,
  client     text        NOT NULL,
  host       text        NOT NULL,
  queues     text[]      NOT NULL,
  machines   jsonb       NOT NULL,
  started_at timestamptz NOT NULL DEFAULT now(),
  seen_at    timestamptz NOT NULL DEFAULT now()
);

-- Bulk upgrades an operator asked for (gendurable upgrade): a running node that knows the
-- machine's newest version takes the request (a lease, like a claim), brings the machine's
-- parked and scheduled instances forward in batches, and records what it did.
CREATE TABLE {schema}.upgrade_requests (
  id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  machine      text        NOT NULL,
  requested_at timestamptz NOT NULL DEFAULT now(),
  taken_by     text,
  taken_until  timestamptz,
  finished_at  timestamptz,
  version      integer,
  upgraded     bigint      NOT NULL DEFAULT 0,
  blocked      bigint      NOT NULL DEFAULT 0,
  error        text
);
CREATE INDEX upgrade_requests_open ON {schema}.upgrade_requests (id) WHERE finished_at IS NULL;
