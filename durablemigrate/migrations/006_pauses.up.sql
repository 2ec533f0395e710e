-- Version 6: pausing a queue, a machine or one instance.
--
-- An expand-only migration (README.md): a new table and a nullable column, which the library
-- that knows version 5 neither reads nor writes (its nodes keep claiming what is paused until
-- they are replaced; docs/operations.md says so).
--
-- Locks: ADD COLUMN without a default changes the catalog only (no table rewrite), under a brief
-- ACCESS EXCLUSIVE lock on instances; the lock timeout bounds how long it may wait for one.
SET LOCAL lock_timeout = '10s';

-- The paused queues and machines. A node does not claim rows of a paused queue or machine; every
-- node reads this table every half second (store: pauses_list). Inserts and signals go on.
CREATE TABLE {schema}.pauses (
  kind      text        NOT NULL CHECK (kind IN ('queue', 'machine')),
  name      text        NOT NULL,
  reason    text        NOT NULL DEFAULT '',
  paused_by text        NOT NULL DEFAULT '',
  paused_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (kind, name)
);

-- When the instance was paused (NULL: it is not). A paused instance is never claimed; whatever
-- else happens to it (a signal, a deadline, a child finishing) happens as usual, and it runs
-- again once resumed.
ALTER TABLE {schema}.instances ADD COLUMN paused_at timestamptz;
