-- Version 12: instances_pick goes. Version 11's instances_ready holds the same rows (the runnable
-- ones) and serves every read instances_pick served; keeping both cost every runnable row a
-- second index entry.
--
-- A contract migration (README.md): it removes only what the library that knows version 11 no
-- longer reads, and the libraries before it do read. So the library that knows 12 runs against a
-- schema at 11 as well, and `gendurable migrate` applies this step to an existing schema only when
-- asked for it (--target 12), once every node runs a library that knows 11 (docs/upgrading.md).
-- contract
--
-- Locks: DROP INDEX takes a brief ACCESS EXCLUSIVE lock on instances; the lock timeout bounds how
-- long it may wait for one.
SET LOCAL lock_timeout = '10s';
DROP INDEX {schema}.instances_pick;
