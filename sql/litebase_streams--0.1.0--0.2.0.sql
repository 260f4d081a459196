-- litebase_streams 0.1.0 -> 0.2.0: per-stream privileges and private
-- streams, functions pinned to a safe search_path, publish running as the
-- caller, the log's identity, notifications that can lag visibility.
-- Every event, position, time and tx stays as it is; the roles that could
-- read or publish before keep doing so (as holders of a grant on '*').
-- Definitions repeat sql/streams.sql; the upgrade test compares the result
-- with a fresh install.

-- The status view and its function change shape: remember who could read it.
-- (Kept in a transaction-local setting: a table would join the extension.)
SELECT pg_catalog.set_config('litebase_streams_upgrade.status_readers', coalesce(pg_catalog.string_agg(g.grantee::oid::text, ','), ''), true)
FROM (
    SELECT a.grantee::regrole AS grantee FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
    WHERE c.oid = 'streams.status'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> 0 AND a.grantee <> c.relowner
    UNION
    SELECT a.grantee::regrole FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
    WHERE p.oid = 'streams._worker_status()'::regprocedure AND a.grantee <> 0 AND a.grantee <> p.proowner
) g;

-- Locks first, in the order publishers, readers and the worker take them,
-- so that they wait behind this step instead of deadlocking with it (a
-- publisher holding the log while it waits for the BRIN index this step
-- alters, a reader holding horizon_state while it waits for the log).
-- Readers lock a view before the tables under it, so the views this step
-- replaces come first: streams.status (dropped here, created again below)
-- and streams.events, whose lock takes the log and the tables it reads in
-- the readers' order; publishers and the worker lock the log first.
DROP VIEW streams.status;
LOCK TABLE streams.events IN ACCESS EXCLUSIVE MODE;
LOCK TABLE streams.event_log, streams.transactions, streams.horizon_state IN ACCESS EXCLUSIVE MODE;

-- The schema must hold nothing the extension does not own (see bootstrap.sql).
DO $check$
DECLARE
    ext_oid oid := (SELECT x.oid FROM pg_catalog.pg_extension x WHERE x.extname = 'litebase_streams');
    schema_oid oid := (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = 'streams');
    stranger text;
BEGIN
    SELECT pg_catalog.format('%s %s', o.kind, o.name) INTO stranger FROM (
        SELECT 'relation' AS kind, c.oid::regclass::text AS name, 'pg_class'::regclass AS cls, c.oid
        FROM pg_catalog.pg_class c WHERE c.relnamespace = schema_oid AND c.relkind NOT IN ('i', 't')
        UNION ALL
        SELECT 'function', p.oid::regprocedure::text, 'pg_proc'::regclass, p.oid
        FROM pg_catalog.pg_proc p WHERE p.pronamespace = schema_oid
        UNION ALL
        SELECT 'operator', o.oid::regoperator::text, 'pg_operator'::regclass, o.oid
        FROM pg_catalog.pg_operator o WHERE o.oprnamespace = schema_oid
        UNION ALL
        SELECT 'type', t.oid::regtype::text, 'pg_type'::regclass, t.oid
        FROM pg_catalog.pg_type t WHERE t.typnamespace = schema_oid AND t.typrelid = 0 AND t.typelem = 0
    ) o
    WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                      WHERE d.classid = o.cls AND d.objid = o.oid AND d.refobjid = ext_oid AND d.deptype = 'e')
    LIMIT 1;
    IF stranger IS NOT NULL
       OR (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.oid = schema_oid)
          <> (SELECT x.extowner FROM pg_catalog.pg_extension x WHERE x.oid = ext_oid) THEN
        RAISE EXCEPTION 'litebase_streams: schema "streams" holds objects the extension did not create, or is owned by another role'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = pg_catalog.format('First found: %s.', coalesce(stranger, 'the schema''s owner')),
                  HINT = 'Move those objects out of the schema (they could shadow the extension''s functions), then update again.';
    END IF;
END
$check$;

-- Rust functions new in 0.2.0.
CREATE FUNCTION streams."_acl_changed"() RETURNS void
STRICT VOLATILE
LANGUAGE c AS 'MODULE_PATHNAME', '_acl_changed_wrapper';
CREATE FUNCTION streams."_stream_matches"("stream" TEXT, "patterns" TEXT[]) RETURNS bool
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', '_stream_matches_wrapper';
CREATE FUNCTION streams._era("position" bigint, era_bounds bigint[]) RETURNS integer
LANGUAGE c IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'litebase_streams_era';
CREATE FUNCTION streams."worker_pid"() RETURNS INT
STRICT STABLE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'worker_pid_wrapper';

-- Who could read or publish at 0.1.0 (SELECT on the view, EXECUTE on
-- publish): they keep that as a grant on every stream, made below after the
-- privileges are reset. (Kept as role OIDs in transaction-local settings: a
-- table would join the extension.)
SELECT pg_catalog.set_config('litebase_streams_upgrade.readers', coalesce(pg_catalog.string_agg(DISTINCT a.grantee::text, ','), ''), true)
FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
WHERE c.oid = 'streams.events'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> 0 AND a.grantee <> c.relowner;
SELECT pg_catalog.set_config('litebase_streams_upgrade.publishers', coalesce(pg_catalog.string_agg(DISTINCT a.grantee::text, ','), ''), true)
FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
WHERE p.oid IN ('streams.publish(text, jsonb)'::regprocedure, 'streams.publish_batch(text, jsonb[])'::regprocedure)
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner;

DROP FUNCTION streams._worker_status();
CREATE FUNCTION streams."_worker_status"() RETURNS TABLE (
	"newest_position" bigint,
	"worker_pid" INT,
	"worker_state" TEXT,
	"delivered_position" bigint,
	"holder_pid" INT,
	"holder_position" bigint,
	"notify_state" TEXT,
	"rounds" bigint
)
STRICT VOLATILE SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '_worker_status_wrapper';

-- Storage. Eras (see streams.sql): the log of 0.1.0 was written by this
-- cluster.
ALTER TABLE streams.horizon_state ADD COLUMN delivered bigint,
    ADD COLUMN system_identifier bigint, ADD COLUMN era_bounds bigint[];
UPDATE streams.horizon_state SET system_identifier = (SELECT s.system_identifier FROM pg_catalog.pg_control_system() s);
-- The worker summarises new BRIN ranges itself (see streams.sql).
ALTER INDEX streams.event_log_tx SET (autosummarize = off);

-- The commit time of every final event, by position: one row per stretch of
-- positions (a worker round, later merged into rows of up to 4,096
-- positions), written by the worker in the transaction that moves the
-- horizon past them. `times[i]` is the commit time of the event at
-- `first_position + i - 1` (null: no event has that position). Keyed by
-- position, not by transaction id: a replay reads the log in position order
-- and finds each event's time in the row it already holds (see
-- streams._commit_time), and transaction ids repeated by a restore into
-- another cluster cannot mix up two transactions' times.
-- `last_time`: the latest time in the row (replay(since => ..) starts at the
-- first row that reaches it). `inexact`: the positions whose commit time was
-- gone before the worker recorded it (commit timestamps truncated by VACUUM
-- FREEZE while no worker ran, or an event restored from a dump taken before
-- it was recorded); their time is when the worker recorded them, a bound the
-- commit came before. toast_tuple_target: a round's row (up to about a
-- thousand times) stays inline and uncompressed; compressing it cost the
-- worker more than it saved.
CREATE TABLE streams.commit_times (
    first_position bigint PRIMARY KEY,
    times          timestamptz[] NOT NULL,
    last_time      timestamptz NOT NULL,
    inexact        bigint[]
) WITH (toast_tuple_target = 8160);
CREATE INDEX commit_times_last_time ON streams.commit_times (last_time);
SELECT pg_catalog.pg_extension_config_dump('streams.commit_times', '');
-- Every final event of 0.1.0 has its transaction's exact commit time in
-- streams.transactions (dropped below): copied by position, in rows of
-- 4,096 positions (the worker merges rows to that size too).
INSERT INTO streams.commit_times (first_position, times, last_time)
SELECT r.first_position,
       ARRAY(SELECT t.committed_at
             FROM pg_catalog.generate_series(r.first_position, r.last_position) AS g(p)
             LEFT JOIN streams.event_log e ON e.position = g.p
             LEFT JOIN streams.transactions t ON t.tx = e.tx
             ORDER BY g.p),
       r.last_time
FROM (
    SELECT pg_catalog.min(e.position) AS first_position, pg_catalog.max(e.position) AS last_position,
           pg_catalog.max(t.committed_at) AS last_time
    FROM streams.event_log e
    JOIN streams.transactions t ON t.tx = e.tx
    WHERE e.position <= coalesce((SELECT h.horizon FROM streams.horizon_state h), 0)
    GROUP BY (e.position - 1) / 4096
) r;

-- Commit times change for nobody either. Only the database's worker deletes
-- rows: when it merges short rows into one (the times stay the same).
CREATE FUNCTION streams._refuse_commit_time_change() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' AND pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) streams.worker_pid() THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'streams: stored events are immutable; % on %.% is not allowed',
        TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'Publish a new event that corrects or supersedes the old one.';
END
$$;
COMMENT ON FUNCTION streams._refuse_commit_time_change() IS 'Trigger: refuses UPDATE, DELETE and TRUNCATE of commit times, but the worker''s merging of rows.';
CREATE TRIGGER commit_times_immutable BEFORE UPDATE OR DELETE OR TRUNCATE ON streams.commit_times
    FOR EACH STATEMENT EXECUTE FUNCTION streams._refuse_commit_time_change();
ALTER TABLE streams.commit_times ENABLE ALWAYS TRIGGER commit_times_immutable;

-- streams._commit_time(position) -> timestamptz
-- The commit time of the event at `position`, from streams.commit_times as
-- the caller reads it (src/replay.rs); null before the worker recorded it.
-- Keeps the row it last read for the rest of the query.
CREATE FUNCTION streams._commit_time("position" bigint) RETURNS timestamptz
LANGUAGE c STABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'litebase_streams_commit_time';
COMMENT ON FUNCTION streams._commit_time(bigint) IS 'Internal: the commit time of the event at a position (streams.events reads it).';

CREATE OR REPLACE FUNCTION streams._replay_check(after bigint, since timestamptz, from_tx xid8) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    -- Qualified: num_nonnulls is VARIADIC "any", so an exact-type function in
    -- the caller's search_path would otherwise win.
    IF pg_catalog.num_nonnulls(after, since, from_tx) OPERATOR(pg_catalog.>) 1 THEN
        RAISE EXCEPTION 'streams.replay: give at most one of after, since and from_tx'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'after => a position, since => a time, or from_tx => a transaction id.';
    END IF;
    RETURN true;
END
$$;

-- Which log this is: a new id for every CREATE EXTENSION (also the one a
-- restore runs), so a client can tell a re-created or restored log, whose
-- positions may repeat, from the one it was reading. Not dumped on purpose.
CREATE TABLE streams.log_info (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    log_id     uuid NOT NULL DEFAULT pg_catalog.gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
INSERT INTO streams.log_info DEFAULT VALUES;
COMMENT ON TABLE streams.log_info IS 'The identity of this log: a new log_id for every CREATE EXTENSION.';

-------------------------------------------------------------------------------
-- Privileges: who may read and publish which streams (see also "Granting")
-------------------------------------------------------------------------------

-- One row per grant: `grantee` may `privilege` ('read' or 'publish') the
-- streams `stream` selects (an exact name, 'prefix.*' or '*'). Written only
-- through streams.grant and streams.revoke. Every role may select it, and
-- row-level security shows each role only the grants it holds (directly or
-- through a role it is a member of); the owner and superusers see all.
CREATE TABLE streams.stream_grants (
    grantee   regrole NOT NULL,
    privilege text NOT NULL CHECK (privilege IN ('read', 'publish')),
    stream    text COLLATE "C" NOT NULL,
    PRIMARY KEY (grantee, privilege, stream)
);
ALTER TABLE streams.stream_grants ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_grants ON streams.stream_grants FOR SELECT
    USING (pg_catalog.pg_has_role(grantee, 'USAGE'));
COMMENT ON TABLE streams.stream_grants IS 'Per-stream read and publish grants (streams.grant / streams.revoke); each role sees its own.';

-- Streams whose notifications never carry data (streams.set_private).
CREATE TABLE streams.private_streams (
    stream text COLLATE "C" PRIMARY KEY
);
COMMENT ON TABLE streams.private_streams IS 'Stream names or patterns whose notifications carry no data (streams.set_private).';

SELECT pg_catalog.pg_extension_config_dump('streams.stream_grants', '');
SELECT pg_catalog.pg_extension_config_dump('streams.private_streams', '');

-- The planner's estimate for the privilege test in streams.events: it keeps
-- every row (see src/privileges.rs).
CREATE FUNCTION streams._stream_matches_support(internal) RETURNS internal
LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'litebase_streams_matches_support';
ALTER FUNCTION streams._stream_matches(text, text[]) SUPPORT streams._stream_matches_support;
COMMENT ON FUNCTION streams._stream_matches_support(internal) IS 'Internal: planner support for _stream_matches (the privilege test keeps every row).';

-- streams._reads_all() -> boolean
-- Whether the current user reads every stream: a superuser, a member of the
-- extension's owner, or a holder of a 'read' grant on '*'.
CREATE FUNCTION streams._reads_all() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = current_user AND r.rolsuper)
        OR pg_catalog.pg_has_role((SELECT x.extowner FROM pg_catalog.pg_extension x WHERE x.extname = 'litebase_streams'), 'USAGE')
        OR EXISTS (SELECT FROM streams.stream_grants g
                   WHERE g.privilege = 'read' AND g.stream = '*' AND pg_catalog.pg_has_role(g.grantee, 'USAGE'))
$$;
COMMENT ON FUNCTION streams._reads_all() IS 'Internal: whether the current user may read every stream.';

-- streams._read_patterns() -> text[]
-- The names and patterns of the streams the current user may read.
CREATE FUNCTION streams._read_patterns() RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(pg_catalog.array_agg(DISTINCT g.stream::text), '{}')
    FROM streams.stream_grants g
    WHERE g.privilege = 'read' AND pg_catalog.pg_has_role(g.grantee, 'USAGE')
$$;
COMMENT ON FUNCTION streams._read_patterns() IS 'Internal: the stream names and patterns the current user may read.';

-- streams._may_publish(stream text) -> boolean
-- Whether the current user may publish to `stream` (publish.rs asks, as the
-- caller, before writing as the owner).
CREATE FUNCTION streams._may_publish(stream text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = current_user AND r.rolsuper)
        OR pg_catalog.pg_has_role((SELECT x.extowner FROM pg_catalog.pg_extension x WHERE x.extname = 'litebase_streams'), 'USAGE')
        OR EXISTS (SELECT FROM streams.stream_grants g
                   WHERE g.privilege = 'publish' AND pg_catalog.pg_has_role(g.grantee, 'USAGE')
                     AND streams._stream_matches(_may_publish.stream, ARRAY[g.stream::text]))
$$;
COMMENT ON FUNCTION streams._may_publish(text) IS 'Internal: whether the current user may publish to the stream.';

-- Who reads which events: row-level security on the log. Readers query
-- streams.events (a security_invoker view) or the log itself and see the
-- same rows: final events (position <= horizon) of the streams granted to
-- them. The owner and superusers bypass it (the view keeps the horizon test
-- for them). As security quals, these run before any condition of the
-- caller's that is not leakproof, so a function in the caller's WHERE
-- clause never sees a hidden row; comparisons on position, stream, time and
-- tx are leakproof and still drive index scans. The privilege test runs
-- once per query (the sub-selects become InitPlans): a role that reads
-- every stream pays one boolean test per row.
ALTER TABLE streams.event_log ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON streams.event_log FOR SELECT USING (
    (position > coalesce((SELECT h.horizon FROM streams.horizon_state h), 0)) IS NOT TRUE
    AND ((SELECT streams._reads_all()) OR streams._stream_matches(stream, (SELECT streams._read_patterns())))
);

-- SECURITY DEFINER: a reader needs no access to streams.horizon_state.
CREATE OR REPLACE FUNCTION streams.horizon() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT h.horizon FROM streams.horizon_state h), 0)
$$;
COMMENT ON FUNCTION streams.horizon() IS 'The highest final position: no event at or below it can appear later.';

-- streams.log_id() -> uuid
-- Which log this is (see streams.log_info): compare it with the one a
-- client's saved position belongs to before resuming from that position.
CREATE FUNCTION streams.log_id() RETURNS uuid
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT l.log_id FROM streams.log_info l
$$;
COMMENT ON FUNCTION streams.log_id() IS 'The identity of this log; changes when the extension is re-created or restored.';

CREATE OR REPLACE FUNCTION streams._newest_position() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value OPERATOR(pg_catalog.-) 1 END
    FROM streams.position_seq s
$$;
COMMENT ON FUNCTION streams._newest_position() IS 'Internal: the newest allocated position, final or not.';

CREATE OR REPLACE VIEW streams.events WITH (security_invoker = true) AS
SELECT e.position, e.stream, streams._commit_time(e.position) AS "time", e.tx, e.data
FROM streams.event_log e
WHERE (e.position > coalesce((SELECT h.horizon FROM streams.horizon_state h), 0)) IS NOT TRUE;

CREATE OR REPLACE FUNCTION streams._replay_start(since timestamptz, from_tx xid8) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        WHEN since IS NOT NULL THEN
            -- The first final event committed at or after `since`: in the first
            -- row of commit times (by position) that reaches `since`, since no
            -- earlier row does. Replay's time filter drops earlier commits that
            -- sit later on the timeline.
            (SELECT min(c.first_position + u.o - 1) - 1
             FROM (SELECT c.first_position, c.times FROM streams.commit_times c
                   WHERE c.last_time >= since ORDER BY c.first_position LIMIT 1) c
             CROSS JOIN LATERAL unnest(c.times) WITH ORDINALITY AS u(t, o)
             WHERE u.t >= since)
        -- The transaction's first final event. A transaction id used again
        -- after a restore into another cluster names its newest transaction:
        -- the one of the era of the id's last event.
        ELSE (WITH hit AS (
                  SELECT e.position FROM streams.event_log e
                  WHERE e.tx = from_tx
                    AND e.position <= coalesce((SELECT h.horizon FROM streams.horizon_state h), 0)),
              bounds AS (SELECT (SELECT h.era_bounds FROM streams.horizon_state h) AS b)
              SELECT min(hit.position) - 1 FROM hit, bounds
              WHERE streams._era(hit.position, bounds.b)
                    = (SELECT streams._era(max(hit.position), bounds.b) FROM hit))
    END
$$;

-- Nothing reads the transactions' table any more. Leaving the extension
-- first takes it off the list of tables pg_dump dumps (a plain DROP would
-- leave its OID there).
ALTER EXTENSION litebase_streams DROP TABLE streams.transactions;
DROP TABLE streams.transactions;

CREATE OR REPLACE FUNCTION streams.replay(
    stream     text        DEFAULT NULL,
    after      bigint      DEFAULT NULL,
    since      timestamptz DEFAULT NULL,
    from_tx    xid8        DEFAULT NULL,
    max_events integer     DEFAULT 1000
) RETURNS SETOF streams.events
LANGUAGE sql STABLE AS $$
    SELECT e.*
    FROM streams.events e
    WHERE streams._replay_check(replay.after, replay.since, replay.from_tx)
      -- after => a position, or nothing: a constant the planner can estimate with.
      AND e.position > CASE WHEN replay.since IS NULL AND replay.from_tx IS NULL
                            THEN coalesce(replay.after, 0)
                            ELSE streams._replay_start(replay.since, replay.from_tx) END
      AND (streams._stream_exact(replay.stream) IS NULL OR e.stream = streams._stream_exact(replay.stream))
      AND (streams._stream_prefix_low(replay.stream) IS NULL
           OR (e.stream >= streams._stream_prefix_low(replay.stream)
               AND e.stream < streams._stream_prefix_high(replay.stream)))
      -- Later commits than `since` only (the start position is the first one).
      AND (replay.since IS NULL OR e."time" >= replay.since)
    ORDER BY e.position
    LIMIT streams._replay_limit(replay.max_events)
$$;

-- streams.publish(stream text, data jsonb) -> bigint
-- Append one event in the caller's transaction and return its position. It
-- becomes visible (streams.events, LISTEN "<stream>") once the transaction
-- commits and every transaction that published before it has finished.
-- Runs as the caller, who needs the 'publish' privilege on the stream
-- (streams.grant; 42501 otherwise), and writes as the log's owner: nobody
-- needs access to the tables. Implemented in Rust (src/publish.rs): a
-- position, then the row appended as an INSERT would (src/append.rs).
CREATE OR REPLACE FUNCTION streams.publish(stream text, data jsonb) RETURNS bigint
LANGUAGE c VOLATILE SECURITY INVOKER
AS 'MODULE_PATHNAME', 'litebase_streams_publish';
COMMENT ON FUNCTION streams.publish(text, jsonb) IS 'Append one event in the caller''s transaction; returns its position.';

-- streams.publish_batch(stream text, data jsonb[]) -> setof bigint
-- Append one event per array element, positions increasing in array order.
CREATE OR REPLACE FUNCTION streams._publish_batch(stream text, data jsonb[]) RETURNS bigint[]
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'litebase_streams_publish_batch';
COMMENT ON FUNCTION streams._publish_batch(text, jsonb[]) IS 'Internal: publish_batch''s positions as an array.';

CREATE OR REPLACE FUNCTION streams.publish_batch(stream text, data jsonb[]) RETURNS SETOF bigint
LANGUAGE sql VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.unnest(streams._publish_batch(publish_batch.stream, publish_batch.data))
$$;
COMMENT ON FUNCTION streams.publish_batch(text, jsonb[]) IS 'Append one event per element, in array order; returns their positions.';

-------------------------------------------------------------------------------
-- Granting
-------------------------------------------------------------------------------

-- streams._check_grant(privilege, stream, role)
-- 22023 for an unknown privilege or a malformed stream pattern, 22004 for nulls.
CREATE FUNCTION streams._check_grant(privilege text, stream text, role regrole) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF privilege IS NULL OR stream IS NULL OR role IS NULL THEN
        RAISE EXCEPTION 'streams.grant/revoke: privilege, stream and role must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF privilege NOT IN ('read', 'publish') THEN
        RAISE EXCEPTION 'unknown stream privilege "%"', privilege
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''read'' or ''publish''.';
    END IF;
    PERFORM streams._stream_exact(stream);  -- raises 22023 for a malformed name or pattern
END
$$;
COMMENT ON FUNCTION streams._check_grant(text, text, regrole) IS 'Internal: validates the arguments of streams.grant and streams.revoke.';

-- streams._sql_privileges(privilege text, grant_it boolean, role regrole) -> void
-- Grants (grant_it) or revokes the SQL privileges a stream privilege takes:
-- the one list of them, for streams.grant and streams.revoke.
CREATE FUNCTION streams._sql_privileges(privilege text, grant_it boolean, role regrole) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    objects text[] := CASE privilege
        WHEN 'read' THEN ARRAY[
            'SELECT ON streams.events, streams.event_log, streams.commit_times, streams.horizon_state',
            'EXECUTE ON FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer), streams.get(bigint),
                 streams.horizon(), streams.wait(bigint, interval), streams.worker_pid(), streams.log_id(),
                 streams._replay_start(timestamptz, xid8)']
        ELSE ARRAY[
            'EXECUTE ON FUNCTION streams.publish(text, jsonb), streams.publish_batch(text, jsonb[]),
                 streams._publish_batch(text, jsonb[])']
    END;
    object text;
BEGIN
    FOREACH object IN ARRAY objects LOOP
        EXECUTE CASE WHEN grant_it THEN pg_catalog.format('GRANT %s TO %s', object, role)
                     ELSE pg_catalog.format('REVOKE %s FROM %s', object, role) END;
    END LOOP;
END
$$;
COMMENT ON FUNCTION streams._sql_privileges(text, boolean, regrole) IS 'Internal: grants or revokes the SQL privileges a stream privilege takes.';

-- streams.grant(privilege text, stream text, to_role regrole) -> void
-- Let `to_role` 'read' or 'publish' the streams `stream` selects (a name,
-- 'prefix.*' or '*'), including the SQL privileges that takes (schema usage,
-- the view and functions). Runs as the caller (by default only the owner and
-- superusers may execute it), so it cannot give away more than they have.
CREATE FUNCTION streams.grant(privilege text, stream text, to_role regrole) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM streams._check_grant(privilege, stream, to_role);
    INSERT INTO streams.stream_grants (grantee, privilege, stream)
    VALUES (to_role, privilege, stream) ON CONFLICT DO NOTHING;
    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA streams TO %s', to_role);
    PERFORM streams._sql_privileges(privilege, true, to_role);
    PERFORM streams._acl_changed();
END
$$;
COMMENT ON FUNCTION streams.grant(text, text, regrole) IS 'Grant ''read'' or ''publish'' on a stream, ''prefix.*'' or ''*'' to a role.';

-- streams.revoke(privilege text, stream text, from_role regrole) -> boolean
-- Remove one grant; true if it existed. When the role has no grant of that
-- privilege left, its SQL privileges for it go too (schema usage when it has
-- no grant at all).
CREATE FUNCTION streams.revoke(privilege text, stream text, from_role regrole) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    removed boolean;
BEGIN
    PERFORM streams._check_grant(privilege, stream, from_role);
    DELETE FROM streams.stream_grants g
    WHERE g.grantee = from_role AND g.privilege = revoke.privilege AND g.stream = revoke.stream;
    removed := FOUND;
    IF NOT EXISTS (SELECT FROM streams.stream_grants g WHERE g.grantee = from_role AND g.privilege = revoke.privilege) THEN
        PERFORM streams._sql_privileges(privilege, false, from_role);
    END IF;
    IF NOT EXISTS (SELECT FROM streams.stream_grants g WHERE g.grantee = from_role) THEN
        EXECUTE pg_catalog.format('REVOKE USAGE ON SCHEMA streams FROM %s', from_role);
    END IF;
    PERFORM streams._acl_changed();
    RETURN removed;
END
$$;
COMMENT ON FUNCTION streams.revoke(text, text, regrole) IS 'Remove a grant made by streams.grant; true if it existed.';

-- streams.set_private(stream text, private boolean DEFAULT true) -> void
-- Notifications of the streams `stream` selects (a name, 'prefix.*' or '*')
-- carry position, stream, time, tx and "private":true, never data; readers
-- fetch the data with streams.get. false undoes an earlier call with the
-- same name or pattern.
CREATE FUNCTION streams.set_private(stream text, private boolean DEFAULT true) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF stream IS NULL OR private IS NULL THEN
        RAISE EXCEPTION 'streams.set_private: stream and private must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM streams._stream_exact(stream);  -- raises 22023 for a malformed name or pattern
    IF private THEN
        INSERT INTO streams.private_streams (stream) VALUES (set_private.stream) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM streams.private_streams p WHERE p.stream = set_private.stream;
    END IF;
END
$$;
COMMENT ON FUNCTION streams.set_private(text, boolean) IS 'Make the matching streams'' notifications carry no data (or undo it).';

-------------------------------------------------------------------------------
-- Operations
-------------------------------------------------------------------------------

-- streams.status: one row. horizon; newest_position (the newest allocated
-- position, final or not); the worker's pid, state, delivered position, lag
-- and whether its notifications go out; the log's identity; and, when an
-- open publishing transaction holds the horizon back, its pid, position,
-- xid and age (see litebase_streams.hold_timeout).
-- Tables are read by the view itself (as its owner): an operator needs
-- SELECT on the view and EXECUTE on streams._worker_status() only.
CREATE VIEW streams.status AS
SELECT coalesce((SELECT h.horizon FROM streams.horizon_state h), 0) AS horizon,
       w.newest_position,
       w.worker_pid,
       w.worker_state,
       w.delivered_position,
       w.newest_position - w.delivered_position AS lag_positions,
       w.notify_state,
       (SELECT l.log_id FROM streams.log_info l) AS log_id,
       w.holder_pid,
       w.holder_position,
       a.backend_xid AS holder_xid,
       now() - a.xact_start AS holder_age,
       w.rounds
FROM streams._worker_status() w
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = w.holder_pid;

COMMENT ON VIEW streams.status IS 'Horizon, newest position, worker state and lag, notification state, log identity, and what holds the horizon back.';

-- Descriptions of what the sections above do not comment on already.
COMMENT ON TABLE streams.event_log IS 'Every event ever published, final or not; read streams.events instead.';
COMMENT ON TABLE streams.horizon_state IS 'The persisted horizon and the last notified position (one row, written by the worker).';
COMMENT ON TABLE streams.commit_times IS 'The commit time of every final event, by position (read streams.events instead).';
COMMENT ON COLUMN streams.commit_times.times IS 'times[i]: the commit time of the event at first_position + i - 1 (null: no event there).';
COMMENT ON COLUMN streams.commit_times.last_time IS 'The latest commit time in the row.';
COMMENT ON COLUMN streams.commit_times.inexact IS 'Positions whose commit time was lost before it was recorded: their time is when the worker recorded them.';
COMMENT ON TABLE streams.horizon_state IS 'The persisted horizon and the last notified position (one row, written by the worker).';
COMMENT ON COLUMN streams.horizon_state.system_identifier IS 'The cluster that last wrote this row (pg_control_system()).';
COMMENT ON COLUMN streams.horizon_state.era_bounds IS 'Positions after which a new era of transaction ids begins (one per restore into another cluster).';
COMMENT ON FUNCTION streams._era(bigint, bigint[]) IS 'Internal: the era of the log a position belongs to.';
COMMENT ON SEQUENCE streams.position_seq IS 'Hands out positions; advanced only by streams.publish and publish_batch.';
COMMENT ON FUNCTION streams.get(bigint) IS 'One final event of a stream the caller may read, or null.';
COMMENT ON FUNCTION streams._replay_check(bigint, timestamptz, xid8) IS 'Internal: at most one of after, since and from_tx.';
COMMENT ON FUNCTION streams._replay_start(timestamptz, xid8) IS 'Internal: where a replay from a time or a transaction starts.';
COMMENT ON FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer) IS 'Final events of the streams a pattern selects, in position order, from a position, time or transaction.';
COMMENT ON FUNCTION streams._launch_worker() IS 'Internal: starts this database''s worker when CREATE EXTENSION commits.';
COMMENT ON FUNCTION streams._require_preload() IS 'Internal: refuses to install without the server settings the extension needs.';
COMMENT ON FUNCTION streams._stream_exact(text) IS 'Internal: the stream name when a pattern is an exact name.';
COMMENT ON FUNCTION streams._stream_prefix_low(text) IS 'Internal: the lowest name a prefix pattern selects.';
COMMENT ON FUNCTION streams._stream_prefix_high(text) IS 'Internal: the smallest name above every name a prefix pattern selects.';
COMMENT ON FUNCTION streams._replay_limit(integer) IS 'Internal: max_events, checked.';
COMMENT ON FUNCTION streams._worker_status() IS 'Internal: the shared-memory half of streams.status.';
COMMENT ON FUNCTION streams.worker_pid() IS 'The pid of this database''s worker: trust only notifications sent by it.';
COMMENT ON FUNCTION streams._acl_changed() IS 'Internal: makes publishers re-check their privileges after this transaction commits.';
COMMENT ON FUNCTION streams._stream_matches(text, text[]) IS 'Internal: whether a stream is selected by any of the names or patterns.';

-- streams.wait(position bigint, timeout interval DEFAULT '5s') -> boolean
-- True as soon as the event at `position` is final: the caller's next
-- statement sees it in streams.events (read-your-writes after a COMMIT, and
-- tests). False when `timeout` passes first. Sleeps until the worker moves
-- the horizon (src/waiting.rs, shared with subscriptions' long polls); needs
-- READ COMMITTED to wait (0A000 otherwise).
CREATE FUNCTION streams.wait("position" bigint, timeout interval DEFAULT '5s') RETURNS boolean
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_wait_wrapper';
COMMENT ON FUNCTION streams.wait(bigint, interval) IS 'Wait until the event at a position is visible in streams.events; false on timeout.';

-- Subscriptions (new in 0.2.0; the same as sql/subscriptions.sql).
CREATE TABLE streams.subscription_state (
    id          integer PRIMARY KEY,
    name        text COLLATE "C" NOT NULL UNIQUE,
    stream      text COLLATE "C" NOT NULL,
    ordered     boolean NOT NULL,
    -- Every event of the subscription at or below it is processed.
    position    bigint NOT NULL CHECK (position >= 0),
    -- The role that created it: its members poll, ack, seek and drop it.
    owner       regrole NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_ack_at timestamptz
);
CREATE SEQUENCE streams.subscription_ids AS integer OWNED BY streams.subscription_state.id;
ALTER TABLE streams.subscription_state ALTER COLUMN id SET DEFAULT pg_catalog.nextval('streams.subscription_ids');

-- Unordered subscriptions: within each chunk of 1024 positions
-- (streams._chunk), the processed events are a prefix, through done_through.
-- A poll folds the chunks below its first unprocessed event into `position`
-- and deletes their rows.
CREATE TABLE streams.subscription_progress (
    subscription integer NOT NULL REFERENCES streams.subscription_state (id) ON DELETE CASCADE,
    chunk        bigint NOT NULL,
    done_through bigint NOT NULL,
    acked_at     timestamptz NOT NULL,
    PRIMARY KEY (subscription, chunk)
);

-- pg_dump keeps the subscriptions with the log they follow.
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_state', '');
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_progress', '');
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_ids', '');

-- The functions below run as the caller and check it themselves (a member of
-- the subscription's owner, with the read privilege on every stream its
-- pattern selects), then use the tables as the extension's owner. Nobody
-- needs access to the tables.
CREATE FUNCTION streams._create_subscription(name text, stream text, start bigint, ordered boolean) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_create_subscription_wrapper';
CREATE FUNCTION streams._seek_subscription(name text, start bigint) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_seek_subscription_wrapper';
CREATE FUNCTION streams._poll(subscription text, max_events integer, wait interval)
RETURNS TABLE (stream text, after bigint, count integer)
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_poll_wrapper';
CREATE FUNCTION streams._chunk("position" bigint) RETURNS bigint
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_chunk_wrapper';
CREATE FUNCTION streams._claims() RETURNS TABLE (subscription integer, pid integer, claimed bigint)
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_claims_wrapper';

-- streams._start_position(function, after, since, from_tx) -> bigint
-- Where a subscription starts: after => that position, since/from_tx as in
-- replay, none => the current horizon. 22023 for more than one of them.
CREATE FUNCTION streams._start_position(caller text, after bigint, since timestamptz, from_tx xid8) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.num_nonnulls(after, since, from_tx) OPERATOR(pg_catalog.>) 1 THEN
        RAISE EXCEPTION '%: give at most one of after, since and from_tx', caller
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'after => a position, since => a time, or from_tx => a transaction id.';
    END IF;
    IF after IS NOT NULL THEN
        RETURN after;
    END IF;
    -- A time or transaction that names nothing final yet: from the horizon.
    RETURN coalesce(CASE WHEN since IS NOT NULL OR from_tx IS NOT NULL
                         THEN streams._replay_start(since, from_tx) END,
                    streams.horizon());
END
$$;

-- streams.create_subscription(name, stream, after, since, from_tx, ordered) -> void
-- A durable, named cursor over `stream` (a name, 'prefix.*' or '*'). Starts
-- after the current horizon, or after => a position (0: the beginning),
-- since => a time, from_tx => a transaction. ordered => true: one transaction
-- at a time polls it, in position order; false: concurrent pollers get
-- disjoint events (competing consumers). 42710 if the name exists, 42501
-- without the read privilege on the whole pattern.
CREATE FUNCTION streams.create_subscription(
    name    text,
    stream  text        DEFAULT '*',
    after   bigint      DEFAULT NULL,
    since   timestamptz DEFAULT NULL,
    from_tx xid8        DEFAULT NULL,
    ordered boolean     DEFAULT true
) RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT streams._create_subscription(
        create_subscription.name, create_subscription.stream,
        streams._start_position('streams.create_subscription', create_subscription.after,
                                create_subscription.since, create_subscription.from_tx),
        create_subscription.ordered)
$$;

-- streams.drop_subscription(name) -> boolean
-- Drop it and its progress; true if it existed.
CREATE FUNCTION streams.drop_subscription(name text) RETURNS boolean
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_drop_subscription_wrapper';

-- streams.poll(subscription, max_events, wait) -> setof streams.events
-- The next final events of the subscription that are neither processed nor
-- claimed by another open transaction, in position order, at most
-- max_events (1 to 10000), claimed for the caller's transaction. With wait
-- and nothing to return, sleeps until events arrive or wait is over. Two
-- statements on purpose: the second one's snapshot sees every claimed event.
CREATE FUNCTION streams.poll(subscription text, max_events integer DEFAULT 100, wait interval DEFAULT '0')
RETURNS SETOF streams.events
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pattern text;
    afters bigint[];
    counts integer[];
BEGIN
    SELECT pg_catalog.min(c.stream), pg_catalog.array_agg(c.after ORDER BY c.after),
           pg_catalog.array_agg(c.count ORDER BY c.after)
    INTO pattern, afters, counts
    FROM streams._poll(poll.subscription, poll.max_events, poll.wait) c;
    RETURN QUERY
        SELECT e.*
        FROM ROWS FROM (pg_catalog.unnest(afters), pg_catalog.unnest(counts)) AS c(after, count)
        CROSS JOIN LATERAL streams.replay(pattern, after => c.after, max_events => c.count) e
        ORDER BY e.position;
END
$$;

-- streams.ack(subscription, through) -> void
-- The events this transaction polled with positions up to `through` are
-- processed, as part of this transaction. 22023 for positions it did not poll.
CREATE FUNCTION streams.ack(subscription text, through bigint) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_ack_wrapper';

-- streams.seek(subscription, after, since, from_tx) -> void
-- Move the subscription: back to reprocess, ahead to skip. None given: to
-- the current horizon. Waits for a transaction that holds an ordered
-- subscription's events.
CREATE FUNCTION streams.seek(
    subscription text,
    after        bigint      DEFAULT NULL,
    since        timestamptz DEFAULT NULL,
    from_tx      xid8        DEFAULT NULL
) RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT streams._seek_subscription(
        seek.subscription, streams._start_position('streams.seek', seek.after, seek.since, seek.from_tx))
$$;

-- streams.subscriptions: the subscriptions of the roles the caller belongs
-- to, with their progress. position: every event of it at or below is
-- processed; pending: final events after it not yet processed; lag_time: the
-- age of the oldest pending one; claimed: events claimed by open
-- transactions, claimed_by: their pids. security_barrier: the role filter
-- runs before any function of the caller's query sees a row.
CREATE VIEW streams.subscriptions WITH (security_barrier) AS
SELECT s.name, s.stream, s.ordered, s.owner,
       coalesce(first_pending.position - 1, GREATEST(s.position, h.horizon)) AS "position",
       coalesce(pending.count, 0) AS pending,
       pg_catalog.now() - first_pending.committed_at AS lag_time,
       coalesce(claims.claimed, 0) AS claimed,
       coalesce(claims.pids, '{}') AS claimed_by,
       GREATEST(s.last_ack_at, progress.acked_at) AS last_ack_at,
       s.created_at
FROM streams.subscription_state s
CROSS JOIN LATERAL (SELECT coalesce((SELECT hs.horizon FROM streams.horizon_state hs), 0) AS horizon) h
LEFT JOIN LATERAL (
    SELECT e.position,
           -- Read here rather than through streams._commit_time, which reads as
           -- the caller: the view reads the tables as its owner.
           (SELECT c.times[e.position - c.first_position + 1] FROM streams.commit_times c
            WHERE c.first_position <= e.position ORDER BY c.first_position DESC LIMIT 1) AS committed_at
    FROM streams.event_log e
    WHERE e.position > s.position AND e.position <= h.horizon
      AND (streams._stream_exact(s.stream) IS NULL OR e.stream = streams._stream_exact(s.stream))
      AND (streams._stream_prefix_low(s.stream) IS NULL
           OR (e.stream >= streams._stream_prefix_low(s.stream) AND e.stream < streams._stream_prefix_high(s.stream)))
      AND NOT EXISTS (SELECT FROM streams.subscription_progress p
                      WHERE p.subscription = s.id AND p.chunk = streams._chunk(e.position) AND p.done_through >= e.position)
    ORDER BY e.position LIMIT 1
) first_pending ON true
LEFT JOIN LATERAL (
    SELECT pg_catalog.count(*) AS count
    FROM streams.event_log e
    WHERE e.position >= first_pending.position AND e.position <= h.horizon
      AND (streams._stream_exact(s.stream) IS NULL OR e.stream = streams._stream_exact(s.stream))
      AND (streams._stream_prefix_low(s.stream) IS NULL
           OR (e.stream >= streams._stream_prefix_low(s.stream) AND e.stream < streams._stream_prefix_high(s.stream)))
      AND NOT EXISTS (SELECT FROM streams.subscription_progress p
                      WHERE p.subscription = s.id AND p.chunk = streams._chunk(e.position) AND p.done_through >= e.position)
) pending ON true
LEFT JOIN (
    SELECT c.subscription, pg_catalog.sum(c.claimed)::bigint AS claimed, pg_catalog.array_agg(DISTINCT c.pid) AS pids
    FROM streams._claims() c GROUP BY c.subscription
) claims ON claims.subscription = s.id
LEFT JOIN LATERAL (
    SELECT pg_catalog.max(p.acked_at) AS acked_at FROM streams.subscription_progress p WHERE p.subscription = s.id
) progress ON true
WHERE pg_catalog.pg_has_role(s.owner, 'USAGE');

COMMENT ON TABLE streams.subscription_state IS 'Subscriptions: name, stream pattern, ordering, processed position, owner (see streams.subscriptions).';
COMMENT ON COLUMN streams.subscription_state.position IS 'Every event of the subscription at or below this position is processed (unordered: plus the progress rows above it).';
COMMENT ON TABLE streams.subscription_progress IS 'Unordered subscriptions: the processed prefix of each chunk of 1024 positions above the position.';
COMMENT ON SEQUENCE streams.subscription_ids IS 'Ids of subscriptions (keys of their claim locks).';
COMMENT ON FUNCTION streams._create_subscription(text, text, bigint, boolean) IS 'Internal: create_subscription once the start position is known.';
COMMENT ON FUNCTION streams._seek_subscription(text, bigint) IS 'Internal: seek once the position is known.';
COMMENT ON FUNCTION streams._poll(text, integer, interval) IS 'Internal: claim the next events of a subscription, as ranges of positions.';
COMMENT ON FUNCTION streams._chunk(bigint) IS 'Internal: the chunk (1024 positions) of an unordered subscription a position falls in.';
COMMENT ON FUNCTION streams._claims() IS 'Internal: the events open transactions of this database claimed, per subscription and pid.';
COMMENT ON FUNCTION streams._start_position(text, bigint, timestamptz, xid8) IS 'Internal: where a subscription starts or seeks to.';
COMMENT ON FUNCTION streams.create_subscription(text, text, bigint, timestamptz, xid8, boolean) IS 'Create a durable, named subscription to a stream, ''prefix.*'' or ''*''.';
COMMENT ON FUNCTION streams.drop_subscription(text) IS 'Drop a subscription and its progress; true if it existed.';
COMMENT ON FUNCTION streams.poll(text, integer, interval) IS 'Claim the next events of a subscription for this transaction; wait => long poll.';
COMMENT ON FUNCTION streams.ack(text, bigint) IS 'Mark what this transaction polled, up to a position, as processed (commits with the transaction).';
COMMENT ON FUNCTION streams.seek(text, bigint, timestamptz, xid8) IS 'Move a subscription back (reprocess) or ahead (skip).';
COMMENT ON VIEW streams.subscriptions IS 'The subscriptions of the caller''s roles: position, pending events, lag, claims.';

-- Webhooks (new in 0.2.0; the same as sql/webhooks.sql).
CREATE TABLE streams.webhook_state (
    subscription    integer PRIMARY KEY REFERENCES streams.subscription_state (id) ON DELETE CASCADE,
    url             text NOT NULL,
    -- whsec_ + base64 of the signing key. Never shown by streams.webhooks.
    secret          text NOT NULL,
    -- The most events one request carries (1: the body is one event).
    batch           integer NOT NULL CHECK (batch BETWEEN 1 AND 1000),
    paused          boolean NOT NULL DEFAULT false,
    -- Set when delivery gave up (410 Gone, too many failures); last_error says why.
    disabled_at     timestamptz,
    -- Failed attempts of the request now pending; 0 after a success.
    attempts        integer NOT NULL DEFAULT 0,
    failing_since   timestamptz,
    next_attempt_at timestamptz,
    last_status     integer,
    last_error      text,
    last_attempt_at timestamptz,
    last_success_at timestamptz
);

SELECT pg_catalog.pg_extension_config_dump('streams.webhook_state', '');

-- The functions run as the caller and check it themselves (like the
-- subscription functions), then use the tables as the extension's owner.
CREATE FUNCTION streams.create_webhook(
    name   text,
    stream text,
    url    text,
    after  bigint  DEFAULT NULL,
    secret text    DEFAULT NULL,
    batch  integer DEFAULT 1
) RETURNS text
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_create_webhook_wrapper';
CREATE FUNCTION streams.drop_webhook(name text) RETURNS boolean
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_drop_webhook_wrapper';
CREATE FUNCTION streams.pause_webhook(name text) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_pause_webhook_wrapper';
CREATE FUNCTION streams.resume_webhook(name text) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_resume_webhook_wrapper';

-- streams.webhooks: the webhooks of the roles the caller belongs to (the
-- row filter is the one of streams.subscriptions). position: every event
-- of the webhook at or below it was delivered; pending: final events after
-- it; attempts: failed attempts of the pending request.
CREATE VIEW streams.webhooks WITH (security_barrier) AS
SELECT sub.name, sub.stream, w.url,
       CASE WHEN w.disabled_at IS NOT NULL THEN 'disabled'
            WHEN w.paused THEN 'paused'
            WHEN w.attempts > 0 THEN 'retrying'
            ELSE 'active' END AS state,
       sub.position, sub.pending, w.attempts, w.last_status, w.last_error, w.next_attempt_at, sub.lag_time,
       w.batch, sub.owner, w.disabled_at, w.last_attempt_at, w.last_success_at, sub.created_at
FROM streams.subscriptions sub
JOIN streams.subscription_state s ON s.name = sub.name
JOIN streams.webhook_state w ON w.subscription = s.id;

COMMENT ON TABLE streams.webhook_state IS 'Webhooks: the endpoint, secret and delivery state of each webhook subscription (see streams.webhooks).';
COMMENT ON FUNCTION streams.create_webhook(text, text, text, bigint, text, integer) IS 'POST every event of a stream (or ''prefix.*'', ''*'') to an http(s) URL, signed; returns the signing secret.';
COMMENT ON FUNCTION streams.drop_webhook(text) IS 'Drop a webhook and its progress; true if it existed.';
COMMENT ON FUNCTION streams.pause_webhook(text) IS 'Stop delivering to a webhook until resume_webhook.';
COMMENT ON FUNCTION streams.resume_webhook(text) IS 'Deliver again to a paused or disabled webhook, from where it stopped, retrying at once.';
COMMENT ON VIEW streams.webhooks IS 'The webhooks of the caller''s roles: URL, state, delivered position, pending events, attempts, last status and error.';
COMMENT ON COLUMN streams.webhooks.state IS 'active, retrying (the pending request failed; next_attempt_at says when it is tried again), paused, or disabled (last_error says why).';
COMMENT ON COLUMN streams.webhooks.position IS 'Every event of the webhook at or below this position was delivered (a 2xx answer).';

-- Privileges, as a fresh install sets them.
-- Privileges start from nothing: what default privileges (ALTER DEFAULT
-- PRIVILEGES of the installing role) gave others on the new objects, or what
-- a pre-existing empty schema granted, is taken back first.
DO $reset$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT g.kind, g.name, CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END AS grantee
        FROM (
            SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END AS kind, c.oid::regclass::text AS name,
                   a.grantee, c.relowner AS owner
            FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
            WHERE c.relnamespace = 'streams'::regnamespace
            UNION ALL
            SELECT 'FUNCTION', p.oid::regprocedure::text, a.grantee, p.proowner
            FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
            WHERE p.pronamespace = 'streams'::regnamespace
            UNION ALL
            SELECT 'SCHEMA', 'streams', a.grantee, n.nspowner
            FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
            WHERE n.nspname = 'streams'
        ) g
        WHERE g.grantee <> g.owner
        GROUP BY 1, 2, 3
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM %s', r.kind, r.name, r.grantee);
    END LOOP;
END
$reset$;
REVOKE ALL ON ALL TABLES IN SCHEMA streams FROM PUBLIC;
REVOKE ALL ON SEQUENCE streams.position_seq FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA streams FROM PUBLIC;
GRANT SELECT ON streams.stream_grants TO PUBLIC;
GRANT EXECUTE ON FUNCTION streams._replay_check(bigint, timestamptz, xid8),
    streams._stream_exact(text), streams._stream_prefix_low(text), streams._stream_prefix_high(text),
    streams._replay_limit(integer), streams._stream_matches(text, text[]), streams._era(bigint, bigint[]),
    streams._commit_time(bigint),
    streams._reads_all(), streams._read_patterns(), streams._may_publish(text) TO PUBLIC;

-- Subscriptions: each function checks its caller; the tables stay the owner's alone.
GRANT SELECT ON streams.subscriptions TO PUBLIC;
GRANT EXECUTE ON FUNCTION streams.create_subscription(text, text, bigint, timestamptz, xid8, boolean),
    streams.drop_subscription(text), streams.poll(text, integer, interval), streams.ack(text, bigint),
    streams.seek(text, bigint, timestamptz, xid8), streams._create_subscription(text, text, bigint, boolean),
    streams._seek_subscription(text, bigint), streams._poll(text, integer, interval), streams._chunk(bigint),
    streams._claims(), streams._start_position(text, bigint, timestamptz, xid8) TO PUBLIC;

-- Webhooks: creating one is a privilege of its own, for nobody until granted:
--   GRANT EXECUTE ON FUNCTION streams.create_webhook(text, text, text, bigint, text, integer) TO app;
-- (plus the read privilege on the webhook's streams). The others check their caller.
GRANT SELECT ON streams.webhooks TO PUBLIC;
GRANT EXECUTE ON FUNCTION streams.drop_webhook(text), streams.pause_webhook(text), streams.resume_webhook(text)
    TO PUBLIC;

-- The roles captured above get their access back.
DO $migrate$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT g.name::oid::regrole AS grantee
             FROM pg_catalog.unnest(pg_catalog.string_to_array(pg_catalog.current_setting('litebase_streams_upgrade.readers'), ',')) g(name)
    LOOP
        PERFORM streams.grant('read', '*', r.grantee);
    END LOOP;
    FOR r IN SELECT g.name::oid::regrole AS grantee
             FROM pg_catalog.unnest(pg_catalog.string_to_array(pg_catalog.current_setting('litebase_streams_upgrade.publishers'), ',')) g(name)
    LOOP
        PERFORM streams.grant('publish', '*', r.grantee);
    END LOOP;
    FOR r IN SELECT g.name::oid::regrole AS grantee
             FROM pg_catalog.unnest(pg_catalog.string_to_array(pg_catalog.current_setting('litebase_streams_upgrade.status_readers'), ',')) g(name)
    LOOP
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA streams TO %s', r.grantee);
        EXECUTE pg_catalog.format('GRANT SELECT ON streams.status TO %s', r.grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION streams._worker_status() TO %s', r.grantee);
    END LOOP;
END
$migrate$;
