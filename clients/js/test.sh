#!/usr/bin/env bash
# The JavaScript client's whole check: install the dev dependencies (npm ci
# when package-lock.json is there), build dist/ from src/, check that the
# committed dist/ is that build, then every test (node:test; each test in a
# database of its own on the cluster of LITEBASE_STREAMS_DSN; the browser
# tests need /usr/bin/chromium and target/gateway/litebase-streams-gateway).
#
# Environment (the harness's, with these defaults):
#   LITEBASE_STREAMS_DSN          host=127.0.0.1 port=54329 user=postgres dbname=postgres
#   LITEBASE_STREAMS_SCRATCH_DIR  /tmp/litebase_streams-scratch-54329 (PgBouncer's config and log)
#   LITEBASE_STREAMS_GATEWAY_BIN  the gateway binary (default: target/gateway/litebase-streams-gateway)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export LITEBASE_STREAMS_DSN="${LITEBASE_STREAMS_DSN:-host=127.0.0.1 port=54329 user=postgres dbname=postgres}"
export LITEBASE_STREAMS_SCRATCH_DIR="${LITEBASE_STREAMS_SCRATCH_DIR:-/tmp/litebase_streams-scratch-54329}"
mkdir -p "$LITEBASE_STREAMS_SCRATCH_DIR"

if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund --prefer-offline
else
    npm install --no-audit --no-fund
fi
npm run build
npm test "$@"
