-- Version 10: fair shares across the keys of a queue (docs/fairness.md).
--
-- An expand-only migration (README.md): two nullable columns, which the library that knows
-- version 9 neither reads nor writes (its nodes pick in time order whatever the keys, and a row
-- one of them moves on keeps the tag it had: docs/fairness.md says what that does).
--
-- Locks: ADD COLUMN without a default changes the catalog only (no table rewrite), under a brief
-- ACCESS EXCLUSIVE lock on instances; the lock timeout bounds how long it may wait for one.
SET LOCAL lock_timeout = '10s';

-- The fairness key the instance's steps are scheduled under (NULL: none; the rows without one
-- share the queue as one key), set by the insert or by the Next that leads to a step.
ALTER TABLE {schema}.instances ADD COLUMN fair_key text CHECK (char_length(fair_key) BETWEEN 1 AND 512);

-- The row's place in its queue's fair order (start-time fair queueing): set when the row becomes
-- runnable at once with a fairness key, as the later of the queue's head and the key's last
-- runnable row, plus 1/weight; NULL for every other row. Rows with a tag are picked in tag order,
-- those without in time order (store: pick.sql).
ALTER TABLE {schema}.instances ADD COLUMN fair_tag double precision;
