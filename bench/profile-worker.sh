#!/usr/bin/env bash
# Profile the delivery worker while pgbench publishes at full speed:
#   bench/profile-worker.sh [clients] [seconds]
# PROFILE_SCRIPT names another pgbench script in bench/ (publish_batch.sql;
# publish_wait.sql: one event per round, what a round costs at low rates).
# Needs the local cluster (`make start`) and perf (Debian package linux-perf).
# PERF=0 measures the worker's CPU only, without perf and its overhead.
# Prints the worker's hottest call paths (children view), as quoted in the
# issue notes: how much of a delivery round is executor work, commit, waiting.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
require_pg_bindir
clients="${1:-8}" seconds="${2:-6}"
db=litebase_profile
profiling=${PERF:-1}
[ "$profiling" = 0 ] || command -v perf >/dev/null || die "perf not found (apt-get install linux-perf)"
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
PGDATABASE=$db cluster_psql -X -q -c "CREATE EXTENSION litebase_streams"
sleep 1
worker="$(cluster_psql -X -At -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'litebase_streams worker' AND datname = '$db'")"
[ -n "$worker" ] || die "no worker in $db"
"$PG_BINDIR/pgbench" -n -h "$SOCKET_DIR" -p "$PGPORT" -U postgres -f "$REPO_ROOT/bench/${PROFILE_SCRIPT:-publish.sql}" \
    -c "$clients" -j 2 -T $((seconds + 3)) "$db" > /dev/null &
sleep 2
# The worker's CPU time (utime + stime, in clock ticks) and its rounds, before and after.
cpu() { awk '{print $14 + $15}' "/proc/$worker/stat"; }
state() { PGDATABASE=$db cluster_psql -X -At -c "SELECT rounds || ' ' || newest_position FROM streams.status"; }
cpu0=$(cpu); read -r rounds0 newest0 <<<"$(state)"
if [ "$profiling" = 0 ]; then
    sleep "$seconds"
else
    perf record -q -g -p "$worker" -o "$REPO_ROOT/target/worker.perf" -- sleep "$seconds" 2>/dev/null
fi
cpu1=$(cpu); read -r rounds1 newest1 <<<"$(state)"
wait
ticks=$(getconf CLK_TCK)
events=$((newest1 - newest0)) rounds=$((rounds1 - rounds0))
awk -v p="$profiling" -v e="$events" -v r="$rounds" -v s="$seconds" -v c="$((cpu1 - cpu0))" -v t="$ticks" 'BEGIN {
    r = r > 0 ? r : 1; e = e > 0 ? e : 1; us = c * 1000000 / t
    printf "events published: %d in %d s; worker rounds: %d (%.1f events per round)\n", e, s, r, e / r
    printf "worker CPU: %.0f µs per event, %.0f µs per round%s\n", us / e, us / r, p == 0 ? "" : " (under perf, which adds to it)" }'
[ "$profiling" = 0 ] || perf report -i "$REPO_ROOT/target/worker.perf" --children --sort symbol --percent-limit 5 --stdio -g none 2>/dev/null \
    | grep -E '%' | grep -v '0x0000' | sed -E 's/ +- +- *$//' | head -30
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
