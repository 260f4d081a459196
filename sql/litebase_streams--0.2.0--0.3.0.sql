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
-- 4. The horizon is found through an index on it (readers take the version
--    with the highest horizon), so a long-open snapshot, which keeps every
--    old version of the row, no longer slows every reader and the worker;
--    horizon_state loses its primary key, whose check visited them all.
-- 5. streams.status says what the transaction holding the horizon back
--    waits for (holder_waits_for): synchronous replication, its client.

\echo Use "ALTER EXTENSION litebase_streams UPDATE TO '0.3.0'" to load this file. \quit

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

-- Locks, in the order publishers, readers and the worker take them, so
-- that they wait behind this step instead of deadlocking with it. Readers
-- lock a view before the tables under it, so the views this step replaces
-- come first, each replaced before the views it reads (webhooks reads
-- subscriptions): replacing one takes only shared locks on what it reads.
-- Then streams.events, whose lock takes the log and the horizon in the
-- readers' order, then the tables this step alters. Only those: a
-- publisher reads the grants after it locked the log, and waits at the log.
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
CREATE OR REPLACE VIEW streams.subscriptions WITH (security_barrier) AS
SELECT s.name, s.stream, s.ordered, s.owner,
       coalesce(first_pending.position - 1, GREATEST(s.position, h.horizon)) AS "position",
       coalesce(pending.count, 0) AS pending,
       pg_catalog.now() - first_pending.committed_at AS lag_time,
       coalesce(claims.claimed, 0) AS claimed,
       coalesce(claims.pids, '{}') AS claimed_by,
       GREATEST(s.last_ack_at, progress.acked_at) AS last_ack_at,
       s.created_at
FROM streams.subscription_state s
CROSS JOIN LATERAL (SELECT coalesce((SELECT hs.horizon FROM streams.horizon_state hs ORDER BY hs.horizon DESC LIMIT 1), 0) AS horizon) h
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

CREATE OR REPLACE VIEW streams.status AS
SELECT coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0) AS horizon,
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
       w.rounds,
       CASE WHEN w.holder_pid IS NULL THEN NULL
            WHEN a.wait_event = 'SyncRep' THEN 'synchronous replication: committed locally, waiting for the standbys'
            WHEN a.state LIKE 'idle in transaction%' THEN 'its client: idle in transaction'
            WHEN a.wait_event IS NOT NULL THEN pg_catalog.concat(a.wait_event_type, ': ', a.wait_event)
            ELSE 'its own work: running'
       END AS holder_waits_for
FROM streams._worker_status() w
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = w.holder_pid;
COMMENT ON COLUMN streams.status.holder_waits_for IS 'What the transaction holding the horizon back waits for: synchronous replication (committed locally; hold_timeout never ends it), its client (idle in transaction), or a wait event.';

LOCK TABLE streams.events IN ACCESS EXCLUSIVE MODE;
LOCK TABLE streams.event_log, streams.horizon_state, streams.commit_times, streams.log_info,
    streams.private_streams, streams.subscription_state, streams.subscription_progress,
    streams.webhook_state IN ACCESS EXCLUSIVE MODE;

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
-- (streams.webhooks, which joins on both, is replaced above.)

-- 3. The batch in flight.
ALTER TABLE streams.webhook_state ADD COLUMN sending_upto bigint;
COMMENT ON COLUMN streams.webhook_state.sending_upto IS
    'The last position of the request in flight or last failed, written before it is sent: its retry carries the same events under the same webhook-id.';

-- 4. The horizon through its index (see streams.horizon_state in sql/streams.sql).
ALTER TABLE streams.horizon_state DROP CONSTRAINT horizon_state_pkey;
CREATE INDEX horizon_state_horizon ON streams.horizon_state (horizon);
ALTER TABLE streams.horizon_state REPLICA IDENTITY FULL;
-- horizon_state keeps one row without a unique key (see the table): the
-- worker inserts it at its first round, a restore brings it, and a second
-- one is refused, serialised by a lock so that two inserting transactions
-- cannot both miss the other's row.
CREATE FUNCTION streams._one_horizon_row() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    LOCK TABLE streams.horizon_state IN SHARE ROW EXCLUSIVE MODE;
    IF EXISTS (SELECT FROM streams.horizon_state) THEN
        RAISE EXCEPTION 'streams.horizon_state already has its row'
            USING ERRCODE = 'unique_violation',
                  HINT = 'Restore a dump into a new database: this one''s log already has a horizon.';
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION streams._one_horizon_row() IS 'Trigger: refuses a second row of streams.horizon_state.';
CREATE TRIGGER one_row BEFORE INSERT ON streams.horizon_state
    FOR EACH ROW EXECUTE FUNCTION streams._one_horizon_row();
ALTER TABLE streams.horizon_state ENABLE ALWAYS TRIGGER one_row;
REVOKE EXECUTE ON FUNCTION streams._one_horizon_row() FROM PUBLIC;
ALTER POLICY readable ON streams.event_log USING (
    (position > coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)) IS NOT TRUE
    AND ((SELECT streams._reads_all()) OR streams._stream_matches(stream, (SELECT streams._read_patterns())))
);

CREATE OR REPLACE FUNCTION streams.horizon() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)
$$;

CREATE OR REPLACE VIEW streams.events WITH (security_invoker = true) AS
SELECT e.position, e.stream, streams._commit_time(e.position) AS "time", e.tx, e.data
FROM streams.event_log e
WHERE (e.position > coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)) IS NOT TRUE;

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
                    AND e.position <= coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)),
              bounds AS (SELECT (SELECT h.era_bounds FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1) AS b)
              SELECT min(hit.position) - 1 FROM hit, bounds
              WHERE streams._era(hit.position, bounds.b)
                    = (SELECT streams._era(max(hit.position), bounds.b) FROM hit))
    END
$$;
