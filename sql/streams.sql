-- litebase_streams 0.3.0: the tables, views and SQL functions users see.
-- Loaded by CREATE EXTENSION after the Rust functions (src/*.rs) exist.
-- Every change here ships a step in sql/litebase_streams--<from>--<to>.sql
-- too; the upgrade test compares a fresh install with the upgraded one.

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

-- Every event ever published (final or not yet final). type, key and
-- headers: the optional envelope (src/log/envelope.rs checks them); null
-- when not given, which costs a row nothing (the null bitmap fits in the
-- padding of the tuple header).
-- Partitioned by ranges of positions (streams.partitions, sql/storage.sql):
-- the worker makes partitions ahead of need, archive moves whole ones to
-- another tablespace, and opt-in retention drops whole ones, which is how
-- storage is bounded without deleting a row. The partitions are plain
-- tables of this schema, not members of the extension, so that pg_dump
-- dumps them with their rows (a fresh CREATE EXTENSION has none; the first
-- publish makes the first).
CREATE TABLE streams.event_log (
    position bigint NOT NULL,
    stream   text COLLATE "C" NOT NULL,
    tx       xid8 NOT NULL,
    data     jsonb NOT NULL,
    type     text COLLATE "C",
    key      text COLLATE "C",
    headers  jsonb
) PARTITION BY RANGE (position);
-- Its indexes are each partition's own (streams._add_partition makes them:
-- the primary key on position, (stream, position) and a BRIN on tx), not
-- the log's: pg_dump then restores a partition's indexes with it, where an
-- index of the log would make a second one on the partition it attaches.
-- Positions are unique across partitions since their ranges are disjoint.

-- Lookups by tx use a BRIN index (on each partition): transaction ids grow with positions, so a
-- block range summary finds a transaction's events for a few dozen bytes per
-- million events, and publishers pay nothing for it at insert time. New
-- ranges are summarised by the worker every few seconds (autosummarize would
-- queue one autovacuum request per range, and at high rates that queue
-- overflows and floods the server log). PostgreSQL has no BRIN operator
-- class for xid8; this is its minmax one, built from the standard parts.
CREATE OPERATOR CLASS streams.xid8_minmax_ops FOR TYPE xid8 USING brin AS
    OPERATOR 1 <, OPERATOR 2 <=, OPERATOR 3 =, OPERATOR 4 >=, OPERATOR 5 >,
    FUNCTION 1 pg_catalog.brin_minmax_opcinfo(internal),
    FUNCTION 2 pg_catalog.brin_minmax_add_value(internal, internal, internal, internal),
    FUNCTION 3 pg_catalog.brin_minmax_consistent(internal, internal, internal),
    FUNCTION 4 pg_catalog.brin_minmax_union(internal, internal, internal);

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
-- The first row (by position) that reaches a time, found in the index alone:
-- replay(since => ..) walks it from the start of the log (a few hundred
-- bytes per 4,096 positions) without reading the rows' times.
CREATE INDEX commit_times_position_time ON streams.commit_times (first_position, last_time);

-- The persisted horizon: every position at or below it is final. One row,
-- written by the worker. `delivered`: the last position notified, when
-- notifications lag behind visibility (null: everything visible was notified).
-- `system_identifier`: the cluster that wrote it (pg_control_system()); a
-- restore into another cluster brings the old one along, and the worker then
-- appends the restored horizon to `era_bounds`: the positions after which a
-- new era of transaction ids begins: that cluster's transaction ids may
-- repeat ids of restored events, and replay(from_tx => ..) takes the newest
-- transaction with an id (see streams._replay_start).
--
-- One row, a new version of it per round that moves the horizon. A
-- snapshot held open for long (a REPEATABLE READ report, pg_dump) keeps
-- every version since it began, so the row is found through the index on
-- the horizon: every reader asks for the version with the highest horizon
-- (ORDER BY horizon DESC LIMIT 1), which is the newest one, and finds it
-- first, however many old versions there are. No unique key: checking one
-- on every new version would visit all the old ones (the worker is the only
-- writer and keeps to one row).
CREATE TABLE streams.horizon_state (
    id                boolean NOT NULL DEFAULT true CHECK (id),
    horizon           bigint NOT NULL,
    delivered         bigint,
    system_identifier bigint,
    era_bounds        bigint[]
);
CREATE INDEX horizon_state_horizon ON streams.horizon_state (horizon);
-- Logical decoding (wal2json and the like) sends a table's updates only when
-- it has a replica identity; without a key that is the whole row (its old
-- version goes to the WAL only under wal_level = logical).
ALTER TABLE streams.horizon_state REPLICA IDENTITY FULL;

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

-- Only the extension's own code writes these tables: the worker and
-- publish, as the extension's owner (a superuser, who bypasses row-level
-- security). Table privileges alone do not keep others out: the predefined
-- roles pg_write_all_data and pg_read_all_data act as if they had INSERT,
-- UPDATE, DELETE and SELECT on every table, but they do not bypass
-- row-level security. So row-level security is on, and the only policies
-- let the roles that were granted SELECT (readers, through streams.grant)
-- read the horizon and commit times; no policy allows a write.
ALTER TABLE streams.commit_times ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON streams.commit_times FOR SELECT USING (true);
ALTER TABLE streams.horizon_state ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON streams.horizon_state FOR SELECT USING (true);
ALTER TABLE streams.log_info ENABLE ROW LEVEL SECURITY;

-- pg_dump keeps the events (extension tables are otherwise skipped).
SELECT pg_catalog.pg_extension_config_dump('streams.event_log', '');
SELECT pg_catalog.pg_extension_config_dump('streams.commit_times', '');
SELECT pg_catalog.pg_extension_config_dump('streams.horizon_state', '');
SELECT pg_catalog.pg_extension_config_dump('streams.position_seq', '');

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

-- Immutability: UPDATE, DELETE and TRUNCATE of stored events fail for
-- everyone, owner and superusers included (ENABLE ALWAYS: also under
-- session_replication_role = replica). The one exception is the UPDATE of
-- streams.redact and streams.redact_matching (src/log/redact.rs), which the
-- trigger recognises by a flag only that code sets.
CREATE FUNCTION streams._refuse_change() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'litebase_streams_refuse_change';
COMMENT ON FUNCTION streams._refuse_change() IS 'Trigger: refuses UPDATE, DELETE and TRUNCATE of stored events (but a redaction''s UPDATE).';

CREATE TRIGGER event_log_immutable BEFORE UPDATE OR DELETE OR TRUNCATE ON streams.event_log
    FOR EACH STATEMENT EXECUTE FUNCTION streams._refuse_change();
ALTER TABLE streams.event_log ENABLE ALWAYS TRIGGER event_log_immutable;
-- A statement on a partition itself fires the partition's triggers, not the
-- log's: this row trigger is cloned onto every partition, also one an
-- operator attaches, ENABLE ALWAYS included. TRUNCATE, DROP and DETACH of a
-- partition are refused by the extension's ProcessUtility hook
-- (src/hooks/partitions.rs).
CREATE TRIGGER event_log_immutable_rows BEFORE UPDATE OR DELETE ON streams.event_log
    FOR EACH ROW EXECUTE FUNCTION streams._refuse_change();
ALTER TABLE streams.event_log ENABLE ALWAYS TRIGGER event_log_immutable_rows;

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

-------------------------------------------------------------------------------
-- Privileges: who may read and publish which streams (see also "Granting")
-------------------------------------------------------------------------------

-- One row per grant: `grantee` may `privilege` ('read', 'publish' or 'redact') the
-- streams `stream` selects (an exact name, 'prefix.*' or '*'). Written only
-- through streams.grant and streams.revoke. Every role may select it, and
-- row-level security shows each role only the grants it holds (directly or
-- through a role it is a member of); the owner and superusers see all.
CREATE TABLE streams.stream_grants (
    grantee   regrole NOT NULL,
    privilege text NOT NULL CHECK (privilege IN ('read', 'publish', 'redact')),
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
ALTER TABLE streams.private_streams ENABLE ROW LEVEL SECURITY;
COMMENT ON TABLE streams.private_streams IS 'Stream names or patterns whose notifications carry no data (streams.set_private).';

SELECT pg_catalog.pg_extension_config_dump('streams.stream_grants', '');
SELECT pg_catalog.pg_extension_config_dump('streams.private_streams', '');

-- streams._era(position, era_bounds) -> integer
-- The era of the log a position belongs to (src/replay.rs): the events of
-- transaction ids used again after a restore are of a later era.
CREATE FUNCTION streams._era("position" bigint, era_bounds bigint[]) RETURNS integer
LANGUAGE c IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'litebase_streams_era';

-- streams._commit_time(position) -> timestamptz
-- The commit time of the event at `position`, from streams.commit_times as
-- the caller reads it (src/replay.rs); null before the worker recorded it.
-- Keeps the row it last read for the rest of the query.
CREATE FUNCTION streams._commit_time("position" bigint) RETURNS timestamptz
LANGUAGE c STABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', 'litebase_streams_commit_time';
COMMENT ON FUNCTION streams._commit_time(bigint) IS 'Internal: the commit time of the event at a position (streams.events reads it).';

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
    (position > coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)) IS NOT TRUE
    AND ((SELECT streams._reads_all()) OR streams._stream_matches(stream, (SELECT streams._read_patterns())))
);

-------------------------------------------------------------------------------
-- Reading
-------------------------------------------------------------------------------

-- streams.horizon() -> bigint
-- The highest final position: every event at or below it is committed and
-- visible, and no event at or below it will ever appear later.
-- SECURITY DEFINER: a reader needs no access to streams.horizon_state.
CREATE FUNCTION streams.horizon() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)
$$;
COMMENT ON FUNCTION streams.horizon() IS 'The highest final position: no event at or below it can appear later.';

-- streams.wait(position bigint, timeout interval DEFAULT '5s') -> boolean
-- True as soon as the event at `position` is final: the caller's next
-- statement sees it in streams.events (read-your-writes after a COMMIT, and
-- tests). False when `timeout` passes first. Sleeps until the worker moves
-- the horizon (src/subscriptions/wait.rs, shared with long polls); needs
-- READ COMMITTED to wait (0A000 otherwise).
CREATE FUNCTION streams.wait("position" bigint, timeout interval DEFAULT '5s') RETURNS boolean
LANGUAGE c VOLATILE SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', '_wait_wrapper';
COMMENT ON FUNCTION streams.wait(bigint, interval) IS 'Wait until the event at a position is visible in streams.events; false on timeout.';

-- streams.log_id() -> uuid
-- Which log this is (see streams.log_info): compare it with the one a
-- client's saved position belongs to before resuming from that position.
CREATE FUNCTION streams.log_id() RETURNS uuid
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT l.log_id FROM streams.log_info l
$$;
COMMENT ON FUNCTION streams.log_id() IS 'The identity of this log; changes when the extension is re-created or restored.';

-- streams._newest_position() -> bigint
-- The newest allocated position, final or not (0 before the first publish).
-- Reads the sequence directly: no MVCC, no lock other sessions wait on.
CREATE FUNCTION streams._newest_position() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value OPERATOR(pg_catalog.-) 1 END
    FROM streams.position_seq s
$$;
COMMENT ON FUNCTION streams._newest_position() IS 'Internal: the newest allocated position, final or not.';

-- streams.events: final events only (position <= horizon, as this reader's
-- snapshot sees it) of the streams this reader may read. Query it with plain
-- SQL; its indexes serve ranges by position, by (stream, position) and by
-- tx. For a time range, start with streams.replay(since => ..), which finds
-- the first position through streams.commit_times.
-- "time" comes from streams._commit_time(position), which keeps the
-- streams.commit_times row of the last position it was asked for: an ordered
-- scan finds the times of thousands of events in one row, at the cost of an
-- array lookup per event (a join would look up an index per event). Every
-- final event has its time (the worker writes both in one transaction); the
-- planner leaves the call out of queries that do not read "time".
-- The horizon test is written as (position > horizon) IS NOT TRUE: the
-- planner then neither folds it with the caller's own `position > x` into a
-- range it guesses to be tiny, nor rewrites it back into one (as it would a
-- NOT), and it guesses it keeps most rows, which it does. Ordered scans then
-- stay ordered instead of sorting.
-- security_invoker: the rows a reader sees are decided by the log's
-- row-level security (above), as that reader.
CREATE VIEW streams.events WITH (security_invoker = true) AS
SELECT e.position, e.stream, streams._commit_time(e.position) AS "time", e.tx, e.data, e.type, e.key, e.headers
FROM streams.event_log e
WHERE (e.position > coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)) IS NOT TRUE;

COMMENT ON VIEW streams.events IS 'Final events: position, stream, time (commit time), tx (xid8), data.';
COMMENT ON COLUMN streams.events.position IS 'Place on the database''s global timeline; readers never see a lower one appear later.';
COMMENT ON COLUMN streams.events.stream IS 'Stream name, also the LISTEN channel.';
COMMENT ON COLUMN streams.events."time" IS 'Commit time of the publishing transaction.';
COMMENT ON COLUMN streams.events.tx IS 'The publishing transaction (xid8); joins to xmin of the rows it wrote via tx::xid.';
COMMENT ON COLUMN streams.events.data IS 'The published payload.';
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
CREATE FUNCTION streams.get("position" bigint) RETURNS streams.events
LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT e.* FROM streams.events e
    WHERE e.position = get."position" AND streams._retained(get."position" OPERATOR(pg_catalog.-) 1, NULL, NULL)
$$;

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
COMMENT ON FUNCTION streams.to_json(streams.events) IS 'An event in its canonical JSON form: its notification''s text without prev (data always present).';
COMMENT ON FUNCTION streams._event_json(bigint, text, timestamptz, bigint, text, text, text, text) IS 'Internal: the canonical JSON text of an event from its fields.';

-- streams._replay_check(after, since, from_tx) -> boolean
-- True, or 22023 when both since and from_tx are given (after goes with
-- either: the later bound wins). IMMUTABLE: with literal arguments it runs
-- once, at plan time.
CREATE FUNCTION streams._replay_check(after bigint, since timestamptz, from_tx xid8) RETURNS boolean
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

-- streams._first_time_reaching(times timestamptz[], since timestamptz) -> integer
-- The 1-based index of the first of a row's commit times at or after since
-- (null: none); _replay_start's search of the row it found.
CREATE FUNCTION streams._first_time_reaching(times timestamptz[], since timestamptz) RETURNS integer
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE AS 'MODULE_PATHNAME', '_first_time_reaching_wrapper';
COMMENT ON FUNCTION streams._first_time_reaching(timestamptz[], timestamptz) IS 'Internal: the index of the first of a row''s commit times at or after a time.';

-- streams._replay_start(since, from_tx) -> bigint
-- Where a replay from a time or a transaction starts: the position after which
-- events are returned, or null when it names nothing final (yet).
-- SECURITY DEFINER: it reads the log beyond the caller's streams (only to
-- find a position; replay then returns what the caller may read); granted
-- with the 'read' privilege, not to PUBLIC.
CREATE FUNCTION streams._replay_start(since timestamptz, from_tx xid8) RETURNS bigint
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

-------------------------------------------------------------------------------
-- Publishing
-------------------------------------------------------------------------------

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
    IF privilege NOT IN ('read', 'publish', 'redact') THEN
        RAISE EXCEPTION 'unknown stream privilege "%"', privilege
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''read'', ''publish'' or ''redact''.';
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

COMMENT ON VIEW streams.status IS 'Horizon, newest position, worker state and lag, notification state, log identity, and what holds the horizon back.';
COMMENT ON COLUMN streams.status.first_position IS 'The first position retention kept: every lower one was removed (null: nothing removed).';
COMMENT ON COLUMN streams.status.holder_waits_for IS 'What the transaction holding the horizon back waits for: synchronous replication (committed locally; hold_timeout never ends it), its client (idle in transaction), or a wait event.';

-- Descriptions of what the sections above do not comment on already.
COMMENT ON TABLE streams.event_log IS 'Every event ever published, final or not; read streams.events instead.';
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
COMMENT ON FUNCTION streams._replay_check(bigint, timestamptz, xid8) IS 'Internal: since or from_tx, not both (after goes with either).';
COMMENT ON FUNCTION streams._replay_start(timestamptz, xid8) IS 'Internal: where a replay from a time or a transaction starts.';
COMMENT ON FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer, text[], jsonb, bigint) IS 'Final events of the streams a pattern selects (''order.*.failed'': one segment per *), in position order, from a position, time or transaction (after with since or from_tx: the later bound wins), up to a position (until); types and filter (data @> filter) keep only the matching ones.';
COMMENT ON FUNCTION streams.transaction_events(xid8) IS 'The events of one transaction, in position order: all of them once every one is final, none before.';
COMMENT ON FUNCTION streams._transaction_final(xid8) IS 'Internal: whether every event of a transaction is final.';
COMMENT ON FUNCTION streams._replay_until(bigint) IS 'Internal: replay''s until, checked (22023 when negative; null: no end).';
COMMENT ON FUNCTION streams._stream_wildcard(text) IS 'Internal: the pattern when it has a * segment before its end.';
COMMENT ON FUNCTION streams._check_types(text[]) IS 'Internal: a types argument, checked (22023).';
COMMENT ON FUNCTION streams._check_filter(jsonb) IS 'Internal: a filter argument, checked: a JSON object of at most 4 kB (22023).';
COMMENT ON FUNCTION streams._launch_worker() IS 'Internal: starts this database''s worker when CREATE EXTENSION commits.';
COMMENT ON FUNCTION streams._require_preload() IS 'Internal: refuses to install without the server settings the extension needs.';
COMMENT ON FUNCTION streams._stream_exact(text) IS 'Internal: the stream name when a pattern is an exact name.';
COMMENT ON FUNCTION streams._stream_prefix_low(text) IS 'Internal: the lowest name a prefix pattern (or a wildcard pattern''s literal prefix) selects.';
COMMENT ON FUNCTION streams._stream_prefix_high(text) IS 'Internal: the smallest name above every name a prefix pattern (or a wildcard pattern''s literal prefix) selects.';
COMMENT ON FUNCTION streams._replay_limit(integer) IS 'Internal: max_events, checked.';
COMMENT ON FUNCTION streams._worker_status() IS 'Internal: the shared-memory half of streams.status.';
COMMENT ON FUNCTION streams.worker_pid() IS 'The pid of this database''s worker: trust only notifications sent by it.';
COMMENT ON FUNCTION streams._acl_changed() IS 'Internal: makes publishers re-check their privileges after this transaction commits.';
COMMENT ON FUNCTION streams._stream_matches(text, text[]) IS 'Internal: whether a stream is selected by any of the names or patterns.';
