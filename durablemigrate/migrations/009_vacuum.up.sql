-- Version 9: vacuum keeps up with a queue's churn. Every instance leaves dead row versions behind
-- (its claim, its outcome, GC's delete), and a pick steps over the dead entries of the pick index
-- until vacuum removes them. Postgres's defaults start vacuuming a table once a fifth of it is
-- dead, and then throttle the vacuum (2 ms of sleep per 200 cost units): on a table that keeps
-- millions of finished rows, that is minutes between passes and minutes per pass, and the dead
-- rows of a busy queue outgrow it (docs/operations.md, "What grows"). The tables that churn
-- (instances, signals, the finished counts) are vacuumed once a hundredth of them is dead, without
-- the throttle. An operator can set other values with ALTER TABLE; later migrations leave them.
--
-- Locks: ALTER TABLE ... SET (storage parameters for autovacuum) takes SHARE UPDATE EXCLUSIVE,
-- which conflicts with no read or write of the rows (only with another vacuum, index build or
-- schema change); the lock timeout bounds the wait for one.
SET LOCAL lock_timeout = '10s';

ALTER TABLE {schema}.instances SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01,
                                    autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE {schema}.signals SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE {schema}.finished_counts SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);
