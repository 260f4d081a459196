#!/usr/bin/env bash
# Guided walkthrough of litebase_streams against the development cluster.
# Run via `make demo` (which does setup, install and start first).
#
# To extend: add more `step "..."` headings followed by `sql "..."` calls.
#   step "title"          print a heading
#   sql "SQL or \meta"    echo the SQL, then run it through psql (stops the demo on error)
#   sql <<'SQL'           same, reading the script from stdin (heredoc)
#   ...
#   SQL
#   val=$(sql_value "SELECT ...")   run quietly, capture a single unaligned value
#   note "text"           print an explanatory line
#   pause                 wait for Enter when DEMO_PAUSE=1 (and stdin is a terminal)
# Each `sql` call is a separate psql session (so a separate transaction).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_pg_bindir

if [ -t 1 ]; then
    _B=$'\033[1m' _D=$'\033[2m' _C=$'\033[36m' _R=$'\033[0m'
else
    _B='' _D='' _C='' _R=''
fi
_STEP=0

step() {
    _STEP=$((_STEP + 1))
    printf '\n%s==> %d. %s%s\n' "$_B" "$_STEP" "$*" "$_R"
}

note() { printf '%s    %s%s\n' "$_D" "$*" "$_R"; }

sql() {
    local script
    if [ "$#" -gt 0 ]; then script="$*"; else script="$(cat)"; fi
    printf '%s\n' "$script" | sed "s/^/${_C}sql> /; s/\$/${_R}/"
    printf '%s\n' "$script" | cluster_psql -X -q -v ON_ERROR_STOP=1 -P pager=off -f -
}

sql_value() {
    cluster_psql -X -q -v ON_ERROR_STOP=1 -At -c "$*"
}

pause() {
    if [ "${DEMO_PAUSE:-0}" = 1 ] && [ -t 0 ]; then
        read -r -p "    (press Enter to continue) " _
    fi
}

# ---------------------------------------------------------------------------
# Walkthrough, in a fresh database so every run shows the same story
# ---------------------------------------------------------------------------

export PGDATABASE=litebase_demo
PGDATABASE=postgres sql_value "DROP DATABASE IF EXISTS litebase_demo WITH (FORCE)" >/dev/null
PGDATABASE=postgres sql_value "CREATE DATABASE litebase_demo" >/dev/null

step "Install the extension (its background worker starts at once)"
sql "CREATE EXTENSION litebase_streams;"
sleep 0.5
sql "SELECT pid, backend_type FROM pg_stat_activity WHERE backend_type = 'litebase_streams worker' AND datname = current_database();"

step "Start a LISTEN client in the background"
note 'It runs LISTEN "payment.success" and prints what arrives.'
LISTEN_OUT="$(mktemp)"
{
    echo 'LISTEN "payment.success";'
    sleep 3
    echo "SELECT 'listener done' AS listener;"
} | cluster_psql -X -q -P pager=off >"$LISTEN_OUT" 2>&1 &
LISTENER=$!
sleep 0.5

step "Publish inside a transaction that rolls back: the event never existed"
sql <<'SQL'
BEGIN;
SELECT streams.publish('payment.success', '{"order_id":"ord_100","amount":10.00}');
ROLLBACK;
SELECT count(*) AS events_visible FROM streams.events;
SQL

step "Publish inside a transaction that commits, together with your own row"
sql <<'SQL'
CREATE TABLE orders (id text PRIMARY KEY, amount numeric);
BEGIN;
INSERT INTO orders VALUES ('ord_123', 49.00);
SELECT streams.publish('payment.success', '{"order_id":"ord_123","amount":49.00}');
COMMIT;
SQL
sql "SELECT streams.publish('orders.created', '{\"order_id\":\"ord_124\"}');"
sql "SELECT * FROM streams.publish_batch('payment.success', ARRAY['{\"order_id\":\"ord_125\",\"amount\":5.00}', '{\"order_id\":\"ord_126\",\"amount\":7.50}']::jsonb[]);"
sleep 0.3
sql "SELECT position, stream, time, tx, data FROM streams.events ORDER BY position;"

step "The LISTEN client received each committed payment.success event, live"
wait "$LISTENER" || true
sed 's/^/    /' "$LISTEN_OUT"
rm -f "$LISTEN_OUT"

step "Replay from the beginning, after a position, for a stream pattern"
sql "SELECT position, stream, data FROM streams.replay();"
sql "SELECT position, stream, data FROM streams.replay(after => 2);"
sql "SELECT position, stream, data FROM streams.replay(stream => 'payment.*', max_events => 2);"

step "Replay from a point in time and from a known transaction"
SINCE="$(sql_value "SELECT time FROM streams.events WHERE stream = 'orders.created'")"
TX="$(sql_value "SELECT tx FROM streams.events WHERE data->>'order_id' = 'ord_125'")"
sql "SELECT position, stream, time FROM streams.replay(since => '$SINCE');"
sql "SELECT position, stream, tx FROM streams.replay(from_tx => '$TX');"

step "The envelope, an idempotent retry, and an append that expects the stream's version"
sql <<'SQL'
SELECT streams.publish('account.7', '{"deposit":100}', type => 'deposit.made', key => 'acct_7',
                       headers => '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
SELECT * FROM streams.publish_once('account.7', '{"deposit":25}', 'atm-tx-991');
SELECT * FROM streams.publish_once('account.7', '{"deposit":25}', 'atm-tx-991');
SELECT streams.wait(streams._newest_position());
SELECT streams.stream_head('account.7') AS version \gset
SELECT streams.publish('account.7', '{"withdrawal":50}', expected_prev => :version);
SELECT position, type, key, data FROM streams.events WHERE stream = 'account.7';
SQL
note "The second publish_once was a duplicate (same position, nothing written); the append expected the stream's newest position and got it. Expecting an old one fails with 40001 and writes nothing."

step "Join an event to the rows its transaction wrote (tx = xmin)"
sql "SELECT o.id, o.amount, e.position, e.tx FROM orders o JOIN streams.events e ON o.xmin = e.tx::xid;"

step "An open publishing transaction holds later events back, and status says who"
cluster_psql -X -q -c "BEGIN; SELECT streams.publish('payment.success', '{\"order_id\":\"ord_slow\"}'); SELECT pg_sleep(2); COMMIT;" >/dev/null &
SLOW=$!
sleep 0.5
sql "SELECT streams.publish('orders.created', '{\"order_id\":\"ord_fast\"}');"
sleep 0.3
sql "SELECT horizon, newest_position, worker_state, holder_pid, holder_position, holder_xid, holder_age FROM streams.status;"
wait "$SLOW"
sleep 0.3
sql "SELECT horizon, newest_position, worker_state, holder_pid FROM streams.status;"

step "Per-stream privileges: a reader sees only the streams granted to it"
sql <<'SQL' || true
DROP ROLE IF EXISTS demo_reporting;
CREATE ROLE demo_reporting;
SELECT streams.grant('read', 'payment.*', 'demo_reporting');
SET ROLE demo_reporting;
SELECT position, stream FROM streams.events ORDER BY position;
SELECT streams.publish('payment.success', '{}');
SQL
note "(42501 above: reading a stream is not publishing to it)"
sql <<'SQL'
SELECT streams.revoke('read', 'payment.*', 'demo_reporting');
DROP ROLE demo_reporting;
SQL

step "Private streams: their notifications never carry data"
sql "SELECT streams.set_private('internal.*');"
sql "SELECT streams.publish('internal.audit', '{\"secret\":\"s3cr3t\"}');"
note "A listener gets {\"position\":…,\"stream\":\"internal.audit\",…,\"private\":true}: fetch data with streams.get."

step "A durable subscription: claim events, do the work, ack in the same transaction"
sql "SELECT streams.create_subscription('billing', 'payment.*', after => 0);"
sql <<'SQL'
CREATE TABLE invoices (position bigint PRIMARY KEY, order_id text);
BEGIN;
SELECT position, data->>'order_id' AS order_id FROM streams.poll('billing', max_events => 100);
ROLLBACK;
BEGIN;
CREATE TEMP TABLE batch ON COMMIT DROP AS SELECT * FROM streams.poll('billing', max_events => 100);
INSERT INTO invoices SELECT position, data->>'order_id' FROM batch;
SELECT streams.ack('billing', (SELECT max(position) FROM batch));
COMMIT;
SELECT * FROM invoices;
SQL
note "The first transaction rolled back: its claims returned, and the second got the same events, wrote them and acked them together."
sql "SELECT name, position, pending, lag_time, claimed FROM streams.subscriptions;"
note "Long poll (works through PgBouncer): SELECT * FROM streams.poll('billing', wait => '10s') returns as soon as an event commits."

step "A failing event: attempts survive a rollback, a nack puts it off, the last attempt parks it"
sql "SELECT streams.create_subscription('shipping', 'payment.*', after => 0, max_attempts => 2, backoff_min => '10 milliseconds');"
sql <<'SQL'
BEGIN;
SELECT position, attempt FROM streams.poll('shipping', max_events => 1);
ROLLBACK;
BEGIN;
SELECT position AS failing, attempt FROM streams.poll('shipping', max_events => 1) \gset
SELECT streams.nack('shipping', :failing, reason => 'carrier API answered 503');
COMMIT;
SELECT subscription, position, attempts, last_error FROM streams.dead_letters;
SELECT streams.retry_dead_letter('shipping', :failing);
SELECT position, attempt FROM streams.poll('shipping', max_events => 1);
SQL
note "The rollback used attempt 1, the nack at attempt 2 (the last) parked the event; the log still holds it, and retry_dead_letter delivers it again as attempt 1."

step "A webhook: every payment.* event POSTed to an HTTP endpoint, signed"
note "A throwaway endpoint on 127.0.0.1 prints what arrives; a superuser lets webhooks reach this machine."
HOOK_OUT="$(mktemp)"
python3 - >"$HOOK_OUT" 2>&1 <<'PY' &
import http.server, json, sys
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        print("webhook-id:", self.headers["webhook-id"], "| signature:", self.headers["webhook-signature"][:16] + "...",
              "| body:", body.decode(), flush=True)
        self.send_response(204)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 8977), Hook)
server.timeout = 10
server.handle_request()  # one request: batch => 10 carries every payment.* event so far
PY
HOOK=$!
sleep 0.5
sql <<'SQL'
ALTER SYSTEM SET litebase_streams.webhook_allowed_hosts = '127.0.0.1';
SELECT pg_reload_conf();
SQL
sleep 0.5
sql "SELECT streams.create_webhook('billing-hook', 'payment.*', 'http://127.0.0.1:8977/hooks', after => 0, batch => 10) AS secret;"
wait "$HOOK" || true
sed 's/^/    endpoint: /' "$HOOK_OUT"
rm -f "$HOOK_OUT"
sql "SELECT name, state, position, pending, attempts, last_status FROM streams.webhooks;"
note "Verify the signature with any Standard Webhooks library and the secret above (docs/webhooks.md)."
sql <<'SQL'
SELECT streams.drop_webhook('billing-hook');
ALTER SYSTEM RESET litebase_streams.webhook_allowed_hosts;
SELECT pg_reload_conf();
SQL

step "Stored events are immutable through SQL, even for a superuser"
sql "DELETE FROM streams.event_log;" || true

printf '\n%sDemo finished.%s Explore it with: make psql PSQL_ARGS="-d litebase_demo"\n' "$_B" "$_R"
