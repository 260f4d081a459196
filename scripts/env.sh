#!/usr/bin/env bash
# Print the libpq settings of the development cluster as shell exports, so that
# psql, createdb and every client library (psycopg, node-postgres, ...) reach it:
#
#   eval "$(make -s env)"      # or: eval "$(bash scripts/env.sh)"
#
# As root the cluster listens on /tmp/litebase_streams-cluster-<port>/socket, as a
# normal user on .cluster/socket in the repository (scripts/common.sh); either way
# on PGPORT (54329 unless overridden) and with the superuser `postgres`.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
printf 'export PGHOST=%q PGPORT=%q PGUSER=postgres\n' "$SOCKET_DIR" "$PGPORT"
