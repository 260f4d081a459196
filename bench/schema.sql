-- The plain table the anchors insert into (bench/plain_insert*.sql, in_tx_notify.sql):
-- the same columns an event has, a bigserial id and an index for per-stream reads.
CREATE TABLE bench_plain (
    id     bigserial PRIMARY KEY,
    stream text NOT NULL,
    tx     xid8 NOT NULL DEFAULT pg_current_xact_id(),
    time   timestamptz NOT NULL DEFAULT now(),
    data   jsonb NOT NULL
);
CREATE INDEX ON bench_plain (stream, id);
