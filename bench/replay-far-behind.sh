#!/usr/bin/env bash
# What a replay far behind the newest events pays in planning on the
# partitioned log (docs/scaling.md, "Planning a replay far behind the newest
# events"): a replay from `after` is pruned below its start while it is
# planned, but plans every partition at or above it.
#
#   bash bench/replay-far-behind.sh      # against the dev cluster (make start), about half a minute
#
# It makes a database of its own (far_behind_bench) with 500,000 events in
# partitions of 10,000 positions (51 partitions), then, in one session each:
#   1. EXPLAIN (ANALYZE, SUMMARY) of a 1,000-event page from far behind
#      (after => 5,000) and from near the newest (after => 495,000), 4 times;
#   2. a prepared statement paging from 5,000 on, 10 pages: PostgreSQL plans
#      the first five, then switches to a generic plan that it does not plan
#      again and that prunes the partitions below the start when it runs.
# Planning and execution times (ms) as EXPLAIN reports them. It drops the
# database at the end.
set -euo pipefail

PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
BIN="$("$PG_CONFIG" --bindir)"
export PGHOST="${PGHOST:-/tmp/litebase_streams-cluster-${PGPORT:-54329}/socket}" PGPORT="${PGPORT:-54329}"
export PGUSER="${PGUSER:-postgres}"
DB=far_behind_bench

cleanup() {
    "$BIN/psql" -qX -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT

"$BIN/psql" -qX -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
"$BIN/psql" -qX -v ON_ERROR_STOP=1 -d "$DB" <<'SQL'
CREATE EXTENSION litebase_streams;
SELECT streams.set_partition_size(10000);
DO $$
BEGIN
    FOR b IN 1..500 LOOP
        PERFORM streams.publish_batch('bench.s' || (b % 10),
            ARRAY(SELECT jsonb_build_object('order_id', 'ord_' || g, 'amount', (g % 10000) / 100.0)
                  FROM generate_series(1, 1000) g));
        COMMIT;
    END LOOP;
END $$;
SQL
# Every event final and every partition made before the measurements.
until [ "$("$BIN/psql" -qXAt -d "$DB" -c "SELECT streams.horizon() >= 500000")" = t ]; do sleep 0.1; done
"$BIN/psql" -qX -v ON_ERROR_STOP=1 -d "$DB" -c "VACUUM ANALYZE" >/dev/null
echo "partitions: $("$BIN/psql" -qXAt -d "$DB" -c "SELECT count(*) FROM streams.partitions")"

# One session for each part, as a client that keeps its connection: the
# first statement of a session also loads the catalog entries of the
# partitions (its planning time shows it), the later ones find them cached.
explain_times() {
    "$BIN/psql" -qXAt -d "$DB" |
        awk '/^(run|page)/ {printf "  %s: ", $0} /Planning Time/ {p=$3} /Execution Time/ {printf "planning %s ms, execution %s ms\n", p, $3}'
}
for after in 5000 495000; do
    echo "replay(after => $after, max_events => 1000), one session:"
    for round in 1 2 3 4; do
        echo "\\echo run $round"
        echo "EXPLAIN (ANALYZE, SUMMARY) SELECT * FROM streams.replay(after => $after, max_events => 1000);"
    done | explain_times
done
echo "prepared: PREPARE p(bigint) AS SELECT * FROM streams.replay(after => \$1, max_events => 1000), pages from 5000 on, one session:"
{
    echo "PREPARE p(bigint) AS SELECT * FROM streams.replay(after => \$1, max_events => 1000);"
    for page in $(seq 0 9); do
        echo "\\echo page $((page + 1)), after => $((5000 + page * 1000))"
        echo "EXPLAIN (ANALYZE, SUMMARY) EXECUTE p($((5000 + page * 1000)));"
    done
} | explain_times
