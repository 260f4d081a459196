#!/usr/bin/env bash
# Profile the delivery worker while pgbench publishes at full speed:
#   bench/profile-worker.sh [clients] [seconds]
# Needs the local cluster (`make start`) and perf (Debian package linux-perf).
# Prints the worker's hottest call paths (children view), as quoted in the
# issue notes: how much of a delivery round is executor work, commit, waiting.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
require_pg_bindir
clients="${1:-8}" seconds="${2:-6}"
db=litebase_profile
command -v perf >/dev/null || die "perf not found (apt-get install linux-perf)"
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
perf record -q -g -p "$worker" -o "$REPO_ROOT/target/worker.perf" -- sleep "$seconds" 2>/dev/null
cpu1=$(cpu); read -r rounds1 newest1 <<<"$(state)"
wait
ticks=$(getconf CLK_TCK)
events=$((newest1 - newest0)) rounds=$((rounds1 - rounds0))
echo "events published: $events in ${seconds} s; worker rounds: $rounds ($((events / (rounds > 0 ? rounds : 1))) events per round)"
echo "worker CPU: $(( (cpu1 - cpu0) * 1000000 / ticks / (events > 0 ? events : 1) )) µs per event (under perf, which adds to it)"
perf report -i "$REPO_ROOT/target/worker.perf" --children --sort symbol --percent-limit 5 --stdio -g none 2>/dev/null \
    | grep -E '%' | grep -v '0x0000' | sed -E 's/ +- +- *$//' | head -30
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
