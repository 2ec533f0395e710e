-- Version 14: instances_ready and instances_fair_last go. Version 13's instances_ready_untagged and
-- instances_ready_tagged hold the same rows as instances_ready (the runnable ones) between them,
-- and instances_fair_key serves the reads of instances_fair_last; keeping them cost every
-- runnable row another index entry.
--
-- A contract migration (README.md): it removes only what the library that knows version 13 no
-- longer reads, and the libraries before it do read. So the library that knows 14 runs against a
-- schema at 13 as well, and `gendurable migrate` applies this step to an existing schema only when
-- asked for it (--target 14), once every node runs a library that knows 13 (docs/upgrading.md).
-- contract
--
-- Locks: DROP INDEX takes a brief ACCESS EXCLUSIVE lock on instances; the lock timeout bounds how
-- long it may wait for one.
SET LOCAL lock_timeout = '10s';
DROP INDEX {schema}.instances_fair_last;
DROP INDEX {schema}.instances_ready;
