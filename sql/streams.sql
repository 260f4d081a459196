-- litebase_streams: the tables, views and SQL functions users see.
-- Loaded by CREATE EXTENSION after the Rust functions (src/*.rs) exist.

-- Refuse to install into a server that did not preload the library or does
-- not record commit timestamps: the error says what to add to postgresql.conf.
SELECT streams._require_preload();

-------------------------------------------------------------------------------
-- Storage. Write only through streams.publish / publish_batch: they announce
-- each position in shared memory, which is what keeps late commits visible.
-------------------------------------------------------------------------------

-- Positions: one global timeline per database. CACHE 1 is required (a
-- backend-local cache would hand out positions the worker cannot see).
CREATE SEQUENCE streams.position_seq AS bigint CACHE 1 NO CYCLE;

-- Every event ever published (final or not yet final).
CREATE TABLE streams.event_log (
    position bigint PRIMARY KEY,
    stream   text COLLATE "C" NOT NULL,
    tx       xid8 NOT NULL,
    data     jsonb NOT NULL
);
CREATE INDEX event_log_stream_position ON streams.event_log (stream, position);

-- Lookups by tx use a BRIN index: transaction ids grow with positions, so a
-- block range summary finds a transaction's events for a few dozen bytes per
-- million events, and publishers pay nothing for it at insert time (new
-- ranges are summarised in the background). PostgreSQL has no BRIN operator
-- class for xid8; this is its minmax one, built from the standard parts.
CREATE OPERATOR CLASS streams.xid8_minmax_ops FOR TYPE xid8 USING brin AS
    OPERATOR 1 <, OPERATOR 2 <=, OPERATOR 3 =, OPERATOR 4 >=, OPERATOR 5 >,
    FUNCTION 1 pg_catalog.brin_minmax_opcinfo(internal),
    FUNCTION 2 pg_catalog.brin_minmax_add_value(internal, internal, internal, internal),
    FUNCTION 3 pg_catalog.brin_minmax_consistent(internal, internal, internal),
    FUNCTION 4 pg_catalog.brin_minmax_union(internal, internal, internal);
CREATE INDEX event_log_tx ON streams.event_log USING brin (tx streams.xid8_minmax_ops)
    WITH (pages_per_range = 16, autosummarize = on);

-- One row per publishing transaction, written by the worker as the horizon
-- passes the transaction's first event: its commit time and first position.
CREATE TABLE streams.transactions (
    tx             xid8 PRIMARY KEY,
    committed_at   timestamptz NOT NULL,
    first_position bigint NOT NULL
);
-- The worker writes these rows in commit-time order (nearly), so BRIN finds a
-- time range as well as a btree would, for next to nothing per row.
CREATE INDEX transactions_committed_at ON streams.transactions USING brin (committed_at)
    WITH (pages_per_range = 16, autosummarize = on);

-- The persisted horizon: every position at or below it is final. One row,
-- written by the worker in the transaction that delivers the events.
CREATE TABLE streams.horizon_state (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    horizon bigint NOT NULL
);

-- pg_dump keeps the events (extension tables are otherwise skipped).
SELECT pg_catalog.pg_extension_config_dump('streams.event_log', '');
SELECT pg_catalog.pg_extension_config_dump('streams.transactions', '');
SELECT pg_catalog.pg_extension_config_dump('streams.horizon_state', '');
SELECT pg_catalog.pg_extension_config_dump('streams.position_seq', '');

-- Immutability: UPDATE, DELETE and TRUNCATE of stored events fail for
-- everyone, owner and superusers included (ENABLE ALWAYS: also under
-- session_replication_role = replica).
CREATE FUNCTION streams._refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'streams: stored events are immutable; % on %.% is not allowed',
        TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'Publish a new event that corrects or supersedes the old one.';
END
$$;
COMMENT ON FUNCTION streams._refuse_change() IS 'Trigger: refuses UPDATE, DELETE and TRUNCATE of stored events.';

CREATE TRIGGER event_log_immutable BEFORE UPDATE OR DELETE OR TRUNCATE ON streams.event_log
    FOR EACH STATEMENT EXECUTE FUNCTION streams._refuse_change();
CREATE TRIGGER transactions_immutable BEFORE UPDATE OR DELETE OR TRUNCATE ON streams.transactions
    FOR EACH STATEMENT EXECUTE FUNCTION streams._refuse_change();
ALTER TABLE streams.event_log ENABLE ALWAYS TRIGGER event_log_immutable;
ALTER TABLE streams.transactions ENABLE ALWAYS TRIGGER transactions_immutable;

-------------------------------------------------------------------------------
-- Reading
-------------------------------------------------------------------------------

-- streams.horizon() -> bigint
-- The highest final position: every event at or below it is committed and
-- visible, and no event at or below it will ever appear later.
CREATE FUNCTION streams.horizon() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT horizon FROM streams.horizon_state), 0)
$$;

-- streams._newest_position() -> bigint
-- The newest allocated position, final or not (0 before the first publish).
-- Reads the sequence directly: no MVCC, no lock other sessions wait on.
CREATE FUNCTION streams._newest_position() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM streams.position_seq
$$;

-- streams.events: final events only (position <= horizon, as this reader's
-- snapshot sees it). Query it with plain SQL; its indexes serve ranges by
-- position, by (stream, position), by time and by tx.
-- Every final event has its transactions row (the worker writes both in one
-- transaction), so the LEFT JOIN returns what an inner join would; unlike an
-- inner join, the planner drops it from queries that do not read "time".
-- The horizon test is written as (position > horizon) IS NOT TRUE: the
-- planner then neither folds it with the caller's own `position > x` into a
-- range it guesses to be tiny, nor rewrites it back into one (as it would a
-- NOT), and it guesses it keeps most rows, which it does. Ordered scans then
-- stay ordered instead of sorting.
CREATE VIEW streams.events AS
SELECT e.position, e.stream, t.committed_at AS "time", e.tx, e.data
FROM streams.event_log e
LEFT JOIN streams.transactions t ON t.tx = e.tx
WHERE (e.position > coalesce((SELECT h.horizon FROM streams.horizon_state h), 0)) IS NOT TRUE;

COMMENT ON VIEW streams.events IS 'Final events: position, stream, time (commit time), tx (xid8), data.';
COMMENT ON COLUMN streams.events.position IS 'Place on the database''s global timeline; readers never see a lower one appear later.';
COMMENT ON COLUMN streams.events.stream IS 'Stream name, also the LISTEN channel.';
COMMENT ON COLUMN streams.events."time" IS 'Commit time of the publishing transaction.';
COMMENT ON COLUMN streams.events.tx IS 'The publishing transaction (xid8); joins to xmin of the rows it wrote via tx::xid.';
COMMENT ON COLUMN streams.events.data IS 'The published payload.';

-- streams.get(position bigint) -> streams.events
-- One final event by position, or null if there is none (or not yet).
CREATE FUNCTION streams.get("position" bigint) RETURNS streams.events
LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT e.* FROM streams.events e WHERE e.position = get."position"
$$;

-- streams._replay_check(after, since, from_tx) -> boolean
-- True, or 22023 when more than one of them is given. IMMUTABLE: with literal
-- arguments it runs once, at plan time.
CREATE FUNCTION streams._replay_check(after bigint, since timestamptz, from_tx xid8) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF num_nonnulls(after, since, from_tx) > 1 THEN
        RAISE EXCEPTION 'streams.replay: give at most one of after, since and from_tx'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'after => a position, since => a time, or from_tx => a transaction id.';
    END IF;
    RETURN true;
END
$$;

-- streams._replay_start(since, from_tx) -> bigint
-- Where a replay from a time or a transaction starts: the position after which
-- events are returned, or null when it names nothing final (yet).
-- SECURITY DEFINER: it reads streams.transactions, which readers need no
-- access to.
CREATE FUNCTION streams._replay_start(since timestamptz, from_tx xid8) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        WHEN since IS NOT NULL THEN
            -- The first final event committed at or after `since`; replay's time
            -- filter drops earlier commits that sit later on the timeline.
            (SELECT min(t.first_position) - 1 FROM streams.transactions t WHERE t.committed_at >= since)
        ELSE (SELECT t.first_position - 1 FROM streams.transactions t WHERE t.tx = from_tx)
    END
$$;

-- streams.replay(stream, after, since, from_tx, max_events) -> setof streams.events
-- Final events in position order, at most max_events of them.
--   stream     exact name, a prefix pattern ('payment.*'), '*' or null (all streams)
--   after      positions greater than this
--   since      events committed at or after this time
--   from_tx    from that transaction's first event on (the whole timeline, not just its events)
--   none       from the beginning
-- At most one of after/since/from_tx. To page, continue with after => the last position seen.
-- A single SQL query that PostgreSQL inlines into the caller's: with literal
-- arguments the helpers fold to constants and it plans like a hand-written
-- range query on streams.events.
CREATE FUNCTION streams.replay(
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
      AND (replay.since IS NULL OR e."time" >= replay.since)
    ORDER BY e.position
    LIMIT streams._replay_limit(replay.max_events)
$$;

-------------------------------------------------------------------------------
-- Publishing
-------------------------------------------------------------------------------

-- streams.publish(stream text, data jsonb) -> bigint
-- Append one event in the caller's transaction and return its position. It
-- becomes visible (streams.events, LISTEN "<stream>") once the transaction
-- commits and every transaction that published before it has finished.
-- SECURITY DEFINER: granting EXECUTE is enough to publish. Implemented in
-- Rust (src/publish.rs): a position, then an INSERT through a kept plan.
CREATE FUNCTION streams.publish(stream text, data jsonb) RETURNS bigint
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'litebase_streams_publish';

-- streams.publish_batch(stream text, data jsonb[]) -> setof bigint
-- Append one event per array element, positions increasing in array order.
CREATE FUNCTION streams._publish_batch(stream text, data jsonb[]) RETURNS bigint[]
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'litebase_streams_publish_batch';
COMMENT ON FUNCTION streams._publish_batch(text, jsonb[]) IS 'Internal: publish_batch''s positions as an array.';

CREATE FUNCTION streams.publish_batch(stream text, data jsonb[]) RETURNS SETOF bigint
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    SELECT pg_catalog.unnest(streams._publish_batch(publish_batch.stream, publish_batch.data))
$$;

-------------------------------------------------------------------------------
-- Operations
-------------------------------------------------------------------------------

-- streams.status: one row. horizon; newest_position (the newest allocated
-- position, final or not); the worker's pid, state, delivered position and
-- lag; and, when an open publishing transaction holds the horizon back, its
-- pid, position, xid and age (set idle_in_transaction_session_timeout!).
CREATE VIEW streams.status AS
SELECT streams.horizon() AS horizon,
       w.newest_position,
       w.worker_pid,
       w.worker_state,
       w.delivered_position,
       w.newest_position - w.delivered_position AS lag_positions,
       w.holder_pid,
       w.holder_position,
       a.backend_xid AS holder_xid,
       now() - a.xact_start AS holder_age
FROM streams._worker_status() w
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = w.holder_pid;

COMMENT ON VIEW streams.status IS 'Horizon, newest position, worker state and lag, and what holds the horizon back.';

-- Privileges: nothing for PUBLIC. Grant per role, e.g.
--   GRANT USAGE ON SCHEMA streams TO app;
--   GRANT EXECUTE ON FUNCTION streams.publish(text, jsonb) TO app;
--   GRANT SELECT ON streams.events TO app;
--   GRANT EXECUTE ON FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer) TO app;
--   GRANT SELECT ON streams.status TO ops; GRANT EXECUTE ON FUNCTION streams._worker_status() TO ops;
REVOKE ALL ON ALL TABLES IN SCHEMA streams FROM PUBLIC;
REVOKE ALL ON SEQUENCE streams.position_seq FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA streams FROM PUBLIC;
-- replay is inlined into the caller's query, so its helpers run as the caller
-- (who still needs USAGE on the schema and SELECT on streams.events).
GRANT EXECUTE ON FUNCTION streams._replay_start(timestamptz, xid8), streams._replay_check(bigint, timestamptz, xid8),
    streams._stream_exact(text),
    streams._stream_prefix_low(text), streams._stream_prefix_high(text), streams._replay_limit(integer) TO PUBLIC;

-- Start this database's worker when CREATE EXTENSION commits.
SELECT streams._launch_worker();
