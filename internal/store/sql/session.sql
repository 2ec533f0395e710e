-- Statement family: the checks Start runs on the session it is given: its search_path
-- (CVE-2018-1058) and its default isolation. Locks: none (catalog and setting reads).

-- The search_path.
--
-- gendurable names its own tables and types with the schema, but Postgres resolves built-in
-- functions and operators (enum equality, unnest, jsonb_build_object, bigint * interval, …)
-- through the session's search_path: a schema on it in which another, less trusted role can
-- create objects can put a better-matching function or operator in place of the built-in. Start
-- runs this once and warns about every such schema.
--
-- A schema is reported when PUBLIC, or a role other than the current one that is not a
-- superuser, may create objects in it. Predefined roles (pg_*) are skipped, but the database's
-- owner stands in for pg_database_owner (the owner of public since Postgres 15).
--
-- Locks: none (catalog reads).

-- name: unsafe_search_path
WITH path AS (
  SELECT n.oid, n.nspname, p.ord
  FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS p(name, ord)
  JOIN pg_catalog.pg_namespace AS n ON n.nspname = p.name
), others AS (
  SELECT r.oid
  FROM pg_catalog.pg_roles AS r
  WHERE NOT r.rolsuper AND r.rolname <> CURRENT_USER AND NOT pg_catalog.starts_with(r.rolname, 'pg_')
  UNION
  SELECT r.oid
  FROM pg_catalog.pg_database AS d
  JOIN pg_catalog.pg_roles AS r ON r.oid = d.datdba
  WHERE d.datname = pg_catalog.current_database() AND NOT r.rolsuper AND r.rolname <> CURRENT_USER
)
SELECT path.nspname::text
FROM path
WHERE pg_catalog.has_schema_privilege('public', path.oid, 'CREATE')
   OR EXISTS (SELECT 1 FROM others WHERE pg_catalog.has_schema_privilege(others.oid, path.oid, 'CREATE'))
ORDER BY path.ord;

-- The isolation a transaction gets unless it asks for another. gendurable's statements are
-- written for read committed, the server's default: each statement reads the newest committed
-- rows, and an UPDATE that finds a row changed since its snapshot re-reads the row's newest
-- version (a signal's flip, a park's re-check and the pick's SKIP LOCKED rely on it). Under
-- repeatable read or serializable those statements fail with serialization errors instead (a
-- pick and an outcome batch of the same rows, constantly), so Start refuses such a session.
-- name: default_isolation
SELECT pg_catalog.current_setting('default_transaction_isolation');
