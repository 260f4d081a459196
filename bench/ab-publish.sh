#!/usr/bin/env bash
# Publish throughput of two builds side by side: two clusters of one machine
# (say the released build on one port, the work tree's on another; each with
# its own PostgreSQL copy, see docs/benchmarks.md), the same pgbench script
# against each, interleaved A B B A ..., each run after a CHECKPOINT:
#   bench/ab-publish.sh PORT_A PORT_B [clients] [seconds] [reps] [script]
# Prints each run's tps, then the medians and B / A.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
require_pg_bindir
port_a="$1" port_b="$2" clients="${3:-8}" seconds="${4:-8}" reps="${5:-4}" script="${6:-$REPO_ROOT/bench/publish.sql}"
db=litebase_ab
socket() { echo "/tmp/${EXT_NAME}-cluster-$1/socket"; }
for port in "$port_a" "$port_b"; do
    "$PG_BINDIR/psql" -X -q -h "$(socket "$port")" -p "$port" -U postgres -d postgres \
        -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
    "$PG_BINDIR/psql" -X -q -h "$(socket "$port")" -p "$port" -U postgres -d "$db" -c "CREATE EXTENSION $EXT_NAME"
done
run() {
    "$PG_BINDIR/psql" -X -q -h "$(socket "$1")" -p "$1" -U postgres -d "$db" -c CHECKPOINT
    "$PG_BINDIR/pgbench" -n -h "$(socket "$1")" -p "$1" -U postgres -f "$script" -c "$clients" -j 2 -T "$seconds" "$db" \
        | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p'
}
a=() b=()
for i in $(seq 1 "$reps"); do
    if [ $((i % 2)) = 1 ]; then order="a b"; else order="b a"; fi
    for side in $order; do
        if [ "$side" = a ]; then t="$(run "$port_a")"; a+=("$t"); else t="$(run "$port_b")"; b+=("$t"); fi
        echo "run $i $side (port $([ "$side" = a ] && echo "$port_a" || echo "$port_b")): $t tps"
    done
done
python3 - "${a[*]}" "${b[*]}" <<'PY'
import statistics, sys
a, b = ([float(x) for x in s.split()] for s in sys.argv[1:3])
ma, mb = statistics.median(a), statistics.median(b)
print(f"median A {ma:,.0f} tps, B {mb:,.0f} tps, B / A = {mb / ma:.3f}")
PY
