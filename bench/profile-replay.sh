#!/usr/bin/env bash
# Where a replay's time goes, against a raw ordered scan of the same rows:
#   bench/profile-replay.sh [events] [seconds]
# Needs the local cluster (`make start`) and perf (Debian package linux-perf).
# Publishes `events` (default 1,000,000) with publish_batch, 1,000 per
# transaction over 10 streams (bench section 3's data set), copies them into a
# plain table with the same columns, then runs each query repeatedly in one
# pgbench session (every column read: count(time), count(data)) under perf,
# and prints each query's mean latency and the backend's hottest functions.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
require_pg_bindir
events="${1:-1000000}" seconds="${2:-6}"
db=litebase_profile
command -v perf >/dev/null || die "perf not found (apt-get install linux-perf)"
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
PGDATABASE=$db cluster_psql -X -q -v ON_ERROR_STOP=1 <<SQL
CREATE EXTENSION litebase_streams;
DO \$\$ BEGIN
    FOR i IN 0..$((events / 1000 - 1)) LOOP
        PERFORM count(*) FROM streams.publish_batch('stream.' || (i % 10),
            ARRAY(SELECT jsonb_build_object('order_id', 'ord_' || g, 'amount', (g % 10000) / 100.0)
                  FROM generate_series(i * 1000 + 1, (i + 1) * 1000) g ORDER BY g));
        COMMIT;
    END LOOP;
END \$\$;
SELECT streams.wait((SELECT max(position) FROM streams.event_log), '120s');
CREATE TABLE raw AS SELECT position, stream, time, tx, data FROM streams.events ORDER BY position;
ALTER TABLE raw ADD PRIMARY KEY (position);
VACUUM (ANALYZE) raw, streams.event_log, streams.commit_times;
SQL
declare -A queries=(
    [replay]="SELECT count(e.time), count(e.data) FROM streams.replay(max_events => $events) e;"
    [raw]="SELECT count(r.time), count(r.data) FROM (SELECT * FROM raw ORDER BY position LIMIT $events) r;"
)
for name in replay raw; do
    script="$REPO_ROOT/target/profile-replay-$name.sql"
    out="$REPO_ROOT/target/profile-replay-$name.perf"
    echo "${queries[$name]}" > "$script"
    "$PG_BINDIR/pgbench" -n -h "$SOCKET_DIR" -p "$PGPORT" -U postgres -f "$script" -c 1 -T $((seconds + 2)) \
        "$db" > "$out.pgbench" &
    sleep 1
    backend="$(cluster_psql -X -At -c "SELECT pid FROM pg_stat_activity WHERE datname = '$db' AND application_name = 'pgbench' AND state = 'active' LIMIT 1")"
    perf record -q -g -p "$backend" -o "$out" -- sleep "$seconds" 2>/dev/null
    wait
    echo "== $name: ${queries[$name]}"
    grep -E 'latency average' "$out.pgbench"
    perf report -i "$out" --no-children --sort symbol --percent-limit 2 --stdio -g none 2>/dev/null \
        | grep -E '%' | sed -E 's/ +- +- *$//' | head -20
done
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
