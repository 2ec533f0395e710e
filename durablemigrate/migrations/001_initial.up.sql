-- gendurable schema, version 1: the schema as it was before numbered migrations. Frozen: never
-- edit a statement here (a test compares this file's statements with their fingerprint); change
-- the schema with a new numbered migration (README.md in this folder).
--
-- Every object lives in the configured schema, written here as {schema}; the migrator substitutes
-- the quoted identifier. Nothing here depends on search_path.

CREATE SCHEMA IF NOT EXISTS {schema};

-- The life of an instance.
--   available  runnable once scheduled_at has passed (fresh, after Next, after Retry, released)
--   executing  claimed by a worker (locked_by) until its lease (locked_until) runs out
--   awaiting   parked on a set of signal names (await_names), optionally until await_deadline
--   joining    parked on its children (pending_children counts the unsettled ones)
--   done, failed, cancelled  terminal; finalized_at says when, GC removes them after retention
CREATE TYPE {schema}.status AS ENUM (
  'available', 'executing', 'awaiting', 'joining', 'done', 'failed', 'cancelled'
);

CREATE TABLE {schema}.instances (
  id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  machine           text        NOT NULL CHECK (char_length(machine) BETWEEN 1 AND 128),
  step              text        NOT NULL CHECK (char_length(step) BETWEEN 1 AND 128),
  queue             text        NOT NULL CHECK (char_length(queue) BETWEEN 1 AND 128),
  status            {schema}.status NOT NULL DEFAULT 'available',
  priority          smallint    NOT NULL DEFAULT 5 CHECK (priority BETWEEN 1 AND 9),
  -- attempt counts the tries of the current step: a claim adds one, Next and Await reset it.
  attempt           integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
  max_attempts      integer     NOT NULL CHECK (max_attempts >= 1),
  scheduled_at      timestamptz NOT NULL DEFAULT now(),
  -- The claim: an opaque token naming the worker and the pick, and the lease it holds until.
  locked_by         text,
  locked_until      timestamptz,
  state             jsonb       NOT NULL,
  result            jsonb,
  -- The most recent errors, oldest first, at most 20 entries.
  errors            jsonb,
  correlation_key   text        CHECK (char_length(correlation_key) BETWEEN 1 AND 512),
  -- Admission (concurrency keys and gates, rate limits): NULL costs nothing in the pick. A key
  -- whose part before the first ':' names a configured gate holds one of that gate's slots
  -- while executing (concurrency_shard: which shard's counter it debited); any other key is
  -- mutual exclusion (K = 1), enforced by instances_concurrency_active.
  concurrency_key   text        CHECK (char_length(concurrency_key) BETWEEN 1 AND 512),
  concurrency_shard smallint,
  -- The rate limit the next step runs under (per transition: set by the insert or by the Next
  -- that leads to the step) and how many of its tokens the step takes.
  rate_limit        text        CHECK (char_length(rate_limit) BETWEEN 1 AND 512),
  weight            integer     NOT NULL DEFAULT 1 CHECK (weight >= 1),
  -- Parking on signals: the names awaited (kept until the woken step's outcome, which reads the
  -- matching subset), and the deadline after which the reaper wakes the instance anyway.
  await_names       text[],
  await_deadline    timestamptz,
  -- Set by every signal delivery and never cleared while the instance lives: the pick loads the
  -- inbox only of rows that ever received a signal, so instances that never do pay nothing.
  -- (NULL is false here and below: a NULL column takes no room in the row.)
  signalled         boolean,
  -- Fan-out: a child names its parent and the parent's wave (spawn) it belongs to; a parent counts
  -- its wave's unsettled children, numbers its waves, and has join_due set until its join step's
  -- outcome (the pick loads the wave's children for the join step only).
  parent_id         bigint,
  parent_wave       integer,
  pending_children  integer     NOT NULL DEFAULT 0 CHECK (pending_children >= 0),
  spawn_wave        integer,
  join_due          boolean,
  -- The steps taken so far, oldest first (the last 50): each step whose outcome moved the
  -- instance on (next, await, spawn) or finished it is appended. The operator's tools show it.
  path              text[],
  inserted_at       timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now(),
  finalized_at      timestamptz,
  -- A claim token is present exactly while the row is executing, so a statement fenced by
  -- "locked_by = <token>" is fenced by the status too.
  CONSTRAINT instances_claim CHECK ((status = 'executing') = (locked_by IS NOT NULL AND locked_until IS NOT NULL))
) WITH (fillfactor = 80);
-- fillfactor 80 leaves room on each page so that updates which touch no indexed column (the
-- heartbeat's lease extension) stay HOT.

-- The pick: runnable rows of one queue in urgency order. Only available rows are in it, so it
-- stays as small as the backlog no matter how many rows are executing, parked or finished.
CREATE INDEX instances_pick ON {schema}.instances (queue, priority, scheduled_at, id)
  WHERE status = 'available';

-- Claims: the heartbeat, the reaper and startup reclaim look only at executing rows. locked_by is
-- set by the claim itself, so lease extensions (locked_until) do not touch this index.
CREATE INDEX instances_executing ON {schema}.instances (locked_by)
  WHERE status = 'executing';

-- Concurrency keys, K = 1: at most one executing row per key that no gate owns. The claim itself
-- is the lock: a second claim of the key cannot commit (a unique violation the pick retries). It
-- is partial, so Postgres never strengthens a row lock for it.
CREATE UNIQUE INDEX instances_concurrency_active ON {schema}.instances (concurrency_key)
  WHERE status = 'executing' AND concurrency_key IS NOT NULL AND concurrency_shard IS NULL;

-- (Gated executions, the truth the reconciler repairs gate counters from, have no index of their
-- own: the reconciler reads the executing rows through instances_executing when a GC sweep (a
-- minute by default) finds a counter to check, where an index would cost every gated claim an
-- insertion: an eighth of its pick.)

-- Runnable rows that wait on a rate limit: the maintenance sweep's report of rows whose limit no
-- node here configures (they stall, rate_limit.unknown).
CREATE INDEX instances_rate_waiting ON {schema}.instances (rate_limit)
  WHERE status = 'available' AND rate_limit IS NOT NULL;

-- Correlation keys: one live instance per (machine, key). The unique index is the arbiter of
-- deduplicating inserts and the address of signals by key. It is partial, so Postgres never
-- strengthens a row lock for it (claims can take FOR NO KEY UPDATE).
CREATE UNIQUE INDEX instances_correlation_live ON {schema}.instances (machine, correlation_key)
  WHERE correlation_key IS NOT NULL
    AND status IN ('available', 'executing', 'awaiting', 'joining');

-- Correlation keys in every status: deduplication scopes that include finished instances, and
-- look-ups by key from the operator's tools.
CREATE INDEX instances_correlation ON {schema}.instances (machine, correlation_key)
  WHERE correlation_key IS NOT NULL;

-- Await deadlines the reaper fires, soonest first. Only parked rows with a deadline are in it.
CREATE INDEX instances_await_deadline ON {schema}.instances (await_deadline)
  WHERE status = 'awaiting' AND await_deadline IS NOT NULL;

-- A parent's children by wave: the join step's load, the spawn's recount.
CREATE INDEX instances_parent ON {schema}.instances (parent_id, parent_wave)
  WHERE parent_id IS NOT NULL;

-- The operator's lists, newest first, of the rows that need a look: failed or cancelled ones, and
-- parked ones. A row enters these only when it fails, is cancelled or parks, so the step path
-- does not pay for them. (Other lists walk the primary key backwards.)
CREATE INDEX instances_problems ON {schema}.instances (id)
  WHERE status IN ('failed', 'cancelled');
CREATE INDEX instances_parked ON {schema}.instances (id)
  WHERE status IN ('awaiting', 'joining');

-- Finished rows in the order GC removes them.
CREATE INDEX instances_finalized ON {schema}.instances (finalized_at, id)
  WHERE status IN ('done', 'failed', 'cancelled');

-- The inbox: signals delivered to an instance and not yet consumed. A step's progress consumes
-- exactly the signals it saw; a terminal outcome clears the rest; deleting the instance (GC)
-- deletes its inbox. The foreign key's check takes FOR KEY SHARE on the instance row, which the
-- claims' FOR NO KEY UPDATE does not conflict with.
CREATE TABLE {schema}.signals (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  instance_id bigint      NOT NULL REFERENCES {schema}.instances (id) ON DELETE CASCADE,
  name        text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 128),
  payload     jsonb,
  inserted_at timestamptz NOT NULL DEFAULT now()
);

-- An instance's inbox in arrival order (the pick's inbox load, the park's re-check, purges).
CREATE INDEX signals_instance ON {schema}.signals (instance_id, id);

-- Concurrency gates: a gate key's slots, split over shards. held counts the executions admitted
-- against a shard; the CHECK makes over-admission uncommittable (two picks racing for the last
-- slot: the second fails and retries). A missing shard row is a full shard: the pick mints it
-- already debited. Completions credit back the shard they debited.
CREATE TABLE {schema}.gates (
  key      text     NOT NULL,
  shard    smallint NOT NULL,
  held     integer  NOT NULL,
  capacity integer  NOT NULL,
  PRIMARY KEY (key, shard),
  CONSTRAINT gates_held CHECK (held >= 0 AND held <= capacity)
);

-- Gate leases: a block of one shard's slots that one runner (owner: its worker id) debited from
-- the counter at once, and admits its own claims of the key against without a counter write per
-- pick or per outcome (an execution's slot goes back to the lease, not to the counter, when its
-- outcome applies). held counts a lease's unused slots as well as the executions, so a counter
-- is right when it lies between its executions and its executions plus its leases' slots; the
-- reconciler repairs it only outside that range. A lease lives while its runner's heartbeat
-- renews expires_at; the reconciler removes an expired one (and with it its unused slots), and a
-- pick under a lease checks it FOR KEY SHARE, so that the removal cannot slip in between.
CREATE TABLE {schema}.gate_leases (
  key        text        NOT NULL,
  shard      smallint    NOT NULL,
  owner      text        NOT NULL,
  slots      integer     NOT NULL CHECK (slots > 0),
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (key, shard, owner)
);

-- Rate-limit token buckets, one per key ("name" or "name:partition"). tokens is the balance as of
-- updated_at; a pick refills it at rate tokens per second up to burst, takes what it grants, and
-- writes it back. rate and burst are the configuration the bucket was last written with (GC uses
-- them to tell an idle, refilled bucket). A missing row is a full bucket: the pick mints it
-- already debited.
CREATE TABLE {schema}.buckets (
  key        text             PRIMARY KEY,
  tokens     double precision NOT NULL CHECK (tokens >= 0),
  rate       double precision NOT NULL,
  burst      double precision NOT NULL,
  updated_at timestamptz      NOT NULL
);

-- The schema's version, as the migrator keeps it (keys version, readers, fingerprint).
CREATE TABLE {schema}.meta (
  key   text PRIMARY KEY,
  value text NOT NULL
);
