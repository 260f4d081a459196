# shellcheck shell=bash disable=SC2034  # variables are used by the sourcing scripts
# Shared settings and helpers for the scripts in scripts/.  Source it, don't run it.
#
# Every setting can be overridden from the environment (the Makefile exports
# them); the defaults below match the Makefile's.
#
#   PG_CONFIG    pg_config of the PostgreSQL 15 we build against and install into
#   PGPORT       TCP port of the development cluster
#   PGDATA_DIR   data directory of the development cluster
#   PGHOST       unix socket directory of the cluster ($PGDATA_DIR/socket)
#   PG_BINDIR    PostgreSQL binaries ($(pg_config --bindir))
#   PG_RUNAS     OS user that owns/runs the cluster: "postgres" when we are
#                root (PostgreSQL refuses to run as root), empty otherwise

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXT_NAME=litebase_streams

PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
PGPORT="${PGPORT:-54329}"

if [ "$(id -u)" -eq 0 ]; then
    IS_ROOT=1
    PG_RUNAS="${PG_RUNAS-postgres}"
    # The server runs as `postgres`, which must be able to traverse every
    # parent directory, so nothing under /root: use /tmp.
    _default_pgdata="/tmp/${EXT_NAME}-cluster-${PGPORT}"
else
    IS_ROOT=0
    PG_RUNAS="${PG_RUNAS-}"
    _default_pgdata="${REPO_ROOT}/.cluster"
fi
PGDATA_DIR="${PGDATA_DIR:-$_default_pgdata}"
# Make it absolute (pg_ctl/initdb run from / when switching user).
case "$PGDATA_DIR" in /*) ;; *) PGDATA_DIR="$PWD/$PGDATA_DIR" ;; esac
PGDATA_DIR="${PGDATA_DIR%/}"
SOCKET_DIR="${PGDATA_DIR}/socket"
PGHOST="$SOCKET_DIR"
SERVER_LOG="${PGDATA_DIR}/server.log"
export PG_CONFIG PGPORT PGDATA_DIR PGHOST PG_RUNAS

say()  { printf '==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
warn() { printf 'WARNING: %s\n' "$*" >&2; }
die()  { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# Run a command with root privileges (directly when root, else via sudo).
as_root() {
    if [ "$IS_ROOT" -eq 1 ]; then
        "$@"
    else
        command -v sudo >/dev/null 2>&1 || die "need root for: $* (install sudo or run as root)"
        sudo "$@"
    fi
}

# Run a command as the OS user that owns the cluster.  Runs from / so that an
# unreadable current directory (e.g. /root/...) does not produce warnings.
as_server() {
    if [ -n "$PG_RUNAS" ]; then
        (cd / && runuser -u "$PG_RUNAS" -- "$@")
    else
        "$@"
    fi
}

# Set PG_BINDIR (in the current shell) from pg_config unless already set.
# Lazy because pg_config may not exist before `make setup`.
require_pg_bindir() {
    if [ -z "${PG_BINDIR:-}" ]; then
        [ -x "$PG_CONFIG" ] || die "pg_config not found at $PG_CONFIG (run 'make setup' or set PG_CONFIG)"
        PG_BINDIR="$("$PG_CONFIG" --bindir)"
    fi
    export PG_BINDIR
}

# psql connected to the development cluster (over the unix socket) as the
# `postgres` superuser, database $PGDATABASE (default postgres).
# Extra arguments are passed to psql.  Call require_pg_bindir first.
cluster_psql() {
    "$PG_BINDIR/psql" -h "$SOCKET_DIR" -p "$PGPORT" -U postgres -d "${PGDATABASE:-postgres}" "$@"
}

# Give the installed litebase_streams.so a fresh inode (copy, then rename over
# it) before something rewrites it in place (cargo pgrx install / test do):
# a running server keeps executing the old, now unlinked, file instead of
# having its mapped code change under it (which crashes its processes).
# The running server picks up the new build on its next restart.
detach_installed_library() {
    local lib
    lib="$("$PG_CONFIG" --pkglibdir)/${EXT_NAME}.so"
    [ -f "$lib" ] || return 0
    as_root cp -p "$lib" "$lib.fresh"
    as_root mv -f "$lib.fresh" "$lib"
}
