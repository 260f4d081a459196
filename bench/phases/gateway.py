"""8. The gateway (gateway/, litebase-streams-gateway): SSE fan-out; --only
gateway runs just this.

The gateway's release build (`cargo build --profile gateway`) runs against a
fresh database as a NOINHERIT login role that is only a member of the
clients' role (docs/gateway.md's recipe). litebase-streams-loadgen (gateway/src/bin/loadgen.rs,
the same stack: tokio, hyper, tokio-postgres) opens gw_clients SSE
connections on one stream, then publishes gw_rate events/s for gw_secs
seconds, one transaction each, and measures in every client the time from
each event's commit timestamp (its `time`) to its arrival, and that each
client received every event once, in order. It reads the gateway's memory
before and after the clients connected (VmRSS: memory per connection) and
its CPU time while events flowed, and counts the gateway's database
connections in pg_stat_activity. The loadgen, the gateway and the server
share the machine's CPUs.
"""

import json
import os
import resource
import secrets
import socket
import subprocess
import time
import urllib.request

import common as H

ORDER = 80
OWN_DB = True

STREAM = "bench.gateway"
READER = "bench_gw_reader"
LOGIN = "bench_gw_gateway"
# The budget per connection (issue 14), in kB.
MEMORY_BUDGET_KB = 64
# "A handful" of database connections.
MAX_DB_CONNECTIONS = 8

FULL = dict(gw_clients=5000, gw_rate=20, gw_secs=20)
QUICK = dict(gw_clients=100, gw_rate=20, gw_secs=1)


def _target_dir():
    return os.environ.get("CARGO_TARGET_DIR") or str(H.REPO / "target")


def _build(b):
    """The gateway profile's binaries (a no-op when scripts/test.sh or make gateway built them)."""
    log = b.log_dir / "gateway-build.log"
    with open(log, "w") as out:
        r = subprocess.run(["cargo", "build", "--profile", "gateway", "-p", "litebase-streams-gateway", "--bins"],
                           cwd=H.REPO, stdout=out, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise H.BenchError(f"cargo build of the gateway failed: see {log}")
    d = os.path.join(_target_dir(), "gateway")
    return os.path.join(d, "litebase-streams-gateway"), os.path.join(d, "litebase-streams-loadgen")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _roles(c, create):
    if create:
        for role, attrs in ((READER, "NOLOGIN"), (LOGIN, "LOGIN NOINHERIT")):
            c.execute(f"DROP ROLE IF EXISTS {role}")
            c.execute(f"CREATE ROLE {role} {attrs}")
        c.execute(f"GRANT {READER} TO {LOGIN}")
    else:
        c.execute(f"DROP OWNED BY {READER}, {LOGIN}")


def run(b):
    cfg = b.cfg
    say_clients = f"{cfg['gw_clients']:,} SSE clients"
    H.say(f"8. gateway: {say_clients} on one stream, {cfg['gw_rate']} events/s for {cfg['gw_secs']} s")
    gateway_bin, loadgen_bin = _build(b)
    b.recreate_db()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < cfg["gw_clients"] + 256:
        raise H.BenchError(f"RLIMIT_NOFILE hard limit {hard} is below {cfg['gw_clients']} clients (ulimit -Hn)")
    with H.connect("postgres") as c:
        for role in (LOGIN, READER):  # leftovers of an interrupted run
            if c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                for (db,) in c.execute("SELECT datname FROM pg_database WHERE datallowconn").fetchall():
                    with H.connect(db) as d:
                        d.execute(f"DROP OWNED BY {role}")
    with H.connect(H.DB) as c:
        _roles(c, create=True)
        c.execute("SELECT streams.grant('read', %s, %s)", (STREAM, READER))
    secret = secrets.token_hex(16)
    token = subprocess.run([gateway_bin, "token", "--role", READER, "--jwt-secret", secret],
                           capture_output=True, text=True, check=True).stdout.strip()
    port = _free_port()
    url = f"host={H.PGHOST} port={H.PGPORT} user={LOGIN} dbname={H.DB}"
    log = open(b.log_dir / "gateway.log", "w")
    gw = subprocess.Popen([gateway_bin, "--listen", f"127.0.0.1:{port}", "--database-url", url],
                          env={**os.environ, "LITEBASE_GATEWAY_JWT_SECRET": secret, "LITEBASE_GATEWAY_LOG": "warn"},
                          stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                break
            except OSError:
                if gw.poll() is not None or time.monotonic() > deadline:
                    raise H.BenchError(f"the gateway did not start: see {b.log_dir / 'gateway.log'}")
                time.sleep(0.05)
        r = subprocess.run(
            [loadgen_bin, "--gateway", f"127.0.0.1:{port}", "--pattern", STREAM, "--stream", STREAM,
             "--clients", str(cfg["gw_clients"]), "--rate", str(cfg["gw_rate"]), "--duration", str(cfg["gw_secs"]),
             "--database-url", f"host={H.PGHOST} port={H.PGPORT} user={H.PGUSER} dbname={H.DB}",
             "--gateway-pid", str(gw.pid)],
            env={**os.environ, "LOADGEN_TOKEN": token}, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise H.BenchError(f"litebase-streams-loadgen failed:\n{r.stderr[-2000:]}")
        out = json.loads(r.stdout)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        gw.terminate()
        try:
            gw.wait(10)
        except subprocess.TimeoutExpired:
            gw.kill()
        log.close()
        with H.connect(H.DB) as c:
            _roles(c, create=False)
        with H.connect("postgres") as c:
            c.execute(f"DROP ROLE IF EXISTS {LOGIN}")
            c.execute(f"DROP ROLE IF EXISTS {READER}")
    scraped = {}
    for line in metrics.splitlines():
        if line.startswith("litebase_streams_gateway_") and " " in line:
            name, value = line.rsplit(" ", 1)
            scraped[name] = float(value)
    g = out["gateway"]
    per_conn = ((g["rss_connected_kb"] - g["rss_before_kb"]) / out["connected"]
                if out["connected"] and g["rss_connected_kb"] is not None else float("nan"))
    b.res["gateway"] = dict(config={k: cfg[k] for k in FULL}, loadgen=out, metrics=scraped, nofile=[soft, hard],
                            kb_per_connection=per_conn,
                            measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                            load_at_start=os.getloadavg()[0])
    lat = out["latency_ms"]
    H.info(f"{out['connected']:,} clients, {out['deliveries']:,} deliveries ({out['deliveries_per_s']:,.0f}/s): "
           f"commit -> client p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms; gateway "
           f"{g['cpu_pct'] or float('nan'):.0f}% CPU, {per_conn:.1f} kB per connection, "
           f"{g['db_connections']} database connections")


def _exactly_once(out):
    return (out["connected"] == out["clients"] and out["clients_complete"] == out["connected"]
            and out["out_of_order_or_duplicate"] == 0 and out["deliveries"] == out["expected_deliveries"])


def values(res):
    gw = res.get("gateway")
    if not gw:
        return {}
    out, g = gw["loadgen"], gw["loadgen"]["gateway"]
    lat = out["latency_ms"]
    ok = _exactly_once(out)
    return {
        "gateway_p99": dict(value=lat["p99"], clients=f"{out['clients']:,}", rate=f"{out['rate']:g}"),
        "gateway_memory": dict(value=gw["kb_per_connection"] / MEMORY_BUDGET_KB, kb=f"{gw['kb_per_connection']:.1f}",
                               budget=MEMORY_BUDGET_KB),
        "gateway_db_connections": dict(value=0 <= g["db_connections"] <= MAX_DB_CONNECTIONS,
                                       n=g["db_connections"], clients=f"{out['clients']:,}",
                                       most=MAX_DB_CONNECTIONS,
                                       shown=f"no: {g['db_connections']}"),
        "gateway_exactly_once": dict(
            value=ok, shown=None if ok else
            f"no: {out['deliveries']:,} of {out['expected_deliveries']:,}, {out['connected']:,} of "
            f"{out['clients']:,} connected, {out['out_of_order_or_duplicate']} out of order"),
    }


def notes(res, short):
    gw = res.get("gateway")
    if not gw or not short & {"gateway_p99", "gateway_memory"}:
        return []
    out = gw["loadgen"]
    return [f"**gateway fan-out:** the gateway used {out['gateway']['cpu_pct'] or float('nan'):.0f}% of one CPU "
            f"and the load generator {out['loadgen_cpu_pct'] or float('nan'):.0f}% for "
            f"{out['deliveries_per_s']:,.0f} deliveries/s on {res['machine']['nproc']} CPUs (load average "
            f"{gw['load_at_start']:.1f} when the phase started)."]


def section(res, w):
    gw = res.get("gateway")
    if not gw:
        return
    cfg, out, g = gw["config"], gw["loadgen"], gw["loadgen"]["gateway"]
    lat = out["latency_ms"]
    f0, fms = H.f0, H.fms
    w("## 8. Gateway: SSE fan-out")
    w("")
    w(f"Measured {gw['measured_at']} (load average {gw['load_at_start']:.2f} at the start of the phase). "
      f"`litebase-streams-gateway` (release build, default settings: a pool of 4 plus one LISTEN connection) "
      f"serves one database as a NOINHERIT login role that is a member of the clients' role only. "
      f"`litebase-streams-loadgen` (gateway/src/bin/loadgen.rs: tokio, hyper, tokio-postgres) opens "
      f"{cfg['gw_clients']:,} SSE connections to `/v1/streams/{STREAM}/events` with one token, then publishes "
      f"{cfg['gw_rate']} events/s for {cfg['gw_secs']} s, one `streams.publish` per transaction "
      f"({cfg['gw_rate'] * cfg['gw_clients']:,} deliveries/s offered). Latency runs from each event's commit "
      "timestamp (`time`) to its arrival in each client. Gateway, load generator and server share the "
      f"machine's {res['machine']['nproc']} CPUs; file descriptor limit {gw['nofile'][0]:,} (hard "
      f"{gw['nofile'][1]:,}), raised to the hard limit by both programs.")
    w("")
    w("| clients | connected in | deliveries | per second | commit -> client p50 | p90 | p99 | max |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- |")
    w(f"| {out['connected']:,} of {out['clients']:,} | {out['connect_s']:.1f} s | {out['deliveries']:,} of "
      f"{out['expected_deliveries']:,} | {f0(out['deliveries_per_s'])} | {fms(lat['p50'])} | {fms(lat['p90'])} | "
      f"{fms(lat['p99'])} | {fms(lat['max'])} |")
    w("")
    cpu = g["cpu_pct"]
    per_delivery = (cpu / 100 * 1e6 / out["deliveries_per_s"]) if cpu and out["deliveries_per_s"] else float("nan")
    w(f"**Gateway resources.** Memory {g['rss_before_kb'] / 1024:.1f} MB before the clients, "
      f"{g['rss_connected_kb'] / 1024:.1f} MB with them connected: **{gw['kb_per_connection']:.1f} kB per "
      f"connection** (budget {MEMORY_BUDGET_KB} kB); peak {g['hwm_kb'] / 1024:.1f} MB. CPU while events flowed: "
      f"{cpu or float('nan'):.0f}% of one CPU ({per_delivery:.1f} µs per delivery); the load generator "
      f"{out['loadgen_cpu_pct'] or float('nan'):.0f}%. **Database connections: {g['db_connections']}** "
      f"(pg_stat_activity, application_name `litebase-streams-gateway`) for {out['connected']:,} clients. "
      f"Every client received every event once, in order: {'yes' if _exactly_once(out) else 'no'}; "
      f"slow-client drops: {gw['metrics'].get('litebase_streams_gateway_slow_client_drops_total', 0):.0f}.")
    w("")
