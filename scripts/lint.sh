#!/usr/bin/env bash
# make lint: formatting, clippy with warnings as errors for the whole
# workspace (the extension with its integration tests, core/, the gateway),
# no import cycle between modules (scripts/import-cycles.py), and the Grafana
# dashboard and alert rules check (scripts/check-grafana.py).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"
cargo fmt --all --check
cargo clippy --workspace --all-targets --features integration -- -D warnings
python3 scripts/import-cycles.py
# The Grafana dashboard and the alert rules (docs/grafana/): with Debian's python3,
# which has the yaml module setup.sh installs (python3-yaml).
GRAFANA_PYTHON=/usr/bin/python3
[ -x "$GRAFANA_PYTHON" ] || GRAFANA_PYTHON=python3
"$GRAFANA_PYTHON" scripts/check-grafana.py --require-promtool
