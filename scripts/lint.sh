#!/usr/bin/env bash
# make lint: formatting, clippy with warnings as errors for the whole
# workspace (the extension with its integration tests, core/, the gateway),
# and no import cycle between modules (scripts/import-cycles.py).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"
cargo fmt --all --check
cargo clippy --workspace --all-targets --features integration -- -D warnings
python3 scripts/import-cycles.py
