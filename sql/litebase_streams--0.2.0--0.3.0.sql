-- litebase_streams 0.2.0 -> 0.3.0. Every schema change after 0.2.0 lands
-- in this one step until 0.3.0 is released. Definitions repeat sql/*.sql;
-- the upgrade test compares the result with a fresh install.
--
-- 1. Row-level security on the internal tables (commit times, horizon,
--    log identity, private streams, subscriptions, webhooks): the predefined
--    roles pg_write_all_data and pg_read_all_data bypass table privileges
--    but not row security.
-- 2. Subscription and webhook names are unique per owning role.
-- 3. A webhook's batch is written down before it is sent
--    (webhook_state.sending_upto), so a retry after a crash resends it
--    under the same webhook-id.

\echo Use "ALTER EXTENSION litebase_streams UPDATE TO '0.3.0'" to load this file. \quit

-- Locks first, in the order publishers, readers and the worker take them,
-- so that they wait behind this step instead of deadlocking with it.
-- Readers lock a view before the tables under it: streams.events first
-- (its lock takes the log, then the horizon), then the view this step
-- replaces, then the tables it alters. Only those: a publisher reads the
-- grants after it locked the log, and waits at the log.
LOCK TABLE streams.events IN ACCESS EXCLUSIVE MODE;
LOCK TABLE streams.event_log, streams.horizon_state IN ACCESS EXCLUSIVE MODE;
LOCK TABLE streams.webhooks IN ACCESS EXCLUSIVE MODE;
LOCK TABLE streams.commit_times, streams.log_info, streams.private_streams, streams.subscription_state,
    streams.subscription_progress, streams.webhook_state IN ACCESS EXCLUSIVE MODE;

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

-- 1. Row-level security (sql/streams.sql, subscriptions.sql, webhooks.sql).
ALTER TABLE streams.commit_times ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON streams.commit_times FOR SELECT USING (true);
ALTER TABLE streams.horizon_state ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON streams.horizon_state FOR SELECT USING (true);
ALTER TABLE streams.log_info ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.private_streams ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.subscription_state ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.subscription_progress ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.webhook_state ENABLE ROW LEVEL SECURITY;

-- 2. Names per owner.
ALTER TABLE streams.subscription_state DROP CONSTRAINT subscription_state_name_key, ADD UNIQUE (name, owner);
CREATE OR REPLACE VIEW streams.webhooks WITH (security_barrier) AS
SELECT sub.name, sub.stream, w.url,
       CASE WHEN w.disabled_at IS NOT NULL THEN 'disabled'
            WHEN w.paused THEN 'paused'
            WHEN w.attempts > 0 THEN 'retrying'
            ELSE 'active' END AS state,
       sub.position, sub.pending, w.attempts, w.last_status, w.last_error, w.next_attempt_at, sub.lag_time,
       w.batch, sub.owner, w.disabled_at, w.last_attempt_at, w.last_success_at, sub.created_at
FROM streams.subscriptions sub
JOIN streams.subscription_state s ON s.name = sub.name AND s.owner = sub.owner
JOIN streams.webhook_state w ON w.subscription = s.id;

-- 3. The batch in flight.
ALTER TABLE streams.webhook_state ADD COLUMN sending_upto bigint;
COMMENT ON COLUMN streams.webhook_state.sending_upto IS
    'The last position of the request in flight or last failed, written before it is sent: its retry carries the same events under the same webhook-id.';
