#!/usr/bin/env bash
# Build (release) and install the extension into $PG_CONFIG's PostgreSQL:
#   $(pg_config --pkglibdir)/litebase_streams.so
#   $(pg_config --sharedir)/extension/litebase_streams{.control,--*.sql}
# As root this writes directly; otherwise cargo-pgrx copies the files with sudo.
# A running dev cluster keeps running the library it loaded (see
# detach_installed_library) and picks the new one up on its next `make start`
# (scripts/cluster.sh restarts it when the .so is newer than the server).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$REPO_ROOT"
detach_installed_library
args=(pgrx install --release --pg-config "$PG_CONFIG")
[ "$IS_ROOT" -eq 1 ] || args+=(--sudo)
say "cargo ${args[*]}"
cargo "${args[@]}"
