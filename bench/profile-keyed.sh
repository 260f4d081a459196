#!/usr/bin/env bash
# Where a consumer of a subscription ordered per key spends its time,
# server-side: make bench section 6d's loop as a procedure.
#   bench/profile-keyed.sh [events] [keys] [batch]
# Needs the local cluster (`make start`); with PERF=1 also perf (Debian
# package linux-perf). Publishes `events` (default 50,000) to one stream,
# one per transaction, whose order ids cycle through `keys` values (default
# 50), then, 3 rounds, CALLs a procedure that polls up to `batch` (default
# 100) events per transaction of a new subscription with key => 'order_id'
# and acks them: each round's wall time (psql's \timing) and the CPU the
# database's delivery worker spent in it (/proc/<pid>/stat, ticks of 10 ms).
# With PERF=1, one more round runs under perf (call graphs), and the
# consumer's hottest functions are printed, inclusive ("children").
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
require_pg_bindir
events="${1:-50000}" keys="${2:-50}" batch="${3:-100}"
db=litebase_profile_keyed
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
[ "${KEEP:-0}" = 1 ] || trap 'cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
PGDATABASE=$db cluster_psql -X -q -v ON_ERROR_STOP=1 <<SQL
CREATE EXTENSION litebase_streams;
SET synchronous_commit = off;
DO \$\$ BEGIN
    FOR i IN 1..$events LOOP
        PERFORM streams.publish('bench.keyed',
            jsonb_build_object('order_id', 'ord_' || (i % $keys), 'amount', (i % 10000) / 100.0));
        COMMIT;
    END LOOP;
END \$\$;
SELECT streams.wait((SELECT max(position) FROM streams.event_log), '120s');
CREATE PROCEDURE consume_keyed(sub text, batch int, INOUT n bigint DEFAULT 0, INOUT polls bigint DEFAULT 0)
LANGUAGE plpgsql AS \$\$
DECLARE r record; k int; last bigint;
BEGIN
    LOOP
        k := 0;
        FOR r IN SELECT * FROM streams.poll(sub, batch) LOOP last := r.position; k := k + 1; END LOOP;
        EXIT WHEN k = 0;
        PERFORM streams.ack(sub, last);
        COMMIT;
        n := n + k;
        polls := polls + 1;
    END LOOP;
END \$\$;
VACUUM (ANALYZE);
SQL
worker="$(cluster_psql -X -At -c "SELECT pid FROM pg_stat_activity WHERE datname = '$db' AND backend_type = 'litebase_streams worker'")"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for i in $(seq 1 "${ROUNDS:-3}"); do
    PGDATABASE=$db cluster_psql -X -q -c \
        "SELECT streams.create_subscription('k$i', 'bench.keyed', after => 0, key => 'order_id')" >/dev/null
    before="$(ticks "$worker")"
    out="$(PGDATABASE=$db cluster_psql -X -q -At -c '\timing on' -c "CALL consume_keyed('k$i', $batch)")"
    after="$(ticks "$worker")"
    took="$(awk '/^Time:/ {print $2}' <<<"$out")"
    IFS='|' read -r n polls < <(grep '|' <<<"$out")
    echo "per key, round $i: $n events in $polls polls of up to $batch, $took ms" \
         "($(awk -v n="$n" -v t="$took" 'BEGIN {printf "%.0f", n / t * 1000}') events/s)," \
         "worker $(( (after - before) * 10 )) ms of CPU"
done
if [ "${PERF:-0}" = 1 ]; then
    command -v perf >/dev/null || die "perf not found (apt-get install linux-perf)"
    out="$REPO_ROOT/target/profile-keyed.perf"
    PGDATABASE=$db cluster_psql -X -q -c \
        "SELECT streams.create_subscription('p', 'bench.keyed', after => 0, key => 'order_id')" >/dev/null
    PGDATABASE=$db cluster_psql -X -q -c "SET application_name = 'profile_keyed'" -c "SELECT pg_sleep(0.5)" \
        -c "CALL consume_keyed('p', $batch)" >/dev/null &
    sleep 0.2
    backend="$(cluster_psql -X -At -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'profile_keyed'")"
    perf record -q -F 2999 --call-graph dwarf,16384 -p "$backend" -o "$out" -- sleep 2 2>/dev/null || true
    wait || true
    echo "== the consumer's hottest functions, inclusive (perf report --children)"
    perf report -i "$out" --children --sort symbol --stdio -g none 2>/dev/null > "$out.txt" || true
    grep -E '%' "$out.txt" | grep -v '0x0000' | sed -E 's/ +- +- *$//' | grep -E 'litebase_streams::|_wrapper' \
        | head -25 || true
fi
