-- Statement family: the checkup (Client.Checkup, gendurable doctor). Read-only. The server's
-- statistics views and catalogs take no lock on the engine's tables; checkup_rows reads the
-- instances and nodes tables (ACCESS SHARE) with a short lock_timeout (Store.Checkup), so that a
-- checkup of a locked table reports the lock instead of waiting behind it.

-- The schema's churning tables ($1 the schema's name): autovacuum on for the server and the
-- table, the live and dead rows the statistics count, and how long ago (by the database clock) a
-- vacuum last ended (NULL: never since the statistics were reset).
-- name: checkup_vacuum
SELECT c.relname,
       current_setting('autovacuum')::bool,
       NOT EXISTS (SELECT 1 FROM pg_catalog.pg_options_to_table(c.reloptions) AS o
                   WHERE o.option_name = 'autovacuum_enabled'
                     AND lower(o.option_value) IN ('false', 'off', 'no', '0', 'f', 'n')),
       coalesce(st.n_live_tup, 0), coalesce(st.n_dead_tup, 0),
       extract(epoch FROM now() - greatest(st.last_vacuum, st.last_autovacuum))::float8
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_stat_user_tables AS st ON st.relid = c.oid
WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname IN ('instances', 'signals', 'finished_counts')
ORDER BY c.relname;

-- Client sessions of this database that have held a transaction open for longer than $1 seconds
-- with a snapshot (backend_xmin: a repeatable-read transaction, a statement running that long)
-- or a transaction id (backend_xid: one that wrote, then sat idle in its transaction): they hold
-- its xmin horizon back, and vacuum keeps every row version younger than them. Vacuums and
-- concurrent index builds are left out (other vacuums ignore their xmin). A session is named by
-- its pid, application name and state, never by its query (which may carry values). Prepared
-- transactions are checkup_prepared's; replication slots are checkup_slots'.
-- name: checkup_horizon
SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''),
       extract(epoch FROM now() - a.xact_start)::float8
FROM pg_catalog.pg_stat_activity AS a
WHERE a.datname = current_database() AND a.backend_type = 'client backend' AND a.pid <> pg_catalog.pg_backend_pid()
  AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
  AND a.xact_start < now() - $1::float8 * interval '1 second'
  AND a.pid NOT IN (SELECT v.pid FROM pg_catalog.pg_stat_progress_vacuum AS v)
  AND a.pid NOT IN (SELECT x.pid FROM pg_catalog.pg_stat_progress_create_index AS x)
ORDER BY 4 DESC;

-- Prepared transactions (PREPARE TRANSACTION) of this database prepared more than $2 seconds ago,
-- and the tables of the schema ($1 its name) they hold a lock on. A prepared transaction outlives
-- its session and the server's restarts until COMMIT PREPARED or ROLLBACK PREPARED ends it; until
-- then it holds the xmin horizon back, keeps the rows it wrote or locked locked, and its table
-- locks make every schema change wait. Its locks show in pg_locks with no pid, under the virtual
-- transaction that holds its transaction id's lock.
-- name: checkup_prepared
SELECT p.gid, p.owner::text, extract(epoch FROM now() - p.prepared)::float8,
       ARRAY(SELECT DISTINCT c.relname::text
             FROM pg_catalog.pg_locks AS x
             JOIN pg_catalog.pg_locks AS l ON l.virtualtransaction = x.virtualtransaction AND l.pid IS NULL
             JOIN pg_catalog.pg_class AS c ON c.oid = l.relation
             JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
             WHERE x.locktype = 'transactionid' AND x.transactionid = p.transaction AND x.pid IS NULL
               AND n.nspname = $1 AND c.relkind IN ('r', 'p')
             ORDER BY 1)
FROM pg_catalog.pg_prepared_xacts AS p
WHERE p.database = current_database() AND p.prepared < now() - $2::float8 * interval '1 second'
ORDER BY p.prepared;

-- Replication slots of the server that nothing is connected to (a standby or a logical consumer
-- gone away) and that keep more than $1 bytes of WAL, or hold the xmin horizon. The server keeps
-- every WAL segment from the slot's restart_lsn on until a consumer reads it or the slot is
-- dropped, and its disk fills; a slot's xmin (a standby's hot_standby_feedback, kept when the
-- standby went) holds back vacuum in every table of every database, and nothing moves it while
-- nothing is connected. Any slot counts, whatever its database: the WAL and the horizon are the
-- server's. On a standby, the WAL it has replayed stands for the current position. Returned:
-- name, type, database, WAL kept, whether that passes $1, whether it holds an xmin and how many
-- transactions old that is.
-- name: checkup_slots
SELECT s.slot_name::text, s.slot_type, coalesce(s.database::text, ''), coalesce(w.kept, 0),
       coalesce(w.kept > $1, false), s.xmin IS NOT NULL, coalesce(pg_catalog.age(s.xmin), 0)::bigint
FROM pg_catalog.pg_replication_slots AS s,
     LATERAL (SELECT pg_catalog.pg_wal_lsn_diff(
                CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn()
                     ELSE pg_catalog.pg_current_wal_lsn() END, s.restart_lsn)::bigint AS kept) AS w
WHERE NOT s.active AND (w.kept > $1 OR s.xmin IS NOT NULL)
ORDER BY w.kept DESC NULLS LAST, s.slot_name;

-- The server's client connections in use, and how many it accepts (max_connections less the
-- slots reserved for superusers and, from PostgreSQL 16, for roles with pg_use_reserved_connections);
-- the share of the server's NOTIFY queue in use (notifications stay queued until every session
-- that listens has read them, and a listening session inside a long transaction reads none, so
-- the queue grows behind it until NOTIFY fails); and the connections of the checkup's role and
-- database, with their CONNECTION LIMITs (-1: none; the server holds no superuser to either).
-- name: checkup_connections
SELECT a.total,
       current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
         - coalesce(current_setting('reserved_connections', true)::int, 0),
       pg_catalog.pg_notification_queue_usage(),
       r.rolname::text, r.rolsuper, r.rolconnlimit, a.role,
       d.datname::text, d.datconnlimit, a.db
FROM pg_catalog.pg_roles AS r, pg_catalog.pg_database AS d,
     LATERAL (SELECT count(*) AS total, count(*) FILTER (WHERE x.usesysid = r.oid) AS role,
                     count(*) FILTER (WHERE x.datid = d.oid) AS db
              FROM pg_catalog.pg_stat_activity AS x WHERE x.backend_type = 'client backend') AS a
WHERE r.rolname = current_user AND d.datname = current_database();

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

-- Sessions waiting longer than $2 seconds for a lock on a table of the schema ($1 its name), or
-- on a row of one, and the sessions that block them. A wait for a row shows in two ways: the
-- first session to wait takes the row's tuple lock (granted, naming the table) and waits for the
-- holding transaction's id (naming no table), so its table is read from its tuple lock; the
-- sessions after it wait for the tuple lock itself.
-- name: checkup_lock_waits
SELECT l.pid, coalesce(a.application_name, ''), c.relname, l.mode, l.locktype = 'tuple',
       extract(epoch FROM now() - l.waitstart)::float8, pg_catalog.pg_blocking_pids(l.pid)
FROM pg_catalog.pg_locks AS l
JOIN pg_catalog.pg_class AS c ON c.oid = l.relation
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
WHERE NOT l.granted AND n.nspname = $1
  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
  AND l.waitstart < now() - $2::float8 * interval '1 second'
UNION ALL
SELECT x.pid, coalesce(a.application_name, ''), c.relname, x.mode, true,
       extract(epoch FROM now() - x.waitstart)::float8, pg_catalog.pg_blocking_pids(x.pid)
FROM pg_catalog.pg_locks AS x
JOIN pg_catalog.pg_locks AS t ON t.pid = x.pid AND t.locktype = 'tuple' AND t.granted
JOIN pg_catalog.pg_class AS c ON c.oid = t.relation
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = x.pid
WHERE x.locktype = 'transactionid' AND NOT x.granted AND n.nspname = $1
  AND t.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
  AND x.waitstart < now() - $2::float8 * interval '1 second'
ORDER BY 6 DESC;

-- The reaper's backlog: claims whose lease ran out more than $1 seconds ago (the reaper releases
-- them within its interval) through instances_executing, and parked rows as far past their await
-- deadline (it wakes them) through instances_await_deadline, each counted up to $3; the queues
-- with due rows, and the queues a node seen within $2 seconds works. The due queues are found by
-- a skip scan: each queue of instances_ready_untagged in one descent (the next queue name after
-- the last), then one descent per priority of that queue for a row due now; a tagged runnable row
-- (instances_ready_tagged) is due by construction. So the cost is the queues times the
-- priorities, never the backlog.
-- name: checkup_rows
WITH RECURSIVE untagged(queue) AS (
  (SELECT i.queue FROM {schema}.instances AS i
   WHERE i.status = 'available' AND i.fair_tag IS NULL ORDER BY i.queue LIMIT 1)
  UNION ALL
  SELECT (SELECT i.queue FROM {schema}.instances AS i
          WHERE i.status = 'available' AND i.fair_tag IS NULL AND i.queue > u.queue ORDER BY i.queue LIMIT 1)
  FROM untagged AS u WHERE u.queue IS NOT NULL
), tagged(queue) AS (
  (SELECT i.queue FROM {schema}.instances AS i
   WHERE i.status = 'available' AND i.fair_tag IS NOT NULL ORDER BY i.queue LIMIT 1)
  UNION ALL
  SELECT (SELECT i.queue FROM {schema}.instances AS i
          WHERE i.status = 'available' AND i.fair_tag IS NOT NULL AND i.queue > t.queue ORDER BY i.queue LIMIT 1)
  FROM tagged AS t WHERE t.queue IS NOT NULL
)
SELECT (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances
        WHERE status = 'executing' AND locked_until < now() - $1::float8 * interval '1 second' LIMIT $3) AS x),
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances
        WHERE status = 'awaiting' AND await_deadline IS NOT NULL
          AND await_deadline < now() - $1::float8 * interval '1 second' LIMIT $3) AS x),
       ARRAY(SELECT u.queue FROM untagged AS u
             WHERE u.queue IS NOT NULL AND EXISTS (
               SELECT 1 FROM generate_series(1, 9) AS p(priority)
               WHERE EXISTS (SELECT 1 FROM {schema}.instances AS i
                             WHERE i.status = 'available' AND i.fair_tag IS NULL AND i.queue = u.queue
                               AND i.priority = p.priority::smallint AND i.scheduled_at <= now()))
             UNION
             SELECT t.queue FROM tagged AS t WHERE t.queue IS NOT NULL
             ORDER BY 1),
       ARRAY(SELECT DISTINCT q FROM {schema}.nodes AS n, unnest(n.queues) AS q
             WHERE n.seen_at > now() - $2::float8 * interval '1 second' ORDER BY 1);
