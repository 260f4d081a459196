#!/usr/bin/env bash
# What a captured bulk statement spends its time on (issue 26's note), each
# part timed alone on the same rows, side by side:
#   bench/profile-capture.sh [rows] [rounds]      (default 100000 rows, 3 rounds)
# Needs the local cluster (`make start`). In a database of its own, each round times, in
# this order: the INSERT ... SELECT into an uncaptured table; to_jsonb of the
# rows; the same wrapped as capture's data ({"new": row}); publish_batch of
# those prebuilt events; the INSERT ... SELECT into a captured table. Prints
# each part's median in ms and the captured / uncaptured ratio.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
require_pg_bindir
rows="${1:-100000}" rounds="${2:-3}"
db=litebase_profile_capture
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
run() { PGDATABASE=$db cluster_psql -X -q -v ON_ERROR_STOP=1 "$@"; }
run -c "CREATE EXTENSION litebase_streams" -c "
    CREATE TABLE plain (id bigserial PRIMARY KEY, customer text NOT NULL, amount numeric NOT NULL,
                        status text NOT NULL, created timestamptz NOT NULL DEFAULT now());
    CREATE TABLE captured (LIKE plain INCLUDING ALL);
    SELECT streams.capture('captured', 'profile.captured');" > /dev/null
insert() { echo "INSERT INTO $1 (customer, amount, status) SELECT 'cus_' || g % 1000, g % 100, 'paid' FROM generate_series(1, $rows) g"; }
declare -A parts=(
    [1_insert_uncaptured]="$(insert plain)"
    [2_to_jsonb]="SELECT count(to_jsonb(p)) FROM plain p"
    [3_as_capture_data]="SELECT count(jsonb_build_object('new', to_jsonb(p))) FROM plain p"
    [4_publish_batch]="SELECT count(*) FROM streams.publish_batch('profile.batch', (SELECT array_agg(jsonb_build_object('new', to_jsonb(p))) FROM plain p), type => 'insert')"
    [5_insert_captured]="$(insert captured)"
)
declare -A runs
ms() { # the statement's duration in ms (psql \timing)
    run -c '\timing on' -c "$1" | grep -o 'Time: [0-9.]*' | cut -d' ' -f2
}
for ((round = 0; round < rounds; round++)); do
    run -c "TRUNCATE plain, captured" -c CHECKPOINT > /dev/null
    for part in $(printf '%s\n' "${!parts[@]}" | sort); do
        t="$(ms "${parts[$part]}")"
        runs[$part]="${runs[$part]:-} $t"
    done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
for part in $(printf '%s\n' "${!parts[@]}" | sort); do
    printf '%-22s %10.1f ms   runs:%s\n' "$part" "$(echo "${runs[$part]}" | median)" "${runs[$part]}"
done
plain="$(echo "${runs[1_insert_uncaptured]}" | median)" captured="$(echo "${runs[5_insert_captured]}" | median)"
awk -v p="$plain" -v c="$captured" -v n="$rows" 'BEGIN {printf "captured / uncaptured rate: %.2fx (%d rows)\n", p / c, n}'
cluster_psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
