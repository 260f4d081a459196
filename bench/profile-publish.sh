#!/usr/bin/env bash
# Where the server's CPU goes while pgbench publishes, against a plain INSERT
# of the same row, side by side:
#   bench/profile-publish.sh [clients] [seconds] [script ...]
# (scripts in bench/; default: publish.sql plain_insert.sql)
# Needs the local cluster (`make start`) and perf (Debian package linux-perf).
# For each script it prints the tps, then the share of all CPU samples taken by
# the delivery worker, the other server processes (mostly the client backends)
# and everything else, and the
# hottest call paths of the backends (children view), as quoted in the issue
# notes. Samples are system-wide (perf record -a): the machine is shared.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
require_pg_bindir
clients="${1:-8}" seconds="${2:-6}"
scripts=("${@:3}")
[ ${#scripts[@]} -gt 0 ] || scripts=(publish.sql plain_insert.sql)
db=litebase_profile
command -v perf >/dev/null || die "perf not found (apt-get install linux-perf)"
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
PGDATABASE=$db cluster_psql -X -q -c "CREATE EXTENSION litebase_streams" -f "$REPO_ROOT/bench/schema.sql"
sleep 1
worker="$(cluster_psql -X -At -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'litebase_streams worker' AND datname = '$db'")"
[ -n "$worker" ] || die "no worker in $db"
for script in "${scripts[@]}"; do
    out="$REPO_ROOT/target/profile-${script%.sql}.perf"
    "$PG_BINDIR/pgbench" -n -h "$SOCKET_DIR" -p "$PGPORT" -U postgres -f "$REPO_ROOT/bench/$script" \
        -c "$clients" -j 2 -T $((seconds + 3)) "$db" > "$out.pgbench" &
    sleep 2
    perf record -q -a -g -o "$out" -- sleep "$seconds" 2>/dev/null
    wait
    echo "== $script, $clients clients: $(grep -o 'tps = [0-9.]*' "$out.pgbench" | head -1)"
    perf report -i "$out" --sort pid --stdio -g none 2>/dev/null | awk -v worker="$worker" '
        /%/ { split($3, p, ":"); share = $1 + 0;
              if (p[1] == worker) w += share; else if (p[2] == "postgres") s += share; else o += share }
        END { printf "CPU samples: delivery worker %.1f%%, other postgres processes (backends, WAL writer, ...) %.1f%%, outside the server %.1f%%\n", w, s, o }'
    perf report -i "$out" --comm postgres --children --sort symbol --percent-limit 2 --stdio -g none 2>/dev/null \
        | grep -E '%' | grep -v '0x0000' | sed -E 's/ +- +- *$//' | head -25
done
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
