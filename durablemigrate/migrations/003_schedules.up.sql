-- Version 3: durable schedules.
--
-- An expand-only migration (README.md): a new table; nothing existing changes.
SET LOCAL lock_timeout = '10s';

-- A schedule: when to fire (a cron expression in a time zone, or an interval in milliseconds),
-- what to insert at each fire (input: the instance's machine, step, state and insert options, as
-- the client built them), and its policies. Every node that fires schedules claims due rows with
-- SKIP LOCKED, inserts their instances and advances next_fire_at in one transaction: one
-- instance per fire time, whatever the number of nodes. declared_by names the service whose
-- Config declares the schedule (NULL: added at runtime); a service reconciles its own only.
CREATE TABLE {schema}.schedules (
  name             text        PRIMARY KEY,
  machine          text        NOT NULL,
  input            jsonb       NOT NULL,
  cron             text        NOT NULL DEFAULT '',
  every_ms         bigint      NOT NULL DEFAULT 0,
  time_zone        text        NOT NULL DEFAULT '',
  overlap          text        NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip', 'cancel')),
  catch_up_ms      bigint      NOT NULL DEFAULT 0,
  jitter_ms        bigint      NOT NULL DEFAULT 0,
  declared_by      text,
  paused           boolean     NOT NULL DEFAULT false,
  next_fire_at     timestamptz NOT NULL,
  last_fire_at     timestamptz,
  last_instance_id bigint,
  fired            bigint      NOT NULL DEFAULT 0,
  skipped          bigint      NOT NULL DEFAULT 0,
  last_skip        jsonb,
  last_error       text,
  last_error_at    timestamptz,
  retry_at         timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  CHECK ((cron <> '') <> (every_ms > 0))
);
-- The firing loop's claim: the due schedules, oldest fire time first.
CREATE INDEX schedules_due ON {schema}.schedules (next_fire_at) WHERE NOT paused;
