#!/usr/bin/env bash
# Install the build prerequisites, skipping everything that is already there:
#   1. Debian packages (PostgreSQL 15 server + headers, clang, sudo, C toolchain)
#   2. a Rust toolchain (via rustup, only if `cargo` is missing)
#   3. cargo-pgrx 0.18.1
#   4. `cargo pgrx init --pg15 $PG_CONFIG` (only if ~/.pgrx/config.toml lacks pg15)
# A second run only does a few cheap checks.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PGRX_VERSION=0.18.1
# postgresql-15 / postgresql-server-dev-15 / libclang-dev / clang: server, headers, bindgen.
# postgresql-15-wal2json: the logical decoding test (tests/logical.rs) reads events with it.
# pgbouncer: `make pgbouncer`, and the subscription tests (tests/subscriptions.rs) consume through it.
# postgresql-15-pgq3: PgQ, the consumer the bench compares subscriptions with (bench/phases/consume.py).
# sudo: `cargo pgrx test --runas` uses it.
# inotify-tools: tests/install.rs watches the library directory while scripts/install.sh places files.
# build-essential / pkg-config / libssl-dev: linker for rustc, and cargo-pgrx's
#   openssl-sys dependency (otherwise `cargo install cargo-pgrx` fails on a bare box).
# ca-certificates / curl: only needed to fetch rustup when cargo is missing.
# python3-venv / nodejs / npm: the doc test (scripts/doctest.py) runs the Python
#   and Node examples of README.md and docs/*.md with psycopg and node-postgres,
#   installed under target/doctest/.
# chromium: the gateway's browser test (tests/gateway.rs) runs it headless.
# nats-server: the bridge's tests (tests/bridge.rs) and bench start it with JetStream (-js).
# dpkg-dev / lintian: make package (dpkg-shlibdeps for Depends) and its check.
# prometheus: its promtool checks docs/grafana/alerts.yml and the dashboard's queries (scripts/check-grafana.py, in make lint);
# python3-yaml: that script reads the rule file (with Debian's python3; pip install pyyaml for another).
APT_PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-15-wal2json pgbouncer postgresql-15-pgq3 libclang-dev clang sudo inotify-tools
              build-essential pkg-config libssl-dev python3-venv nodejs chromium nats-server dpkg-dev lintian prometheus python3-yaml)
# Debian's npm only when npm is missing: NodeSource's nodejs package bundles npm and
# conflicts with Debian's.
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(npm)

pkg_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

apt_install_missing() {
    local missing=() p
    for p in "$@"; do
        pkg_installed "$p" || missing+=("$p")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi
    say "apt-get install ${missing[*]}"
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install manually: ${missing[*]}"
    if [ "$IS_ROOT" -ne 1 ] && ! command -v sudo >/dev/null 2>&1; then
        die "not root and sudo is missing; as root run: apt-get install ${missing[*]}"
    fi
    if [ -z "${_APT_UPDATED:-}" ]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update
        _APT_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# --- 1. Debian packages --------------------------------------------------------
say "system packages"
if command -v dpkg-query >/dev/null 2>&1; then
    apt_install_missing "${APT_PACKAGES[@]}"
    info "ok: ${APT_PACKAGES[*]}"
else
    warn "not a dpkg-based system; make sure PostgreSQL 15 (server + dev headers) and clang are installed"
fi
[ -x "$PG_CONFIG" ] || die "pg_config not found at $PG_CONFIG (set PG_CONFIG=...)"
pg_version="$("$PG_CONFIG" --version)"
case "$pg_version" in
    "PostgreSQL 15"*) info "$PG_CONFIG: $pg_version" ;;
    *) die "$PG_CONFIG reports '$pg_version', expected PostgreSQL 15" ;;
esac
# Note: the Debian package creates (and may start) a system cluster "15/main" on
# port 5432.  We don't use it and leave it alone.

# --- 2. Rust toolchain -------------------------------------------------------------
say "rust toolchain"
if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        apt_install_missing ca-certificates curl
        say "installing Rust via rustup (no cargo found)"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
            sh -s -- -y --profile minimal --default-toolchain stable
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
fi
info "$(cargo --version)"
# make lint needs clippy and rustfmt (rustup's default profile has them; a
# minimal one does not).
if ! cargo clippy --version >/dev/null 2>&1 || ! cargo fmt --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        say "adding clippy and rustfmt"
        rustup component add clippy rustfmt || info "could not add clippy/rustfmt: make lint will fail"
    fi
fi

# --- 3. cargo-pgrx -------------------------------------------------------------
say "cargo-pgrx $PGRX_VERSION"
have_pgrx="$(cargo pgrx --version 2>/dev/null || true)"
if printf '%s\n' "$have_pgrx" | grep -Eq "(^| )${PGRX_VERSION//./\\.}\$"; then
    info "ok: $have_pgrx"
else
    info "found: ${have_pgrx:-none}; installing cargo-pgrx $PGRX_VERSION (takes a few minutes)"
    cargo install cargo-pgrx --version "=$PGRX_VERSION" --locked
fi

# --- 4. cargo pgrx init ----------------------------------------------------------
say "cargo pgrx init --pg15"
pgrx_config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
pg15_line="$(grep -E '^[[:space:]]*pg15[[:space:]]*=' "$pgrx_config" 2>/dev/null || true)"
if [ -n "$pg15_line" ]; then
    info "ok: $pgrx_config has: $pg15_line"
    case "$pg15_line" in
        *"\"$PG_CONFIG\""*) ;;
        *) warn "$pgrx_config's pg15 entry is not $PG_CONFIG; builds will use that one." \
                "To switch: cargo pgrx init --pg15 $PG_CONFIG" ;;
    esac
else
    cargo pgrx init --pg15 "$PG_CONFIG"
fi

say "setup done"
