#!/usr/bin/env bash
# Test the Python client against the dev cluster: a venv under
# target/clients/python-venv (reused when present), the package installed
# from this folder with psycopg[binary] and pytest, then pytest.
#   clients/python/test.sh [pytest arguments]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="$REPO/target/clients/python-venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "psycopg[binary]>=3.2" "pytest>=7"
"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$HERE"
export LITEBASE_STREAMS_DSN="${LITEBASE_STREAMS_DSN:-host=127.0.0.1 port=54329 user=postgres dbname=postgres}"
export LITEBASE_STREAMS_SCRATCH_DIR="${LITEBASE_STREAMS_SCRATCH_DIR:-/tmp/litebase_streams-scratch-54329}"
cd "$HERE"
export PYTHONDONTWRITEBYTECODE=1
# -p no:cacheprovider: no .pytest_cache in the source tree
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q "$@"
