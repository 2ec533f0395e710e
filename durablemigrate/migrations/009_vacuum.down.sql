-- Back to version 8: the churning tables are vacuumed by the server's settings again. Every row
-- stays.
SET LOCAL lock_timeout = '10s';
ALTER TABLE {schema}.instances RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor,
                                      autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay);
ALTER TABLE {schema}.signals RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_cost_delay);
ALTER TABLE {schema}.finished_counts RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_cost_delay);
