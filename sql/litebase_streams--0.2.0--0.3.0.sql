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
-- 6. Attempts, nack and backoff, max_attempts and dead letters,
--    alter_subscription, create_subscription(if_not_exists).
-- 7. Events per stream (streams.stream_stats, counted by the worker),
--    streams.streams and streams.metrics() for Prometheus.
-- 8. The log partitioned by position ranges: the 0.2.0 table becomes its
--    first partition, attached as it is (no rows copied); archive and
--    opt-in retention (sql/storage.sql).

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

-- 8. (the functions streams.status reads; the partitioned log follows below)
-- streams._partition_bounds() -> table (partition, first_position, end_position)
-- The log's partitions in position order, from the relation cache: each
-- holds [first_position, end_position); first_position null: from the start.
CREATE FUNCTION streams._partition_bounds()
RETURNS TABLE (partition regclass, first_position bigint, end_position bigint)
LANGUAGE c STABLE AS 'MODULE_PATHNAME', '_partition_bounds_wrapper';
COMMENT ON FUNCTION streams._partition_bounds() IS 'Internal: the log''s partitions and their bounds, in position order.';

-- streams._first_position() -> bigint
-- The first position the log still holds after retention removed partitions
-- below it (null: nothing was removed): the end of streams.event_log_removed,
-- the empty partition that takes the removed positions' place. From the
-- catalog, under a lock on the log held to the end of the transaction: a
-- partition is dropped only under a lock that waits for every reader of the
-- log, so what a reader reads after calling this is whole.
CREATE FUNCTION streams._first_position() RETURNS bigint
LANGUAGE c STABLE AS 'MODULE_PATHNAME', '_first_position_wrapper';
COMMENT ON FUNCTION streams._first_position() IS 'Internal: the first position retention kept (null: nothing removed).';

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
       END AS holder_waits_for,
       streams._first_position() AS first_position
FROM streams._worker_status() w
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = w.holder_pid;
COMMENT ON COLUMN streams.status.first_position IS 'The first position retention kept: every lower one was removed (null: nothing removed).';
COMMENT ON COLUMN streams.status.holder_waits_for IS 'What the transaction holding the horizon back waits for: synchronous replication (committed locally; hold_timeout never ends it), its client (idle in transaction), or a wait event.';

LOCK TABLE streams.events IN ACCESS EXCLUSIVE MODE;
LOCK TABLE streams.event_log, streams.horizon_state, streams.commit_times, streams.log_info,
    streams.private_streams, streams.subscription_state, streams.subscription_progress,
    streams.webhook_state IN ACCESS EXCLUSIVE MODE;

-- The event envelope (type, key, headers): nullable columns at the end, so
-- the rows of 0.2.0 read back with a null envelope and nothing is rewritten.
ALTER TABLE streams.event_log ADD COLUMN type text COLLATE "C", ADD COLUMN key text COLLATE "C",
    ADD COLUMN headers jsonb;

-- 8. The partitioned log (see streams.event_log in sql/streams.sql). The
-- 0.2.0 table becomes its first partition as it is: renamed, then attached
-- behind a validated constraint that proves its bound, so the attach
-- scans nothing more and no row is copied or rewritten (its files stay).
-- Its indexes stay its own (every partition has its own, none is the
-- log's), its policy and statement trigger give way to the log's, and it
-- leaves the extension, as every partition is a plain table pg_dump dumps
-- with its rows.
ALTER TABLE streams.event_log RENAME TO event_log_0;
ALTER INDEX streams.event_log_pkey RENAME TO event_log_0_pkey;
ALTER INDEX streams.event_log_stream_position RENAME TO event_log_0_stream_position;
ALTER INDEX streams.event_log_tx RENAME TO event_log_0_tx;
DROP POLICY readable ON streams.event_log_0;
DROP TRIGGER event_log_immutable ON streams.event_log_0;
ALTER EXTENSION litebase_streams DROP TABLE streams.event_log_0;

CREATE TABLE streams.event_log (
    position bigint NOT NULL,
    stream   text COLLATE "C" NOT NULL,
    tx       xid8 NOT NULL,
    data     jsonb NOT NULL,
    type     text COLLATE "C",
    key      text COLLATE "C",
    headers  jsonb
) PARTITION BY RANGE (position);
SELECT pg_catalog.pg_extension_config_dump('streams.event_log', '');
CREATE TRIGGER event_log_immutable BEFORE UPDATE OR DELETE OR TRUNCATE ON streams.event_log
    FOR EACH STATEMENT EXECUTE FUNCTION streams._refuse_change();
ALTER TABLE streams.event_log ENABLE ALWAYS TRIGGER event_log_immutable;
CREATE TRIGGER event_log_immutable_rows BEFORE UPDATE OR DELETE ON streams.event_log
    FOR EACH ROW EXECUTE FUNCTION streams._refuse_change();
ALTER TABLE streams.event_log ENABLE ALWAYS TRIGGER event_log_immutable_rows;
-- Its policy is set in 1. below.
ALTER TABLE streams.event_log ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON streams.event_log FOR SELECT USING (false);
COMMENT ON TABLE streams.event_log IS 'Every event ever published, final or not; read streams.events instead.';

-- The partition is read through the log only: nobody keeps a privilege on
-- it (the readers' SELECT on the log comes back with the regrant of
-- streams.grant's privileges below).
REVOKE ALL ON streams.event_log FROM PUBLIC;
DO $revoke$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole::text AS grantee
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.oid = 'streams.event_log_0'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON streams.event_log_0 FROM %s', r.grantee);
    END LOOP;
END
$revoke$;
REVOKE ALL ON streams.event_log_0 FROM PUBLIC;

DO $attach$
DECLARE
    newest bigint := (SELECT CASE WHEN q.is_called THEN q.last_value ELSE q.last_value - 1 END FROM streams.position_seq q);
    -- The end of the first partition: the next multiple of the default
    -- partition size above every position handed out.
    bound bigint := (newest / 1000000 + 1) * 1000000;
BEGIN
    EXECUTE pg_catalog.format('ALTER TABLE streams.event_log_0 ADD CONSTRAINT event_log_0_bound CHECK (position < %s)', bound);
    EXECUTE pg_catalog.format('ALTER TABLE streams.event_log ATTACH PARTITION streams.event_log_0 FOR VALUES FROM (MINVALUE) TO (%s)', bound);
    ALTER TABLE streams.event_log_0 DROP CONSTRAINT event_log_0_bound;
END
$attach$;

-- How the log is stored (sql/storage.sql): the width of new partitions, the
-- opt-in retention, and what retention removed last. At most one row (none:
-- the defaults, nothing removed), changed only by streams.set_partition_size
-- and streams.set_retention (the extension's owner) and by the worker. Not
-- configuration settings: a setting per database is its owner's to change,
-- and the worker trusts no setting of a database or a role.
CREATE TABLE streams.storage_settings (
    id             boolean PRIMARY KEY DEFAULT true CHECK (id),
    partition_size bigint NOT NULL DEFAULT 1000000 CHECK (partition_size >= 10000),
    retention_max_age interval CHECK (retention_max_age >= '0'),
    retention_max_size bigint CHECK (retention_max_size > 0),
    retention_overrides_consumers boolean NOT NULL DEFAULT false,
    -- The first position retention kept (null: it never removed anything),
    -- when, and the newest commit time and transaction of what it removed.
    first_position bigint,
    cut_at         timestamptz,
    cut_time       timestamptz,
    cut_tx         xid8
);
ALTER TABLE streams.storage_settings ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON streams.storage_settings FOR SELECT USING (true);
SELECT pg_catalog.pg_extension_config_dump('streams.storage_settings', '');
REVOKE ALL ON streams.storage_settings FROM PUBLIC;

-- streams._retained(after, since, from_tx) -> boolean
-- True when every event a read from these bounds asks for is still in the
-- log, else SQLSTATE LS001 naming the first position retention kept: a read
-- below the cut is an error, never a shorter answer. From a position: after
-- at or past the first kept one less one. From a time: later than every
-- removed event's commit time. From a transaction: newer than every removed
-- event's (a transaction id is no position, so an older one may have events
-- on both sides of the cut). Called by replay and get as a one-time test,
-- after the statement locked the log. SECURITY DEFINER: it reads the cut's
-- record, which streams.storage shows everyone anyway.
CREATE FUNCTION streams._retained(after bigint, since timestamptz, from_tx xid8) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    kept bigint := streams._first_position();
    cut record;
BEGIN
    IF kept IS NULL OR coalesce(after, 0) >= kept - 1 THEN
        RETURN true;
    END IF;
    SELECT s.cut_at, s.cut_time, s.cut_tx INTO cut FROM streams.storage_settings s;
    IF (since IS NOT NULL AND since > cut.cut_time) OR (from_tx IS NOT NULL AND from_tx > cut.cut_tx) THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'streams: the events before position % were removed by retention%', kept,
        coalesce(' at ' || cut.cut_at::text, '')
        USING ERRCODE = 'LS001',
              DETAIL = pg_catalog.format('The log holds the positions from %s on.', kept),
              HINT = pg_catalog.format('Read from after => %s on (or seek a subscription there).', kept - 1);
END
$$;
COMMENT ON FUNCTION streams._retained(bigint, timestamptz, xid8) IS 'Internal: true when a read from these bounds is whole, else LS001 (retention removed some of it).';

-- streams.get(position bigint) -> streams.events
-- One final event by position, or null if there is none (or not yet).
CREATE OR REPLACE FUNCTION streams.get("position" bigint) RETURNS streams.events
LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT e.* FROM streams.events e
    WHERE e.position = get."position" AND streams._retained(get."position" OPERATOR(pg_catalog.-) 1, NULL, NULL)
$$;


-- replay(since => ..) finds the first row of commit times that reaches a time
-- in this index alone (sql/streams.sql).
CREATE INDEX commit_times_position_time ON streams.commit_times (first_position, last_time);

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
SELECT e.position, e.stream, streams._commit_time(e.position) AS "time", e.tx, e.data, e.type, e.key, e.headers
FROM streams.event_log e
WHERE (e.position > coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)) IS NOT TRUE;

-- streams._first_time_reaching(times timestamptz[], since timestamptz) -> integer
-- The 1-based index of the first of a row's commit times at or after since
-- (null: none); _replay_start's search of the row it found.
CREATE FUNCTION streams._first_time_reaching(times timestamptz[], since timestamptz) RETURNS integer
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_first_time_reaching_wrapper';
COMMENT ON FUNCTION streams._first_time_reaching(timestamptz[], timestamptz) IS 'Internal: the index of the first of a row''s commit times at or after a time.';
REVOKE EXECUTE ON FUNCTION streams._first_time_reaching(timestamptz[], timestamptz) FROM PUBLIC;

CREATE OR REPLACE FUNCTION streams._replay_start(since timestamptz, from_tx xid8) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
    start bigint;
BEGIN
    -- PL/pgSQL, one query per branch: a replay from a time plans only the
    -- lookup of commit times, and the session keeps each plan. (As one SQL
    -- statement both branches were planned at every call, the transaction's
    -- over every partition of the log, and its cost switched JIT on: 40 ms
    -- for a lookup of well under one.) jit = off: the transaction's lookup
    -- is an index probe per partition, never worth compiling.
    IF since IS NOT NULL THEN
        -- The first final event committed at or after `since`: in the first
        -- row of commit times (by position) that reaches `since`, since no
        -- earlier row does. Replay's time filter drops earlier commits that
        -- sit later on the timeline. The row is found in the index on
        -- (first_position, last_time) alone, then read by its key.
        SELECT c.first_position + streams._first_time_reaching(c.times, since) - 2 INTO start
        FROM streams.commit_times c
        WHERE c.first_position = (SELECT f.first_position FROM streams.commit_times f
                                  WHERE f.last_time >= since ORDER BY f.first_position LIMIT 1);
        -- None: nothing final committed since, or only events retention
        -- removed (a late commit low in a dropped partition), LS001 here.
        IF start IS NULL THEN
            PERFORM streams._retained(NULL, since, NULL);
        END IF;
        RETURN start;
    END IF;
    -- The transaction's first final event. A transaction id used again
    -- after a restore into another cluster names its newest transaction:
    -- the one of the era of the id's last event.
    WITH hit AS (
         SELECT e.position FROM streams.event_log e
         WHERE e.tx = from_tx
           AND e.position <= coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)),
     bounds AS (SELECT (SELECT h.era_bounds FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1) AS b)
    SELECT min(hit.position) - 1 INTO start FROM hit, bounds
    WHERE streams._era(hit.position, bounds.b)
          = (SELECT streams._era(max(hit.position), bounds.b) FROM hit);
    -- None: a transaction with no final event, or one whose events
    -- retention removed, LS001 here. (A null start leaves replay no
    -- partition to read, so its own check of the bounds never runs.)
    IF start IS NULL AND from_tx IS NOT NULL THEN
        PERFORM streams._retained(NULL, NULL, from_tx);
    END IF;
    RETURN start;
END
$$;

-- 6. Consumers that survive failing events: every poll's delivery is
--    written down (by the worker) before the events are returned, so each
--    event carries its attempt; nack with backoff, max_attempts, dead
--    letters that copy nothing, if_not_exists.
-- Pattern and filter helpers (issue 25, filters and wildcards; see replay below).
-- streams._stream_wildcard(pattern text) -> text
-- The pattern when it has a '*' segment before its end ('order.*.failed'),
-- else null: replay matches the names in its prefix range against it.
CREATE FUNCTION streams._stream_wildcard(pattern text) RETURNS text
LANGUAGE c IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', '_stream_wildcard_wrapper';

-- streams._check_types(types text[]) -> text[]
-- types, or 22023: 1 to 100 types, none null or empty.
CREATE FUNCTION streams._check_types(types text[]) RETURNS text[]
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_check_types_wrapper';

-- streams._check_filter(filter jsonb) -> jsonb
-- filter, or 22023: a JSON object of at most 4 kB.
CREATE FUNCTION streams._check_filter(filter jsonb) RETURNS jsonb
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_check_filter_wrapper';

LOCK TABLE streams.subscription_state IN ACCESS EXCLUSIVE MODE;
ALTER TABLE streams.subscription_state
    ADD COLUMN max_attempts integer CHECK (max_attempts BETWEEN 1 AND 1000),
    ADD COLUMN backoff_min interval NOT NULL DEFAULT '1 second',
    ADD COLUMN backoff_max interval NOT NULL DEFAULT '10 minutes',
    ADD COLUMN key text,
    ADD COLUMN key_path text[],
    ADD COLUMN on_dead_letter text NOT NULL DEFAULT 'hold' CHECK (on_dead_letter IN ('hold', 'skip')),
    ADD COLUMN types text[],
    ADD COLUMN filter jsonb,
    ADD COLUMN lost_before bigint;
-- How often each event was handed out and not yet settled (acked, parked,
-- discarded): every event of the subscription in (low, high] was
-- delivered `attempts` times, last to the backend with pid delivered_to
-- that started at delivered_to_start. Written by the database's worker in
-- transactions of its own before a poll returns (src/subscriptions/attempts.rs),
-- trimmed by acks. A lease's events carry its id and expiry.
CREATE TABLE streams.subscription_deliveries (
    subscription       integer NOT NULL REFERENCES streams.subscription_state (id) ON DELETE CASCADE,
    low                bigint NOT NULL,
    high               bigint NOT NULL CHECK (high > low),
    attempts           integer NOT NULL CHECK (attempts > 0),
    delivered_to       integer NOT NULL,
    delivered_to_start timestamptz NOT NULL,
    delivered_at       timestamptz NOT NULL,
    -- Delivered under a lease (poll(lease => ...)): claimed until leased_until.
    lease              bigint,
    leased_until       timestamptz,
    -- By the end: a delivery's segments are found from its first position up
    -- (high > after), past none of the settled ones below it, which stay in
    -- the index until VACUUM.
    PRIMARY KEY (subscription, high)
);

-- Subscriptions ordered per key: the last processed event of each key
-- above the subscription's position (an event is processed when it is at or
-- below either). An ack writes its keys' rows; the rows below the position
-- are dropped as it moves.
CREATE TABLE streams.subscription_keys (
    subscription integer NOT NULL REFERENCES streams.subscription_state (id) ON DELETE CASCADE,
    key          text COLLATE "C" NOT NULL,
    position     bigint NOT NULL,
    PRIMARY KEY (subscription, key)
);

-- streams._bounded_key(key) -> text
-- A key as subscriptions keep it: itself up to 200 bytes, else 'sha256:'
-- and its digest, so that a publisher's huge key can neither exceed an
-- index entry nor fill a poll's memory.
CREATE FUNCTION streams._bounded_key(key text) RETURNS text
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_bounded_key_wrapper';

-- streams._event_key(key_path, stream, data, key) -> text
-- The key of an event for a subscription ordered per key: the stream for
-- '{$stream}', the event's own key for '{$key}', else the text at that path
-- of data ('' when it has none), bounded. No SET clause, so that the planner inlines it into the queries
-- that scan events; every operator, function and type is qualified instead
-- (its body is parsed where it is inlined, under the caller's search_path).
CREATE FUNCTION streams._event_key(key_path text[], stream text, data jsonb, key text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT streams._bounded_key(
        CASE WHEN key_path OPERATOR(pg_catalog.=) '{$stream}'::pg_catalog.text[] THEN stream
             WHEN key_path OPERATOR(pg_catalog.=) '{$key}'::pg_catalog.text[] THEN coalesce(key, ''::pg_catalog.text)
             ELSE coalesce(data OPERATOR(pg_catalog.#>>) key_path, ''::pg_catalog.text) END)
$$;

-- Events that failed: nacked (retry_at: not delivered again before) or
-- parked as dead letters (parked_at). The event stays in the log; this is
-- all a dead letter holds.
CREATE TABLE streams.subscription_failures (
    subscription    integer NOT NULL REFERENCES streams.subscription_state (id) ON DELETE CASCADE,
    position        bigint NOT NULL,
    attempts        integer NOT NULL,
    first_error     text,
    last_error      text,
    first_failed_at timestamptz,
    last_failed_at  timestamptz,
    retry_at        timestamptz,
    parked_at       timestamptz,
    -- Discarded while the subscription had not yet moved past it: it is
    -- skipped like a dead letter, and forgotten once passed.
    discarded       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (subscription, position)
);

ALTER TABLE streams.subscription_deliveries ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.subscription_failures ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.subscription_keys ENABLE ROW LEVEL SECURITY;
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_deliveries', '');
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_failures', '');
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_keys', '');

DROP FUNCTION streams.create_subscription(text, text, bigint, timestamptz, xid8, boolean);
DROP FUNCTION streams._create_subscription(text, text, bigint, boolean);
DROP FUNCTION streams.poll(text, integer, interval);
CREATE FUNCTION streams._create_subscription(name text, stream text, start bigint, ordered boolean,
    key text, on_dead_letter text, max_attempts integer, backoff_min interval, backoff_max interval,
    if_not_exists boolean, types text[], filter jsonb) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_create_subscription_with_retries_wrapper';
CREATE FUNCTION streams._claim(subscription text, max_events integer, wait interval, lease interval)
RETURNS TABLE (stream text, prefix text, afters bigint[], throughs bigint[], lease bigint,
               pattern text, types text[], filter jsonb, lost_before bigint)
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_claim_wrapper';
-- No SET clause (called once per event returned): its one SQL statement
-- runs as the extension's owner with search_path pinned in Rust
-- (as_owner), like _commit_time's.
CREATE FUNCTION streams._attempt("position" bigint) RETURNS integer
LANGUAGE c VOLATILE STRICT AS 'MODULE_PATHNAME', '_attempt_wrapper';
-- Waits for the worker's commit of this backend's last poll's delivery;
-- no SET clause, as _attempt: it runs no SQL.
CREATE FUNCTION streams._await_delivery() RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_await_delivery_wrapper';
-- streams.create_subscription(name, stream, after, since, from_tx, ordered, key,
--     max_attempts, backoff_min, backoff_max, on_dead_letter, if_not_exists,
--     types, filter) -> void
-- A durable, named cursor over `stream` (a name, 'prefix.*', a pattern with
-- '*' segments such as 'order.*.failed', or '*'). Starts
-- after the current horizon, or after => a position (0: the beginning),
-- since => a time, from_tx => a transaction. ordered => true: one transaction
-- at a time polls it, in position order; false: concurrent pollers get
-- disjoint events (competing consumers). key: ordered per key instead, a
-- path into data ('order_id', 'customer.id') or '$stream': one
-- transaction at a time per key, keys in parallel. max_attempts:
-- deliveries of an event before it is parked as a dead letter (NULL: no
-- limit); backoff_min/backoff_max: the delay before
-- a nacked event comes again; on_dead_letter: per key, whether a dead
-- letter holds its key ('hold') or not ('skip'). types: only events of
-- these types; filter: only events whose data contains this JSON object
-- (data @> filter). Its other events are skipped: never polled, and passed
-- by the acks of the events around them. 42710 if the name exists
-- (if_not_exists => true: unless it is the same pattern, ordering and
-- filters), 42501 without the read privilege on the whole pattern, 22023
-- for a bad pattern or filter.
CREATE FUNCTION streams.create_subscription(
    name          text,
    stream        text        DEFAULT '*',
    after         bigint      DEFAULT NULL,
    since         timestamptz DEFAULT NULL,
    from_tx       xid8        DEFAULT NULL,
    ordered       boolean     DEFAULT true,
    key           text        DEFAULT NULL,
    max_attempts  integer     DEFAULT NULL,
    backoff_min   interval    DEFAULT '1 second',
    backoff_max   interval    DEFAULT '10 minutes',
    on_dead_letter text       DEFAULT 'hold',
    if_not_exists boolean     DEFAULT false,
    types         text[]      DEFAULT NULL,
    filter        jsonb       DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    start bigint := streams._start_position('streams.create_subscription', create_subscription.after,
                                            create_subscription.since, create_subscription.from_tx);
BEGIN
    PERFORM streams._create_subscription(
        create_subscription.name, create_subscription.stream, start,
        create_subscription.ordered, create_subscription.key, create_subscription.on_dead_letter,
        create_subscription.max_attempts, create_subscription.backoff_min, create_subscription.backoff_max,
        create_subscription.if_not_exists, create_subscription.types, create_subscription.filter);
    -- LS001 when it would start below the first position retention kept.
    -- _retained locks the log until the transaction ends: a drop after it
    -- waits for this transaction and then sees the new subscription.
    -- From the arguments given (a since or from_tx checks against the cut's
    -- time or transaction), or from the start chosen when none was.
    PERFORM streams._retained(
        coalesce(create_subscription.after,
                 CASE WHEN create_subscription.since IS NULL AND create_subscription.from_tx IS NULL THEN start END),
        create_subscription.since, create_subscription.from_tx);
END
$$;

-- streams.alter_subscription(name, max_attempts, backoff_min, backoff_max,
--     unlimited_attempts) -> void
-- Change a subscription's retry settings; NULL leaves one as it is, and
-- unlimited_attempts => true removes the limit.
CREATE FUNCTION streams.alter_subscription(
    name               text,
    max_attempts       integer  DEFAULT NULL,
    backoff_min        interval DEFAULT NULL,
    backoff_max        interval DEFAULT NULL,
    unlimited_attempts boolean  DEFAULT false
) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_alter_subscription_wrapper';

-- streams.poll(subscription, max_events, wait, lease) -> table of events
-- The next final events of the subscription that are neither processed nor
-- claimed by another open transaction, in position order, at most
-- max_events (1 to 10000), claimed for the caller's transaction, each with
-- its delivery attempt (1 the first time), written down before they are
-- returned. With wait and nothing to return, sleeps until events arrive or
-- wait is over. With lease (ordered subscriptions): claimed for that long
-- instead, under the lease id in the lease_id column, to settle from any
-- session with ack(subscription, through, lease) or nack(..., lease => ...).
-- Two statements on purpose: the next ones' snapshots see every claimed
-- event. Each claimed range of positions (in order, disjoint) is then read
-- by a statement of its own straight from the log (as the caller: its row
-- security applies), the events of a stream the pattern selects, in the
-- order of the index it scans, so nothing is sorted: the (stream,
-- position) one for one stream, the positions for a prefix or '*' (no
-- wider than the claim's own scan of them). Each event's attempt is its
-- count before this poll plus one (read by _claim, with the claims held);
-- the worker writes the delivery down while the events are read, and
-- _await_delivery waits for that commit before the function returns:
-- nothing is returned before it. A range holds the claimed events and the
-- ones between them that the subscription's wildcard pattern or filters
-- leave out: those are tested again here.
CREATE FUNCTION streams.poll(subscription text, max_events integer DEFAULT 100, wait interval DEFAULT '0',
                             lease interval DEFAULT NULL)
RETURNS TABLE ("position" bigint, stream text, "time" timestamptz, tx xid8, data jsonb, type text, key text,
               headers jsonb, attempt integer, lease_id bigint)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    claimed record;
BEGIN
    SELECT * INTO STRICT claimed FROM streams._claim(poll.subscription, poll.max_events, poll.wait, poll.lease);
    IF claimed.lost_before IS NOT NULL THEN
        -- Retention cut below the subscription: LS001, raised here (through
        -- Rust, the extension's own SQLSTATE would become XX000).
        PERFORM streams._subscription_lost(poll.subscription, claimed.lost_before);
    END IF;
    FOR i IN 1 .. pg_catalog.cardinality(claimed.afters) LOOP
        IF claimed.stream IS NOT NULL THEN
            RETURN QUERY
            SELECT e.position, e.stream, streams._commit_time(e.position), e.tx, e.data, e.type, e.key, e.headers,
                   streams._attempt(e.position), claimed.lease
            FROM streams.event_log e
            WHERE e.position > claimed.afters[i] AND e.position <= claimed.throughs[i]
              -- The equality positions the scan of (stream, position) at the
              -- range's start, and the redundant range makes a generic plan
              -- (which guesses the equality's share from the number of
              -- streams) see how narrow it is.
              AND e.stream = claimed.stream AND e.stream >= claimed.stream
              AND e.stream < claimed.stream OPERATOR(pg_catalog.||) pg_catalog.chr(1)
              AND (claimed.types IS NULL OR e.type = ANY (claimed.types))
              AND (claimed.filter IS NULL OR e.data OPERATOR(pg_catalog.@>) claimed.filter)
            ORDER BY e.position;
        ELSE
            RETURN QUERY
            SELECT e.position, e.stream, streams._commit_time(e.position), e.tx, e.data, e.type, e.key, e.headers,
                   streams._attempt(e.position), claimed.lease
            FROM streams.event_log e
            WHERE e.position > claimed.afters[i] AND e.position <= claimed.throughs[i]
              AND (claimed.prefix IS NULL
                   OR pg_catalog.substr(e.stream, 1, pg_catalog.length(claimed.prefix)) = claimed.prefix)
              AND (claimed.pattern IS NULL OR streams._stream_matches(e.stream, ARRAY[claimed.pattern]))
              AND (claimed.types IS NULL OR e.type = ANY (claimed.types))
              AND (claimed.filter IS NULL OR e.data OPERATOR(pg_catalog.@>) claimed.filter)
            ORDER BY e.position;
        END IF;
    END LOOP;
    PERFORM streams._await_delivery();
END
$$;

-- streams.nack(subscription, position, retry_after, reason) -> void
-- The event failed: deliver it again not before retry_after (NULL: the
-- subscription's backoff), recording the reason. In the transaction that
-- polled it (an ordered ack there stops before it; an unordered one goes
-- on, and the event comes again by itself), or after that transaction
-- failed, from the same session, until it is delivered again; or, with
-- lease, from any session while the lease is live (the lease ends: its
-- events not acked come again). At its last attempt it is parked as a dead
-- letter. 55000 for an event that is not the caller's to settle.
CREATE FUNCTION streams.nack(subscription text, "position" bigint, retry_after interval DEFAULT NULL,
                             reason text DEFAULT NULL, lease bigint DEFAULT NULL) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_nack_wrapper';

-- streams.ack(subscription, through, lease) -> void
-- The events of a live lease up to `through` are processed, as part of the
-- caller's transaction, from any session. 55000 once the lease expired or
-- its events were delivered again: nothing changes.
CREATE FUNCTION streams.ack(subscription text, through bigint, lease bigint) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_ack_lease_wrapper';

-- streams.extend_lease(subscription, lease, duration) -> timestamptz
-- Keep a live lease's events for `duration` from now (at most a day); the
-- new expiry. 55000 once it expired.
CREATE FUNCTION streams.extend_lease(subscription text, lease bigint, duration interval) RETURNS timestamptz
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_extend_lease_wrapper';

-- streams.retry_dead_letter(subscription, position) -> bigint
-- Put a dead letter (position NULL: every one) back: it is delivered again,
-- before the subscription's next events, as attempt 1. How many.
CREATE FUNCTION streams.retry_dead_letter(subscription text, "position" bigint DEFAULT NULL) RETURNS bigint
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_retry_dead_letter_wrapper';

-- streams.discard_dead_letter(subscription, position) -> bigint
-- Drop a dead letter (position NULL: every one); the event stays in the log.
-- How many.
CREATE FUNCTION streams.discard_dead_letter(subscription text, "position" bigint DEFAULT NULL) RETURNS bigint
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_discard_dead_letter_wrapper';

CREATE OR REPLACE VIEW streams.subscriptions WITH (security_barrier) AS
SELECT s.name, s.stream, s.ordered, s.owner,
       coalesce(first_pending.position - 1, GREATEST(s.position, h.horizon)) AS "position",
       coalesce(pending.count, 0) AS pending,
       pg_catalog.now() - first_pending.committed_at AS lag_time,
       coalesce(claims.claimed, 0) AS claimed,
       coalesce(claims.pids, '{}') AS claimed_by,
       GREATEST(s.last_ack_at, progress.acked_at) AS last_ack_at,
       s.created_at,
       s.max_attempts,
       (SELECT pg_catalog.max(d.attempts) FROM streams.subscription_deliveries d
        WHERE d.subscription = s.id) AS highest_attempt,
       coalesce(failures.retrying, 0) AS retrying,
       coalesce(failures.parked, 0) AS parked,
       failures.oldest_parked,
       failures.next_retry_at,
       s.key,
       s.types,
       s.filter,
       s.lost_before
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
      AND (streams._stream_wildcard(s.stream) IS NULL
           OR streams._stream_matches(e.stream, ARRAY[streams._stream_wildcard(s.stream)]))
      AND (s.types IS NULL OR e.type = ANY (s.types))
      AND (s.filter IS NULL OR e.data OPERATOR(pg_catalog.@>) s.filter)
      AND NOT EXISTS (SELECT FROM streams.subscription_progress p
                      WHERE p.subscription = s.id AND p.chunk = streams._chunk(e.position) AND p.done_through >= e.position)
      AND NOT EXISTS (SELECT FROM streams.subscription_keys k
                      WHERE s.key_path IS NOT NULL AND k.subscription = s.id
                        AND k.key = streams._event_key(s.key_path, e.stream, e.data, e.key) AND k.position >= e.position)
    ORDER BY e.position LIMIT 1
) first_pending ON true
LEFT JOIN LATERAL (
    SELECT pg_catalog.count(*) AS count
    FROM streams.event_log e
    WHERE e.position >= first_pending.position AND e.position <= h.horizon
      AND (streams._stream_exact(s.stream) IS NULL OR e.stream = streams._stream_exact(s.stream))
      AND (streams._stream_prefix_low(s.stream) IS NULL
           OR (e.stream >= streams._stream_prefix_low(s.stream) AND e.stream < streams._stream_prefix_high(s.stream)))
      AND (streams._stream_wildcard(s.stream) IS NULL
           OR streams._stream_matches(e.stream, ARRAY[streams._stream_wildcard(s.stream)]))
      AND (s.types IS NULL OR e.type = ANY (s.types))
      AND (s.filter IS NULL OR e.data OPERATOR(pg_catalog.@>) s.filter)
      AND NOT EXISTS (SELECT FROM streams.subscription_progress p
                      WHERE p.subscription = s.id AND p.chunk = streams._chunk(e.position) AND p.done_through >= e.position)
      AND NOT EXISTS (SELECT FROM streams.subscription_keys k
                      WHERE s.key_path IS NOT NULL AND k.subscription = s.id
                        AND k.key = streams._event_key(s.key_path, e.stream, e.data, e.key) AND k.position >= e.position)
) pending ON true
LEFT JOIN (
    SELECT c.subscription, pg_catalog.sum(c.claimed)::bigint AS claimed, pg_catalog.array_agg(DISTINCT c.pid) AS pids
    FROM streams._claims() c GROUP BY c.subscription
) claims ON claims.subscription = s.id
LEFT JOIN LATERAL (
    SELECT pg_catalog.max(p.acked_at) AS acked_at FROM streams.subscription_progress p WHERE p.subscription = s.id
) progress ON true
LEFT JOIN LATERAL (
    SELECT pg_catalog.count(*) FILTER (WHERE f.parked_at IS NULL) AS retrying,
           pg_catalog.count(*) FILTER (WHERE f.parked_at IS NOT NULL) AS parked,
           pg_catalog.min(f.parked_at) AS oldest_parked,
           pg_catalog.min(f.retry_at) FILTER (WHERE f.parked_at IS NULL) AS next_retry_at
    FROM streams.subscription_failures f WHERE f.subscription = s.id AND NOT f.discarded
) failures ON true
WHERE pg_catalog.pg_has_role(s.owner, 'USAGE');

-- streams.dead_letters: the parked events of the subscriptions of the
-- roles the caller belongs to. The event itself stays in the log:
-- streams.get(position) returns it to whoever may read its stream.
CREATE VIEW streams.dead_letters WITH (security_barrier) AS
SELECT s.name AS subscription, s.owner, f.position, e.stream, f.attempts, f.first_error, f.last_error,
       f.first_failed_at, f.last_failed_at, f.parked_at
FROM streams.subscription_failures f
JOIN streams.subscription_state s ON s.id = f.subscription
LEFT JOIN streams.event_log e ON e.position = f.position
WHERE f.parked_at IS NOT NULL AND NOT f.discarded AND pg_catalog.pg_has_role(s.owner, 'USAGE');



COMMENT ON FUNCTION streams._create_subscription(text, text, bigint, boolean, text, text, integer, interval, interval, boolean, text[], jsonb) IS 'Internal: create_subscription once the start position is known.';
COMMENT ON FUNCTION streams._poll(text, integer, interval) IS 'Internal: streams._claim without the attempts (the 0.2.0 form, for polls compiled before an update).';
COMMENT ON FUNCTION streams._claim(text, integer, interval, interval) IS 'Internal: claim the next events of a subscription: its stream (or prefix and pattern), its filters and the ranges of positions holding them.';
COMMENT ON FUNCTION streams._attempt(bigint) IS 'Internal: the delivery attempt of an event this backend''s last poll claimed (its count before that poll, plus one).';
COMMENT ON FUNCTION streams._await_delivery() IS 'Internal: wait until the worker wrote down the delivery of this backend''s last poll.';
COMMENT ON FUNCTION streams.create_subscription(text, text, bigint, timestamptz, xid8, boolean, text, integer, interval, interval, text, boolean, text[], jsonb) IS 'Create a durable, named subscription to a stream, ''prefix.*'', ''order.*.failed'' or ''*''; ordered in one sequence, per key, or not; max_attempts and backoff for failing events; types and filter (data @> filter) keep only the matching events.';
COMMENT ON TABLE streams.subscription_keys IS 'Subscriptions ordered per key: the last processed event of each key above the position.';
COMMENT ON FUNCTION streams._event_key(text[], text, jsonb, text) IS 'Internal: an event''s key for a subscription ordered per key.';
COMMENT ON FUNCTION streams._bounded_key(text) IS 'Internal: a key up to 200 bytes, else its SHA-256 digest.';
COMMENT ON COLUMN streams.subscription_state.key IS 'Ordered per key: the key as given (a path into data, or ''$stream''); NULL otherwise.';
COMMENT ON COLUMN streams.subscription_state.on_dead_letter IS 'Ordered per key: whether a dead letter holds its key''s later events (hold) or not (skip).';
COMMENT ON COLUMN streams.subscription_state.types IS 'Only events whose type is one of these (NULL: every type).';
COMMENT ON COLUMN streams.subscription_state.filter IS 'Only events whose data contains this JSON object, data @> filter (NULL: all).';
COMMENT ON FUNCTION streams.alter_subscription(text, integer, interval, interval, boolean) IS 'Change a subscription''s max_attempts and backoff.';
COMMENT ON FUNCTION streams.nack(text, bigint, interval, text, bigint) IS 'An event failed: deliver it again after retry_after (or the backoff), or park it at its last attempt.';
COMMENT ON FUNCTION streams.ack(text, bigint, bigint) IS 'Mark a live lease''s events, up to a position, as processed (any session).';
COMMENT ON FUNCTION streams.extend_lease(text, bigint, interval) IS 'Keep a live lease''s events for a while longer; the new expiry.';
COMMENT ON FUNCTION streams.retry_dead_letter(text, bigint) IS 'Put a dead letter (or all) back: delivered again as attempt 1.';
COMMENT ON FUNCTION streams.discard_dead_letter(text, bigint) IS 'Drop a dead letter (or all); the event stays in the log.';
COMMENT ON TABLE streams.subscription_deliveries IS 'How often each event of a subscription was delivered and not yet settled, as position ranges (written by the worker before a poll returns).';
COMMENT ON TABLE streams.subscription_failures IS 'Events of a subscription that failed: nacked (retry_at) or parked as dead letters (parked_at).';
COMMENT ON VIEW streams.dead_letters IS 'Parked events of the caller''s roles'' subscriptions; the events stay in the log.';
COMMENT ON COLUMN streams.subscription_state.max_attempts IS 'Deliveries of an event before it is parked (NULL: no limit).';
COMMENT ON COLUMN streams.subscription_state.backoff_min IS 'Delay before a nacked event comes again, at its first failure (doubling, with jitter).';
COMMENT ON COLUMN streams.subscription_state.backoff_max IS 'The longest delay before a nacked event comes again.';
COMMENT ON FUNCTION streams.poll(text, integer, interval, interval) IS 'Claim the next events of a subscription for this transaction (or for a lease), with their delivery attempt; wait => long poll.';

CREATE FUNCTION streams._delivery_waits() RETURNS TABLE (deliveries bigint, waited_us bigint)
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_delivery_waits_wrapper';
COMMENT ON FUNCTION streams._delivery_waits() IS 'Internal: this backend''s deliveries written down by the worker and the time its polls waited (microseconds).';
REVOKE EXECUTE ON FUNCTION streams._delivery_waits() FROM PUBLIC;

REVOKE ALL ON streams.subscription_deliveries, streams.subscription_failures, streams.subscription_keys FROM PUBLIC;
-- streams.subscriptions calls it, and a view's functions are checked
-- against the querying role; it reads nothing but its arguments.
GRANT EXECUTE ON FUNCTION streams._event_key(text[], text, jsonb, text), streams._bounded_key(text) TO PUBLIC;
REVOKE EXECUTE ON FUNCTION
    streams.create_subscription(text, text, bigint, timestamptz, xid8, boolean, text, integer, interval, interval, text, boolean, text[], jsonb),
    streams.alter_subscription(text, integer, interval, interval, boolean),
    streams.poll(text, integer, interval, interval), streams.ack(text, bigint, bigint),
    streams.extend_lease(text, bigint, interval),
    streams.nack(text, bigint, interval, text, bigint), streams.retry_dead_letter(text, bigint),
    streams.discard_dead_letter(text, bigint),
    streams._create_subscription(text, text, bigint, boolean, text, text, integer, interval, interval, boolean, text[], jsonb),
    streams._claim(text, integer, interval, interval), streams._attempt(bigint),
    streams._await_delivery() FROM PUBLIC;
GRANT SELECT ON streams.dead_letters TO PUBLIC;
GRANT EXECUTE ON FUNCTION
    streams.create_subscription(text, text, bigint, timestamptz, xid8, boolean, text, integer, interval, interval, text, boolean, text[], jsonb),
    streams.alter_subscription(text, integer, interval, interval, boolean),
    streams.poll(text, integer, interval, interval), streams.ack(text, bigint, bigint),
    streams.extend_lease(text, bigint, interval),
    streams.nack(text, bigint, interval, text, bigint), streams.retry_dead_letter(text, bigint),
    streams.discard_dead_letter(text, bigint),
    streams._create_subscription(text, text, bigint, boolean, text, text, integer, interval, interval, boolean, text[], jsonb),
    streams._claim(text, integer, interval, interval), streams._attempt(bigint),
    streams._await_delivery() TO PUBLIC;

-------------------------------------------------------------------------------
-- The event envelope, idempotent publish and expected version (issue 25)
-------------------------------------------------------------------------------

COMMENT ON COLUMN streams.events.type IS 'The event''s type, as published (null: none).';
COMMENT ON COLUMN streams.events.key IS 'The event''s key, as published: the entity it is about (null: none).';
COMMENT ON COLUMN streams.events.headers IS 'The event''s headers, a JSON object of strings (traceparent, correlation ids; null: none).';

-- streams.stream_head(stream text) -> bigint
-- The position of the stream's newest final event, 0 when it has none (or
-- none the caller may read): the version an event-sourcing writer reads
-- before appending with publish(..., expected_prev => it). A stream whose
-- events retention removed, every one, is not new: its head is its newest
-- event's position, removed or not, from the worker's count (streams.streams,
-- as the caller), which is what publish checks expected_prev against.
-- PL/pgSQL: the session keeps the plans (streams.streams is created later
-- in the script, too).
CREATE FUNCTION streams.stream_head(stream text) RETURNS bigint
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN coalesce(
        (SELECT e.position FROM streams.events e WHERE e.stream = stream_head.stream
         ORDER BY e.position DESC LIMIT 1),
        (SELECT s.last_position FROM streams.streams s
         WHERE s.stream = stream_head.stream AND s.last_position < streams._first_position()),
        0);
END
$$;
COMMENT ON FUNCTION streams.stream_head(text) IS 'The position of a stream''s newest final event (0: none; one retention removed still counts): the expected_prev of the next append.';

DROP FUNCTION streams.publish_batch(text, jsonb[]);
DROP FUNCTION streams._publish_batch(text, jsonb[]);
DROP FUNCTION streams.publish(text, jsonb);

-- streams.publish(stream, data, type, key, headers, idempotency_key, expected_prev) -> bigint
-- Append one event in the caller's transaction and return its position. It
-- becomes visible (streams.events, LISTEN "<stream>") once the transaction
-- commits and every transaction that published before it has finished.
--   type, key, headers  the envelope (all optional): the event's type, the
--                       entity it is about, and a JSON object of string
--                       headers (traceparent, correlation ids); 22023 past
--                       their limits (docs/publishing.md, "The event envelope")
--   idempotency_key     at most one event per (stream, key) while the key is
--                       remembered (litebase_streams.idempotency_window): a
--                       repeat writes nothing and returns the first one's
--                       position, waiting for it if it is still open
--   expected_prev       append only if the stream's newest event, counting
--                       uncommitted ones, is at this position (0: none);
--                       40001 otherwise, naming the actual one
-- Runs as the caller, who needs the 'publish' privilege on the stream
-- (streams.grant; 42501 otherwise), and writes as the log's owner: nobody
-- needs access to the tables. Implemented in Rust (src/log/publish.rs): a
-- position, then the row appended as an INSERT would (src/log/append.rs).
CREATE FUNCTION streams.publish(stream text, data jsonb, type text DEFAULT NULL, key text DEFAULT NULL,
                                headers jsonb DEFAULT NULL, idempotency_key text DEFAULT NULL,
                                expected_prev bigint DEFAULT NULL) RETURNS bigint
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'litebase_streams_publish';
COMMENT ON FUNCTION streams.publish(text, jsonb, text, text, jsonb, text, bigint) IS 'Append one event in the caller''s transaction, with an optional type, key and headers, idempotency key and expected previous position; returns its position.';

-- streams._last_publish_duplicate() -> boolean
-- Whether this session's last publish found its idempotency key remembered.
CREATE FUNCTION streams._last_publish_duplicate() RETURNS boolean
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_last_publish_duplicate_wrapper';

-- streams.publish_once(stream, data, idempotency_key, type, key, headers,
--                      expected_prev) -> (position, duplicate)
-- publish with an idempotency key that also says whether the key was
-- remembered: duplicate is true when nothing was written and position is
-- the original event's.
CREATE FUNCTION streams.publish_once(stream text, data jsonb, idempotency_key text, type text DEFAULT NULL,
                                     key text DEFAULT NULL, headers jsonb DEFAULT NULL,
                                     expected_prev bigint DEFAULT NULL,
                                     OUT "position" bigint, OUT duplicate boolean)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF publish_once.idempotency_key IS NULL THEN
        RAISE EXCEPTION 'streams.publish_once: idempotency_key must not be null'
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Without a key, use streams.publish.';
    END IF;
    "position" := streams.publish(publish_once.stream, publish_once.data, publish_once.type, publish_once.key,
                                  publish_once.headers, publish_once.idempotency_key, publish_once.expected_prev);
    duplicate := streams._last_publish_duplicate();
END
$$;
COMMENT ON FUNCTION streams.publish_once(text, jsonb, text, text, text, jsonb, bigint) IS 'publish with an idempotency key; also says whether the key was remembered (a duplicate: nothing written).';
COMMENT ON FUNCTION streams._last_publish_duplicate() IS 'Internal: whether this session''s last publish found its idempotency key remembered.';

-- streams.publish_batch(stream, data[], type, key, headers, idempotency_key,
--                       expected_prev) -> setof bigint
-- Append one event per array element, positions increasing in array order.
-- The envelope is the batch's (each event gets it), the idempotency key
-- makes the batch idempotent as a whole (a repeat returns the original
-- positions), and expected_prev is checked before the batch's first event.
CREATE FUNCTION streams._publish_batch(stream text, data jsonb[], type text, key text, headers jsonb,
                                       idempotency_key text, expected_prev bigint) RETURNS bigint[]
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'litebase_streams_publish_batch';
COMMENT ON FUNCTION streams._publish_batch(text, jsonb[], text, text, jsonb, text, bigint) IS 'Internal: publish_batch''s positions as an array.';

CREATE FUNCTION streams.publish_batch(stream text, data jsonb[], type text DEFAULT NULL, key text DEFAULT NULL,
                                      headers jsonb DEFAULT NULL, idempotency_key text DEFAULT NULL,
                                      expected_prev bigint DEFAULT NULL) RETURNS SETOF bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.unnest(streams._publish_batch(publish_batch.stream, publish_batch.data, publish_batch.type,
        publish_batch.key, publish_batch.headers, publish_batch.idempotency_key, publish_batch.expected_prev))
$$;
COMMENT ON FUNCTION streams.publish_batch(text, jsonb[], text, text, jsonb, text, bigint) IS 'Append one event per element, in array order, with the batch''s envelope, idempotency key and expected previous position; returns their positions.';

-- Idempotency keys of publishes (src/log/idempotency.rs): one row per
-- (stream, key) with the positions it published, written in the publishing
-- transaction; rows older than litebase_streams.idempotency_window count as
-- forgotten and the worker deletes them. The owner's alone.
CREATE TABLE streams.idempotency_keys (
    stream     text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    positions  bigint[] NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (stream, key)
);
CREATE INDEX idempotency_keys_created_at ON streams.idempotency_keys (created_at);
ALTER TABLE streams.idempotency_keys ENABLE ROW LEVEL SECURITY;
SELECT pg_catalog.pg_extension_config_dump('streams.idempotency_keys', '');
COMMENT ON TABLE streams.idempotency_keys IS 'Idempotency keys of publishes per stream, with the positions they published; forgotten after litebase_streams.idempotency_window.';

-------------------------------------------------------------------------------
-- Filters and wildcards (issue 25): patterns with '*' segments, and replay
-- with types and filter. replay gains two arguments: the old one is
-- dropped, and whoever could execute it may execute the new one.
-------------------------------------------------------------------------------

-- The grantees, kept in a setting of this transaction across the DROP.
SELECT pg_catalog.set_config('litebase_streams_update.replay_grantees',
    coalesce(pg_catalog.string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END, ','), ''),
    true)
FROM pg_catalog.pg_proc p
CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
WHERE p.oid = 'streams.replay(text, bigint, timestamptz, xid8, integer)'::pg_catalog.regprocedure
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;
DROP FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer);

-- streams._replay_until(until bigint) -> bigint
-- until, or the largest bigint for null; 22023 when negative.
CREATE FUNCTION streams._replay_until(until bigint) RETURNS bigint
LANGUAGE c IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', '_replay_until_wrapper';

-- streams.replay(stream, after, since, from_tx, max_events, types, filter, until) -> setof streams.events
-- Final events in position order, at most max_events of them.
--   stream     exact name, a prefix pattern ('payment.*'), a pattern with '*'
--              segments ('order.*.failed': one whole segment each), '*' or
--              null (all streams)
--   after      positions greater than this
--   since      events committed at or after this time
--   from_tx    from that transaction's first event on (the whole timeline, not just its events)
--   none       from the beginning
--   types      only events whose type is one of these (null: every event)
--   filter     only events whose data contains this JSON object (data @> filter)
--   until      positions up to this one, inclusive (a projection rebuilt as of a position)
-- since or from_tx, not both. after goes with either: an event is returned
-- only past both bounds (the later one wins), so a page loop from a time is
-- replay(since => t, after => the last position seen). To page, continue
-- with after => the last position seen.
-- A single SQL query that PostgreSQL inlines into the caller's: with literal
-- arguments the helpers fold to constants and it plans like a hand-written
-- range query on streams.events. The filters are conditions on the rows
-- the caller's row-level security lets through, tested while the
-- (stream, position) index is scanned; 22023 for a bad one.
CREATE FUNCTION streams.replay(
    stream     text        DEFAULT NULL,
    after      bigint      DEFAULT NULL,
    since      timestamptz DEFAULT NULL,
    from_tx    xid8        DEFAULT NULL,
    max_events integer     DEFAULT 1000,
    types      text[]      DEFAULT NULL,
    filter     jsonb       DEFAULT NULL,
    until      bigint      DEFAULT NULL
) RETURNS SETOF streams.events
LANGUAGE sql STABLE AS $$
    SELECT e.*
    FROM streams.events e
    WHERE streams._replay_check(replay.after, replay.since, replay.from_tx)
      -- LS001 when retention removed some of what this asks for.
      AND streams._retained(replay.after, replay.since, replay.from_tx)
      -- after => a position, or nothing: a constant the planner can estimate
      -- with and prune partitions by. With since or from_tx, the later of after
      -- and their start (int8larger is strict: a start that names nothing final
      -- yet returns nothing), as a subquery: run once, and the partitions below
      -- it pruned when the query starts. (As a plain expression the planner
      -- ran the lookup once per partition to estimate with.)
      AND e.position > CASE WHEN replay.since IS NULL AND replay.from_tx IS NULL
                            THEN coalesce(replay.after, 0)
                            ELSE (SELECT pg_catalog.int8larger(coalesce(replay.after, 0),
                                         streams._replay_start(replay.since, replay.from_tx))) END
      AND (streams._stream_exact(replay.stream) IS NULL OR e.stream = streams._stream_exact(replay.stream))
      AND (streams._stream_prefix_low(replay.stream) IS NULL
           OR (e.stream >= streams._stream_prefix_low(replay.stream)
               AND e.stream < streams._stream_prefix_high(replay.stream)))
      AND (streams._stream_wildcard(replay.stream) IS NULL
           OR streams._stream_matches(e.stream, ARRAY[streams._stream_wildcard(replay.stream)]))
      AND (replay.types IS NULL OR e.type = ANY (streams._check_types(replay.types)))
      AND (replay.filter IS NULL OR e.data OPERATOR(pg_catalog.@>) streams._check_filter(replay.filter))
      -- Later commits than `since` only (the start position is the first one).
      AND (replay.since IS NULL OR e."time" >= replay.since)
      -- No until, no clause: the planner would probe every partition's primary
      -- key for its highest position to estimate position <= the largest bigint.
      AND (replay.until IS NULL OR e.position <= streams._replay_until(replay.until))
    ORDER BY e.position
    LIMIT streams._replay_limit(replay.max_events)
$$;

-- streams._transaction_final(tx xid8) -> boolean
-- Whether no event of the transaction is above the horizon. A committed
-- transaction can be final in part, its later positions waiting behind
-- another open transaction's. SECURITY DEFINER: row security hides events
-- that are not final yet (the search is a scan of the log's short
-- non-final end); granted with the 'read' privilege, not to PUBLIC.
CREATE FUNCTION streams._transaction_final(tx xid8) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT NOT EXISTS (
        SELECT FROM streams.event_log l
        WHERE l.tx = _transaction_final.tx AND l.position > streams.horizon())
$$;

-- streams.transaction_events(tx xid8) -> setof streams.events
-- The events of one transaction, in position order (positions of
-- concurrent transactions interleave, so they need not be adjacent): all of
-- them once every one is final, none before. A transaction id used again
-- after a restore into another cluster names its newest transaction, as
-- replay's from_tx does.
CREATE FUNCTION streams.transaction_events(tx xid8) RETURNS SETOF streams.events
LANGUAGE sql STABLE AS $$
    SELECT e.*
    FROM streams.events e
    WHERE e.tx = transaction_events.tx
      -- A subquery: run once (see replay).
      AND e.position > (SELECT streams._replay_start(NULL, transaction_events.tx))
      AND streams._transaction_final(transaction_events.tx)
      AND streams._retained(NULL, NULL, transaction_events.tx)
    ORDER BY e.position
$$;

REVOKE EXECUTE ON FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer, text[], jsonb, bigint) FROM PUBLIC;
DO $regrant_replay$
DECLARE
    grantees text := pg_catalog.current_setting('litebase_streams_update.replay_grantees');
BEGIN
    IF grantees <> '' THEN
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer, text[], jsonb, bigint) TO %s',
            grantees);
    END IF;
END
$regrant_replay$;
GRANT EXECUTE ON FUNCTION streams._stream_wildcard(text), streams._check_types(text[]), streams._check_filter(jsonb),
    streams._replay_until(bigint) TO PUBLIC;
-- transaction_events and its helper go with the 'read' privilege (the regrant below).
REVOKE EXECUTE ON FUNCTION streams.transaction_events(xid8), streams._transaction_final(xid8) FROM PUBLIC;
COMMENT ON FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer, text[], jsonb, bigint) IS 'Final events of the streams a pattern selects (''order.*.failed'': one segment per *), in position order, from a position, time or transaction (after with since or from_tx: the later bound wins), up to a position (until); types and filter (data @> filter) keep only the matching ones.';
COMMENT ON FUNCTION streams.transaction_events(xid8) IS 'The events of one transaction, in position order: all of them once every one is final, none before.';
COMMENT ON FUNCTION streams._transaction_final(xid8) IS 'Internal: whether every event of a transaction is final.';
COMMENT ON FUNCTION streams._replay_until(bigint) IS 'Internal: replay''s until, checked (22023 when negative; null: no end).';
COMMENT ON FUNCTION streams._stream_wildcard(text) IS 'Internal: the pattern when it has a * segment before its end.';
COMMENT ON FUNCTION streams._check_types(text[]) IS 'Internal: a types argument, checked (22023).';
COMMENT ON FUNCTION streams._check_filter(jsonb) IS 'Internal: a filter argument, checked: a JSON object of at most 4 kB (22023).';
COMMENT ON FUNCTION streams._stream_prefix_low(text) IS 'Internal: the lowest name a prefix pattern (or a wildcard pattern''s literal prefix) selects.';
COMMENT ON FUNCTION streams._stream_prefix_high(text) IS 'Internal: the smallest name above every name a prefix pattern (or a wildcard pattern''s literal prefix) selects.';

-------------------------------------------------------------------------------
-- One JSON form of an event (issue 29): streams.to_json, the text of its
-- notification without prev; it goes with the 'read' privilege (the
-- regrant below). replay takes after with since or from_tx (the later
-- bound wins; replay above, its check here).
-------------------------------------------------------------------------------

-- streams._event_json(position, stream, time, tx, type, key, headers, data) -> json
-- The canonical JSON text of an event from its fields (data and headers
-- as jsonb prints them, tx as a number); to_json's half in Rust.
CREATE FUNCTION streams._event_json("position" bigint, stream text, "time" timestamptz, tx bigint, type text,
                                    key text, headers text, data text) RETURNS json
LANGUAGE c IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', '_event_json_wrapper';

-- streams.to_json(e streams.events) -> json
-- An event (a row of streams.events, replay or get) in its canonical JSON
-- form, the one every path hands out: position, stream, time (RFC 3339,
-- UTC, microseconds, Z), tx (a number), then type, key and headers when
-- set, then data; the text of its notification without prev. json, not
-- jsonb, so the text stays as written (key order, 49.00).
--   SELECT streams.to_json(e) FROM streams.replay('orders', after => 0) e;
CREATE FUNCTION streams.to_json(e streams.events) RETURNS json
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    -- Types qualified: the body is parsed with the caller's search_path.
    SELECT streams._event_json(e."position", e.stream, e."time", e.tx::pg_catalog.text::pg_catalog.int8, e.type,
                               e.key, e.headers::pg_catalog.text, e.data::pg_catalog.text)
$$;
REVOKE EXECUTE ON FUNCTION streams.to_json(streams.events) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION streams._event_json(bigint, text, timestamptz, bigint, text, text, text, text) TO PUBLIC;
COMMENT ON FUNCTION streams.to_json(streams.events) IS 'An event in its canonical JSON form: its notification''s text without prev (data always present).';
COMMENT ON FUNCTION streams._event_json(bigint, text, timestamptz, bigint, text, text, text, text) IS 'Internal: the canonical JSON text of an event from its fields.';

-- streams._replay_check(after, since, from_tx) -> boolean
-- True, or 22023 when both since and from_tx are given (after goes with
-- either: the later bound wins). IMMUTABLE: with literal arguments it runs
-- once, at plan time.
CREATE OR REPLACE FUNCTION streams._replay_check(after bigint, since timestamptz, from_tx xid8) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    -- Qualified: num_nonnulls is VARIADIC "any", so an exact-type function in
    -- the caller's search_path would otherwise win.
    IF pg_catalog.num_nonnulls(since, from_tx) OPERATOR(pg_catalog.>) 1 THEN
        RAISE EXCEPTION 'streams.replay: give since or from_tx, not both'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'since => a time or from_tx => a transaction id; after => a position goes with either.';
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION streams._replay_check(bigint, timestamptz, xid8) IS 'Internal: since or from_tx, not both (after goes with either).';

-- streams._sql_privileges(privilege text, grant_it boolean, role regrole) -> void
-- Grants (grant_it) or revokes the SQL privileges a stream privilege takes:
-- the one list of them, for streams.grant and streams.revoke.
CREATE OR REPLACE FUNCTION streams._sql_privileges(privilege text, grant_it boolean, role regrole) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    objects text[] := CASE privilege
        WHEN 'read' THEN ARRAY[
            'SELECT ON streams.events, streams.event_log, streams.commit_times, streams.horizon_state',
            'EXECUTE ON FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer, text[], jsonb, bigint), streams.get(bigint),
                 streams.horizon(), streams.wait(bigint, interval), streams.worker_pid(), streams.log_id(),
                 streams._replay_start(timestamptz, xid8), streams.stream_head(text),
                 streams.transaction_events(xid8), streams._transaction_final(xid8),
                 streams.to_json(streams.events)']
        WHEN 'redact' THEN ARRAY[
            'SELECT ON streams.redactions',
            'EXECUTE ON FUNCTION streams.redact(bigint, text), streams.redact_matching(text, text, jsonb, text)']
        ELSE ARRAY[
            'EXECUTE ON FUNCTION streams.publish(text, jsonb, text, text, jsonb, text, bigint),
                 streams.publish_once(text, jsonb, text, text, text, jsonb, bigint),
                 streams.publish_batch(text, jsonb[], text, text, jsonb, text, bigint),
                 streams._publish_batch(text, jsonb[], text, text, jsonb, text, bigint)']
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

REVOKE EXECUTE ON FUNCTION streams.stream_head(text),
    streams.publish(text, jsonb, text, text, jsonb, text, bigint),
    streams.publish_once(text, jsonb, text, text, text, jsonb, bigint),
    streams.publish_batch(text, jsonb[], text, text, jsonb, text, bigint),
    streams._publish_batch(text, jsonb[], text, text, jsonb, text, bigint) FROM PUBLIC;
REVOKE ALL ON streams.idempotency_keys FROM PUBLIC;
GRANT EXECUTE ON FUNCTION streams._last_publish_duplicate() TO PUBLIC;
-- The roles granted 'read' or 'publish' get the new functions.
DO $regrant$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT g.privilege, g.grantee FROM streams.stream_grants g LOOP
        PERFORM streams._sql_privileges(r.privilege, true, r.grantee);
    END LOOP;
END
$regrant$;

-------------------------------------------------------------------------------
-- Webhooks with filters (issue 25): create_webhook gains types and filter,
-- kept in the webhook's subscription row like a subscription's. The old
-- function is dropped, and whoever could execute it may execute the new one.
-------------------------------------------------------------------------------

SELECT pg_catalog.set_config('litebase_streams_update.webhook_grantees',
    coalesce(pg_catalog.string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END, ','), ''),
    true)
FROM pg_catalog.pg_proc p
CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
WHERE p.oid = 'streams.create_webhook(text, text, text, bigint, text, integer)'::pg_catalog.regprocedure
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;
DROP FUNCTION streams.create_webhook(text, text, text, bigint, text, integer);

CREATE FUNCTION streams.create_webhook(
    name   text,
    stream text,
    url    text,
    after  bigint  DEFAULT NULL,
    secret text    DEFAULT NULL,
    batch  integer DEFAULT 1,
    types  text[]  DEFAULT NULL,
    filter jsonb   DEFAULT NULL
) RETURNS text
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_create_filtered_webhook_wrapper';
REVOKE EXECUTE ON FUNCTION streams.create_webhook(text, text, text, bigint, text, integer, text[], jsonb) FROM PUBLIC;
DO $regrant_webhook$
DECLARE
    grantees text := pg_catalog.current_setting('litebase_streams_update.webhook_grantees');
BEGIN
    IF grantees <> '' THEN
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION streams.create_webhook(text, text, text, bigint, text, integer, text[], jsonb) TO %s',
            grantees);
    END IF;
END
$regrant_webhook$;
COMMENT ON FUNCTION streams.create_webhook(text, text, text, bigint, text, integer, text[], jsonb) IS 'POST every event of a stream (or a pattern: ''prefix.*'', ''order.*.failed'', ''*'') to an http(s) URL, signed; types and filter (data @> filter) keep only the matching events; returns the signing secret.';

-- streams.webhooks shows the filters (from streams.subscriptions, replaced above).
CREATE OR REPLACE VIEW streams.webhooks WITH (security_barrier) AS
SELECT sub.name, sub.stream, w.url,
       CASE WHEN w.disabled_at IS NOT NULL THEN 'disabled'
            WHEN w.paused THEN 'paused'
            WHEN w.attempts > 0 THEN 'retrying'
            ELSE 'active' END AS state,
       sub.position, sub.pending, w.attempts, w.last_status, w.last_error, w.next_attempt_at, sub.lag_time,
       w.batch, sub.owner, w.disabled_at, w.last_attempt_at, w.last_success_at, sub.created_at,
       sub.types, sub.filter
FROM streams.subscriptions sub
JOIN streams.subscription_state s ON s.name = sub.name AND s.owner = sub.owner
JOIN streams.webhook_state w ON w.subscription = s.id;

-- Table capture and the snapshot handoff (sql/capture.sql, as a fresh install has them).
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
REVOKE EXECUTE ON FUNCTION streams._capture(), streams._capture_guard() FROM PUBLIC;
GRANT SELECT ON streams.captures TO PUBLIC;
GRANT EXECUTE ON FUNCTION streams.capture(regclass, text, text[]), streams.uncapture(regclass),
    streams._capture_args(bytea), streams.snapshot(text) TO PUBLIC;

-------------------------------------------------------------------------------
-- Redaction (issue 27, point 4): a 'redact' stream privilege, streams.redact,
-- streams.redact_matching and the streams.redactions record; the
-- immutability trigger becomes C so that it can tell a redaction's UPDATE.
-------------------------------------------------------------------------------

ALTER TABLE streams.stream_grants DROP CONSTRAINT stream_grants_privilege_check,
    ADD CONSTRAINT stream_grants_privilege_check CHECK (privilege IN ('read', 'publish', 'redact'));

CREATE OR REPLACE FUNCTION streams._check_grant(privilege text, stream text, role regrole) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF privilege IS NULL OR stream IS NULL OR role IS NULL THEN
        RAISE EXCEPTION 'streams.grant/revoke: privilege, stream and role must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF privilege NOT IN ('read', 'publish', 'redact') THEN
        RAISE EXCEPTION 'unknown stream privilege "%"', privilege
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''read'', ''publish'' or ''redact''.';
    END IF;
    PERFORM streams._stream_exact(stream);  -- raises 22023 for a malformed name or pattern
END
$$;

CREATE OR REPLACE FUNCTION streams._refuse_change() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'litebase_streams_refuse_change';
COMMENT ON FUNCTION streams._refuse_change() IS 'Trigger: refuses UPDATE, DELETE and TRUNCATE of stored events (but a redaction''s UPDATE).';

-- streams._may_redact(stream text) -> boolean
-- Whether the current user holds a 'redact' grant covering `stream` (null:
-- any stream), as a member of the grantee. No bypass for superusers or the
-- extension's owner: the grant is the record of who may erase.
CREATE FUNCTION streams._may_redact(stream text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE member_of(role) AS (
        SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user
        UNION
        SELECT m.roleid FROM pg_catalog.pg_auth_members m JOIN member_of ON m.member = member_of.role
    )
    SELECT EXISTS (SELECT FROM streams.stream_grants g
                   WHERE g.privilege = 'redact'
                     AND g.grantee::pg_catalog.oid IN (SELECT role FROM member_of)
                     AND (_may_redact.stream IS NULL
                          OR streams._stream_matches(_may_redact.stream, ARRAY[g.stream::text])))
$$;
COMMENT ON FUNCTION streams._may_redact(text) IS 'Internal: whether the current user holds a redact grant covering the stream (null: any).';

-- One row per redacted event: readable by the roles that may redact its stream.
CREATE TABLE streams.redactions (
    "position"  bigint PRIMARY KEY,
    stream      text COLLATE "C" NOT NULL,
    redacted_by regrole NOT NULL,
    redacted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    reason      text NOT NULL
);
ALTER TABLE streams.redactions ENABLE ROW LEVEL SECURITY;
CREATE POLICY redactors ON streams.redactions FOR SELECT USING (streams._may_redact(stream));
SELECT pg_catalog.pg_extension_config_dump('streams.redactions', '');
COMMENT ON TABLE streams.redactions IS 'Every redaction: the event''s position and stream, who redacted it, when and why. Readable by the roles granted redact on the stream.';

-- streams.redact(position bigint, reason text) -> boolean
CREATE FUNCTION streams.redact("position" bigint, reason text) RETURNS boolean
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'redact_wrapper';
COMMENT ON FUNCTION streams.redact(bigint, text) IS 'Replace the data of the final event at position with {"redacted": true} (headers with null; position, stream, time, tx, type and key stay) and record it in streams.redactions; false when it was redacted already. Needs the redact grant on the event''s stream.';

-- streams.redact_matching(stream text, reason text, filter jsonb DEFAULT NULL, key text DEFAULT NULL) -> bigint
CREATE FUNCTION streams.redact_matching(stream text, reason text, filter jsonb DEFAULT NULL, key text DEFAULT NULL)
RETURNS bigint
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'redact_matching_wrapper';
COMMENT ON FUNCTION streams.redact_matching(text, text, jsonb, text) IS 'Redact every final event of the stream whose data contains filter and whose key is key (at least one of them; filter => ''{}'' selects all); returns how many. Needs the redact grant on the stream.';
REVOKE EXECUTE ON FUNCTION streams.redact(bigint, text), streams.redact_matching(text, text, jsonb, text) FROM PUBLIC;
REVOKE ALL ON streams.redactions FROM PUBLIC;
GRANT EXECUTE ON FUNCTION streams._may_redact(text) TO PUBLIC;

-------------------------------------------------------------------------------
-- 7. Metrics (issue 30): events per stream counted by the worker
-- (counted_through starts at 0: the worker counts the events already in the
-- log, in short steps), streams.streams, streams.metrics().
-------------------------------------------------------------------------------

-- streams._worker_counters() -> table (src/delivery/status.rs)
CREATE FUNCTION streams."_worker_counters"() RETURNS TABLE (
	"worker_starts" bigint,
	"notification_failures" bigint,
	"notify_reason" TEXT
)
STRICT VOLATILE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '_worker_counters_wrapper';

COMMENT ON FUNCTION streams._worker_counters() IS 'Internal: worker starts, notification failures and why notifications fail, from shared memory (streams.metrics reads them).';

-- The final events of each stream up to stream_stats_state.counted_through.
-- The database's worker adds the events above it about every second
-- (src/delivery/stream_stats.rs), in short steps, each in the transaction
-- that moves counted_through: every event is counted once, also across
-- crashes and restarts. Derived from the log, so neither table is dumped: a
-- restored log is counted again from 0. The owner's alone (row-level
-- security, no policy: not even pg_read_all_data reads them); readers see
-- their streams in streams.streams.
CREATE TABLE streams.stream_stats (
    stream         text COLLATE "C" PRIMARY KEY,
    events         bigint NOT NULL,
    first_position bigint NOT NULL,
    last_position  bigint NOT NULL,
    last_time      timestamptz
);
-- streams.metrics() names the streams with the lowest first positions: it
-- reads just those through this index, however many streams there are.
CREATE INDEX stream_stats_first_position ON streams.stream_stats (first_position, stream);
ALTER TABLE streams.stream_stats ENABLE ROW LEVEL SECURITY;
COMMENT ON TABLE streams.stream_stats IS 'Final events per stream up to stream_stats_state.counted_through, counted by the worker (read streams.streams instead).';
COMMENT ON COLUMN streams.stream_stats.events IS 'How many final events the stream has (up to counted_through).';
COMMENT ON COLUMN streams.stream_stats.first_position IS 'The position of the stream''s first event.';
COMMENT ON COLUMN streams.stream_stats.last_position IS 'The position of the stream''s newest counted event.';
COMMENT ON COLUMN streams.stream_stats.last_time IS 'The commit time of the stream''s newest counted event.';

-- One row: every final event at or below counted_through is in stream_stats,
-- and events is their sum over all streams (moved by the worker in the same
-- statement as the per-stream totals), so that streams.metrics() gets the
-- total without reading every stream's row.
CREATE TABLE streams.stream_stats_state (
    counted_through bigint NOT NULL,
    events          bigint NOT NULL
);
INSERT INTO streams.stream_stats_state (counted_through, events) VALUES (0, 0);
ALTER TABLE streams.stream_stats_state ENABLE ROW LEVEL SECURITY;
COMMENT ON TABLE streams.stream_stats_state IS 'One row: the position up to which streams.stream_stats has counted the events.';
COMMENT ON COLUMN streams.stream_stats_state.counted_through IS 'Every final event at or below this position is counted in streams.stream_stats.';
COMMENT ON COLUMN streams.stream_stats_state.events IS 'The events counted in streams.stream_stats, summed over all streams.';

-- streams.streams: one row per stream the caller may read (the predicate of
-- the log's `readable` policy), with its number of events, first and last
-- position and the commit time of its newest event, as of the worker's last
-- count (up to about a second behind streams.events). The view reads the
-- table as its owner; the privilege test runs as the caller, before any
-- condition of the caller's (security_barrier).
CREATE VIEW streams.streams WITH (security_barrier) AS
SELECT s.stream::text AS stream, s.events, s.first_position, s.last_position, s.last_time
FROM streams.stream_stats s
WHERE (SELECT streams._reads_all()) OR streams._stream_matches(s.stream, (SELECT streams._read_patterns()));
COMMENT ON VIEW streams.streams IS 'The streams the caller may read: events, first and last position, newest commit time (as of the worker''s last count, about a second behind).';

-- streams.metrics(max_streams, max_subscriptions) -> table of (metric, type, help, labels, value)
-- The database side's numbers as Prometheus samples: metric name, type
-- ('gauge' or 'counter'), help text, labels (always "database") and value,
-- grouped by metric. The label sets are bounded whatever users create:
-- events_total names the max_streams streams with the lowest first
-- position (a stable set, so each counter only grows) and sums the others
-- into stream="(other)" and the private streams (streams.private_streams)
-- into stream="(private)"; subscriptions and webhooks name the
-- max_subscriptions with the lowest ids and sum the others into
-- "(other)" (claimed, retrying, parked; webhooks: states, failures and
-- next retry as maxima). Pending and lag are reported for the named
-- subscriptions and webhooks only, "(other)" has no pending and no lag
-- row: counting them would read the backlog of every subscription anyone
-- created. A subscription's pending events are counted up to 1,000
-- (1,000: at least that many; its lag in seconds says how far behind it
-- is), so that one call stays cheap however far behind the consumers are;
-- one stream's events are read through its index. The work of one call
-- is bounded by the bounds, not by how many streams or subscriptions
-- exist: the named streams are read through stream_stats'
-- first_position index, the private ones through streams.private_streams
-- (names by key, patterns by their prefix range), and "(other)" is the
-- total of stream_stats_state minus both.
-- Webhook URLs never appear (they may hold credentials). SECURITY
-- DEFINER: it reads the internal tables; executable by pg_monitor only
-- (22023 for a bound outside 0 to 10,000). jit off: compiling the query's
-- expressions took seconds, running it takes milliseconds.
CREATE FUNCTION streams.metrics(max_streams integer DEFAULT 100, max_subscriptions integer DEFAULT 100)
RETURNS TABLE (metric text, type text, help text, labels jsonb, value double precision)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
#variable_conflict use_column
BEGIN
    IF max_streams IS NULL OR max_streams NOT BETWEEN 0 AND 10000
       OR max_subscriptions IS NULL OR max_subscriptions NOT BETWEEN 0 AND 10000 THEN
        RAISE EXCEPTION 'streams.metrics: max_streams and max_subscriptions must be between 0 and 10000'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'They bound the label sets: the streams and subscriptions beyond them are summed into "(other)".';
    END IF;
    RETURN QUERY
    WITH families (ord, metric, type, help) AS (VALUES
        (1, 'litebase_streams_horizon', 'gauge', 'The horizon: every event at or below this position is final.'),
        (2, 'litebase_streams_newest_position', 'gauge', 'The newest allocated position, final or not.'),
        (3, 'litebase_streams_horizon_lag_positions', 'gauge', 'Positions allocated above the horizon (newest_position - horizon).'),
        (4, 'litebase_streams_horizon_holder_age_seconds', 'gauge', 'Age of the open publishing transaction holding the horizon back (0: none).'),
        (5, 'litebase_streams_delivery_lag_positions', 'gauge', 'Positions allocated above the last one the worker notified.'),
        (6, 'litebase_streams_worker_up', 'gauge', 'Whether the database''s worker runs (1) or not (0).'),
        (7, 'litebase_streams_worker_state', 'gauge', 'The worker''s state (label state), value 1.'),
        (8, 'litebase_streams_worker_starts_total', 'counter', 'Workers started for the database since the server started (restarts: this minus 1).'),
        (9, 'litebase_streams_worker_rounds_total', 'counter', 'Delivery rounds the worker ran.'),
        (10, 'litebase_streams_notifications_failing', 'gauge', 'Whether sending notifications fails now (1) or not (0); label reason: ok, queue_full or failing.'),
        (11, 'litebase_streams_notification_failures_total', 'counter', 'Failed attempts of the worker to send notifications.'),
        (12, 'litebase_streams_events_total', 'counter', 'Final events per stream (up to about a second behind); stream="(other)": the streams beyond max_streams, "(private)": private streams.'),
        (13, 'litebase_streams_subscription_pending', 'gauge', 'Final events the subscription has not processed (counted up to 1000; none for "(other)").'),
        (14, 'litebase_streams_subscription_lag_seconds', 'gauge', 'Age of the subscription''s oldest unprocessed event (0: none; none for "(other)").'),
        (15, 'litebase_streams_subscription_claimed', 'gauge', 'Events of the subscription claimed by open transactions or leases.'),
        (16, 'litebase_streams_subscription_retrying', 'gauge', 'Events of the subscription that failed and wait to be delivered again.'),
        (17, 'litebase_streams_subscription_parked', 'gauge', 'Dead letters of the subscription (parked events).'),
        (18, 'litebase_streams_webhook_state', 'gauge', 'The webhook''s state: 1 for the current one of active, retrying, paused, disabled, 0 for the others.'),
        (19, 'litebase_streams_webhook_consecutive_failures', 'gauge', 'Failed attempts of the webhook''s pending request (0 after a success).'),
        (20, 'litebase_streams_webhook_next_retry_seconds', 'gauge', 'Seconds until the webhook''s next attempt (0: none pending, or due).'),
        (21, 'litebase_streams_webhook_pending', 'gauge', 'Final events the webhook has not delivered (counted up to 1000; none for "(other)").')
    ),
    w AS MATERIALIZED (SELECT * FROM streams._worker_status()),
    c AS MATERIALIZED (SELECT * FROM streams._worker_counters()),
    persisted AS MATERIALIZED (
        SELECT h.horizon, coalesce(h.delivered, h.horizon) AS delivered
        FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1
    ),
    p AS MATERIALIZED (
        SELECT coalesce((SELECT x.horizon FROM persisted x), 0) AS horizon,
               coalesce(w.delivered_position, (SELECT x.delivered FROM persisted x), 0) AS delivered,
               w.newest_position AS newest, w.worker_pid, w.worker_state, w.rounds,
               coalesce(EXTRACT(epoch FROM pg_catalog.now() - a.xact_start)::double precision, 0) AS holder_age
        FROM w LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = w.holder_pid
    ),
    -- The private streams' totals, one pattern of streams.private_streams at
    -- a time: an exact name by the key, a pattern by its prefix range (a
    -- stream two patterns select once).
    private_rows AS MATERIALIZED (
        SELECT DISTINCT m.stream, m.events
        FROM streams.private_streams ps
        CROSS JOIN LATERAL (
            (SELECT st.stream, st.events FROM streams.stream_stats st
             WHERE streams._stream_exact(ps.stream) IS NOT NULL AND st.stream = streams._stream_exact(ps.stream))
            UNION ALL
            (SELECT st.stream, st.events FROM streams.stream_stats st
             WHERE streams._stream_exact(ps.stream) IS NULL
               AND (streams._stream_prefix_low(ps.stream) IS NULL
                    OR (st.stream >= streams._stream_prefix_low(ps.stream)
                        AND (streams._stream_prefix_high(ps.stream) IS NULL OR st.stream < streams._stream_prefix_high(ps.stream))))
               AND streams._stream_matches(st.stream, ARRAY[ps.stream::text]))
        ) m
    ),
    -- The named streams: the first max_streams that are not private, in
    -- first_position order. They are among the first max_streams + (private
    -- ones) rows of the index, so it is read that far and no further.
    named_streams AS MATERIALIZED (
        SELECT x.stream::text AS stream, x.events
        FROM (SELECT st.stream, st.events, st.first_position FROM streams.stream_stats st
              ORDER BY st.first_position, st.stream
              LIMIT max_streams + (SELECT pg_catalog.count(*) FROM private_rows)) x
        WHERE NOT EXISTS (SELECT FROM private_rows pr WHERE pr.stream = x.stream)
        ORDER BY x.first_position, x.stream
        LIMIT max_streams
    ),
    stream_totals AS MATERIALIZED (
        SELECT coalesce((SELECT ss.events FROM streams.stream_stats_state ss LIMIT 1), 0) AS total,
               coalesce((SELECT pg_catalog.sum(pr.events) FROM private_rows pr), 0) AS private,
               coalesce((SELECT pg_catalog.sum(ns.events) FROM named_streams ns), 0) AS named
    ),
    stream_rows AS (
        SELECT ns.stream, ns.events::numeric AS events FROM named_streams ns
        UNION ALL SELECT '(other)', GREATEST(t.total - t.named - t.private, 0) FROM stream_totals t
        UNION ALL SELECT '(private)', t.private FROM stream_totals t
    ),
    -- Which subscriptions get their own labels: the max_subscriptions with
    -- the lowest ids, and of the webhooks the max_subscriptions with the
    -- lowest ids. Only these have their pending events counted.
    ranked AS MATERIALIZED (
        SELECT s.id,
               pg_catalog.row_number() OVER (ORDER BY s.id) <= max_subscriptions AS named,
               wh.subscription IS NOT NULL AND pg_catalog.row_number() OVER (PARTITION BY wh.subscription IS NULL ORDER BY s.id) <= max_subscriptions AS hook_named
        FROM streams.subscription_state s
        LEFT JOIN streams.webhook_state wh ON wh.subscription = s.id
    ),
    subs AS MATERIALIZED (
        SELECT s.id, s.name::text AS name, s.owner::text AS owner,
               r.named, r.hook_named,
               coalesce(pending.count, 0) AS pending,
               coalesce(EXTRACT(epoch FROM pg_catalog.now() - first_pending.committed_at)::double precision, 0) AS lag,
               coalesce(claims.claimed, 0) AS claimed,
               coalesce(failures.retrying, 0) AS retrying,
               coalesce(failures.parked, 0) AS parked
        FROM streams.subscription_state s
        JOIN ranked r ON r.id = s.id
        CROSS JOIN p
        -- Whether its progress rows (unordered subscriptions) need looking at for each event.
        CROSS JOIN LATERAL (
            SELECT (r.named OR r.hook_named)
                   AND EXISTS (SELECT FROM streams.subscription_progress pr WHERE pr.subscription = s.id) AS has_progress
        ) progressed
        -- The first pending event and the pending ones as streams.subscriptions
        -- finds them, but one stream's events through its index (the view's
        -- one condition for all patterns reads the log in position order).
        LEFT JOIN LATERAL (
            SELECT f.position,
                   (SELECT ct.times[f.position - ct.first_position + 1] FROM streams.commit_times ct
                    WHERE ct.first_position <= f.position ORDER BY ct.first_position DESC LIMIT 1) AS committed_at
            FROM ((SELECT e.position FROM streams.event_log e
                   WHERE (r.named OR r.hook_named)
                     AND streams._stream_exact(s.stream) IS NOT NULL AND e.stream = streams._stream_exact(s.stream)
                     AND e.position > s.position AND e.position <= p.horizon
                     AND (s.types IS NULL OR e.type = ANY (s.types))
                     AND (s.filter IS NULL OR e.data OPERATOR(pg_catalog.@>) s.filter)
                     AND (NOT progressed.has_progress OR NOT EXISTS (SELECT FROM streams.subscription_progress pr
                                     WHERE pr.subscription = s.id AND pr.chunk = streams._chunk(e.position) AND pr.done_through >= e.position))
                     AND (s.key_path IS NULL OR NOT EXISTS (SELECT FROM streams.subscription_keys k
                                     WHERE s.key_path IS NOT NULL AND k.subscription = s.id
                                          AND k.key = streams._event_key(s.key_path, e.stream, e.data, e.key) AND k.position >= e.position))
                   ORDER BY e.position LIMIT 1)
                  UNION ALL
                  (SELECT e.position FROM streams.event_log e
                   WHERE (r.named OR r.hook_named)
                     AND streams._stream_exact(s.stream) IS NULL
                     AND e.position > s.position AND e.position <= p.horizon
                     AND (streams._stream_prefix_low(s.stream) IS NULL
                          OR (e.stream >= streams._stream_prefix_low(s.stream) AND e.stream < streams._stream_prefix_high(s.stream)))
                     AND (streams._stream_wildcard(s.stream) IS NULL
                          OR streams._stream_matches(e.stream, ARRAY[streams._stream_wildcard(s.stream)]))
                     AND (s.types IS NULL OR e.type = ANY (s.types))
                     AND (s.filter IS NULL OR e.data OPERATOR(pg_catalog.@>) s.filter)
                     AND (NOT progressed.has_progress OR NOT EXISTS (SELECT FROM streams.subscription_progress pr
                                     WHERE pr.subscription = s.id AND pr.chunk = streams._chunk(e.position) AND pr.done_through >= e.position))
                     AND (s.key_path IS NULL OR NOT EXISTS (SELECT FROM streams.subscription_keys k
                                     WHERE s.key_path IS NOT NULL AND k.subscription = s.id
                                          AND k.key = streams._event_key(s.key_path, e.stream, e.data, e.key) AND k.position >= e.position))
                   ORDER BY e.position LIMIT 1)) f
        ) first_pending ON true
        LEFT JOIN LATERAL (
            SELECT pg_catalog.count(*) AS count FROM (
                (SELECT FROM streams.event_log e
                 WHERE (r.named OR r.hook_named)
                   AND streams._stream_exact(s.stream) IS NOT NULL AND e.stream = streams._stream_exact(s.stream)
                   AND e.position >= first_pending.position AND e.position <= p.horizon
                   AND (s.types IS NULL OR e.type = ANY (s.types))
                   AND (s.filter IS NULL OR e.data OPERATOR(pg_catalog.@>) s.filter)
                   AND (NOT progressed.has_progress OR NOT EXISTS (SELECT FROM streams.subscription_progress pr
                                   WHERE pr.subscription = s.id AND pr.chunk = streams._chunk(e.position) AND pr.done_through >= e.position))
                   AND (s.key_path IS NULL OR NOT EXISTS (SELECT FROM streams.subscription_keys k
                                   WHERE s.key_path IS NOT NULL AND k.subscription = s.id
                                      AND k.key = streams._event_key(s.key_path, e.stream, e.data, e.key) AND k.position >= e.position))
                 LIMIT 1000)
                UNION ALL
                (SELECT FROM streams.event_log e
                 WHERE (r.named OR r.hook_named)
                   AND streams._stream_exact(s.stream) IS NULL
                   AND e.position >= first_pending.position AND e.position <= p.horizon
                   AND (streams._stream_prefix_low(s.stream) IS NULL
                        OR (e.stream >= streams._stream_prefix_low(s.stream) AND e.stream < streams._stream_prefix_high(s.stream)))
                   AND (streams._stream_wildcard(s.stream) IS NULL
                        OR streams._stream_matches(e.stream, ARRAY[streams._stream_wildcard(s.stream)]))
                   AND (s.types IS NULL OR e.type = ANY (s.types))
                   AND (s.filter IS NULL OR e.data OPERATOR(pg_catalog.@>) s.filter)
                   AND (NOT progressed.has_progress OR NOT EXISTS (SELECT FROM streams.subscription_progress pr
                                   WHERE pr.subscription = s.id AND pr.chunk = streams._chunk(e.position) AND pr.done_through >= e.position))
                   AND (s.key_path IS NULL OR NOT EXISTS (SELECT FROM streams.subscription_keys k
                                   WHERE s.key_path IS NOT NULL AND k.subscription = s.id
                                      AND k.key = streams._event_key(s.key_path, e.stream, e.data, e.key) AND k.position >= e.position))
                 LIMIT 1000)
            ) counted
        ) pending ON true
        LEFT JOIN (
            SELECT cl.subscription, pg_catalog.sum(cl.claimed)::bigint AS claimed
            FROM streams._claims() cl GROUP BY cl.subscription
        ) claims ON claims.subscription = s.id
        LEFT JOIN LATERAL (
            SELECT pg_catalog.count(*) FILTER (WHERE f.parked_at IS NULL) AS retrying,
                   pg_catalog.count(*) FILTER (WHERE f.parked_at IS NOT NULL) AS parked
            FROM streams.subscription_failures f WHERE f.subscription = s.id AND NOT f.discarded
        ) failures ON true
    ),
    sub_rows AS (
        SELECT s.named, pg_catalog.jsonb_build_object('subscription', CASE WHEN s.named THEN pg_catalog.min(s.name) ELSE '(other)' END,
                                             'owner', CASE WHEN s.named THEN pg_catalog.min(s.owner) ELSE '(other)' END) AS labels,
               pg_catalog.sum(s.pending) AS pending, pg_catalog.max(s.lag) AS lag, pg_catalog.sum(s.claimed) AS claimed,
               pg_catalog.sum(s.retrying) AS retrying, pg_catalog.sum(s.parked) AS parked
        FROM subs s
        GROUP BY s.named, CASE WHEN s.named THEN s.id END
    ),
    hooks AS (
        SELECT s.id, s.name, s.owner, s.pending, wh.attempts, s.hook_named AS named,
               CASE WHEN wh.disabled_at IS NOT NULL THEN 'disabled'
                    WHEN wh.paused THEN 'paused'
                    WHEN wh.attempts > 0 THEN 'retrying'
                    ELSE 'active' END AS state,
               GREATEST(coalesce(EXTRACT(epoch FROM wh.next_attempt_at - pg_catalog.now())::double precision, 0), 0) AS next_retry
        FROM subs s JOIN streams.webhook_state wh ON wh.subscription = s.id
    ),
    hook_rows AS (
        SELECT h.named, pg_catalog.jsonb_build_object('webhook', CASE WHEN h.named THEN pg_catalog.min(h.name) ELSE '(other)' END,
                                             'owner', CASE WHEN h.named THEN pg_catalog.min(h.owner) ELSE '(other)' END) AS labels,
               pg_catalog.count(*) FILTER (WHERE h.state = 'active') AS active,
               pg_catalog.count(*) FILTER (WHERE h.state = 'retrying') AS retrying,
               pg_catalog.count(*) FILTER (WHERE h.state = 'paused') AS paused,
               pg_catalog.count(*) FILTER (WHERE h.state = 'disabled') AS disabled,
               pg_catalog.max(h.attempts) AS failures, pg_catalog.max(h.next_retry) AS next_retry,
               pg_catalog.sum(h.pending) AS pending
        FROM hooks h
        GROUP BY h.named, CASE WHEN h.named THEN h.id END
    ),
    samples (metric, labels, value) AS (
        SELECT 'litebase_streams_horizon', '{}'::jsonb, p.horizon::double precision FROM p
        UNION ALL SELECT 'litebase_streams_newest_position', '{}'::jsonb, p.newest::double precision FROM p
        UNION ALL SELECT 'litebase_streams_horizon_lag_positions', '{}'::jsonb, GREATEST(p.newest - p.horizon, 0)::double precision FROM p
        UNION ALL SELECT 'litebase_streams_horizon_holder_age_seconds', '{}'::jsonb, p.holder_age FROM p
        UNION ALL SELECT 'litebase_streams_delivery_lag_positions', '{}'::jsonb, GREATEST(p.newest - p.delivered, 0)::double precision FROM p
        UNION ALL SELECT 'litebase_streams_worker_up', '{}'::jsonb, CASE WHEN p.worker_pid IS NULL THEN 0 ELSE 1 END::double precision FROM p
        UNION ALL SELECT 'litebase_streams_worker_state', pg_catalog.jsonb_build_object('state', p.worker_state), 1::double precision FROM p
        UNION ALL SELECT 'litebase_streams_worker_starts_total', '{}'::jsonb, c.worker_starts::double precision FROM c
        UNION ALL SELECT 'litebase_streams_worker_rounds_total', '{}'::jsonb, coalesce(p.rounds, 0)::double precision FROM p
        UNION ALL SELECT 'litebase_streams_notifications_failing', pg_catalog.jsonb_build_object('reason', c.notify_reason),
                         CASE WHEN c.notify_reason = 'ok' THEN 0 ELSE 1 END::double precision FROM c
        UNION ALL SELECT 'litebase_streams_notification_failures_total', '{}'::jsonb, c.notification_failures::double precision FROM c
        UNION ALL SELECT 'litebase_streams_events_total', pg_catalog.jsonb_build_object('stream', sr.stream), sr.events::double precision
                  FROM stream_rows sr
        UNION ALL SELECT 'litebase_streams_subscription_pending', s.labels, s.pending::double precision FROM sub_rows s WHERE s.named
        UNION ALL SELECT 'litebase_streams_subscription_lag_seconds', s.labels, s.lag FROM sub_rows s WHERE s.named
        UNION ALL SELECT 'litebase_streams_subscription_claimed', s.labels, s.claimed::double precision FROM sub_rows s
        UNION ALL SELECT 'litebase_streams_subscription_retrying', s.labels, s.retrying::double precision FROM sub_rows s
        UNION ALL SELECT 'litebase_streams_subscription_parked', s.labels, s.parked::double precision FROM sub_rows s
        UNION ALL SELECT 'litebase_streams_webhook_state', h.labels || pg_catalog.jsonb_build_object('state', st.state),
                         CASE st.state WHEN 'active' THEN h.active WHEN 'retrying' THEN h.retrying
                                       WHEN 'paused' THEN h.paused ELSE h.disabled END::double precision
                  FROM hook_rows h CROSS JOIN (VALUES ('active'), ('retrying'), ('paused'), ('disabled')) st (state)
        UNION ALL SELECT 'litebase_streams_webhook_consecutive_failures', h.labels, h.failures::double precision FROM hook_rows h
        UNION ALL SELECT 'litebase_streams_webhook_next_retry_seconds', h.labels, h.next_retry FROM hook_rows h
        UNION ALL SELECT 'litebase_streams_webhook_pending', h.labels, h.pending::double precision FROM hook_rows h WHERE h.named
    )
    SELECT f.metric, f.type, f.help,
           pg_catalog.jsonb_build_object('database', pg_catalog.current_database()) || sa.labels, sa.value
    FROM families f JOIN samples sa ON sa.metric = f.metric
    ORDER BY f.ord, sa.labels::text;
END
$$;
COMMENT ON FUNCTION streams.metrics(integer, integer) IS 'The database side''s Prometheus samples (metric, type, help, labels, value): horizon and lag, worker, notifications, events per stream, subscriptions, webhooks; label sets bounded by max_streams and max_subscriptions (the others summed into "(other)"; pending and lag only for the named subscriptions and webhooks, none for "(other)"). For pg_monitor.';
REVOKE ALL ON streams.stream_stats, streams.stream_stats_state, streams.streams FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION streams.metrics(integer, integer), streams._worker_counters() FROM PUBLIC;
GRANT SELECT ON streams.streams TO PUBLIC;
GRANT USAGE ON SCHEMA streams TO pg_monitor;
GRANT EXECUTE ON FUNCTION streams.metrics(integer, integer) TO pg_monitor;

-- 8. Storage (sql/storage.sql, the same text).
-- litebase_streams 0.3.0: how the log is stored. streams.event_log is
-- partitioned by ranges of positions (sql/streams.sql); this file makes
-- the partitions, lists them, moves old ones to another tablespace and sets
-- the opt-in retention the worker applies (src/delivery/storage.rs).
-- Loaded by CREATE EXTENSION and, byte for byte, by the 0.2.0 -> 0.3.0 step
-- (tests/upgrade.rs compares).

-- streams._storage() -> streams.storage_settings
-- The storage settings row, or the defaults when there is none.
CREATE FUNCTION streams._storage() RETURNS streams.storage_settings
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s streams.storage_settings;
BEGIN
    SELECT * INTO s FROM streams.storage_settings;
    IF NOT FOUND THEN
        -- The table's defaults.
        s.id := true;
        s.partition_size := 1000000;
        s.retention_overrides_consumers := false;
    END IF;
    RETURN s;
END
$$;
COMMENT ON FUNCTION streams._storage() IS 'Internal: the storage settings (partition size, retention, the last cut), defaults when unset.';

-- streams._owner_only(rel regclass) -> void
-- Revoke every privilege on a table but its owner's: the owner's default
-- privileges (ALTER DEFAULT PRIVILEGES) grant a new table to others, and a
-- partition is read through the log alone. Called by the SECURITY DEFINER
-- functions that make partitions, as the log's owner; not for PUBLIC.
CREATE FUNCTION streams._owner_only(rel regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.oid = rel AND a.grantee <> c.relowner
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %s', rel, grantee);
    END LOOP;
END
$$;
COMMENT ON FUNCTION streams._owner_only(regclass) IS 'Internal: revoke every privilege on a table but its owner''s.';
REVOKE EXECUTE ON FUNCTION streams._owner_only(regclass) FROM PUBLIC;

-- streams._add_partition(position bigint) -> regclass
-- Make the partition that holds `position`, unless one does: from the end
-- of the partition below it (the start for the first) up to the next
-- multiple of the partition size above it, or to the partition above it.
-- Made empty with its indexes (primary key, (stream, position), BRIN on
-- tx) and attached, which scans nothing and takes SHARE UPDATE EXCLUSIVE on
-- the log: publishers and readers go on. Row-level security
-- on and no policy: read it through streams.events. Called by the worker
-- ahead of need, and by a publish that finds no partition for its position.
-- SECURITY DEFINER: the partition belongs to the log's owner; not for PUBLIC.
CREATE FUNCTION streams._add_partition("position" bigint) RETURNS regclass
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- In the database's default tablespace, as heap tables, whatever the caller's settings.
    SET default_tablespace = '' SET default_table_access_method = heap AS $$
DECLARE
    size bigint := (streams._storage()).partition_size;
    below bigint;
    above bigint;
    lower_bound bigint;
    upper_bound bigint;
    name text;
    made regclass;
BEGIN
    -- One maker at a time (the attach would wait for the other anyway).
    LOCK TABLE streams.event_log IN SHARE UPDATE EXCLUSIVE MODE;
    SELECT b.partition INTO made FROM streams._partition_bounds() b
    WHERE (b.first_position IS NULL OR b.first_position <= _add_partition."position")
      AND _add_partition."position" < b.end_position;
    IF made IS NOT NULL THEN
        RETURN made;
    END IF;
    IF _add_partition."position" < streams._first_position() THEN
        RAISE EXCEPTION 'streams: position % is below the first one the log keeps (%)',
            _add_partition."position", streams._first_position()
            USING ERRCODE = 'LS001';
    END IF;
    SELECT max(b.end_position) INTO below FROM streams._partition_bounds() b
    WHERE b.end_position <= _add_partition."position";
    SELECT min(b.first_position) INTO above FROM streams._partition_bounds() b
    WHERE b.first_position > _add_partition."position";
    lower_bound := below;
    upper_bound := least((_add_partition."position" / size + 1) * size, above);
    name := 'event_log_' || coalesce(lower_bound, 0);
    EXECUTE pg_catalog.format(
        'CREATE TABLE streams.%I (position bigint NOT NULL, stream text COLLATE "C" NOT NULL, tx xid8 NOT NULL,
                                  data jsonb NOT NULL, type text COLLATE "C", key text COLLATE "C", headers jsonb,
                                  CONSTRAINT %I PRIMARY KEY (position))',
        name, name || '_pkey');
    EXECUTE pg_catalog.format('CREATE INDEX %I ON streams.%I (stream, position)', name || '_stream_position', name);
    -- See the operator class in sql/streams.sql: summarised by the worker.
    EXECUTE pg_catalog.format('CREATE INDEX %I ON streams.%I USING brin (tx streams.xid8_minmax_ops)
                               WITH (pages_per_range = 16, autosummarize = off)', name || '_tx', name);
    EXECUTE pg_catalog.format('ALTER TABLE streams.%I ENABLE ROW LEVEL SECURITY', name);
    -- Nobody but the owner gets a partition.
    PERFORM streams._owner_only(pg_catalog.format('streams.%I', name)::regclass);
    EXECUTE pg_catalog.format('ALTER TABLE streams.event_log ATTACH PARTITION streams.%I FOR VALUES FROM (%s) TO (%s)',
        name, coalesce(lower_bound::text, 'MINVALUE'), upper_bound);
    RETURN pg_catalog.format('streams.%I', name)::regclass;
END
$$;
COMMENT ON FUNCTION streams._add_partition(bigint) IS 'Internal: make the partition of streams.event_log that holds a position.';

-- streams._add_removed_range(end_position bigint) -> void
-- Make streams.event_log_removed, the empty partition of the positions
-- retention removed, from the start up to end_position (the first one
-- kept). A read of positions below the cut reaches it, since no plan prunes
-- it away, and fails there (streams._retained) instead of coming back
-- short. Called by the worker's retention, the log locked, after dropping
-- the previous one. SECURITY DEFINER: it belongs to the log's owner; not
-- for PUBLIC.
CREATE FUNCTION streams._add_removed_range(end_position bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- In the database's default tablespace, as heap tables, whatever the caller's settings.
    SET default_tablespace = '' SET default_table_access_method = heap AS $$
DECLARE
BEGIN
    CREATE TABLE streams.event_log_removed (position bigint NOT NULL, stream text COLLATE "C" NOT NULL,
        tx xid8 NOT NULL, data jsonb NOT NULL, type text COLLATE "C", key text COLLATE "C", headers jsonb);
    ALTER TABLE streams.event_log_removed ENABLE ROW LEVEL SECURITY;
    PERFORM streams._owner_only('streams.event_log_removed'::regclass);
    EXECUTE pg_catalog.format('ALTER TABLE streams.event_log ATTACH PARTITION streams.event_log_removed
                               FOR VALUES FROM (MINVALUE) TO (%s)', end_position);
END
$$;
COMMENT ON FUNCTION streams._add_removed_range(bigint) IS 'Internal: the empty partition of the positions retention removed.';

-- streams.set_partition_size(positions bigint) -> void
-- How many positions each partition made from now on holds (default
-- 1,000,000; at least 10,000). Existing partitions keep their bounds.
CREATE FUNCTION streams.set_partition_size(positions bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF positions IS NULL OR positions < 10000 THEN
        RAISE EXCEPTION 'streams.set_partition_size: positions must be at least 10000, not %', coalesce(positions::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO streams.storage_settings (partition_size) VALUES (positions)
    ON CONFLICT (id) DO UPDATE SET partition_size = excluded.partition_size;
END
$$;
COMMENT ON FUNCTION streams.set_partition_size(bigint) IS 'How many positions each new partition of the log holds (default 1,000,000).';

-- streams.set_retention(max_age interval, max_size bigint, overrides_consumers boolean) -> void
-- Opt-in retention (both null: off, the default; the log keeps everything).
-- The worker drops whole partitions, oldest first, whose events are all
-- older than max_age, or while the log is larger than max_size bytes; never
-- the one that holds the newest position, one with events not final yet, or
-- one holding an event a subscription (a webhook that is not disabled, a
-- dead letter) has not passed, unless overrides_consumers: then such a
-- subscription is marked lost_before the new first position instead.
CREATE FUNCTION streams.set_retention(max_age interval DEFAULT NULL, max_size bigint DEFAULT NULL,
                                      overrides_consumers boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF max_age < '0'::interval OR max_size <= 0 OR overrides_consumers IS NULL THEN
        RAISE EXCEPTION 'streams.set_retention: max_age must not be negative, max_size must be positive, overrides_consumers not null'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO streams.storage_settings (retention_max_age, retention_max_size, retention_overrides_consumers)
    VALUES (max_age, max_size, overrides_consumers)
    ON CONFLICT (id) DO UPDATE SET retention_max_age = excluded.retention_max_age,
        retention_max_size = excluded.retention_max_size,
        retention_overrides_consumers = excluded.retention_overrides_consumers;
END
$$;
COMMENT ON FUNCTION streams.set_retention(interval, bigint, boolean) IS 'Opt-in retention: drop whole partitions older than max_age or while the log exceeds max_size bytes, never past a consumer unless overrides_consumers (both null: off).';

-- streams.storage: the storage settings and the last cut, for everyone
-- (positions and times, no stream).
CREATE VIEW streams.storage AS
SELECT s.partition_size, s.retention_max_age, s.retention_max_size, s.retention_overrides_consumers,
       streams._first_position() AS first_position, s.cut_at
FROM streams._storage() s;
COMMENT ON VIEW streams.storage IS 'Partition size, retention settings, the first position retention kept and when it last removed partitions.';
COMMENT ON COLUMN streams.storage.first_position IS 'The first position the log holds: every lower one was removed by retention (null: nothing removed).';
COMMENT ON COLUMN streams.storage.cut_at IS 'When retention last removed partitions (null: never).';

-- streams._partition_info() -> table
-- What streams.partitions shows. SECURITY DEFINER: it reads the ends of each
-- partition (their first and last positions, through their primary keys)
-- and their commit times, none of which names a stream.
CREATE FUNCTION streams._partition_info()
RETURNS TABLE (partition regclass, first_position bigint, end_position bigint, size bigint,
               oldest_time timestamptz, newest_time timestamptz, tablespace name, state text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b record;
    newest bigint := (SELECT CASE WHEN q.is_called THEN q.last_value ELSE q.last_value - 1 END FROM streams.position_seq q);
    low bigint;
    high bigint;
BEGIN
    FOR b IN SELECT x.partition, x.first_position, x.end_position FROM streams._partition_bounds() x LOOP
        EXECUTE pg_catalog.format('SELECT min(p.position), max(p.position) FROM %s p', b.partition) INTO low, high;
        partition := b.partition;
        first_position := b.first_position;
        end_position := b.end_position;
        size := pg_catalog.pg_total_relation_size(b.partition);
        oldest_time := streams._commit_time(low);
        -- The latest commit among its positions, not the commit of its
        -- highest one: transactions commit out of position order. From the
        -- rows of commit times that overlap them (a row's last_time is its
        -- latest; one that reaches past either end can only make this later,
        -- which keeps retention, archive and the cut's time on the safe side).
        newest_time := GREATEST(
            (SELECT pg_catalog.max(c.last_time) FROM streams.commit_times c
             WHERE c.first_position > low AND c.first_position <= high),
            (SELECT c.last_time FROM streams.commit_times c
             WHERE c.first_position <= low ORDER BY c.first_position DESC LIMIT 1));
        tablespace := (SELECT t.spcname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_tablespace t ON t.oid = c.reltablespace
                       WHERE c.oid = b.partition);
        state := CASE WHEN b.first_position IS NULL AND b.end_position = streams._first_position() THEN 'removed'
                      WHEN b.first_position > newest THEN 'ahead'
                      WHEN b.end_position > newest THEN 'active'
                      WHEN tablespace IS NOT NULL THEN 'archived'
                      ELSE 'full' END;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION streams._partition_info() IS 'Internal: the rows of streams.partitions.';

-- streams.partitions: the log's partitions in position order.
CREATE VIEW streams.partitions AS
SELECT * FROM streams._partition_info();
COMMENT ON VIEW streams.partitions IS 'The partitions of the log: position range, size, commit times of their first and last events, tablespace, state (ahead, active, full, archived).';
COMMENT ON COLUMN streams.partitions.first_position IS 'The lowest position it holds (null: from the start).';
COMMENT ON COLUMN streams.partitions.end_position IS 'The position after the highest it holds.';
COMMENT ON COLUMN streams.partitions.size IS 'Bytes on disk, indexes and TOAST included.';
COMMENT ON COLUMN streams.partitions.oldest_time IS 'Commit time of its first final event (null: none).';
COMMENT ON COLUMN streams.partitions.newest_time IS 'The latest commit time of its final events (null: none).';
COMMENT ON COLUMN streams.partitions.tablespace IS 'Its tablespace (null: the database''s default).';
COMMENT ON COLUMN streams.partitions.state IS 'ahead: made for positions not handed out yet; active: holds the newest position; full: below it; archived: full and in another tablespace; removed: the empty place of the positions retention removed.';

-- streams.archive(before_position bigint, tablespace name) -> integer
-- streams.archive(older_than interval, tablespace name) -> integer
-- Move the full partitions entirely at or below before_position (or whose
-- newest event is older than older_than) with their indexes into
-- `tablespace`; returns how many moved. Replay reads them as before. Each
-- move rewrites the partition's files under an ACCESS EXCLUSIVE lock on it:
-- readers of those positions wait meanwhile; publishers write elsewhere.
-- For the log's owner (and superusers), who own the partitions.
CREATE FUNCTION streams.archive(before_position bigint, tablespace name) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p record;
    i regclass;
    moved integer := 0;
BEGIN
    IF before_position IS NULL OR tablespace IS NULL THEN
        RAISE EXCEPTION 'streams.archive: before_position and tablespace must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_tablespace t WHERE t.spcname = archive.tablespace) THEN
        RAISE EXCEPTION 'streams.archive: tablespace "%" does not exist', tablespace USING ERRCODE = 'undefined_object';
    END IF;
    FOR p IN SELECT x.partition FROM streams.partitions x
             WHERE x.state IN ('full', 'archived') AND x.end_position <= before_position + 1
               AND x.tablespace IS DISTINCT FROM archive.tablespace
             ORDER BY x.first_position NULLS FIRST LOOP
        EXECUTE pg_catalog.format('ALTER TABLE %s SET TABLESPACE %I', p.partition, tablespace);
        FOR i IN SELECT x.indexrelid::regclass FROM pg_catalog.pg_index x WHERE x.indrelid = p.partition LOOP
            EXECUTE pg_catalog.format('ALTER INDEX %s SET TABLESPACE %I', i, tablespace);
        END LOOP;
        moved := moved + 1;
    END LOOP;
    RETURN moved;
END
$$;
COMMENT ON FUNCTION streams.archive(bigint, name) IS 'Move the full partitions entirely at or below a position, with their indexes, to a tablespace; returns how many moved.';

CREATE FUNCTION streams.archive(older_than interval, tablespace name) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF older_than IS NULL THEN
        RAISE EXCEPTION 'streams.archive: older_than must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN streams.archive(
        coalesce((SELECT max(x.end_position) - 1 FROM streams.partitions x
                  WHERE x.state IN ('full', 'archived')
                    AND x.newest_time < pg_catalog.now() - older_than
                    AND NOT EXISTS (SELECT FROM streams.partitions y
                                    WHERE y.state IN ('full', 'archived') AND y.end_position <= x.end_position
                                      AND (y.newest_time IS NULL OR y.newest_time >= pg_catalog.now() - older_than))),
                 0),
        tablespace);
END
$$;
COMMENT ON FUNCTION streams.archive(interval, name) IS 'Move the full partitions whose newest event is older than an interval, with their indexes, to a tablespace; returns how many moved.';

-- streams._retention_due() -> table (partition, end_position, held, newest_time)
-- What retention would drop now, oldest first: the full partitions (below
-- the active one, every event final) that are due by age or by size, each
-- with whether a consumer still needs it (held). The worker drops them in
-- order and stops at the first held one, unless overrides_consumers.
CREATE FUNCTION streams._retention_due()
RETURNS TABLE (partition regclass, end_position bigint, held boolean, newest_time timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s streams.storage_settings := streams._storage();
    total bigint;
    p record;
    horizon bigint := streams.horizon();
    needed bigint;
    counted bigint;
BEGIN
    IF s.retention_max_age IS NULL AND s.retention_max_size IS NULL THEN
        RETURN;
    END IF;
    -- Only partitions whose events the worker has counted per stream
    -- (streams.streams): a stream whose events are all removed keeps its
    -- last position there, which stream_head and expected_prev read.
    counted := coalesce((SELECT c.counted_through FROM streams.stream_stats_state c), horizon);
    SELECT sum(x.size) INTO total FROM streams.partitions x;
    -- The lowest position some consumer has not passed: a subscription's
    -- (a webhook's, unless disabled) and every dead letter's.
    needed := least(
        (SELECT min(t.position) + 1 FROM streams.subscription_state t
         WHERE NOT EXISTS (SELECT FROM streams.webhook_state w WHERE w.subscription = t.id AND w.disabled_at IS NOT NULL)),
        (SELECT min(f.position) FROM streams.subscription_failures f WHERE NOT f.discarded));
    FOR p IN SELECT x.partition, x.end_position, x.size, x.newest_time FROM streams.partitions x
             WHERE x.state IN ('full', 'archived') AND x.end_position <= least(horizon, counted) + 1
             ORDER BY x.first_position NULLS FIRST LOOP
        EXIT WHEN NOT ((s.retention_max_age IS NOT NULL AND p.newest_time < pg_catalog.now() - s.retention_max_age)
                       OR (s.retention_max_size IS NOT NULL AND total > s.retention_max_size));
        partition := p.partition;
        end_position := p.end_position;
        held := needed IS NOT NULL AND needed < p.end_position;
        newest_time := p.newest_time;
        total := total - p.size;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION streams._retention_due() IS 'Internal: the partitions retention would drop now, oldest first, and whether a consumer still needs each.';

-- streams._subscription_lost(subscription text, first_position bigint) -> void
-- LS001 for a poll of a subscription that retention, told to override
-- consumers, cut below: events it had not processed are gone.
CREATE FUNCTION streams._subscription_lost(subscription text, first_position bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'streams: retention removed events subscription "%" had not processed', subscription
        USING ERRCODE = 'LS001',
              DETAIL = pg_catalog.format('The log holds the positions from %s on.', first_position),
              HINT = pg_catalog.format('Seek it to a kept position: streams.seek(%L, after => %s) or later.', subscription, first_position - 1);
END
$$;
COMMENT ON FUNCTION streams._subscription_lost(text, bigint) IS 'Internal: LS001 for a subscription whose unprocessed events retention removed.';

-- streams.seek: LS001 below the first position retention kept (see sql/subscriptions.sql).
CREATE OR REPLACE FUNCTION streams.seek(
    subscription text,
    after        bigint      DEFAULT NULL,
    since        timestamptz DEFAULT NULL,
    from_tx      xid8        DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    start bigint := streams._start_position('streams.seek', seek.after, seek.since, seek.from_tx);
BEGIN
    PERFORM streams._seek_subscription(seek.subscription, start);
    -- Checked after the move, which locked the log until the transaction
    -- ends: retention drops a partition only after a lock that waits for
    -- this transaction, and then sees the new position. (Here, not in
    -- Rust: there the extension's own SQLSTATE would become XX000.)
    PERFORM streams._retained(
        coalesce(seek.after, CASE WHEN seek.since IS NULL AND seek.from_tx IS NULL THEN start END),
        seek.since, seek.from_tx);
END
$$;

COMMENT ON COLUMN streams.subscriptions.lost_before IS 'Retention, told to override consumers, removed events it had not processed: the first position it kept (null: none lost). Polls fail with LS001 until a seek.';
COMMENT ON TABLE streams.storage_settings IS 'The storage settings (partition size, retention) and what retention removed last; read streams.storage.';

REVOKE EXECUTE ON FUNCTION streams._partition_bounds(), streams._first_position(),
    streams._retained(bigint, timestamptz, xid8), streams._storage(), streams._add_partition(bigint),
    streams._add_removed_range(bigint), streams.set_partition_size(bigint),
    streams.set_retention(interval, bigint, boolean), streams._partition_info(), streams.archive(bigint, name),
    streams.archive(interval, name), streams._retention_due(), streams._subscription_lost(text, bigint) FROM PUBLIC;
GRANT SELECT ON streams.storage TO PUBLIC;
GRANT EXECUTE ON FUNCTION streams._retained(bigint, timestamptz, xid8), streams._first_position(),
    streams._partition_bounds(), streams._storage(), streams._subscription_lost(text, bigint) TO PUBLIC;
GRANT SELECT ON streams.partitions TO pg_monitor;
GRANT EXECUTE ON FUNCTION streams._partition_info() TO pg_monitor;
