-- Statement family: pokes over LISTEN/NOTIFY (the PokePostgres transport), the listener's
-- keep-alive (poke_idle_timeout), and the commit watcher of InsertTx (poke_committed). No row
-- locks: NOTIFY
-- takes only the server's notification-queue lock at commit, and a poke's payload is the
-- sending client's origin tag, never data.

-- One notification per channel: $1 the channels (one per queue), $2 the origin tag. Run inside a
-- caller's transaction, the notifications are sent when it commits and never if it rolls back;
-- Postgres folds identical notifications of one transaction into one.
-- name: poke_notify
SELECT pg_notify(ch, $2) FROM unnest($1::text[]) AS ch;

-- poke_notify sent on its own (the transport's sender, not a caller's transaction): the
-- statement's implicit transaction commits without waiting for its WAL flush. A NOTIFY gets a
-- transaction id and a commit record, so a synchronous commit would wait for a flush (and hold
-- the server's notify lock, which serializes every notifying commit, through that wait) for a
-- transaction that wrote no row: nothing here needs to survive a crash of Postgres, whose
-- notifications are lost anyway, and the notification is delivered at commit, flushed or not.
-- The rows the poke announces were committed, and flushed, before it is sent.
-- name: poke_notify_alone
SELECT pg_catalog.set_config('synchronous_commit', 'off', true), count(pg_notify(ch, $2))
FROM unnest($1::text[]) AS ch;

-- poke_notify in a caller's transaction, but nothing is sent while the server's NOTIFY queue is
-- $3 full or more (pg_notification_queue_usage, 0 to 1: notifications stay queued until every
-- listening session has read them, and one that sits in a transaction reads none): once the
-- queue is full, every transaction that notified fails at its commit, and a poke must never fail
-- the transaction it rides. Returns the queue's usage and how many notifications were sent. The
-- usage is read as the statement runs, not at the commit: half the queue (4 GB on Postgres 15)
-- is the margin. Reading it first moves the queue's tail past what every listening session has
-- read (asyncQueueAdvanceTail: the queue's lightweight locks, held exclusively for an instant,
-- and on crossing a segment the removal of the segments read, which a notifying commit does
-- anyway every few pages); no row locks. The transport sends it only when it has not read the
-- usage for a while (see poke_queue_usage).
-- name: poke_notify_below
WITH q AS (SELECT pg_catalog.pg_notification_queue_usage() AS usage)
SELECT q.usage, (SELECT count(pg_notify(ch, $2)) FROM unnest($1::text[]) AS ch WHERE q.usage < $3)
FROM q;

-- The share of the server's NOTIFY queue in use, 0 to 1 (the transport keeps it, read off the
-- callers' path, and sends a caller's pokes with poke_notify while it is below its limit).
-- Reading it moves the queue's tail as in poke_notify_below; no row locks.
-- name: poke_queue_usage
SELECT pg_catalog.pg_notification_queue_usage();

-- Which of the rows an InsertTx inserted are visible now, i.e. their transaction committed (the
-- commit watcher: the transport could not send with the caller's commit). Read-only, by primary
-- key; no locks. $1 the ids.
-- name: poke_committed
SELECT id FROM {schema}.instances WHERE id = ANY($1::bigint[]);

-- The server's idle_session_timeout for this session, in milliseconds (0: none; Postgres 13 and
-- older have no such setting). A listening connection runs no statement while it waits for
-- notifications, so the server counts it idle: the transport pings it often enough to stay
-- under the timeout. Read-only; no locks.
-- name: poke_idle_timeout
SELECT coalesce(max(setting::bigint), 0) FROM pg_catalog.pg_settings WHERE name = 'idle_session_timeout';
