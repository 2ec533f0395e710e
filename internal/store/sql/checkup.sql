-- Statement family: the checkup (Client.Checkup, gendurable doctor). Read-only. The server's
-- statistics views and catalogs take no lock on the engine's tables; the two reads of the
-- instances table take ACCESS SHARE, and run with a short lock_timeout (Store.Checkup), so that a
-- checkup of a locked table reports the lock instead of waiting behind it.

-- The schema's churning tables ($1 the schema's name): autovacuum on for the server and the
-- table, the live and dead rows the statistics count, and when a vacuum last ended.
-- name: checkup_vacuum
SELECT c.relname,
       current_setting('autovacuum')::bool,
       NOT EXISTS (SELECT 1 FROM pg_catalog.pg_options_to_table(c.reloptions) AS o
                   WHERE o.option_name = 'autovacuum_enabled'
                     AND lower(o.option_value) IN ('false', 'off', 'no', '0', 'f', 'n')),
       coalesce(st.n_live_tup, 0), coalesce(st.n_dead_tup, 0),
       greatest(st.last_vacuum, st.last_autovacuum)
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_stat_user_tables AS st ON st.relid = c.oid
WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname IN ('instances', 'signals', 'finished_counts')
ORDER BY c.relname;

-- Sessions of this database that have held a transaction or snapshot open for longer than $1
-- seconds: they hold its xmin horizon back, and vacuum keeps every row version younger than it.
-- A session is named by its pid, application name and state, never by its query (which may carry
-- values).
-- name: checkup_horizon
SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''),
       extract(epoch FROM now() - coalesce(a.xact_start, a.backend_start))::float8
FROM pg_catalog.pg_stat_activity AS a
WHERE a.datname = current_database() AND a.pid <> pg_catalog.pg_backend_pid() AND a.backend_xmin IS NOT NULL
  AND coalesce(a.xact_start, a.backend_start) < now() - $1::float8 * interval '1 second'
ORDER BY 4 DESC;

-- The schema's invalid indexes ($1 the schema's name): a CREATE INDEX CONCURRENTLY or REINDEX
-- CONCURRENTLY that failed leaves one, which every write still maintains and no read uses.
-- name: checkup_invalid_indexes
SELECT c.relname, t.relname
FROM pg_catalog.pg_index AS i
JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND NOT i.indisvalid
ORDER BY c.relname;

-- Sessions waiting longer than $2 seconds for a lock on a table of the schema ($1 its name), and
-- the sessions that block them.
-- name: checkup_lock_waits
SELECT l.pid, coalesce(a.application_name, ''), c.relname, l.mode,
       extract(epoch FROM now() - l.waitstart)::float8, pg_catalog.pg_blocking_pids(l.pid)
FROM pg_catalog.pg_locks AS l
JOIN pg_catalog.pg_class AS c ON c.oid = l.relation
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
WHERE NOT l.granted AND n.nspname = $1 AND l.waitstart < now() - $2::float8 * interval '1 second'
ORDER BY l.waitstart;

-- The reaper's backlog: claims whose lease ran out more than $1 seconds ago (the reaper releases
-- them within its interval) through instances_executing, and parked rows as far past their await
-- deadline (it wakes them) through instances_await_deadline; and whether rows are runnable (a
-- walk of each pick index up to the first due row) while no node seen within $2 seconds works a
-- queue.
-- name: checkup_rows
SELECT (SELECT count(*) FROM {schema}.instances
        WHERE status = 'executing' AND locked_until < now() - $1::float8 * interval '1 second'),
       (SELECT count(*) FROM {schema}.instances
        WHERE status = 'awaiting' AND await_deadline IS NOT NULL
          AND await_deadline < now() - $1::float8 * interval '1 second'),
       EXISTS (SELECT 1 FROM {schema}.instances WHERE status = 'available' AND fair_tag IS NULL AND scheduled_at <= now())
         OR EXISTS (SELECT 1 FROM {schema}.instances WHERE status = 'available' AND fair_tag IS NOT NULL AND scheduled_at <= now()),
       EXISTS (SELECT 1 FROM {schema}.nodes
               WHERE cardinality(queues) > 0 AND seen_at > now() - $2::float8 * interval '1 second');
