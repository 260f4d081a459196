#!/usr/bin/env bash
# Test the Debian package that scripts/package.sh built (make package) the way
# an operator uses it, on this machine:
#   1. dpkg -i the package (as root);
#   2. initdb a fresh cluster in a temporary directory, as the server's OS
#      user, on a free port, with shared_preload_libraries = 'litebase_streams'
#      and track_commit_timestamp = on; start it;
#   3. CREATE EXTENSION in one database: the current version, its worker runs,
#      an event published is read back by streams.replay;
#   4. in a second database: CREATE EXTENSION ... VERSION '0.1.0' fails with
#      the package's files alone (old install scripts are not shipped); with
#      the repository's frozen 0.1.0 script put beside them for that one
#      statement it works, an event is published, and ALTER EXTENSION UPDATE
#      reaches the package's version through the package's upgrade steps and
#      keeps the event;
#   5. dpkg -L lists the library, the control file, the install script and
#      every upgrade step of sql/ in PostgreSQL 15's directories, and no
#      install script of an older version; dpkg --verify finds them intact.
# Files of the extension that an earlier install.sh left in those directories
# and the package lacks are moved aside for the test (else they would hide
# a missing upgrade step) and put back after it.
# On exit (trap), whatever happened: the cluster is stopped and deleted, the
# package is removed from dpkg's database WITHOUT deleting its files (local
# diversions point dpkg's removal elsewhere, so there is no moment without a
# library or control file for the dev cluster's new backends), and
# `scripts/install.sh --place-only` puts the dev build (target/install-stage,
# the one the package was made from) back in place.
#
# The running dev cluster is not disturbed: dpkg writes each file as
# <name>.dpkg-new and renames it over the old one, as install.sh does, so a
# server keeps the library it mapped (the old inode); the test checks that the
# library's inode changed and that the dev cluster still answers. The dev
# cluster is not restarted (it picks the library up on its next `make start`).
#
#   package-test.sh [DEB]   default: the one .deb in target/package/
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$REPO_ROOT"
require_pg_bindir
TARGET="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
pkglibdir="$("$PG_CONFIG" --pkglibdir)"
extdir="$("$PG_CONFIG" --sharedir)/extension"
lib="$pkglibdir/$EXT_NAME.so"
DIVERT_SUFFIX=".package-test-kept"

fail() { die "package test: $*"; }
pass() { info "ok: $*"; }

# wait_until SECONDS WHAT COMMAND...: run COMMAND until it succeeds; fail
# with WHAT after SECONDS.
wait_until() {
    local seconds="$1" what="$2" deadline
    shift 2
    deadline=$(($(date +%s) + seconds))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "timed out after ${seconds}s waiting until $what"
        sleep 0.1
    done
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# q DB SQL: one statement on the test cluster, unaligned tuples only; stops at the first error.
q() {
    "$PG_BINDIR/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$SOCK" -p "$PORT" -U postgres -d "$1" -c "$2"
}

# expect DB SQL WANT WHAT: the statement's output is WANT.
expect() {
    local got
    got="$(q "$1" "$2")" || fail "$4: the statement failed: $2"
    [ "$got" = "$3" ] || fail "$4: expected '$3', got '$got' from: $2"
    pass "$4"
}

# Paths the package owns (dpkg -L), one a line.
owned_files() { dpkg -L "$PKG" 2>/dev/null; }

# ---- clean-up --------------------------------------------------------------

INSTALLED=0 OLD_SCRIPT="" TMP="" DATA="" HIDDEN=()

# Remove the package from dpkg's database, keeping its files in PostgreSQL's
# directories (its doc files go): a local diversion of each makes dpkg remove
# <file>.package-test-kept (which does not exist) instead of the file itself.
forget_package() {
    local files f
    files="$(owned_files | grep -E "^($pkglibdir|$extdir)/[^/]+\$" || true)"
    while read -r f; do
        [ -n "$f" ] && as_root dpkg-divert --quiet --local --no-rename --divert "$f$DIVERT_SUFFIX" --add "$f"
    done <<<"$files"
    as_root dpkg --remove "$PKG" >"$TMP/dpkg-remove.log" 2>&1 || { cat "$TMP/dpkg-remove.log" >&2; warn "dpkg --remove $PKG failed"; }
    remove_diversions
}

remove_diversions() {
    local f
    dpkg-divert --list | sed -n "s|^local diversion of \(.*\) to .*$DIVERT_SUFFIX\$|\1|p" | while read -r f; do
        as_root dpkg-divert --quiet --local --no-rename --remove "$f"
    done
}

# Files of the extension in PostgreSQL's directories that the package does
# not hold (an earlier install.sh left them) would make the test pass for a
# package that lacks them: move them into $TMP/hidden for the test.
hide_strays() {
    local shipped f
    shipped="$(dpkg-deb -c "$DEB" | awk '{ print substr($6, 2) }')"
    mkdir -p "$TMP/hidden"
    for f in "$extdir/$EXT_NAME".* "$extdir/$EXT_NAME"--*.sql "$pkglibdir/$EXT_NAME".*; do
        [ -f "$f" ] || continue
        grep -qxF -- "$f" <<<"$shipped" && continue
        as_root mv -- "$f" "$TMP/hidden/"
        HIDDEN+=("$f")
        info "hidden for the test (not in the package): $f"
    done
}

# Put the hidden files back where nothing took their place (rename-safe).
restore_strays() {
    local f
    for f in "${HIDDEN[@]}"; do
        [ -e "$f" ] && continue
        as_root install -m 644 "$TMP/hidden/$(basename "$f")" "$f.restoring.$$" && as_root mv -f "$f.restoring.$$" "$f"
    done
}

cleanup() {
    local status=$?
    set +e
    if [ -n "$DATA" ] && [ -f "$DATA/postmaster.pid" ]; then
        as_server "$PG_BINDIR/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1
    fi
    [ -n "$OLD_SCRIPT" ] && as_root rm -f -- "$OLD_SCRIPT"
    if [ "$INSTALLED" -eq 1 ]; then
        forget_package
        restore_strays
        if [ -f "$TARGET/install-stage$lib" ]; then
            bash "$REPO_ROOT/scripts/install.sh" --place-only >/dev/null \
                || warn "scripts/install.sh --place-only failed: run 'make install' to put the dev build back"
        else
            warn "nothing staged in $TARGET/install-stage: run 'make install' to put the dev build back"
        fi
    fi
    if [ "$status" -ne 0 ] && [ -n "$TMP" ] && [ -f "$TMP/server.log" ]; then
        printf -- '--- last lines of the test server log (%s) ---\n' "$TMP/server.log" >&2
        tail -n 20 "$TMP/server.log" >&2
    fi
    [ -n "$TMP" ] && rm -rf -- "$TMP"
    if [ "$status" -eq 0 ]; then say "package test passed"; else printf 'package test FAILED\n' >&2; fi
    exit "$status"
}

# ---- the steps -------------------------------------------------------------

find_deb() {
    local debs=("$TARGET"/package/postgresql-15-litebase-streams_*_"$(dpkg --print-architecture)".deb)
    [ -f "${debs[0]}" ] || fail "no package in $TARGET/package: run 'make package' first"
    [ "${#debs[@]}" -eq 1 ] || fail "several packages in $TARGET/package, name one: ${debs[*]}"
    printf '%s\n' "${debs[0]}"
}

# Processes that have the installed library mapped (the dev cluster's).
mapping_pids() {
    grep -l -F -- "$lib" /proc/[0-9]*/maps 2>/dev/null | cut -d/ -f3 | sort -n || true
}

install_package() {
    local before="" after pids pid dev_pid=""
    [ -f "$lib" ] && before="$(stat -c %i "$lib")"
    pids="$(mapping_pids)"
    [ -f "$PGDATA_DIR/postmaster.pid" ] && dev_pid="$(head -n 1 "$PGDATA_DIR/postmaster.pid")"

    say "dpkg -i $(basename "$DEB")"
    remove_diversions # of an earlier run killed before its clean-up
    INSTALLED=1
    hide_strays
    as_root dpkg -i "$DEB" >"$TMP/dpkg.log" 2>&1 || { cat "$TMP/dpkg.log" >&2; fail "dpkg -i $DEB failed"; }
    [ "$(dpkg-query -W -f '${db:Status-Status} ${Version}' "$PKG")" = "installed $VERSION" ] \
        || fail "dpkg does not list $PKG $VERSION as installed"
    pass "dpkg -i installed $PKG $VERSION"

    after="$(stat -c %i "$lib")"
    if [ -n "$before" ]; then
        [ "$before" != "$after" ] || fail "dpkg rewrote $lib in place (same inode): a running server's mapped library changed"
        pass "the library is a new file (inode $before -> $after): a running server keeps the one it mapped"
    fi
    for pid in $pids; do
        [ -d "/proc/$pid" ] || continue # ended by itself (a backend that finished)
        grep -qF -- "$lib (deleted)" "/proc/$pid/maps" 2>/dev/null || [ ! -d "/proc/$pid" ] \
            || fail "process $pid no longer maps the old, unlinked library"
    done
    [ -z "$pids" ] || pass "the $(wc -w <<<"$pids") processes that had the library mapped keep the old one (deleted)"
    if [ -n "$dev_pid" ] && kill -0 "$dev_pid" 2>/dev/null; then
        PGDATABASE=postgres cluster_psql -X -A -t -c 'SELECT 1' >/dev/null 2>&1 \
            || fail "the dev cluster (pid $dev_pid) stopped answering after dpkg -i"
        pass "the dev cluster (pid $dev_pid) still answers"
    fi
}

start_cluster() {
    PORT="$(free_port)"
    DATA="$TMP/data"
    SOCK="$TMP/socket"
    mkdir -p "$SOCK"
    [ -n "$PG_RUNAS" ] && chown "$PG_RUNAS" "$TMP" "$SOCK"
    say "initdb a fresh cluster in $DATA (port $PORT)"
    as_server "$PG_BINDIR/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 \
        >"$TMP/initdb.log" 2>&1 || { cat "$TMP/initdb.log" >&2; fail "initdb failed"; }
    cat >>"$DATA/postgresql.conf" <<EOF
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$SOCK'
shared_preload_libraries = '$EXT_NAME'
track_commit_timestamp = on
max_worker_processes = 8
EOF
    as_server "$PG_BINDIR/pg_ctl" -D "$DATA" -l "$TMP/server.log" -w -t 60 start >/dev/null \
        || fail "the test cluster did not start"
    expect postgres "SHOW shared_preload_libraries" "$EXT_NAME" "the test cluster runs with the library preloaded"
}

worker_runs() { [ "$(q "$1" "SELECT streams.worker_pid() IS NOT NULL")" = t ]; }
event_replayed() { [ "$(q "$1" "SELECT count(*) FROM streams.replay(stream => 'package.test') WHERE data = '$2'")" = 1 ]; }

test_fresh_install() {
    local db=lbs_package_new
    say "CREATE EXTENSION $EXT_NAME in database $db"
    q postgres "CREATE DATABASE $db" >/dev/null
    q "$db" "CREATE EXTENSION $EXT_NAME" >/dev/null || fail "CREATE EXTENSION $EXT_NAME failed"
    expect "$db" "SELECT extversion FROM pg_extension WHERE extname = '$EXT_NAME'" "$EXT_VERSION" \
        "CREATE EXTENSION installs $EXT_VERSION"
    wait_until 30 "the worker of $db runs (streams.worker_pid() not null)" worker_runs "$db"
    pass "the worker of $db runs (pid $(q "$db" "SELECT streams.worker_pid()"))"
    q "$db" "SELECT streams.publish('package.test', '{\"n\": 1}')" >/dev/null || fail "streams.publish failed"
    wait_until 30 "the published event replays" event_replayed "$db" '{"n": 1}'
    pass "an event published is read back by streams.replay"
}

# The first released version: the oldest frozen install script in sql/.
oldest_version() {
    local f v
    for f in sql/"$EXT_NAME"--*.sql; do
        v="$(basename "$f" .sql)"
        v="${v#"$EXT_NAME"--}"
        case "$v" in *--*) ;; *) printf '%s\n' "$v" ;; esac
    done | sort -V | head -n 1
}

test_upgrade() {
    local db=lbs_package_upgrade out first
    first="$(oldest_version)"
    say "CREATE EXTENSION $EXT_NAME VERSION '$first', then ALTER EXTENSION UPDATE, in database $db"
    q postgres "CREATE DATABASE $db" >/dev/null

    if out="$(q "$db" "CREATE EXTENSION $EXT_NAME VERSION '$first'" 2>&1)"; then
        fail "CREATE EXTENSION ... VERSION '$first' worked with the package's files: it ships an old install script"
    fi
    case "$out" in
        *"has no installation script"* | *"no installation script nor update path"*) ;;
        *) fail "CREATE EXTENSION ... VERSION '$first' failed for another reason: $out" ;;
    esac
    pass "the package installs no install script of $first (CREATE EXTENSION ... VERSION '$first' fails)"

    # The repository's frozen script, for this one statement (as tests/upgrade.rs does).
    OLD_SCRIPT="$extdir/$EXT_NAME--$first.sql"
    as_root install -m 644 "sql/$EXT_NAME--$first.sql" "$OLD_SCRIPT"
    out="$(q "$db" "CREATE EXTENSION $EXT_NAME VERSION '$first'" 2>&1)" || fail "CREATE EXTENSION ... VERSION '$first': $out"
    as_root rm -f -- "$OLD_SCRIPT"
    OLD_SCRIPT=""
    expect "$db" "SELECT extversion FROM pg_extension WHERE extname = '$EXT_NAME'" "$first" "installed $first"
    q "$db" "SELECT streams.publish('package.test', '{\"n\": 2}')" >/dev/null || fail "streams.publish at $first failed"

    out="$(q "$db" "ALTER EXTENSION $EXT_NAME UPDATE" 2>&1)" \
        || fail "ALTER EXTENSION $EXT_NAME UPDATE from $first failed: $out"
    expect "$db" "SELECT extversion FROM pg_extension WHERE extname = '$EXT_NAME'" "$EXT_VERSION" \
        "ALTER EXTENSION UPDATE went from $first to $EXT_VERSION"
    wait_until 30 "the worker of $db runs after the update" worker_runs "$db"
    wait_until 30 "the event published at $first replays after the update" event_replayed "$db" '{"n": 2}'
    pass "the event published at $first replays after the update"
}

test_files() {
    local owned want f
    owned="$(owned_files)"
    want=("$lib" "$extdir/$EXT_NAME.control" "$extdir/$EXT_NAME--$EXT_VERSION.sql")
    for f in sql/"$EXT_NAME"--*--*.sql; do want+=("$extdir/$(basename "$f")"); done
    for f in "${want[@]}"; do
        grep -qxF -- "$f" <<<"$owned" || fail "dpkg -L $PKG does not list $f"
    done
    pass "dpkg -L lists the library, the control file, the install script and $((${#want[@]} - 3)) upgrade steps:" \
        "${want[@]##*/}"
    if grep -E "^$extdir/$EXT_NAME--[^-]+\.sql\$" <<<"$owned" | grep -vxF "$extdir/$EXT_NAME--$EXT_VERSION.sql"; then
        fail "the package ships an install script of an older version (above)"
    fi
    pass "no install script of an older version"
    as_root dpkg --verify "$PKG" || fail "dpkg --verify $PKG: files on disk differ from the package"
    pass "dpkg --verify: the installed files match the package"
}

main() {
    DEB="${1:-$(find_deb)}"
    [ -f "$DEB" ] || fail "no such package: $DEB"
    PKG="$(dpkg-deb -f "$DEB" Package)"
    VERSION="$(dpkg-deb -f "$DEB" Version)"
    EXT_VERSION="${VERSION%-*}"
    command -v runuser >/dev/null 2>&1 || [ -z "$PG_RUNAS" ] || fail "runuser not found"
    # The clean-up removes the package again: never one an operator installed.
    if dpkg-query -W -f '${db:Status-Status}' "$PKG" 2>/dev/null | grep -qx installed; then
        fail "$PKG is installed already (by hand, or a run killed before its clean-up); this test installs and" \
            "removes it itself: 'dpkg -r $PKG && make install' first"
    fi

    TMP="$(mktemp -d /tmp/lbs-package-test.XXXXXX)"
    chmod 755 "$TMP"
    trap cleanup EXIT
    trap 'exit 130' INT TERM

    install_package
    start_cluster
    test_fresh_install
    test_upgrade
    test_files
}

main "$@"
