#!/usr/bin/env bash
# Run every test suite, keep going after a failure, print a summary (each
# suite's `test result:` lines) and exit non-zero if anything failed.
# Expects `make setup install start` to have run (the Makefile's `test` does).
#
# First, one after the other (they compete for the CPU: mostly compiling):
#   lint: scripts/lint.sh           cargo fmt --check, clippy -D warnings, import cycles
#   core: cargo test -p litebase-streams-core   the pure logic (core/), no server
#   (a) cargo pgrx test pg15       #[test] + #[pg_test] in src/, in a throwaway
#                                  cluster that pgrx creates (as `postgres` when root)
#   package: scripts/package-test.sh   the Debian package installed with dpkg -i
#   the gateway's and the bridge's builds and unit tests, every test binary compiled
# Then, at the same time (they mostly wait on the servers), on two clusters:
#   on the dev cluster:
#   (b) cargo test --test '*'      tests/*.rs, with LITEBASE_STREAMS_* variables
#                                  describing the cluster (they restart it)
#   on a second cluster (port PGPORT + 1, data directory PGDATA_DIR-second):
#   (c) scripts/doctest.py         every code block of README.md and docs/*.md
#   (d) bench/bench.py --quick     the benchmark harness, as a smoke run
#   (e) the client libraries' tests (clients/python, clients/js, clients/rust)
#   (f) make docs                  the API references build
#
# Logs: $TEST_LOG_DIR (default target/test-logs/); the second cluster's suites
# print their output when they are done.
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

# Each suite appends "exit status<TAB>title<TAB>log" here, also from the
# suites that run in the background.
RESULTS_TSV="$LOG_DIR/results.tsv"
: >"$RESULTS_TSV"

# run_suite "Title" logname cmd [args...]
run_suite() {
    local title="$1" log="$LOG_DIR/$2.log" rc
    shift 2
    say "$title"
    info "\$ $(printf '%q ' "$@")"
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$rc" "$title" "$log" >>"$RESULTS_TSV"
    return 0
}

skip_suite() {
    say "$1: skipped ($2)"
    printf 'SKIP: %s\t%s\t\n' "$2" "$1" >>"$RESULTS_TSV"
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

# --- the gateway (gateway/) and the bridge (bridge/): their optimised builds, which
# tests/gateway.rs and tests/bridge.rs start and the benchmark smoke run and the doc
# test drive (the `gateway` profile: release without the extension's fat LTO), and
# their unit tests. In the background, beside the suites up to the Debian package:
# cargo locks one profile's directory at a time (target/gateway here, target/debug
# there), and two builds keep both cores busy through each other's serial stretches
# (linking, the crates everything waits for). Each package is built alone, as
# `make gateway`, `make bridge`, the doc test and the bench build it: built together,
# cargo unifies their dependencies' features into a third set, and each of those
# builds compiled them all again.
gateway_suites() {
    run_suite "gateway and bridge builds and unit tests (cargo build/test --profile gateway)" gateway-build \
        bash -c 'set -e
                 cargo build --profile gateway -p litebase-streams-gateway --bins
                 cargo build --profile gateway -p litebase-streams-bridge --bins
                 cargo test --profile gateway -p litebase-streams-gateway
                 cargo test --profile gateway -p litebase-streams-bridge'
}
say "the gateway's and the bridge's builds run in the background (output: $LOG_DIR/gateway.out)"
gateway_suites >"$LOG_DIR/gateway.out" 2>&1 &
GATEWAY_JOB=$!

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

# --- the Debian package: built from the release build above, installed with dpkg -i,
# CREATE EXTENSION in a fresh cluster of its own (then the dev build is put back) ---
if [ "$IS_ROOT" -ne 1 ]; then
    skip_suite "Debian package (make package, dpkg -i)" "needs root for dpkg -i"
else
    run_suite "Debian package (make package, dpkg -i, CREATE EXTENSION in a fresh cluster)" package \
        bash -c 'bash "$1"/package.sh && bash "$1"/package-test.sh' _ "$REPO_ROOT/scripts"
fi

# --- every test binary the parallel part below runs, so that it starts with nothing
# to compile (the test profile's directory, free again after the pgrx tests) ---------
say "waiting for the gateway's and the bridge's builds"
wait "$GATEWAY_JOB"
cat "$LOG_DIR/gateway.out"
run_suite "test binaries (cargo test --no-run: tests/*.rs, clients/rust)" test-build \
    bash -c 'set -e
             cargo test --no-run --features integration --test "*"
             if [ -f clients/rust/Cargo.toml ]; then
                 cargo test --no-run -p litebase-streams-client --features integration
             fi'

# The LITEBASE_STREAMS_* variables describing a cluster (port $1, data directory $2)
# to the tests (tests/common/mod.rs and the client libraries' tests read them).
cluster_env() {
    local port="$1" data="$2"
    printf '%s\n' \
        "LITEBASE_STREAMS_DSN=host=127.0.0.1 port=$port user=postgres dbname=postgres" \
        "LITEBASE_STREAMS_PGDATA=$data" \
        "LITEBASE_STREAMS_PGHOST=$data/socket" \
        "LITEBASE_STREAMS_PGPORT=$port" \
        "LITEBASE_STREAMS_PG_BINDIR=$PG_BINDIR" \
        "LITEBASE_STREAMS_PG_CONFIG=$PG_CONFIG" \
        "LITEBASE_STREAMS_SERVER_LOG=$data/server.log" \
        "LITEBASE_STREAMS_RUNAS=$PG_RUNAS" \
        "LITEBASE_STREAMS_SCRATCH_DIR=$SCRATCH_DIR"
}
mkdir -p "$SCRATCH_DIR"
[ -z "$PG_RUNAS" ] || chown "$PG_RUNAS:" "$SCRATCH_DIR"
chmod 755 "$SCRATCH_DIR"

# --- the second cluster: the doc test, the bench smoke run and the client libraries'
# tests, while the integration tests (which restart the dev cluster and kill its
# workers) run on the dev cluster ---------------------------------------------------
SECOND_PORT=$((PGPORT + 1))
SECOND_PGDATA="${PGDATA_DIR}-second"
# What scripts/common.sh, scripts/doctest.py and bench/common.py read to find a cluster.
second() { env PGPORT="$SECOND_PORT" PGDATA_DIR="$SECOND_PGDATA" PGHOST="$SECOND_PGDATA/socket" "$@"; }
mapfile -t SECOND_ENV < <(cluster_env "$SECOND_PORT" "$SECOND_PGDATA")

second_cluster_suites() {
    run_suite "second cluster (port $SECOND_PORT) for the suites below" second-cluster \
        second bash "$REPO_ROOT/scripts/cluster.sh" start
    # (c) the doc test: the examples run in order, in one database, undisturbed.
    run_suite "doc test (README.md, docs/*.md: scripts/doctest.py)" doctest \
        second python3 "$REPO_ROOT/scripts/doctest.py"
    # (d) benchmark smoke run, so the harness never rots.
    run_suite "benchmark smoke run (bench/bench.py --quick)" bench \
        second python3 "$REPO_ROOT/bench/bench.py" --quick
    # (e) the client libraries, each against the same cluster, in databases of their own.
    local lang
    for lang in python js; do
        if [ -f "$REPO_ROOT/clients/$lang/test.sh" ]; then
            run_suite "client library: $lang (clients/$lang/test.sh)" "client-$lang" \
                env "${SECOND_ENV[@]}" bash "$REPO_ROOT/clients/$lang/test.sh"
        else
            skip_suite "client library: $lang" "no clients/$lang/test.sh"
        fi
    done
    if [ -f "$REPO_ROOT/clients/rust/Cargo.toml" ]; then
        run_suite "client library: rust (cargo test -p litebase-streams-client)" client-rust \
            env "${SECOND_ENV[@]}" cargo test --no-fail-fast -p litebase-streams-client --features integration
    fi
    # (f) the API references.
    run_suite "API references (make docs)" docs make -s -C "$REPO_ROOT" docs
    second bash "$REPO_ROOT/scripts/cluster.sh" stop >/dev/null 2>&1 || true
}

say "the second cluster's suites run in the background (output: $LOG_DIR/second.out)"
second_cluster_suites >"$LOG_DIR/second.out" 2>&1 &
SECOND_JOB=$!

# --- (b) integration tests against the dev cluster ------------------------------
if compgen -G "$REPO_ROOT/tests/*.rs" >/dev/null; then
    mapfile -t DEV_ENV < <(cluster_env "$PGPORT" "$PGDATA_DIR")
    run_suite "integration tests (cargo test --test '*')" integration \
        env "${DEV_ENV[@]}" cargo test --no-fail-fast --features integration --test '*' -- --test-threads=4
else
    skip_suite "integration tests (cargo test --test '*')" "no tests/*.rs"
fi

say "waiting for the second cluster's suites"
wait "$SECOND_JOB"
cat "$LOG_DIR/second.out"

# --- summary -----------------------------------------------------------------------
echo
say "summary"
FAILED=0
while IFS=$'\t' read -r rc title log; do
    case "$rc" in
        0) result=PASS ;;
        SKIP*) result="$rc" ;;
        *) result="FAIL (exit $rc)" FAILED=$((FAILED + 1)) ;;
    esac
    printf '  [%s] %s\n' "$result" "$title"
    [ -n "$log" ] || continue
    # "test result:" lines, labelled with the test binary they belong to.
    lines="$(sed 's/\x1b\[[0-9;]*m//g' "$log" | awk '
        /^ +Running (unittests )?[^ ]+ \(/ { name = ($2 == "unittests") ? $3 : $2; next }
        /^ *Doc-tests / { name = "doc-tests " $2; next }
        /^test result:/ { printf "%-22s %s\n", name ":", $0 }')"
    if [ -n "$lines" ]; then
        printf '%s\n' "$lines" | sed 's/^/      /'
    elif [[ "$title" == *tests* ]]; then
        printf '      (no "test result:" lines: build failure? see %s)\n' "$log"
    fi
    printf '      log: %s\n' "$log"
done <"$RESULTS_TSV"
if [ "$FAILED" -gt 0 ]; then
    say "$FAILED suite(s) FAILED"
    exit 1
fi
say "all suites passed"
