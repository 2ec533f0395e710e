-- Statement family: pokes over LISTEN/NOTIFY (the PokePostgres transport). No row locks: NOTIFY
-- takes only the server's notification-queue lock at commit, and a poke's payload is the
-- sending client's origin tag, never data.

-- One notification per channel: $1 the channels (one per queue), $2 the origin tag. Run inside a
-- caller's transaction, the notifications are sent when it commits and never if it rolls back;
-- Postgres folds identical notifications of one transaction into one.
-- name: poke_notify
SELECT pg_notify(ch, $2) FROM unnest($1::text[]) AS ch;
