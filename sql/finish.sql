-------------------------------------------------------------------------------
-- The last part of CREATE EXTENSION, after every object of streams.sql and
-- subscriptions.sql exists: privileges, then the worker.
-------------------------------------------------------------------------------

-- Privileges: nothing for PUBLIC but helpers that reveal nothing (pure
-- functions, and what the caller itself may do). Readers and publishers get
-- what they need from streams.grant; operators:
--   GRANT USAGE ON SCHEMA streams TO ops;
--   GRANT SELECT ON streams.status TO ops;
--   GRANT EXECUTE ON FUNCTION streams._worker_status() TO ops;
-- or, for numbers to alert on: GRANT pg_monitor TO ops (streams.metrics()).
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
-- replay is inlined into the caller's query and the events view calls these
-- as the caller.
GRANT EXECUTE ON FUNCTION streams._replay_check(bigint, timestamptz, xid8),
    streams._stream_exact(text), streams._stream_prefix_low(text), streams._stream_prefix_high(text),
    streams._stream_wildcard(text), streams._check_types(text[]), streams._check_filter(jsonb),
    streams._replay_limit(integer), streams._replay_until(bigint), streams._stream_matches(text, text[]),
    streams._era(bigint, bigint[]),
    streams._commit_time(bigint),
    streams._event_json(bigint, text, timestamptz, bigint, text, text, text, text),
    streams._reads_all(), streams._read_patterns(), streams._may_publish(text),
    streams._last_publish_duplicate() TO PUBLIC;

-- Subscriptions: each function checks its caller; the tables stay the owner's alone.
GRANT SELECT ON streams.subscriptions, streams.dead_letters TO PUBLIC;
GRANT EXECUTE ON FUNCTION
    streams.create_subscription(text, text, bigint, timestamptz, xid8, boolean, text, integer, interval, interval, text, boolean, text[], jsonb),
    streams.alter_subscription(text, integer, interval, interval, boolean),
    streams.drop_subscription(text), streams.poll(text, integer, interval, interval), streams.ack(text, bigint),
    streams.ack(text, bigint, bigint), streams.extend_lease(text, bigint, interval),
    streams.nack(text, bigint, interval, text, bigint), streams.retry_dead_letter(text, bigint),
    streams.discard_dead_letter(text, bigint),
    streams.seek(text, bigint, timestamptz, xid8),
    streams._create_subscription(text, text, bigint, boolean, text, text, integer, interval, interval, boolean, text[], jsonb),
    streams._seek_subscription(text, bigint), streams._poll(text, integer, interval),
    streams._claim(text, integer, interval, interval), streams._attempt(bigint), streams._await_delivery(),
    streams._chunk(bigint),
    streams._event_key(text[], text, jsonb, text), streams._bounded_key(text),
    streams._claims(), streams._start_position(text, bigint, timestamptz, xid8) TO PUBLIC;

-- Webhooks: creating one is a privilege of its own, for nobody until granted:
--   GRANT EXECUTE ON FUNCTION streams.create_webhook TO app;
-- (plus the read privilege on the webhook's streams). The others check their caller.
GRANT SELECT ON streams.webhooks TO PUBLIC;
GRANT EXECUTE ON FUNCTION streams.drop_webhook(text), streams.pause_webhook(text), streams.resume_webhook(text)
    TO PUBLIC;

-- Capture: capture and uncapture check ownership of the table (and the
-- publish privilege), snapshot lists only events the caller reads. The
-- trigger function stays the owner's: nobody else can attach it.
GRANT SELECT ON streams.captures TO PUBLIC;
GRANT EXECUTE ON FUNCTION streams.capture(regclass, text, text[]), streams.uncapture(regclass),
    streams._capture_args(bytea), streams.snapshot(text) TO PUBLIC;
-- Redaction: whether the caller itself may redact (redact and the audit table come with the grant).
GRANT EXECUTE ON FUNCTION streams._may_redact(text) TO PUBLIC;

-- Metrics: streams.streams shows each role its own readable streams;
-- streams.metrics() is for monitoring roles (the PostgreSQL convention:
-- pg_monitor, which already sees more in pg_stat_activity), with the schema
-- usage it takes. The statistics tables stay the owner's alone.
GRANT SELECT ON streams.streams TO PUBLIC;
GRANT USAGE ON SCHEMA streams TO pg_monitor;
GRANT EXECUTE ON FUNCTION streams.metrics(integer, integer) TO pg_monitor;

-- Storage: the settings and the first position retention kept are
-- everyone's to see (a reader needs to know where the log starts), and
-- reads call _retained as the reader. The partitions, with their sizes and
-- the times of their newest events, are for monitoring roles. Changing any
-- of it (set_partition_size, set_retention, archive) is the extension
-- owner's alone.
GRANT SELECT ON streams.storage TO PUBLIC;
GRANT EXECUTE ON FUNCTION streams._retained(bigint, timestamptz, xid8), streams._first_position(),
    streams._partition_bounds(), streams._storage(), streams._subscription_lost(text, bigint) TO PUBLIC;
GRANT SELECT ON streams.partitions TO pg_monitor;
GRANT EXECUTE ON FUNCTION streams._partition_info() TO pg_monitor;

-- Start this database's worker when CREATE EXTENSION commits.
SELECT streams._launch_worker();
