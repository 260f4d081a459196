-- The controls of bench/phases/partitions.py: rows of the log's shape,
-- written by a plain INSERT, without the extension.
--
-- bench_log_plain: one table, as the log was up to 0.2.0: the columns of
-- streams.event_log (LIKE: types, collations, NOT NULL), a primary key on
-- position, an index on (stream, position) and the BRIN index on tx with the
-- extension's operator class and the log's storage parameters.
-- bench_log_parted: the same, partitioned by range of position with one
-- partition that takes every position (the cost of partition routing alone).
-- Positions come from a sequence each, CACHE 1 like streams.position_seq.
CREATE SEQUENCE bench_log_plain_seq AS bigint CACHE 1;
CREATE TABLE bench_log_plain (LIKE streams.event_log);
ALTER TABLE bench_log_plain
    ALTER position SET DEFAULT nextval('bench_log_plain_seq'),
    ALTER tx SET DEFAULT pg_current_xact_id(),
    ADD PRIMARY KEY (position);
CREATE INDEX ON bench_log_plain (stream, position);
CREATE INDEX ON bench_log_plain USING brin (tx streams.xid8_minmax_ops)
    WITH (pages_per_range = 16, autosummarize = off);

CREATE SEQUENCE bench_log_parted_seq AS bigint CACHE 1;
CREATE TABLE bench_log_parted (LIKE streams.event_log) PARTITION BY RANGE (position);
ALTER TABLE bench_log_parted
    ALTER position SET DEFAULT nextval('bench_log_parted_seq'),
    ALTER tx SET DEFAULT pg_current_xact_id(),
    ADD PRIMARY KEY (position);
CREATE INDEX ON bench_log_parted (stream, position);
CREATE INDEX ON bench_log_parted USING brin (tx streams.xid8_minmax_ops)
    WITH (pages_per_range = 16, autosummarize = off);
CREATE TABLE bench_log_parted_0 PARTITION OF bench_log_parted FOR VALUES FROM (MINVALUE) TO (MAXVALUE);
