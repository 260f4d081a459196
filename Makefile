# Build / run tooling for the litebase_streams PostgreSQL 15 extension (pgrx 0.18.1).
# The logic lives in scripts/*.sh; this file only wires targets to them.
# Every variable below can be overridden: make start PGPORT=55432

PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
PGPORT    ?= 54329

IS_ROOT := $(filter 0,$(shell id -u))
ifneq ($(IS_ROOT),)
# Root: the server runs as the `postgres` OS user, which cannot traverse /root,
# so the cluster lives under /tmp.
PGDATA_DIR ?= /tmp/litebase_streams-cluster-$(PGPORT)
PG_RUNAS   ?= postgres
else
PGDATA_DIR ?= $(CURDIR)/.cluster
PG_RUNAS   ?=
endif
PGHOST := $(PGDATA_DIR)/socket
# Empty before `make setup` on a fresh machine; the scripts then ask pg_config.
PG_BINDIR := $(shell $(PG_CONFIG) --bindir 2>/dev/null)

# rustup installs cargo here; make it visible even if the shell profile wasn't reloaded.
export PATH := $(HOME)/.cargo/bin:$(PATH)
export PG_CONFIG PGPORT PGDATA_DIR PGHOST PG_BINDIR PG_RUNAS

# Invoked via `bash` so a lost executable bit does not matter.
SCRIPTS := $(CURDIR)/scripts

# Prerequisites (setup -> install -> start) must run in order.
.NOTPARALLEL:
.DEFAULT_GOAL := help
.PHONY: help setup install start stop restart status env psql pgbouncer pgbouncer-stop gateway bridge nats-stop demo test lint doctest bench clean-cluster

help:
	@echo "litebase_streams: make targets"
	@echo "  setup          install missing prerequisites (apt packages, cargo-pgrx 0.18.1, cargo pgrx init)"
	@echo "  install        cargo pgrx install --release into $(PG_CONFIG)'s PostgreSQL"
	@echo "  package        Debian package of the extension, target/package/postgresql-15-litebase-streams_*.deb,"
	@echo "                 from install's build (PACKAGE_ARGS=--no-build: as staged); test: bash scripts/package-test.sh"
	@echo "  start          create (if missing) and start the dev cluster"
	@echo "  stop           stop the dev cluster"
	@echo "  restart        stop + start"
	@echo "  status         show whether the dev cluster is running"
	@echo "  env            print the dev cluster's PGHOST/PGPORT/PGUSER as exports: eval \"\$$(make -s env)\""
	@echo "  psql           start if needed, CREATE EXTENSION IF NOT EXISTS, open psql (PSQL_ARGS=...)"
	@echo "  pgbouncer      start if needed, then pgbouncer (transaction pooling) in front of the dev cluster;"
	@echo "                 prints its connection string (PGBOUNCER_PORT=..., default PGPORT + 10000)"
	@echo "  pgbouncer-stop stop that pgbouncer"
	@echo "  gateway        start if needed, build the gateway (gateway/), run it in the foreground against database"
	@echo "                 GATEWAY_DB (default postgres) on GATEWAY_LISTEN (default 127.0.0.1:8080), printing the web"
	@echo "                 console's URL with a development token for GATEWAY_CONSOLE_ROLE; Ctrl-C stops it"
	@echo "  bridge         start if needed, build the bridge (bridge/), start nats-server with JetStream (NATS_PORT,"
	@echo "                 default 4222), run the bridge in the foreground: database BRIDGE_DB (default postgres),"
	@echo "                 streams BRIDGE_PATTERN (default payment.*) into JetStream stream LITEBASE_STREAMS;"
	@echo "                 other flags in BRIDGE_ARGS (\$$(BRIDGE_BIN) --help); Ctrl-C stops it"
	@echo "  nats-stop      stop that nats-server"
	@echo "  demo           setup + install + start, then run scripts/demo.sh"
	@echo "  test           setup + install + start, then every suite: lint, pgrx tests, the package, integration"
	@echo "                 tests, the doc test, the bench smoke run, the client libraries, the API references"
	@echo "  docs           API references of the client libraries (Python, TypeScript, Rust) in target/docs/"
	@echo "  lint           cargo fmt --check, cargo clippy -D warnings (workspace, all targets), no import cycles"
	@echo "  doctest        start if needed, then run every code block of README.md and docs/*.md (scripts/doctest.py)"
	@echo "  bench          benchmarks side by side, report in docs/benchmarks.md (QUICK=1: smoke run, LARGE=1: + growth to 50M events)"
	@echo "  clean-cluster  stop and delete the dev cluster"
	@echo ""
	@echo "  PG_CONFIG=$(PG_CONFIG)"
	@echo "  PGPORT=$(PGPORT)"
	@echo "  PGDATA_DIR=$(PGDATA_DIR)"
	@echo "  PGHOST=$(PGHOST)"

lint:
	@echo "==> lint"
	@bash $(SCRIPTS)/lint.sh

setup:
	@echo "==> setup"
	@bash $(SCRIPTS)/setup.sh

install:
	@echo "==> install"
	@bash $(SCRIPTS)/install.sh

# The Debian package (scripts/package.sh): what install.sh installs, from the
# build it stages in target/install-stage (built first when missing or older
# than the sources), into target/package/. scripts/package-test.sh installs
# it with dpkg -i and tries it on a fresh cluster.
PACKAGE_ARGS ?=
.PHONY: package
package:
	@echo "==> package"
	@bash $(SCRIPTS)/package.sh $(PACKAGE_ARGS)

start:
	@echo "==> start"
	@bash $(SCRIPTS)/cluster.sh start

stop:
	@echo "==> stop"
	@bash $(SCRIPTS)/cluster.sh stop

restart:
	@echo "==> restart"
	@bash $(SCRIPTS)/cluster.sh restart

status:
	@bash $(SCRIPTS)/cluster.sh status || true

# Prints only the exports (no "==>" line), so that eval "$$(make -s env)" works.
env:
	@bash $(SCRIPTS)/env.sh

psql:
	@echo "==> psql"
	@bash $(SCRIPTS)/cluster.sh psql $(PSQL_ARGS)

# PgBouncer (transaction pooling) in front of the dev cluster; settings in
# scripts/pgbouncer.sh (PGBOUNCER_PORT, PGBOUNCER_DIR). The integration tests
# start their own from the same configuration.
pgbouncer: start
	@echo "==> pgbouncer"
	@bash $(SCRIPTS)/pgbouncer.sh start

pgbouncer-stop:
	@echo "==> pgbouncer-stop"
	@bash $(SCRIPTS)/pgbouncer.sh stop

# The SSE/WebSocket gateway (gateway/, docs/gateway.md), in the foreground,
# logged in as postgres (a dev convenience: in production give it a role of
# its own, see docs/gateway.md). Tokens are signed with LITEBASE_GATEWAY_JWT_SECRET
# (a fixed development secret unless set); print one with
#   $(GATEWAY_BIN) token --role <role>
# Every other option: $(GATEWAY_BIN) --help, passed through GATEWAY_ARGS.
GATEWAY_DB     ?= postgres
GATEWAY_LISTEN ?= 127.0.0.1:8080
GATEWAY_ARGS   ?=
# The role of the console URL's development token (make gateway prints the URL).
GATEWAY_CONSOLE_ROLE ?= postgres
GATEWAY_BIN    := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/gateway/litebase-streams-gateway
LITEBASE_GATEWAY_JWT_SECRET ?= litebase-dev-secret
# /metrics with the database's numbers needs this bearer token (a fixed development one unless set).
LITEBASE_GATEWAY_METRICS_TOKEN ?= litebase-dev-metrics-token
gateway: start
	@echo "==> gateway"
	@cargo build --profile gateway -p litebase-streams-gateway --bins
	@token=$$(LITEBASE_GATEWAY_JWT_SECRET='$(LITEBASE_GATEWAY_JWT_SECRET)' $(GATEWAY_BIN) token \
		--role '$(GATEWAY_CONSOLE_ROLE)' --expires-in 43200) && \
		echo "==> console: http://$(GATEWAY_LISTEN)/console/#token=$$token" && \
		echo "    (a development token for role $(GATEWAY_CONSOLE_ROLE), valid 12 hours; GATEWAY_CONSOLE_ROLE=<role> for another)"
	@echo "==> metrics: curl -H 'Authorization: Bearer $(LITEBASE_GATEWAY_METRICS_TOKEN)' http://$(GATEWAY_LISTEN)/metrics"
	@LITEBASE_GATEWAY_JWT_SECRET='$(LITEBASE_GATEWAY_JWT_SECRET)' \
		LITEBASE_GATEWAY_METRICS_TOKEN='$(LITEBASE_GATEWAY_METRICS_TOKEN)' $(GATEWAY_BIN) \
		--database-url "host=$(PGHOST) port=$(PGPORT) user=postgres dbname=$(GATEWAY_DB)" \
		--listen $(GATEWAY_LISTEN) $(GATEWAY_ARGS)

# The bridge into NATS JetStream (bridge/, docs/bridge.md): starts a local nats-server with JetStream (scripts/nats.sh;
# NATS_PORT, default 4222), then runs the bridge in the foreground against
# database BRIDGE_DB for the streams BRIDGE_PATTERN (a pattern of every
# stream, '*', needs a subject prefix: BRIDGE_ARGS=--subject-prefix=app), logged in as postgres
# (a dev convenience: in production give it a role of its own). Ctrl-C
# stops the bridge; `make nats-stop` stops nats-server. Every other option:
# $(BRIDGE_BIN) --help, passed through BRIDGE_ARGS.
BRIDGE_DB      ?= postgres
BRIDGE_PATTERN ?= payment.*
BRIDGE_LISTEN  ?= 127.0.0.1:9181
BRIDGE_ARGS    ?=
BRIDGE_BIN     := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/gateway/litebase-streams-bridge
NATS_PORT      ?= 4222
export NATS_PORT
bridge: start
	@echo "==> bridge"
	@cargo build --profile gateway -p litebase-streams-bridge --bins
	@bash $(SCRIPTS)/nats.sh start
	@$(BRIDGE_BIN) --database-url "host=$(PGHOST) port=$(PGPORT) user=postgres dbname=$(BRIDGE_DB)" \
		--nats-url nats://127.0.0.1:$(NATS_PORT) --pattern '$(BRIDGE_PATTERN)' --listen $(BRIDGE_LISTEN) $(BRIDGE_ARGS)

nats-stop:
	@echo "==> nats-stop"
	@bash $(SCRIPTS)/nats.sh stop

demo: setup install start
	@echo "==> demo"
	@bash $(SCRIPTS)/demo.sh

test: setup install start
	@echo "==> test"
	@bash $(SCRIPTS)/test.sh

# The doc test alone (make test runs it too): DOCTEST_ARGS="-v README.md" etc.,
# see python3 scripts/doctest.py --help.
DOCTEST_ARGS ?=
doctest: start
	@echo "==> doctest"
	@python3 $(SCRIPTS)/doctest.py $(DOCTEST_ARGS)

# Benchmarks (bench/bench.py): full run rewrites docs/benchmarks.md and docs/bench-*.png;
# QUICK=1 is a smoke run (< 1 min) that reports to target/bench-quick/ instead;
# LARGE=1 also grows one log to 50M events (section 5, about 25 more minutes).
# Exits non-zero only if the harness breaks, not on a missed target.
BENCH_PYTHON ?= python3
BENCH_ARGS   ?=
bench: setup install start
	@echo "==> bench$(if $(filter-out 0,$(QUICK)), (quick))$(if $(filter-out 0,$(LARGE)), (large))"
	@$(BENCH_PYTHON) $(CURDIR)/bench/bench.py $(if $(filter-out 0,$(QUICK)),--quick) \
		$(if $(filter-out 0,$(LARGE)),--large) $(BENCH_ARGS)

# API references of the client libraries (scripts/docs.sh): target/docs/{python,js,rust}
# and target/docs/index.html.
.PHONY: docs
docs:
	@echo "==> docs"
	@bash $(SCRIPTS)/docs.sh

clean-cluster:
	@echo "==> clean-cluster"
	@bash $(SCRIPTS)/cluster.sh destroy
