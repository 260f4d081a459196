#!/usr/bin/env bash
# What streams.archive costs while publishers run (docs/operations.md, "Archive
# old partitions on cheaper disk"): the time to move one full partition of
# 1,000,000 events to another tablespace, and publish latency before and
# during, from pgbench's per-transaction log.
#
#   bash bench/archive-latency.sh        # against the dev cluster (make start), about 1 minute
#
# It makes a database of its own (archive_bench), 2,100,000 events in
# partitions of 1,000,000 positions, and a tablespace in a fresh directory
# under /tmp; pgbench publishes at 1,000 transactions/s (-c 4, bench/publish.sql)
# and, 8 s in, one call archives every full partition below position 1,000,000
# (event_log_0). It drops the database and the tablespace at the end.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
BIN="$("$PG_CONFIG" --bindir)"
export PGHOST="${PGHOST:-/tmp/litebase_streams-cluster-${PGPORT:-54329}/socket}" PGPORT="${PGPORT:-54329}"
export PGUSER="${PGUSER:-postgres}"
DB=archive_bench
WORK="$(mktemp -d /tmp/archive-latency.XXXXXX)"
SPACE_DIR="$WORK/tablespace"
mkdir -p "$SPACE_DIR"
if [ "$(id -u)" = 0 ]; then chown postgres "$WORK" "$SPACE_DIR"; fi

cleanup() {
    "$BIN/psql" -qX -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" \
        -c "DROP TABLESPACE IF EXISTS archive_bench_cold" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/psql" -qX -v ON_ERROR_STOP=1 -d postgres \
    -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "DROP TABLESPACE IF EXISTS archive_bench_cold" \
    -c "CREATE DATABASE $DB" -c "CREATE TABLESPACE archive_bench_cold LOCATION '$SPACE_DIR'"
"$BIN/psql" -qX -v ON_ERROR_STOP=1 -d "$DB" <<'SQL'
CREATE EXTENSION litebase_streams;
DO $$
BEGIN
FOR i IN 0..209 LOOP
    PERFORM count(*) FROM streams.publish_batch('growth.' || (i % 10),
        ARRAY(SELECT jsonb_build_object('order_id', 'ord_' || g, 'amount', (g % 10000) / 100.0)
              FROM generate_series(1, 10000) g));
    COMMIT;
END LOOP;
END $$;
VACUUM ANALYZE streams.event_log;
CHECKPOINT;
SQL
"$BIN/psql" -qX -d "$DB" -c "SELECT partition, pg_size_pretty(size) AS size, state FROM streams.partitions"

cd "$WORK"
"$BIN/pgbench" -n -f "$HERE/publish.sql" -c 4 -j 2 -R 1000 -T 20 -l "$DB" >pgbench.out 2>&1 &
PGBENCH=$!
sleep 8
START="$(date +%s.%N)"
"$BIN/psql" -qX -v ON_ERROR_STOP=1 -d "$DB" \
    -c "SELECT streams.archive(before_position => 1000000, tablespace => 'archive_bench_cold') AS archived"
END="$(date +%s.%N)"
wait "$PGBENCH"

python3 - "$START" "$END" "$WORK" <<'PY'
import glob, sys
start, end, work = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
before, during = [], []
for path in glob.glob(f"{work}/pgbench_log.*"):
    for line in open(path):
        f = line.split()
        # client, transaction, latency (us), script, epoch s, us[, schedule lag]
        latency_ms, done = int(f[2]) / 1000.0, int(f[4]) + int(f[5]) / 1e6
        if done < start:
            before.append(latency_ms)
        elif done - latency_ms / 1000 <= end + 1:
            during.append(latency_ms)
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]
print(f"archive of one partition: {end - start:.2f} s (the psql call, connection included)")
for name, v in (("before", before), ("during (to 1 s after)", during)):
    print(f"publish latency {name}: n={len(v)} p50={pct(v, .5):.2f} ms p99={pct(v, .99):.2f} ms max={max(v):.2f} ms")
PY
