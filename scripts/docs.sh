#!/usr/bin/env bash
# make docs: the client libraries' API references, under target/docs/ (DOCS_DIR):
#   python/  pdoc       (clients/python/docs.sh, in the clients' venv)
#   js/      typedoc    (clients/js: npm run docs; warnings are errors)
#   rust/    rustdoc    (cargo doc -p litebase-streams-client --no-deps; warnings are errors)
# and an index.html linking the three.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"
OUT="${DOCS_DIR:-$REPO_ROOT/target/docs}"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
mkdir -p "$OUT"

say "docs: Python (pdoc) -> $OUT/python"
bash clients/python/docs.sh "$OUT/python"

say "docs: TypeScript (typedoc) -> $OUT/js"
(
    cd clients/js
    [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
    npm run --silent docs -- --out "$OUT/js"
)

say "docs: Rust (rustdoc) -> $OUT/rust"
RUSTDOCFLAGS="-D warnings" cargo doc -q -p litebase-streams-client --no-deps
rm -rf "$OUT/rust"
cp -r "${CARGO_TARGET_DIR:-$REPO_ROOT/target}/doc" "$OUT/rust"

cat >"$OUT/index.html" <<'HTML'
<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>litebase_streams client libraries</title></head>
<body>
<h1>litebase_streams client libraries</h1>
<ul>
<li><a href="python/litebase_streams.html">Python: litebase-streams</a> (psycopg 3, sync and asyncio)</li>
<li><a href="js/index.html">TypeScript: @litebase/streams</a> (node-postgres; the browser entry point for the gateway)</li>
<li><a href="rust/litebase_streams_client/index.html">Rust: litebase-streams-client</a> (tokio-postgres)</li>
</ul>
</body></html>
HTML
say "docs: $OUT/index.html"
