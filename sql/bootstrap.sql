-- Runs first in CREATE EXTENSION, before any object is created.
--
-- The control file names the schema `streams`, and CREATE EXTENSION adopts a
-- schema of that name that already exists. A role that created it beforehand
-- (a database owner can) would own the schema the superuser installs into,
-- and could have left functions in it that shadow the extension's own (an
-- overload of streams.publish taking text, say, which an untyped literal
-- call resolves to). So the schema must be new, or empty and owned by the
-- role running CREATE EXTENSION.
DO $bootstrap$
DECLARE
    schema_oid oid := (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = 'streams');
    owner_name name;
BEGIN
    SELECT r.rolname INTO owner_name FROM pg_catalog.pg_namespace n
    JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner WHERE n.oid = schema_oid;
    IF owner_name IS DISTINCT FROM current_user
       OR EXISTS (SELECT FROM pg_catalog.pg_class WHERE relnamespace = schema_oid)
       OR EXISTS (SELECT FROM pg_catalog.pg_proc WHERE pronamespace = schema_oid)
       OR EXISTS (SELECT FROM pg_catalog.pg_type WHERE typnamespace = schema_oid)
       OR EXISTS (SELECT FROM pg_catalog.pg_operator WHERE oprnamespace = schema_oid)
       OR EXISTS (SELECT FROM pg_catalog.pg_opfamily WHERE opfnamespace = schema_oid)
       OR EXISTS (SELECT FROM pg_catalog.pg_collation WHERE collnamespace = schema_oid)
       OR EXISTS (SELECT FROM pg_catalog.pg_conversion WHERE connamespace = schema_oid)
       OR EXISTS (SELECT FROM pg_catalog.pg_ts_config WHERE cfgnamespace = schema_oid)
       OR EXISTS (SELECT FROM pg_catalog.pg_ts_dict WHERE dictnamespace = schema_oid)
       OR EXISTS (SELECT FROM pg_catalog.pg_statistic_ext WHERE stxnamespace = schema_oid)
    THEN
        RAISE EXCEPTION 'litebase_streams: schema "streams" already exists and was not created by CREATE EXTENSION'
            USING ERRCODE = 'duplicate_schema',
                  DETAIL = pg_catalog.format('It is owned by %s and may hold objects that would shadow the extension''s own.', owner_name),
                  HINT = 'Drop or rename that schema (after checking what it holds), then run CREATE EXTENSION again.';
    END IF;
END
$bootstrap$;
