#!/usr/bin/env bash
# pgbench scripts of bench/ timed side by side, for a question make bench
# does not ask (a variant of a publish against the publish itself):
#   bench/compare-publish.sh clients seconds rounds script ...
# Needs the local cluster (`make start`). In a database of its own with the
# extension and bench/schema.sql, each round runs every script once, in a
# rotating order, each after a CHECKPOINT; it prints each script's median tps,
# its runs, and its ratio to the first script's median.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
require_pg_bindir
[ $# -ge 4 ] || die "usage: bench/compare-publish.sh clients seconds rounds script ..."
clients="$1" seconds="$2" rounds="$3"
shift 3
scripts=("$@")
db=litebase_compare
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
PGDATABASE=$db cluster_psql -X -q -c "CREATE EXTENSION litebase_streams" -f "$REPO_ROOT/bench/schema.sql"
declare -A runs
for ((round = 0; round < rounds; round++)); do
    for ((i = 0; i < ${#scripts[@]}; i++)); do
        script="${scripts[$(((i + round) % ${#scripts[@]}))]}"
        PGDATABASE=$db cluster_psql -X -q -c CHECKPOINT
        tps="$("$PG_BINDIR/pgbench" -n -h "$SOCKET_DIR" -p "$PGPORT" -U postgres -f "$REPO_ROOT/bench/$script" \
            -c "$clients" -j 2 -T "$seconds" "$db" 2>/dev/null | grep -o 'tps = [0-9.]*' | head -1 | cut -d' ' -f3)"
        runs[$script]="${runs[$script]:-} $tps"
    done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
base="$(echo "${runs[${scripts[0]}]}" | median)"
for script in "${scripts[@]}"; do
    m="$(echo "${runs[$script]}" | median)"
    printf '%-36s %10.0f tps  %5.2fx   runs:%s\n' "$script" "$m" "$(awk -v m="$m" -v b="$base" 'BEGIN {print m / b}')" "${runs[$script]}"
done
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
