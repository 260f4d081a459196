-------------------------------------------------------------------------------
-- Subscriptions: durable, named consumers of a stream pattern
-- (src/subscriptions/ has the design: claims, chunks, long polls).
--
-- A subscription remembers how far its consumers got (`position`: every event
-- of it at or below is processed). `poll` claims the next final events for
-- the caller's transaction, `ack` marks them processed in that same
-- transaction: commit the consumer's own writes and the ack together and each
-- event takes effect exactly once; roll back (or lose the session) and the
-- events are delivered again.
--
-- Privileges are set in finish.sql, after the reset of default privileges.
-------------------------------------------------------------------------------

CREATE TABLE streams.subscription_state (
    id          integer PRIMARY KEY,
    -- Unique per owner: each role has a name space of its own, so no role
    -- can take a name another team needs (streams.poll resolves a name to the
    -- caller's own subscription first).
    name        text COLLATE "C" NOT NULL,
    stream      text COLLATE "C" NOT NULL,
    ordered     boolean NOT NULL,
    -- Every event of the subscription at or below it is processed.
    position    bigint NOT NULL CHECK (position >= 0),
    -- The role that created it: its members poll, ack, seek and drop it.
    owner       regrole NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_ack_at timestamptz,
    -- Deliveries of an event before it is parked as a dead letter (NULL:
    -- no limit), and the delay before a nacked event comes again:
    -- backoff_min * 2^(attempt - 1), at most backoff_max, with jitter.
    max_attempts integer CHECK (max_attempts BETWEEN 1 AND 1000),
    backoff_min interval NOT NULL DEFAULT '1 second',
    backoff_max interval NOT NULL DEFAULT '10 minutes',
    -- Ordered per key: the key as given (a path into data, or '$stream'),
    -- as streams._event_key takes it, and whether a dead letter holds its
    -- key's later events ('hold') or not ('skip').
    key         text,
    key_path    text[],
    on_dead_letter text NOT NULL DEFAULT 'hold' CHECK (on_dead_letter IN ('hold', 'skip')),
    -- Filters: only events whose type is one of `types`, and whose data
    -- contains `filter` (NULL: no such condition).
    types       text[],
    filter      jsonb,
    -- Retention, told to override consumers, removed events it had not
    -- processed: the first position it kept. Polls fail (LS001) until a seek.
    lost_before bigint,
    UNIQUE (name, owner)
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

-- Written and read only by the extension's code, as the extension's owner:
-- row-level security with no policy keeps out pg_read_all_data and
-- pg_write_all_data, which bypass table privileges but not row security.
ALTER TABLE streams.subscription_state ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.subscription_progress ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.subscription_deliveries ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.subscription_failures ENABLE ROW LEVEL SECURITY;
ALTER TABLE streams.subscription_keys ENABLE ROW LEVEL SECURITY;

-- pg_dump keeps the subscriptions with the log they follow.
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_state', '');
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_progress', '');
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_ids', '');
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_deliveries', '');
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_failures', '');
SELECT pg_catalog.pg_extension_config_dump('streams.subscription_keys', '');

-- The functions below run as the caller and check it themselves (a member of
-- the subscription's owner, with the read privilege on every stream its
-- pattern selects), then use the tables as the extension's owner. Nobody
-- needs access to the tables.
CREATE FUNCTION streams._create_subscription(name text, stream text, start bigint, ordered boolean,
    key text, on_dead_letter text, max_attempts integer, backoff_min interval, backoff_max interval,
    if_not_exists boolean, types text[], filter jsonb) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_create_subscription_with_retries_wrapper';
CREATE FUNCTION streams._seek_subscription(name text, start bigint) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_seek_subscription_wrapper';
-- _poll: the same claim without the attempts, for a poll compiled before
-- an update to 0.3.0 and running after it.
CREATE FUNCTION streams._poll(subscription text, max_events integer, wait interval)
RETURNS TABLE (stream text, after bigint, count integer)
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_poll_wrapper';
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
CREATE FUNCTION streams._chunk("position" bigint) RETURNS bigint
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_chunk_wrapper';
CREATE FUNCTION streams._claims() RETURNS TABLE (subscription integer, pid integer, claimed bigint)
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_claims_wrapper';

-- streams._delivery_waits() -> (deliveries, waited_us)
-- This backend's polls: deliveries written down by the worker, and the
-- microseconds they waited for it (make bench reports the cost from it).
CREATE FUNCTION streams._delivery_waits() RETURNS TABLE (deliveries bigint, waited_us bigint)
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_delivery_waits_wrapper';
COMMENT ON FUNCTION streams._delivery_waits() IS 'Internal: this backend''s deliveries written down by the worker and the time its polls waited (microseconds).';

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

-- streams.drop_subscription(name) -> boolean
-- Drop it and its progress; true if it existed.
CREATE FUNCTION streams.drop_subscription(name text) RETURNS boolean
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_drop_subscription_wrapper';

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

-- streams.ack(subscription, through) -> void
-- The events this transaction polled with positions up to `through` are
-- processed, as part of this transaction. 22023 for positions it did not poll.
CREATE FUNCTION streams.ack(subscription text, through bigint) RETURNS void
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_ack_wrapper';

-- streams.seek(subscription, after, since, from_tx) -> void
-- Move the subscription: back to reprocess, ahead to skip. None given: to
-- the current horizon. Waits for a transaction that holds an ordered
-- subscription's events. LS001 below the first position retention kept.
CREATE FUNCTION streams.seek(
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

COMMENT ON TABLE streams.subscription_state IS 'Subscriptions: name, stream pattern, ordering, processed position, owner (see streams.subscriptions).';
COMMENT ON COLUMN streams.subscription_state.position IS 'Every event of the subscription at or below this position is processed (unordered: plus the progress rows above it).';
COMMENT ON TABLE streams.subscription_progress IS 'Unordered subscriptions: the processed prefix of each chunk of 1024 positions above the position.';
COMMENT ON SEQUENCE streams.subscription_ids IS 'Ids of subscriptions (keys of their claim locks).';
COMMENT ON FUNCTION streams._create_subscription(text, text, bigint, boolean, text, text, integer, interval, interval, boolean, text[], jsonb) IS 'Internal: create_subscription once the start position is known.';
COMMENT ON FUNCTION streams._seek_subscription(text, bigint) IS 'Internal: seek once the position is known.';
COMMENT ON FUNCTION streams._poll(text, integer, interval) IS 'Internal: streams._claim without the attempts (the 0.2.0 form, for polls compiled before an update).';
COMMENT ON FUNCTION streams._claim(text, integer, interval, interval) IS 'Internal: claim the next events of a subscription: its stream (or prefix and pattern), its filters and the ranges of positions holding them.';
COMMENT ON FUNCTION streams._attempt(bigint) IS 'Internal: the delivery attempt of an event this backend''s last poll claimed (its count before that poll, plus one).';
COMMENT ON FUNCTION streams._await_delivery() IS 'Internal: wait until the worker wrote down the delivery of this backend''s last poll.';
COMMENT ON FUNCTION streams._chunk(bigint) IS 'Internal: the chunk (1024 positions) of an unordered subscription a position falls in.';
COMMENT ON FUNCTION streams._claims() IS 'Internal: the events open transactions of this database claimed, per subscription and pid.';
COMMENT ON FUNCTION streams._start_position(text, bigint, timestamptz, xid8) IS 'Internal: where a subscription starts or seeks to.';
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
COMMENT ON FUNCTION streams.drop_subscription(text) IS 'Drop a subscription and its progress; true if it existed.';
COMMENT ON FUNCTION streams.poll(text, integer, interval, interval) IS 'Claim the next events of a subscription for this transaction (or for a lease), with their delivery attempt; wait => long poll.';
COMMENT ON FUNCTION streams.ack(text, bigint) IS 'Mark what this transaction polled, up to a position, as processed (commits with the transaction).';
COMMENT ON FUNCTION streams.seek(text, bigint, timestamptz, xid8) IS 'Move a subscription back (reprocess) or ahead (skip).';
COMMENT ON VIEW streams.subscriptions IS 'The subscriptions of the caller''s roles: position, pending events, lag, claims.';
