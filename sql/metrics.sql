-------------------------------------------------------------------------------
-- Metrics: events per stream, the streams a caller may read, and the
-- numbers an operator alerts on, as rows for Prometheus (the gateway's
-- /metrics, or postgres_exporter).
-------------------------------------------------------------------------------

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
