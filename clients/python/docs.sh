#!/usr/bin/env bash
# Build the Python client's API docs with pdoc into $1
# (default: target/docs/python), in the test venv.
#   clients/python/docs.sh [output folder]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="${1:-$REPO/target/docs/python}"
VENV="$REPO/target/clients/python-venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "psycopg[binary]>=3.2" "pdoc>=14"
"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$HERE"
"$VENV/bin/python" -m pdoc -o "$OUT" litebase_streams
echo "API docs: $OUT/index.html"
