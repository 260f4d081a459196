#!/usr/bin/env bash
# Manage the development cluster (independent of Debian's 15/main on 5432).
#
#   scripts/cluster.sh start     create (initdb) if missing, (re)write our config
#                                block, start unless running; restarts a running
#                                server if litebase_streams.so was reinstalled
#                                since it started
#   scripts/cluster.sh stop      fast shutdown if running
#   scripts/cluster.sh restart
#   scripts/cluster.sh status    exit 0 if running, 3 if stopped/missing
#   scripts/cluster.sh psql [ARGS]   start if needed, CREATE EXTENSION IF NOT
#                                EXISTS, then exec psql (ARGS passed through)
#   scripts/cluster.sh env       print shell exports (eval "$(scripts/cluster.sh env)")
#   scripts/cluster.sh destroy   stop and delete the data directory
#
# Settings come from the environment, see scripts/common.sh.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CONF_BEGIN="# >>> ${EXT_NAME} dev cluster (managed by scripts/cluster.sh; rewritten on start) >>>"
CONF_END="# <<< ${EXT_NAME} dev cluster <<<"

pg_ctl() { as_server "$PG_BINDIR/pg_ctl" "$@"; }

is_initialized() { [ -f "$PGDATA_DIR/PG_VERSION" ]; }

is_running() {
    is_initialized || return 1
    pg_ctl -D "$PGDATA_DIR" status >/dev/null 2>&1
}

installed_lib() {
    printf '%s/%s.so\n' "$("$PG_CONFIG" --pkglibdir)" "$EXT_NAME"
}

check_server_user() {
    if [ -n "$PG_RUNAS" ]; then
        id -u "$PG_RUNAS" >/dev/null 2>&1 ||
            die "OS user '$PG_RUNAS' does not exist (run 'make setup': the postgresql-15 package creates it)"
        command -v runuser >/dev/null 2>&1 || die "runuser not found (util-linux)"
    fi
}

check_socket_path() {
    # sun_path is 108 bytes on Linux, including the NUL.
    local sock="$SOCKET_DIR/.s.PGSQL.$PGPORT"
    if [ "${#sock}" -gt 103 ]; then
        die "unix socket path too long (${#sock} > 103 bytes): $sock
       set a shorter PGDATA_DIR, e.g. make start PGDATA_DIR=/tmp/${EXT_NAME}-cluster-$PGPORT"
    fi
}

create_cluster() {
    if [ -e "$PGDATA_DIR" ] && [ -n "$(ls -A "$PGDATA_DIR" 2>/dev/null)" ]; then
        die "$PGDATA_DIR exists, is not empty and is not a PostgreSQL data directory; remove it or set PGDATA_DIR"
    fi
    say "initdb $PGDATA_DIR"
    mkdir -p "$PGDATA_DIR"
    if [ -n "$PG_RUNAS" ]; then
        chown "$PG_RUNAS:" "$PGDATA_DIR"
        as_server test -w "$PGDATA_DIR" ||
            die "user '$PG_RUNAS' cannot reach/write $PGDATA_DIR (a parent directory is not traversable?); set PGDATA_DIR elsewhere, e.g. under /tmp"
    fi
    chmod 700 "$PGDATA_DIR"
    as_server "$PG_BINDIR/initdb" -D "$PGDATA_DIR" --auth=trust -U postgres \
        --encoding=UTF8 --locale=C.UTF-8 >"$PGDATA_DIR.initdb.log" 2>&1 || {
        cat "$PGDATA_DIR.initdb.log" >&2
        rm -f "$PGDATA_DIR.initdb.log"
        die "initdb failed"
    }
    rm -f "$PGDATA_DIR.initdb.log"
}

# (Re)write our settings block at the end of postgresql.conf.  Later entries
# win, so this overrides initdb's defaults; rewriting on every start keeps it
# in sync with PGPORT/PGDATA_DIR.  ALTER SYSTEM (postgresql.auto.conf) still
# overrides it.
write_config() {
    local conf="$PGDATA_DIR/postgresql.conf" tmp
    tmp="$(mktemp)"
    awk -v b="$CONF_BEGIN" -v e="$CONF_END" '
        $0 == b {skip = 1; next}
        $0 == e {skip = 0; next}
        !skip' "$conf" >"$tmp"
    cat >>"$tmp" <<EOF
$CONF_BEGIN
port = $PGPORT
unix_socket_directories = '$SOCKET_DIR'
listen_addresses = '127.0.0.1'
shared_preload_libraries = '$EXT_NAME'
track_commit_timestamp = on
max_worker_processes = 32
max_connections = 200
max_prepared_transactions = 10
$CONF_END
EOF
    # Keep ownership/permissions of the original file.
    cat "$tmp" >"$conf"
    rm -f "$tmp"
}

cmd_start() {
    require_pg_bindir
    check_server_user
    check_socket_path
    local lib
    lib="$(installed_lib)"
    [ -f "$lib" ] || die "$lib not found: the server preloads $EXT_NAME, run 'make install' first"

    if is_running; then
        if [ "$lib" -nt "$PGDATA_DIR/postmaster.pid" ]; then
            say "$EXT_NAME.so was reinstalled since the server started: restarting"
            cmd_stop
        else
            say "cluster already running (port $PGPORT, $PGDATA_DIR)"
            return 0
        fi
    fi

    is_initialized || create_cluster
    if [ ! -d "$SOCKET_DIR" ]; then
        as_server mkdir -p "$SOCKET_DIR"
    fi
    as_server chmod 755 "$SOCKET_DIR"
    write_config

    say "starting cluster on port $PGPORT ($PGDATA_DIR, log $SERVER_LOG)"
    if ! pg_ctl -D "$PGDATA_DIR" -l "$SERVER_LOG" -w -t 60 start >/dev/null; then
        echo "---- tail of $SERVER_LOG ----" >&2
        tail -n 30 "$SERVER_LOG" >&2 || true
        die "pg_ctl start failed (port $PGPORT in use? see $SERVER_LOG)"
    fi
    "$PG_BINDIR/pg_isready" -q -h "$SOCKET_DIR" -p "$PGPORT" -U postgres -d postgres -t 30 ||
        die "server started but is not accepting connections (see $SERVER_LOG)"
    info "running: psql -h $SOCKET_DIR -p $PGPORT -U postgres postgres"
}

cmd_stop() {
    if ! is_initialized; then
        say "no cluster at $PGDATA_DIR (nothing to stop)"
        return 0
    fi
    require_pg_bindir
    check_server_user
    if is_running; then
        say "stopping cluster ($PGDATA_DIR)"
        pg_ctl -D "$PGDATA_DIR" -m fast -w -t 120 stop >/dev/null
    else
        say "cluster not running ($PGDATA_DIR)"
    fi
}

cmd_status() {
    if ! is_initialized; then
        echo "no cluster at $PGDATA_DIR"
        return 3
    fi
    require_pg_bindir
    if is_running; then
        echo "running: port $PGPORT, data $PGDATA_DIR, socket $SOCKET_DIR, log $SERVER_LOG"
        return 0
    fi
    echo "stopped: data $PGDATA_DIR"
    return 3
}

cmd_psql() {
    cmd_start
    say "CREATE EXTENSION IF NOT EXISTS $EXT_NAME"
    cluster_psql -X -q -v ON_ERROR_STOP=1 -c "CREATE EXTENSION IF NOT EXISTS $EXT_NAME" ||
        die "CREATE EXTENSION failed (did 'make install' succeed?)"
    exec "$PG_BINDIR/psql" -h "$SOCKET_DIR" -p "$PGPORT" -U postgres -d "${PGDATABASE:-postgres}" "$@"
}

cmd_env() {
    require_pg_bindir
    cat <<EOF
export PGHOST='$SOCKET_DIR'
export PGPORT='$PGPORT'
export PGUSER=postgres
export PGDATABASE=postgres
export PGDATA_DIR='$PGDATA_DIR'
export PG_BINDIR='$PG_BINDIR'
EOF
}

cmd_destroy() {
    cmd_stop
    if [ -e "$PGDATA_DIR" ]; then
        case "$PGDATA_DIR" in
            / | /tmp | /root | /home | "$HOME" | "$REPO_ROOT") die "refusing to delete $PGDATA_DIR" ;;
        esac
        if [ -n "$(ls -A "$PGDATA_DIR" 2>/dev/null)" ] && ! is_initialized; then
            die "$PGDATA_DIR does not look like a data directory (no PG_VERSION); not deleting it"
        fi
        say "removing $PGDATA_DIR"
        rm -rf -- "$PGDATA_DIR"
    fi
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_stop; cmd_start ;;
    status) cmd_status ;;
    psql) shift; cmd_psql "$@" ;;
    env) cmd_env ;;
    destroy) cmd_destroy ;;
    *) echo "usage: $0 start|stop|restart|status|psql [psql args]|env|destroy" >&2; exit 2 ;;
esac
