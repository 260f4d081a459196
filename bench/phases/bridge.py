"""9. The NATS JetStream bridge (bridge/, litebase-streams-bridge, issue 31);
--only bridge runs just this.

A nats-server of the phase's own (`nats-server -js`, file storage in a
temporary directory, a free port of 127.0.0.1) and the bridge's release build
(`cargo build --profile gateway -p litebase-streams-bridge --bins`, the
build scripts/test.sh makes) against a fresh database, as the superuser, with
its defaults (--window 100, file storage, a 120 s duplicate window).
litebase-streams-bridge-bench (bridge/src/bin/bench.rs) is the other side:
the bridge's own modules (jetstream.rs, source.rs, bridge.rs) compiled in.

  9a. throughput: br_events events preloaded into one stream (1,000 per
      transaction, the webhooks phase's rows), then
        bridge  the bridge started with `--start beginning` on a subscription
                and into a JetStream stream of its own;
        direct  `direct`: the bridge's JetStream publisher publishing the
                same messages (the events' data as the database returns it,
                the headers and Nats-Msg-Id source.rs gives them) in windows
                of 100, each window's PubAcks awaited before the next, into a
                fresh stream on the same server: no database in the loop;
        database only  `null`: the bridge's loop and database session
                (bridge.rs, source.rs) with a sink that stores at once: what
                the database alone allows.
      bridge and direct are timed by JetStream itself: (N - 1) / (the last
      message's storage time - the first's), the same yardstick for both;
      database only by its sink's first and last batch. Also the bridge's
      wall time from its start to the subscription's position at the last
      event. br_reps rounds, rotating order, medians; the ratio bridge /
      direct (target bridge_vs_direct). CPU of each process per event.
  9b. latency at br_lat_rate events/s: paced publisher processes
      (common.publisher_main) commit one event per transaction into a stream
      the bridge follows (`--start now`, its long poll waiting); `latency`
      (an ordered push consumer of the bridge's JetStream stream, from its
      new messages) records each message's arrival with CLOCK_MONOTONIC,
      the clock of the publishers' COMMIT-returned times: from COMMIT
      returned to stored in JetStream and delivered to a consumer. p50/p99
      are reported, no threshold (issue 31 asks for the figures).

Every run reads its JetStream stream back (`check`): it must hold each event
exactly once (its Litebase-Position), in position order, and nothing else
(target bridge_exactly_once). JetStream streams are deleted after their
check, subscriptions dropped.
"""

import json
import os
import select
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import common as H
from phases.gateway import _free_port, _target_dir
from phases.webhooks import _preload

ORDER = 90
OWN_DB = True

TP_STREAM = "bench.bridge.tp"    # 9a
LAT_STREAM = "bench.bridge.lat"  # 9b
VARIANTS = ("bridge", "direct", "null")
LABELS = {"bridge": "bridge (database -> JetStream)", "direct": "direct (the same publisher, no database)",
          "null": "database only (the bridge's loop, a sink that stores at once)"}

FULL = dict(br_events=20_000, br_reps=3, br_window=100,
            br_lat_rate=1000, br_lat_secs=10, br_lat_warmup=1.0, br_lat_publishers=8)
QUICK = dict(br_events=2_000, br_reps=1, br_window=100,
             br_lat_rate=1000, br_lat_secs=1.5, br_lat_warmup=0.5, br_lat_publishers=4)


# --------------------------------------------------------------------------
# The programs
# --------------------------------------------------------------------------

def _build(b):
    """The bridge and its bench helper (release build, the gateway profile)."""
    log = b.log_dir / "bridge-build.log"
    with open(log, "w") as out:
        r = subprocess.run(["cargo", "build", "--profile", "gateway", "-p", "litebase-streams-bridge", "--bins"],
                           cwd=H.REPO, stdout=out, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise H.BenchError(f"cargo build of the bridge failed: see {log}")
    d = os.path.join(_target_dir(), "gateway")
    return os.path.join(d, "litebase-streams-bridge"), os.path.join(d, "litebase-streams-bridge-bench")


def _nats_server():
    for p in (shutil.which("nats-server"), "/usr/sbin/nats-server", "/usr/local/bin/nats-server"):
        if p and os.access(p, os.X_OK):
            return p
    raise H.BenchError("nats-server not found on PATH or in /usr/sbin (make setup installs it)")


class Nats:
    """nats-server -js on a free port of 127.0.0.1, its store in a temporary directory."""

    def __init__(self, b):
        exe = _nats_server()
        # "nats-server: v2.9.10"
        self.version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.split()[-1]
        self.dir = tempfile.TemporaryDirectory(prefix="litebase-bench-nats-")
        self.port = _free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.log = open(b.log_dir / "nats-server.log", "w")
        self.proc = subprocess.Popen([exe, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.dir.name],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise H.BenchError(f"nats-server did not start: see {b.log_dir / 'nats-server.log'}")
                time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.dir.cleanup()


class Bridge:
    """litebase-streams-bridge against the bench database, /metrics on a free port."""

    def __init__(self, b, exe, nats, subscription, pattern, js_stream, prefix, start, tag):
        self.port = _free_port()
        self.log_path = b.log_dir / f"bridge-{tag}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [exe, "--database-url", _db_url(), "--subscription", subscription, "--pattern", pattern,
             "--start", start, "--nats-url", nats.url, "--jetstream-stream", js_stream,
             "--subject-prefix", prefix, "--window", str(b.cfg["br_window"]),
             "--listen", f"127.0.0.1:{self.port}", "--log", "warn"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        self.pid = self.proc.pid

    def alive(self):
        if self.proc.poll() is not None:
            raise H.BenchError(f"the bridge exited ({self.proc.returncode}): see {self.log_path}")

    def wait_healthy(self, timeout=30):
        """Until /healthz answers 200: the subscription exists and NATS is connected."""
        deadline = time.monotonic() + timeout
        while True:
            self.alive()
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise H.BenchError(f"the bridge was not healthy within {timeout} s: see {self.log_path}")
            time.sleep(0.02)

    def stop(self):
        """SIGTERM: it acks the window in hand and exits."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _db_url():
    return f"host={H.PGHOST} port={H.PGPORT} user={H.PGUSER} dbname={H.DB}"


def _helper(exe, *args, timeout=600):
    r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise H.BenchError(f"litebase-streams-bridge-bench {args[0]} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check(exe, nats, js_stream, expected):
    """Read the stream back and delete it: does it hold each of `expected`
    (positions, ascending) once, in order, and nothing else?"""
    out = _helper(exe, "check", "--nats-url", nats.url, "--stream", js_stream, "--delete")
    got = out.pop("positions")
    want = set(expected)
    distinct = set(got)
    out["missing"] = len(want - distinct)
    out["unexpected"] = len(distinct - want)
    out["exactly_once"] = (out["messages"] == len(expected) and out["read"] == len(expected)
                           and not out["missing"] and not out["unexpected"] and not out["duplicates"]
                           and not out["out_of_order"] and not out["without_position"])
    return out


def _wait_position(c, subscription, position, timeout, proc=None):
    """Until the subscription's position (acked through) reaches `position`."""
    deadline = time.monotonic() + timeout
    while True:
        row = c.execute("SELECT position FROM streams.subscription_state WHERE name = %s",
                        (subscription,)).fetchone()
        if row and row[0] >= position:
            return time.monotonic()
        if proc is not None:
            proc.alive()
        if time.monotonic() > deadline:
            raise H.BenchError(f"subscription {subscription} not at {position} within {timeout} s: {row}")
        time.sleep(0.02)


def _per_event_us(cpu, key, n):
    """CPU µs per event of a process CpuMeter followed (% of one CPU over its seconds)."""
    v = cpu.get(key)
    return v / 100 * cpu["seconds"] * 1e6 / n if v is not None else None


# --------------------------------------------------------------------------
# The phase
# --------------------------------------------------------------------------

def run(b):
    cfg = b.cfg
    H.say(f"9. NATS JetStream bridge: {cfg['br_events']:,} events through the bridge vs published directly "
          f"({cfg['br_reps']} round(s)), latency at {cfg['br_lat_rate']:,} events/s; fresh database")
    bridge_exe, helper = _build(b)
    b.recreate_db()
    nats = Nats(b)
    try:
        res = dict(measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   config={k: cfg[k] for k in FULL}, nats_version=nats.version,
                   load_at_start=os.getloadavg()[0])
        with H.connect(H.DB) as c:
            c.execute("SET synchronous_commit = off")  # the preload is not measured
            positions = _preload(c, TP_STREAM, cfg["br_events"])
            b.wait_delivered(c)
        res["throughput"] = _throughput(b, bridge_exe, helper, nats, positions)
        res["latency"] = _latency(b, bridge_exe, helper, nats)
        b.res["bridge"] = res
    finally:
        nats.stop()


def _throughput(b, bridge_exe, helper, nats, positions):
    cfg = b.cfg
    n = len(positions)
    H.say(f"9a. {n:,} events: bridge / direct / database only, window {cfg['br_window']}, "
          f"{cfg['br_reps']} round(s), rotating order")
    with tempfile.TemporaryDirectory(prefix="litebase-bench-bridge-") as tmp:
        payloads = Path(tmp) / "payloads.txt"
        with H.connect(H.DB) as c:
            rows = c.execute("SELECT data::text FROM streams.events WHERE stream = %s ORDER BY position",
                             (TP_STREAM,)).fetchall()
            payloads.write_text("".join(r[0] + "\n" for r in rows))
            log_id = c.execute("SELECT streams.log_id()::text").fetchone()[0]
            tx, ts = c.execute("SELECT tx::text, to_char(time AT TIME ZONE 'UTC', "
                               "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM streams.events WHERE position = %s",
                               (positions[0],)).fetchone()
        out = {v: [] for v in VARIANTS}
        out["payload_bytes"] = sum(len(r[0]) for r in rows) / len(rows)
        with H.connect(H.DB) as c:
            for rnd, order in enumerate(H.rotations(list(VARIANTS), cfg["br_reps"])):
                for v in order:
                    if v == "bridge":
                        r = _via_bridge(b, c, bridge_exe, helper, nats, positions, rnd)
                    elif v == "direct":
                        r = _direct(b, helper, nats, positions, rnd, payloads, log_id, tx, ts)
                    else:
                        r = _null(b, c, helper, positions, rnd)
                    out[v].append(r)
                    H.info(f"round {rnd}, {v:<6}: {r['events_per_s']:>9,.0f} events/s"
                           + (f" (wall {r['wall_events_per_s']:,.0f}/s)" if "wall_events_per_s" in r else "")
                           + (f"; in JetStream once: {'yes' if r['check']['exactly_once'] else 'NO'}"
                              if "check" in r else ""))
    return out


def _via_bridge(b, c, exe, helper, nats, positions, rnd):
    sub, js, prefix = f"bench_bridge_r{rnd}", f"BENCH_BRIDGE_R{rnd}", f"bridge{rnd}"
    meter = H.CpuMeter(b.postmaster)
    t0 = time.monotonic()
    br = Bridge(b, exe, nats, sub, TP_STREAM, js, prefix, "beginning", f"tp-r{rnd}")
    try:
        meter.start({"nats": nats.pid, "bridge": br.pid})
        t1 = _wait_position(c, sub, positions[-1], timeout=600, proc=br)
        cpu = meter.stop()
    finally:
        br.stop()
    c.execute("SELECT streams.drop_subscription(%s)", (sub,))
    chk = _check(helper, nats, js, positions)
    n = len(positions)
    secs = (chk["last_ts_ns"] - chk["first_ts_ns"]) / 1e9
    return dict(events=n, seconds=secs, events_per_s=(n - 1) / secs if secs > 0 else float("nan"),
                wall_seconds=t1 - t0, wall_events_per_s=n / (t1 - t0), cpu=cpu,
                cpu_us=dict(bridge=_per_event_us(cpu, "bridge", n), nats=_per_event_us(cpu, "nats", n),
                            server=cpu["server_s"] * 1e6 / n if "server_s" in cpu else None),
                check=chk)


def _direct(b, helper, nats, positions, rnd, payloads, log_id, tx, ts):
    js, prefix = f"BENCH_DIRECT_R{rnd}", f"direct{rnd}"
    n = len(positions)
    first = positions[0]
    expected = list(range(first, first + n))
    meter = H.CpuMeter(b.postmaster).start({"nats": nats.pid})
    own = _helper(helper, "direct", "--nats-url", nats.url, "--stream", js, "--subject-prefix", prefix,
                  "--stream-name", TP_STREAM, "--count", n, "--window", b.cfg["br_window"],
                  "--payload-file", payloads, "--log-id", log_id, "--first-position", first, "--tx", tx,
                  "--time", ts)
    cpu = meter.stop()  # the helper exited: its CPU is in RUSAGE_CHILDREN ("pgbench")
    chk = _check(helper, nats, js, expected)
    secs = (chk["last_ts_ns"] - chk["first_ts_ns"]) / 1e9
    return dict(events=n, seconds=secs, events_per_s=(n - 1) / secs if secs > 0 else float("nan"),
                own=own, cpu=cpu,
                cpu_us=dict(publisher=_per_event_us(cpu, "pgbench", n), nats=_per_event_us(cpu, "nats", n)),
                check=chk)


def _null(b, c, helper, positions, rnd):
    sub = f"bench_null_r{rnd}"
    n = len(positions)
    meter = H.CpuMeter(b.postmaster).start({})
    own = _helper(helper, "null", "--database-url", _db_url(), "--subscription", sub, "--pattern", TP_STREAM,
                  "--start", "beginning", "--window", b.cfg["br_window"], "--count", n)
    cpu = meter.stop()
    at = c.execute("SELECT position FROM streams.subscription_state WHERE name = %s", (sub,)).fetchone()[0]
    c.execute("SELECT streams.drop_subscription(%s)", (sub,))
    if own["events"] != n or at < positions[-1]:
        raise H.BenchError(f"the null sink saw {own['events']} of {n} events, acked through {at}")
    return dict(events=n, seconds=own["seconds"], events_per_s=own["events_per_s"], own=own, cpu=cpu,
                cpu_us=dict(loop=_per_event_us(cpu, "pgbench", n),
                            server=cpu["server_s"] * 1e6 / n if "server_s" in cpu else None))


def _latency(b, bridge_exe, helper, nats):
    cfg = b.cfg
    P, rate = cfg["br_lat_publishers"], cfg["br_lat_rate"]
    H.say(f"9b. latency at {rate:,} events/s ({P} publisher processes, {cfg['br_lat_secs']} s, first "
          f"{cfg['br_lat_warmup']} s discarded): COMMIT returned -> stored in JetStream and delivered")
    sub, js = "bench_bridge_lat", "BENCH_BRIDGE_LAT"
    interval = int(P * 1e9 / rate)
    start_evt = b.ctx.Event()
    start_ns, end_ns = b.ctx.Value("q", 0), b.ctx.Value("q", 0)
    pubs, rec = [], None
    tmp = tempfile.TemporaryDirectory(prefix="litebase-bench-bridge-")
    arrivals_path = Path(tmp.name) / "arrivals.jsonl"
    br = Bridge(b, bridge_exe, nats, sub, LAT_STREAM, js, "lat", "now", "lat")
    try:
        br.wait_healthy()
        rec = subprocess.Popen([helper, "latency", "--nats-url", nats.url, "--stream", js,
                                "--out", str(arrivals_path)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([rec.stdout], [], [], 30)
        line = rec.stdout.readline() if ready else ""
        if '"ready"' not in line:
            raise H.BenchError(f"litebase-streams-bridge-bench latency did not start: {line}")
        for i in range(P):
            ready_evt = b.ctx.Event()
            rx, tx = b.ctx.Pipe(duplex=False)
            p = b.ctx.Process(target=H.publisher_main, daemon=True,
                              args=(H.dsn(H.DB), LAT_STREAM, interval, i * interval // P, ready_evt,
                                    start_evt, start_ns, end_ns, tx))
            p.start()
            pubs.append((p, ready_evt, rx))
        for p, ready_evt, _ in pubs:
            if not ready_evt.wait(60):
                raise H.BenchError("a publisher process did not start")
        meter = H.CpuMeter(b.postmaster).start({"bridge": br.pid, "nats": nats.pid, "recorder": rec.pid})
        t0 = time.monotonic_ns() + 200_000_000
        start_ns.value, end_ns.value = t0, t0 + int(cfg["br_lat_secs"] * 1e9)
        start_evt.set()
        sent = []
        for p, _, rx in pubs:
            (recs,) = H._recv(rx, cfg["br_lat_secs"] + 120, "publisher")
            sent.extend(recs)
            p.join(10)
        cpu = meter.stop()
        with H.connect(H.DB) as c:
            _wait_position(c, sub, max(r[0] for r in sent), timeout=120, proc=br)
        rec.stdin.close()  # the recorder drains for 500 ms more, then writes its records
        summary = json.loads(rec.stdout.read().strip().splitlines()[-1])
        if rec.wait(60) != 0:
            raise H.BenchError(f"litebase-streams-bridge-bench latency failed:\n{rec.stderr.read()[-2000:]}")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{br.port}/metrics", timeout=10).read().decode()
    finally:
        for p, _, _ in pubs:
            if p.is_alive():
                p.kill()
        if rec is not None and rec.poll() is None:
            rec.kill()
            rec.wait()
        br.stop()
    with H.connect(H.DB) as c:
        c.execute("SELECT streams.drop_subscription(%s)", (sub,))
    expected = sorted(r[0] for r in sent)
    chk = _check(helper, nats, js, expected)
    arrived = {}
    got = []
    with open(arrivals_path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            got.append(r["position"])
            arrived.setdefault(r["position"], r["mono_ns"])
    tmp.cleanup()
    warm_end = t0 + int(cfg["br_lat_warmup"] * 1e9)
    measured = [r for r in sent if r[1] >= warm_end]
    after = [(arrived[pos] - t_after) / 1e6 for pos, _, _, t_after in measured if pos in arrived]
    behind = [(t_before - t_sched) / 1e6 for _, t_sched, t_before, _ in measured]
    span = cfg["br_lat_secs"] - cfg["br_lat_warmup"]
    scraped = {}
    for line in metrics.splitlines():
        if line.startswith("litebase_streams_bridge_") and " " in line:
            name, value = line.rsplit(" ", 1)
            scraped[name] = float(value)
    windows = scraped.get("litebase_streams_bridge_acks_total")
    n_all = len(sent)
    out = dict(events=len(measured), published=n_all, achieved_rate=len(measured) / span,
               from_commit_returned_ms=after, publisher_behind_schedule_ms=behind,
               received=summary["messages"], recorder_missing=len(set(expected) - set(arrived)),
               recorder_duplicates=len(got) - len(set(got)),
               recorder_out_of_order=sum(1 for a, b_ in zip(got, got[1:]) if b_ <= a),
               windows=windows, events_per_window=n_all / windows if windows else None,
               cpu=cpu, cpu_us=dict(bridge=_per_event_us(cpu, "bridge", n_all),
                                    nats=_per_event_us(cpu, "nats", n_all),
                                    server=cpu["server_s"] * 1e6 / n_all if "server_s" in cpu else None),
               metrics=scraped, check=chk)
    H.info(f"{len(measured):,} events at {out['achieved_rate']:,.0f}/s: COMMIT returned -> in JetStream and "
           f"delivered p50 {H.pct(after, 50):.2f} ms, p99 {H.pct(after, 99):.2f} ms; "
           f"{out['events_per_window'] or float('nan'):.1f} events per window; in JetStream once: "
           f"{'yes' if chk['exactly_once'] else 'NO'}")
    return out


# --------------------------------------------------------------------------
# Report (called from bench/report.py; reads res["bridge"] only)
# --------------------------------------------------------------------------

def _eps(runs):
    return H.med([r["events_per_s"] for r in runs]) if runs else float("nan")


def _bad_runs(br):
    runs = [r for v in ("bridge", "direct") for r in br["throughput"][v]] + [br["latency"]]
    return [r for r in runs if not r["check"]["exactly_once"]]


def values(res):
    br = res.get("bridge")
    if not br:
        return {}
    tp = br["throughput"]
    bridge, direct = _eps(tp["bridge"]), _eps(tp["direct"])
    bad = _bad_runs(br)
    lat = br["latency"]
    bad_lat = lat["recorder_missing"] or lat["recorder_duplicates"] or lat["recorder_out_of_order"]
    return {
        "bridge_vs_direct": dict(value=bridge / direct, events=f"{br['config']['br_events']:,}",
                                 window=br["config"]["br_window"], bridge=f"{bridge:,.0f}", direct=f"{direct:,.0f}"),
        "bridge_exactly_once": dict(
            value=not bad and not bad_lat,
            shown="no: " + "; ".join(
                [f"{r['check']['messages']:,} messages, {r['check']['missing']} missing, "
                 f"{r['check']['duplicates']} twice, {r['check']['unexpected']} unexpected, "
                 f"{r['check']['out_of_order']} out of order" for r in bad]
                + ([f"the consumer: {lat['recorder_missing']} missing, {lat['recorder_duplicates']} twice, "
                    f"{lat['recorder_out_of_order']} out of order"] if bad_lat else []))),
    }


def notes(res, short):
    br = res.get("bridge")
    if not br or "bridge_vs_direct" not in short:
        return []
    tp = br["throughput"]

    def us(v, k):
        x = [r["cpu_us"].get(k) for r in tp[v] if r["cpu_us"].get(k) is not None]
        return H.med(x) if x else float("nan")

    return [f"**bridge:** {_eps(tp['bridge']):,.0f} events/s through the bridge, {_eps(tp['direct']):,.0f} "
            f"published directly, {_eps(tp['null']):,.0f} with the bridge's database loop alone (a sink that "
            f"stores at once); per event the bridge used {us('bridge', 'bridge'):.1f} µs of CPU, the "
            f"server {us('bridge', 'server'):.1f} µs and nats-server {us('bridge', 'nats'):.1f} µs, on "
            f"{res['machine']['nproc']} CPUs (see section 9)."]


def section(res, w):
    br = res.get("bridge")
    if not br:
        return
    cfg, tp, lat = br["config"], br["throughput"], br["latency"]
    f0, fms, pct, med = H.f0, H.fms, H.pct, H.med
    w("## 9. NATS JetStream bridge")
    w("")
    w(f"Measured {br['measured_at']} (load average {br['load_at_start']:.2f} at the start of the phase), in a "
      f"fresh database. `litebase-streams-bridge` (release build, its defaults: window {cfg['br_window']}, "
      "file storage, a 120 s duplicate window) consumes as the superuser and publishes to a nats-server "
      f"{br['nats_version']} of the phase's own (`-js`, file storage in a temporary directory) on 127.0.0.1; "
      "`litebase-streams-bridge-bench` (bridge/src/bin/bench.rs, the bridge's own modules compiled in) is "
      f"the other side. Server, bridge, nats-server and the clients share the machine's "
      f"{res['machine']['nproc']} CPUs.")
    w("")
    w(f"**Throughput.** {cfg['br_events']:,} events preloaded into one stream ({tp['payload_bytes']:.0f} bytes of "
      "data each), then: the bridge started from the beginning on a subscription and into a JetStream stream of "
      f"its own; *direct*: the bridge's JetStream publisher (jetstream.rs) publishing the same messages (the "
      "same data, headers and `Nats-Msg-Id`) into a fresh stream on the same server in windows of "
      f"{cfg['br_window']}, each window's PubAcks awaited before the next, without the database; *database "
      "only*: the bridge's loop and database session (bridge.rs, source.rs) with a sink that stores at once. "
      "Events/s by JetStream's own clock for the bridge and direct: (N - 1) / (last message's storage time - "
      "the first's); for database only between its sink's first and last batch. *Wall*: from starting the "
      "bridge to its subscription acked through the last event (startup included). "
      + (f"{cfg['br_reps']} rounds, rotating order, median (runs in brackets)" if cfg["br_reps"] > 1
         else "One round") + ". CPU per event: % of one CPU of each process over the run.")
    w("")

    def cpu(runs, k):
        x = [r["cpu_us"].get(k) for r in runs if r["cpu_us"].get(k) is not None]
        return f"{med(x):.1f} µs" if x else "n/a"

    w("| variant | events/s | wall events/s | vs direct | client CPU / event | PostgreSQL CPU / event "
      "| nats-server CPU / event |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    direct = _eps(tp["direct"])
    for v in VARIANTS:
        runs = tp[v]
        eps = [r["events_per_s"] for r in runs]
        wall = [r["wall_events_per_s"] for r in runs if "wall_events_per_s" in r]
        client = {"bridge": "bridge", "direct": "publisher", "null": "loop"}[v]
        w(f"| {LABELS[v]} | {f0(med(eps))}" + (f" ({H.reps_str(eps)})" if len(eps) > 1 else "")
          + f" | {f0(med(wall)) if wall else 'n/a'} | {H.fx(med(eps) / direct)} | {cpu(runs, client)} | "
          f"{cpu(runs, 'server') if v != 'direct' else 'none'} | {cpu(runs, 'nats') if v != 'null' else 'none'} |")
    w("")
    null = _eps(tp["null"])
    serial = 1 / (1 / direct + 1 / null)
    w(f"Database only and direct one after the other, nothing overlapping, would give 1 / (1 / {f0(direct)} + "
      f"1 / {f0(null)}) = {f0(serial)} events/s ({H.fx(serial / direct)} direct): the bridge claims a window, "
      "publishes it, waits for its PubAcks and only then acks it and claims the next, in one round trip.")
    w("")
    a = lat["from_commit_returned_ms"]
    w(f"**Latency.** {cfg['br_lat_publishers']} publisher processes commit one `streams.publish` per transaction on "
      f"a fixed schedule ({cfg['br_lat_rate']:,} events/s in total) for {cfg['br_lat_secs']} s, the first "
      f"{cfg['br_lat_warmup']} s discarded (section 2's method), into a stream the bridge follows (`--start now`, "
      "its long poll waiting). An ordered push consumer of the bridge's JetStream stream, from its new messages, "
      "timestamps each arrival: from the publisher's COMMIT returning to the message stored in JetStream and "
      "delivered to the consumer (CLOCK_MONOTONIC in both processes). No target: issue 31 asks for the figures.")
    w("")
    w("| events | events per window | p50 | p90 | p99 | max | bridge CPU / event | publishers behind schedule p99 |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- |")
    epw = lat["events_per_window"]
    w(f"| {f0(lat['events'])} ({f0(lat['achieved_rate'])}/s) | {f'{epw:.1f}' if epw else 'n/a'} | "
      f"{fms(pct(a, 50))} | {fms(pct(a, 90))} | {fms(pct(a, 99))} | {fms(max(a, default=float('nan')))} | "
      + (f"{lat['cpu_us']['bridge']:.1f} µs" if lat["cpu_us"]["bridge"] is not None else "n/a")
      + f" | {fms(pct(lat['publisher_behind_schedule_ms'], 99))} |")
    w("")
    bad = _bad_runs(br)
    w("Every run's JetStream stream held each event exactly once, in position order, and nothing else."
      if not bad else f"**{len(bad)} run(s) left JetStream without an event, with one twice or out of order** "
      "(see results.json).")
    w("")
