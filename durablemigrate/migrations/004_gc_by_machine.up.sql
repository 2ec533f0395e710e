-- Version 4: retention per machine.
--
-- An expand-only migration (README.md). The index of 004_gc_by_machine.pre.sql (finished rows by
-- machine) is built before this step; instances_finalized, which the library that knows version
-- 3 sweeps by and Client.Throughput reads, stays.
SET LOCAL lock_timeout = '10s';

-- How long finished instances of a machine are kept, for the machines whose definition sets a
-- Retention: every client that registers a machine writes its row at Start (or removes it, when
-- the machine keeps the default), and GC sweeps each machine by it. A machine with no row keeps
-- its finished instances for the GC's own Retention.
CREATE TABLE {schema}.retention (
  machine      text        PRIMARY KEY,
  retention_ms bigint      NOT NULL CHECK (retention_ms > 0),
  set_by       text        NOT NULL,
  set_at       timestamptz NOT NULL DEFAULT now()
);
