#!/usr/bin/env bash
# Run every test suite in order, keep going after a failure, print a summary
# (each suite's `test result:` lines) and exit non-zero if anything failed.
# Expects `make setup install start` to have run (the Makefile's `test` does).
#
#   lint: scripts/lint.sh           cargo fmt --check, clippy -D warnings, import cycles
#   core: cargo test -p litebase-streams-core   the pure logic (core/), no server
#   (a) cargo pgrx test pg15       #[test] + #[pg_test] in src/, in a throwaway
#                                  cluster that pgrx creates (as `postgres` when root)
#   (b) cargo test --test '*'      tests/*.rs against the dev cluster, with
#                                  LITEBASE_STREAMS_* variables describing it (the
#                                  gateway is built first: tests/gateway.rs starts it)
#   (c) scripts/doctest.py         every code block of README.md and docs/*.md, in
#                                  order, against the dev cluster (client libraries
#                                  cached in target/doctest/)
#   (d) bench/bench.py --quick     the benchmark harness, as a smoke run
#
# Logs: $TEST_LOG_DIR (default target/test-logs/).
set -uo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_pg_bindir
cd "$REPO_ROOT" || exit 1

LOG_DIR="${TEST_LOG_DIR:-$REPO_ROOT/target/test-logs}"
mkdir -p "$LOG_DIR" || exit 1
PGRX_TEST_PGDATA="${PGRX_TEST_PGDATA:-/tmp/${EXT_NAME}-pgrx-test}"
if [ "$IS_ROOT" -eq 1 ]; then
    SCRATCH_DIR="${LITEBASE_STREAMS_SCRATCH_DIR:-/tmp/${EXT_NAME}-scratch-${PGPORT}}"
else
    SCRATCH_DIR="${LITEBASE_STREAMS_SCRATCH_DIR:-${TMPDIR:-/tmp}/${EXT_NAME}-scratch-$(id -un)-${PGPORT}}"
fi

SUITES=() RESULTS=() LOGS=()
FAILED=0

# run_suite "Title" logname cmd [args...]
run_suite() {
    local title="$1" log="$LOG_DIR/$2.log" rc
    shift 2
    say "$title"
    info "\$ $(printf '%q ' "$@")"
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    SUITES+=("$title") LOGS+=("$log")
    if [ "$rc" -eq 0 ]; then
        RESULTS+=("PASS")
    else
        RESULTS+=("FAIL (exit $rc)")
        FAILED=$((FAILED + 1))
    fi
    return 0
}

skip_suite() {
    say "$1: skipped ($2)"
    SUITES+=("$1") RESULTS+=("SKIP: $2") LOGS+=("")
}

# Remove leftovers of pgrx test runs that were killed before their shutdown
# hook ran (their directories are named <pg major>-<pid of the test binary>).
clean_stale_pgrx_pgdata() {
    local d pid
    for d in "$PGRX_TEST_PGDATA"/*-*; do
        [ -d "$d" ] || continue
        pid="${d##*-}"
        case "$pid" in *[!0-9]*) continue ;; esac
        kill -0 "$pid" 2>/dev/null && continue
        if [ -f "$d/postmaster.pid" ]; then
            as_server "$PG_BINDIR/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true
        fi
        rm -rf -- "$d"
    done
}

# --- make lint first: formatting, clippy -D warnings, no import cycles ---------
run_suite "lint (make lint: fmt, clippy -D warnings, import cycles)" lint \
    bash "$REPO_ROOT/scripts/lint.sh"

# --- the pure logic (core/): plain unit tests, no server ------------------------
run_suite "core unit tests (cargo test -p litebase-streams-core)" core \
    cargo test -p litebase-streams-core

# --- (a) unit + #[pg_test] tests via cargo-pgrx ---------------------------------
# Note: `cargo pgrx test` runs `cargo test` on all targets; tests/*.rs need the
# `integration` feature (Cargo.toml), so they are left out here.  It also installs a debug/pg_test build of the
# extension into $PG_CONFIG's directories, which is why we reinstall below.
pgrx_test=(cargo pgrx test pg15)
if [ "$IS_ROOT" -eq 1 ]; then
    # PostgreSQL won't run as root: pgrx runs its test cluster via `sudo -u postgres`,
    # in a directory postgres can write.
    mkdir -p "$PGRX_TEST_PGDATA"
    chown "$PG_RUNAS:" "$PGRX_TEST_PGDATA"
    chmod 755 "$PGRX_TEST_PGDATA"
    clean_stale_pgrx_pgdata
    pgrx_test+=(--runas "$PG_RUNAS" --pgdata "$PGRX_TEST_PGDATA")
fi
# It installs a debug build over the release one: keep the running dev
# cluster on the library it loaded.
detach_installed_library
run_suite "pgrx tests (cargo pgrx test pg15)" pgrx-test \
    env -u PGHOST -u PGPORT -u PGDATABASE -u PGUSER -u LITEBASE_STREAMS_DSN "${pgrx_test[@]}"

# --- put the release build back and make sure the dev cluster runs it -----------
# shellcheck disable=SC2016
run_suite "reinstall release build + (re)start dev cluster" reinstall \
    bash -c 'bash "$1"/install.sh && bash "$1"/cluster.sh start' _ "$REPO_ROOT/scripts"

# --- the gateway (gateway/) and the bridge (bridge/): their optimised builds, which tests/gateway.rs and tests/bridge.rs start --
# and the benchmark smoke run drives (the `gateway` profile: release without
# the extension's fat LTO).
# Its unit tests run with the same profile, so they reuse its compiled dependencies.
run_suite "gateway and bridge build and unit tests (cargo build/test --profile gateway)" gateway-build \
    bash -c 'cargo build --profile gateway -p litebase-streams-gateway -p litebase-streams-bridge --bins &&
             cargo test --profile gateway -p litebase-streams-gateway -p litebase-streams-bridge'


# --- (b) integration tests against the dev cluster ------------------------------
if compgen -G "$REPO_ROOT/tests/*.rs" >/dev/null; then
    mkdir -p "$SCRATCH_DIR"
    [ -z "$PG_RUNAS" ] || chown "$PG_RUNAS:" "$SCRATCH_DIR"
    chmod 755 "$SCRATCH_DIR"
    run_suite "integration tests (cargo test --test '*')" integration \
        env LITEBASE_STREAMS_DSN="host=127.0.0.1 port=$PGPORT user=postgres dbname=postgres" \
            LITEBASE_STREAMS_PGDATA="$PGDATA_DIR" \
            LITEBASE_STREAMS_PGHOST="$SOCKET_DIR" \
            LITEBASE_STREAMS_PGPORT="$PGPORT" \
            LITEBASE_STREAMS_PG_BINDIR="$PG_BINDIR" \
            LITEBASE_STREAMS_PG_CONFIG="$PG_CONFIG" \
            LITEBASE_STREAMS_SERVER_LOG="$SERVER_LOG" \
            LITEBASE_STREAMS_RUNAS="$PG_RUNAS" \
            LITEBASE_STREAMS_SCRATCH_DIR="$SCRATCH_DIR" \
            cargo test --no-fail-fast --features integration --test '*' -- --test-threads=4
else
    skip_suite "integration tests (cargo test --test '*')" "no tests/*.rs"
fi

# --- (c) the doc test: the README's examples run as written -------------------------
# After the integration tests, which restart the cluster and kill workers: the
# examples run in order, in one database, and must not be disturbed.
run_suite "doc test (README.md, docs/*.md: scripts/doctest.py)" doctest \
    python3 "$REPO_ROOT/scripts/doctest.py"

# --- (d) benchmark smoke run, so the harness never rots ------------------------------
run_suite "benchmark smoke run (bench/bench.py --quick)" bench \
    python3 "$REPO_ROOT/bench/bench.py" --quick

# --- summary -----------------------------------------------------------------------
echo
say "summary"
for i in "${!SUITES[@]}"; do
    printf '  [%s] %s\n' "${RESULTS[$i]}" "${SUITES[$i]}"
    log="${LOGS[$i]}"
    [ -n "$log" ] || continue
    # "test result:" lines, labelled with the test binary they belong to.
    lines="$(sed 's/\x1b\[[0-9;]*m//g' "$log" | awk '
        /^ +Running (unittests )?[^ ]+ \(/ { name = ($2 == "unittests") ? $3 : $2; next }
        /^ *Doc-tests / { name = "doc-tests " $2; next }
        /^test result:/ { printf "%-22s %s\n", name ":", $0 }')"
    if [ -n "$lines" ]; then
        printf '%s\n' "$lines" | sed 's/^/      /'
    elif [[ "${SUITES[$i]}" == *tests* ]]; then
        printf '      (no "test result:" lines: build failure? see %s)\n' "$log"
    fi
    printf '      log: %s\n' "$log"
done
if [ "$FAILED" -gt 0 ]; then
    say "$FAILED suite(s) FAILED"
    exit 1
fi
say "all suites passed"
