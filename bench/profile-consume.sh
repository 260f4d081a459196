#!/usr/bin/env bash
# Where an ordered subscription consumer's time goes, server-side, against a
# consumer paging replay(): bench section 6's loops as procedures.
#   bench/profile-consume.sh [events] [batch]
# Needs the local cluster (`make start`); with PERF=1 also perf (Debian
# package linux-perf). Publishes `events` (default 200,000) to one stream,
# then, 3 rounds each, CALLs a procedure that polls `batch` (default 1,000)
# events per transaction and acks them (a new subscription per round), and one
# that pages replay() with the cursor kept in a variable: each round's wall
# time (psql's \timing) and the CPU the database's delivery worker spent in it
# (/proc/<pid>/stat, ticks of 10 ms), which writes each poll's delivery down.
# With PERF=1, one more subscription round runs under perf (call graphs), and
# the poll's hottest functions are printed, inclusive ("children").
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
require_pg_bindir
events="${1:-200000}" batch="${2:-1000}"
db=litebase_profile_consume
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
trap 'cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
PGDATABASE=$db cluster_psql -X -q -v ON_ERROR_STOP=1 <<SQL
CREATE EXTENSION litebase_streams;
DO \$\$ BEGIN
    FOR i IN 0..$((events / 1000 - 1)) LOOP
        PERFORM count(*) FROM streams.publish_batch('bench.consume',
            ARRAY(SELECT jsonb_build_object('order_id', 'ord_' || g, 'amount', (g % 10000) / 100.0)
                  FROM generate_series(i * 1000 + 1, (i + 1) * 1000) g ORDER BY g));
        COMMIT;
    END LOOP;
END \$\$;
SELECT streams.wait((SELECT max(position) FROM streams.event_log), '120s');
CREATE PROCEDURE consume_subscription(sub text, batch int, INOUT n bigint DEFAULT 0)
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
    END LOOP;
END \$\$;
CREATE PROCEDURE consume_replay(batch int, INOUT n bigint DEFAULT 0)
LANGUAGE plpgsql AS \$\$
DECLARE r record; k int; last bigint := 0;
BEGIN
    LOOP
        k := 0;
        FOR r IN SELECT * FROM streams.replay('bench.consume', after => last, max_events => batch) LOOP
            last := r.position; k := k + 1;
        END LOOP;
        EXIT WHEN k = 0;
        COMMIT;
        n := n + k;
    END LOOP;
END \$\$;
VACUUM (ANALYZE);
SQL
worker="$(cluster_psql -X -At -c "SELECT pid FROM pg_stat_activity WHERE datname = '$db' AND backend_type = 'litebase_streams worker'")"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
round() {  # round <label> <CALL ...>
    local before after took
    before="$(ticks "$worker")"
    took="$(PGDATABASE=$db cluster_psql -X -q -c '\timing on' -c "$2" | awk '/^Time:/ {print $2}')"
    after="$(ticks "$worker")"
    echo "$1: $took ms, worker $(( (after - before) * 10 )) ms of CPU"
}
for i in 1 2 3; do
    PGDATABASE=$db cluster_psql -X -q -c "SELECT streams.create_subscription('s$i', 'bench.consume', after => 0)" >/dev/null
    round "subscription, round $i, $events events, $batch per poll" "CALL consume_subscription('s$i', $batch)"
    round "replay pages, round $i, $events events, $batch per page" "CALL consume_replay($batch)"
done
if [ "${PERF:-0}" = 1 ]; then
    command -v perf >/dev/null || die "perf not found (apt-get install linux-perf)"
    out="$REPO_ROOT/target/profile-consume.perf"
    PGDATABASE=$db cluster_psql -X -q -c "SELECT streams.create_subscription('p', 'bench.consume', after => 0)" >/dev/null
    PGDATABASE=$db cluster_psql -X -q -c "SET application_name = 'profile_consume'" -c "SELECT pg_sleep(0.5)" \
        -c "CALL consume_subscription('p', $batch)" >/dev/null &
    sleep 0.2
    backend="$(cluster_psql -X -At -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'profile_consume'")"
    perf record -q -F 2999 --call-graph dwarf,16384 -p "$backend" -o "$out" -- sleep 1.5 2>/dev/null || true
    wait || true
    echo "== the poll's hottest functions, inclusive (perf report --children)"
    perf report -i "$out" --children --sort symbol --stdio -g none 2>/dev/null > "$out.txt" || true
    grep -E '%' "$out.txt" | grep -v '0x0000' | sed -E 's/ +- +- *$//' \
        | grep -E '_claim_wrapper|next_events|tuplestore_puttupleslot|_ack_wrapper|subscriptions::open|XLogFlush' || true
fi
