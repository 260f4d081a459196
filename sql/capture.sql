-------------------------------------------------------------------------------
-- Table capture and the snapshot handoff (src/capture/).
-------------------------------------------------------------------------------

-- streams._capture() -> trigger
-- The capture trigger, fired AFTER each statement on a captured table. Only
-- the extension's owner may attach it (streams.capture does, as the owner).
CREATE FUNCTION streams._capture() RETURNS trigger
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'litebase_streams_capture';
COMMENT ON FUNCTION streams._capture() IS 'Internal: the capture trigger (publishes a statement''s changed rows as events).';

-- streams.capture(tbl regclass, stream text DEFAULT NULL, exclude text[] DEFAULT NULL) -> text
CREATE FUNCTION streams.capture(tbl regclass, stream text DEFAULT NULL, exclude text[] DEFAULT NULL) RETURNS text
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'capture_wrapper';
COMMENT ON FUNCTION streams.capture(regclass, text, text[]) IS 'Publish every INSERT, UPDATE, DELETE and TRUNCATE of the table as events in the changing transaction, to stream (default schema.table), without the exclude columns; returns the stream. Needs ownership of the table and the publish privilege on the stream.';

-- streams.uncapture(tbl regclass) -> void
CREATE FUNCTION streams.uncapture(tbl regclass) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'uncapture_wrapper';
COMMENT ON FUNCTION streams.uncapture(regclass) IS 'End the capture of the table (its events stay in the log). Needs ownership of the table.';

-- streams._capture_args(tgargs bytea) -> text[]
CREATE FUNCTION streams._capture_args(tgargs bytea) RETURNS text[]
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_capture_args_wrapper';
COMMENT ON FUNCTION streams._capture_args(bytea) IS 'Internal: a trigger''s arguments as an array.';

-- One row per captured table, read from its capture triggers.
CREATE VIEW streams.captures AS
SELECT t.tgrelid::pg_catalog.regclass AS "table",
       a.args[1] AS stream,
       ARRAY(SELECT c.attname::text FROM pg_catalog.pg_attribute c
             WHERE c.attrelid = t.tgrelid AND NOT c.attisdropped
               AND c.attnum::text = ANY (a.args[2:])
             ORDER BY c.attnum) AS exclude,
       r.relowner::pg_catalog.regrole AS owner,
       (SELECT pg_catalog.count(*) = 4 FROM pg_catalog.pg_trigger e
        WHERE e.tgrelid = t.tgrelid AND e.tgfoid = t.tgfoid AND e.tgenabled IN ('O', 'A')) AS enabled
FROM (SELECT DISTINCT ON (g.tgrelid) g.tgrelid, g.tgfoid, g.tgargs FROM pg_catalog.pg_trigger g
      WHERE g.tgfoid = 'streams._capture()'::pg_catalog.regprocedure
      ORDER BY g.tgrelid, g.tgname) t
JOIN pg_catalog.pg_class r ON r.oid = t.tgrelid
CROSS JOIN LATERAL (SELECT streams._capture_args(t.tgargs) AS args) a;
COMMENT ON VIEW streams.captures IS 'Captured tables: the stream their changes go to, the excluded columns, the table''s owner, and whether all four capture triggers are there and enabled (false: some changes are not captured).';

-- streams._capture_guard() -> event_trigger
-- A captured table may not become a partition or join an inheritance tree
-- (as a child or a parent): changes made through the parent, or to a
-- child, fire none of its statement triggers, so they would be missed.
CREATE FUNCTION streams._capture_guard() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    captured pg_catalog.regclass;
BEGIN
    SELECT t.tgrelid::pg_catalog.regclass INTO captured
    FROM pg_catalog.pg_event_trigger_ddl_commands() d
    JOIN pg_catalog.pg_inherits i ON d.objid IN (i.inhrelid, i.inhparent)
    JOIN pg_catalog.pg_trigger t ON t.tgrelid IN (i.inhrelid, i.inhparent)
    WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
      -- By the catalogs, not 'streams._capture()'::regprocedure: the cast
      -- looks the name up as the caller, and a role without USAGE on the
      -- schema streams would get 42501 from every CREATE TABLE.
      AND t.tgfoid = (SELECT p.oid FROM pg_catalog.pg_proc p
                      WHERE p.proname = '_capture' AND p.pronargs = 0
                        AND p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = 'streams'))
    LIMIT 1;
    IF captured IS NOT NULL THEN
        RAISE EXCEPTION 'captured table % cannot be part of a partition or inheritance tree', captured
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'Changes made through a parent table, or to a child table, would not be captured.',
                  HINT = 'streams.uncapture the table first.';
    END IF;
END
$$;
COMMENT ON FUNCTION streams._capture_guard() IS 'Internal: refuses DDL that puts a captured table into a partition or inheritance tree.';
CREATE EVENT TRIGGER streams_capture_guard ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE')
    EXECUTE FUNCTION streams._capture_guard();

-- streams.snapshot(stream text DEFAULT NULL) -> (position, also_visible, snapshot_id)
CREATE FUNCTION streams.snapshot(stream text DEFAULT NULL)
RETURNS TABLE ("position" bigint, also_visible bigint[], snapshot_id text)
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'snapshot_wrapper';
COMMENT ON FUNCTION streams.snapshot(text) IS 'First in a REPEATABLE READ transaction: the tables it reads hold exactly the events at or below position plus also_visible (of the streams the caller reads, narrowed by stream). Copy, commit, then apply the events after position that are not in also_visible. snapshot_id serves SET TRANSACTION SNAPSHOT in parallel copies.';
