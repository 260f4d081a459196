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

COMMENT ON COLUMN streams.subscriptions.lost_before IS 'Retention, told to override consumers, removed events it had not processed: the first position it kept (null: none lost). Polls fail with LS001 until a seek.';
COMMENT ON TABLE streams.storage_settings IS 'The storage settings (partition size, retention) and what retention removed last; read streams.storage.';
