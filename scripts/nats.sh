#!/usr/bin/env bash
# A local nats-server with JetStream for the bridge (`make bridge`), beside
# the development cluster.
#
#   scripts/nats.sh start    start nats-server (JetStream, file store under
#                            NATS_DIR, 127.0.0.1:NATS_PORT) unless it runs;
#                            print its URL
#   scripts/nats.sh stop     stop it (its store stays: JetStream keeps what
#                            the bridge stored)
#   scripts/nats.sh status   exit 0 if running, 3 if not
#
# Settings (besides scripts/common.sh's):
#   NATS_PORT          client port on 127.0.0.1 (default 4222)
#   NATS_MONITOR_PORT  its HTTP monitoring port (default 8222: /jsz?streams=1)
#   NATS_DIR           its store, log and pid file (default: $PGDATA_DIR-nats)
#   NATS_SERVER_BIN    the binary (default: nats-server on PATH, or /usr/sbin/nats-server)
#
# The integration tests (tests/common/nats.rs) start their own servers on
# free ports; this one is for trying the bridge by hand.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NATS_PORT="${NATS_PORT:-4222}"
NATS_MONITOR_PORT="${NATS_MONITOR_PORT:-8222}"
NATS_DIR="${NATS_DIR:-${PGDATA_DIR}-nats}"
NATS_PID="$NATS_DIR/nats-server.pid"
NATS_LOG="$NATS_DIR/nats-server.log"

nats_bin() {
    if [ -n "${NATS_SERVER_BIN:-}" ]; then
        printf '%s\n' "$NATS_SERVER_BIN"
    elif command -v nats-server >/dev/null 2>&1; then
        command -v nats-server
    elif [ -x /usr/sbin/nats-server ]; then
        printf '%s\n' /usr/sbin/nats-server
    else
        die "nats-server not found (run 'make setup': it installs the Debian package nats-server)"
    fi
}

running() {
    [ -f "$NATS_PID" ] && kill -0 "$(cat "$NATS_PID")" 2>/dev/null
}

case "${1:-}" in
    start)
        if running; then
            info "nats-server already running (pid $(cat "$NATS_PID"))"
        else
            mkdir -p "$NATS_DIR/store"
            # A session of its own: Ctrl-C of `make bridge` stops the bridge, not it.
            setsid "$(nats_bin)" -js -a 127.0.0.1 -p "$NATS_PORT" -m "$NATS_MONITOR_PORT" -sd "$NATS_DIR/store" \
                -P "$NATS_PID" -l "$NATS_LOG" < /dev/null > /dev/null 2>&1 &
            for _ in $(seq 1 100); do
                if (exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT") 2>/dev/null; then
                    break
                fi
                sleep 0.1
            done
            running || die "nats-server did not start; its log: $NATS_LOG"
        fi
        echo "nats://127.0.0.1:$NATS_PORT (monitoring: http://127.0.0.1:$NATS_MONITOR_PORT/jsz?streams=1)"
        ;;
    stop)
        if running; then
            kill "$(cat "$NATS_PID")"
            info "nats-server stopped"
        else
            info "nats-server not running"
        fi
        ;;
    status)
        if running; then
            echo "nats-server running (pid $(cat "$NATS_PID")) on 127.0.0.1:$NATS_PORT"
        else
            echo "nats-server not running"
            exit 3
        fi
        ;;
    *)
        die "usage: $0 start|stop|status"
        ;;
esac
