#!/usr/bin/env bash
# Vendors the web console's one third-party library, uPlot (charts), into
# gateway/console/vendor/, which is committed: the gateway embeds those files
# (gateway/src/console/assets.rs) and fetches nothing at build or run time.
#
#   scripts/vendor-console.sh     fetch the pinned tarball from the npm
#                                 registry (npm pack), check it against the
#                                 pinned integrity hash, copy the minified
#                                 script, its CSS and its LICENSE
#
# Run it again only to move the pin: change UPLOT_VERSION and UPLOT_INTEGRITY
# together (`npm view uplot@<version> dist.integrity`), read the changes, and
# commit the result.
set -euo pipefail

UPLOT_VERSION=1.6.32
UPLOT_INTEGRITY=sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
vendor="$root/gateway/console/vendor"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

command -v npm >/dev/null || { echo "vendor-console.sh: npm not found (Debian package npm)" >&2; exit 1; }

(cd "$work" && npm pack --silent "uplot@$UPLOT_VERSION" >/dev/null)
tarball="$work/uplot-$UPLOT_VERSION.tgz"
# npm's integrity string is "sha512-" and the base64 of the tarball's SHA-512:
# computed here from the file itself, not taken from npm's own report.
actual="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
if [ "$actual" != "$UPLOT_INTEGRITY" ]; then
    echo "vendor-console.sh: uplot-$UPLOT_VERSION.tgz has integrity $actual, pinned $UPLOT_INTEGRITY" >&2
    exit 1
fi
tar -xzf "$tarball" -C "$work"
mkdir -p "$vendor"
# The minified build (a classic script that defines the global uPlot): the
# console loads it with <script src>, as its CSP (script-src 'self') allows.
cp "$work/package/dist/uPlot.iife.min.js" "$vendor/uPlot.iife.min.js"
cp "$work/package/dist/uPlot.min.css" "$vendor/uPlot.min.css"
cp "$work/package/LICENSE" "$vendor/uPlot.LICENSE"
printf 'uPlot %s (%s), from the npm registry by scripts/vendor-console.sh\n' "$UPLOT_VERSION" "$UPLOT_INTEGRITY" \
    > "$vendor/README"
echo "vendored uPlot $UPLOT_VERSION into ${vendor#"$root"/}"
