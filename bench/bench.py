#!/usr/bin/env python3
"""Benchmarks of litebase_streams against the plain-PostgreSQL anchors.

    make bench            full run (about 9 minutes): docs/benchmarks.md, docs/bench-*.png
    make bench QUICK=1    smoke run (under a minute): target/bench-quick/benchmarks.md

The Makefile runs `setup install start` first (a release build of the extension
in the local cluster) and exports PGHOST (the cluster's socket directory),
PGPORT and PG_BINDIR. Run directly, this script assumes the same defaults as
scripts/common.sh. Python packages (psycopg, matplotlib) are installed into
target/bench-venv on first use (bench/requirements.txt).

Every comparison runs side by side in one run, repetitions interleaved with a
rotating order (A B C, B C A, C A B), and reports medians:

  1. publish throughput (pgbench, 1/8/32 clients): streams.publish vs a plain
     INSERT of the same row vs INSERT + pg_notify in the same transaction, with
     the delivery worker running and a LISTEN client draining "payment.success";
     publish_batch of 100 events vs a 100-row INSERT.
  2. delivery latency: commit -> notification received at a paced 1,000 events/s,
     and the worker's lag while pgbench publishes at the maximum rate, with
     synchronous commit and with synchronous_commit = off (32 clients).
  3. replay throughput over N events (1M): streams.replay(), the streams.events
     view and a raw ordered scan of a plain copy of the same rows.
  4. storage: bytes per event, streams tables vs bench_plain with the same rows.
  6. subscriptions (bench/consume.py): consume throughput of an ordered
     subscription vs replay() pages with an own cursor table vs PgQ 3, competing
     consumers on an unordered subscription, long-poll wake-up latency.

Exit status: non-zero when the harness breaks (a command or query fails, the
worker does not deliver in time); a missed target is reported, not an error.
"""

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import consume

REPO = Path(__file__).resolve().parent.parent
HERE = REPO / "bench"
VENV = REPO / "target" / "bench-venv"
EXT = "litebase_streams"
CHANNEL = "payment.success"
PAYLOAD = '{"order_id":"ord_123","amount":49.00}'

# The three single-event methods (pgbench scripts in bench/), in report order.
METHODS = [
    ("publish", "streams.publish", "publish.sql"),
    ("plain", "plain INSERT", "plain_insert.sql"),
    ("notify", "INSERT + pg_notify", "in_tx_notify.sql"),
]
BATCH_METHODS = [
    ("publish_batch", "streams.publish_batch (100 events)", "publish_batch.sql"),
    ("plain_batch", "100-row INSERT", "plain_insert_batch.sql"),
]
BATCH_SIZE = 100
# litebase_streams.max_backlog for the second asynchronous-commit lag run:
# off, to show what the default backpressure buys.
ASYNC_MAX_BACKLOG = 0
# Streams of the replay data set (events rotate over them, one stream per chunk).
REPLAY_STREAMS = [
    "payment.success", "payment.failed", "order.created", "order.shipped", "user.signup",
    "user.login", "cart.updated", "invoice.sent", "refund.issued", "stock.changed",
]

FULL = dict(
    secs=8, reps=3, clients=[1, 8, 32], batch_clients=8,
    lat_rate=1000, lat_secs=20, lat_warmup=1.0, lat_publishers=8,
    lag_clients=16, lag_secs=15, async_clients=32,
    replay_events=1_000_000, replay_chunk=1000, replay_reps=3,
    growth_sizes=[1_000_000, 10_000_000, 50_000_000], growth_chunk=10_000,
    **consume.FULL,
)
QUICK = dict(
    secs=2, reps=1, clients=[1, 32], batch_clients=8,
    lat_rate=1000, lat_secs=4, lat_warmup=0.5, lat_publishers=8,
    lag_clients=16, lag_secs=3, async_clients=32,
    replay_events=10_000, replay_chunk=1000, replay_reps=1,
    growth_sizes=[20_000, 60_000], growth_chunk=10_000,
    **consume.QUICK,
)


class BenchError(Exception):
    """The harness itself failed (not a missed target)."""


def say(msg):
    print(f"==> bench: {msg}", flush=True)


def info(msg):
    print(f"    {msg}", flush=True)


# --------------------------------------------------------------------------
# Python environment: re-exec inside target/bench-venv with the packages.
# --------------------------------------------------------------------------

def _have_packages():
    try:
        import matplotlib  # noqa: F401
        import psycopg  # noqa: F401
        return True
    except ImportError:
        return False


def bootstrap():
    if _have_packages():
        return
    if os.environ.get("LITEBASE_BENCH_BOOTSTRAPPED"):
        raise BenchError(f"psycopg/matplotlib still missing in {sys.executable}")
    py = VENV / "bin" / "python"
    if not py.exists():
        say(f"creating {VENV.relative_to(REPO)} (Python packages for the benchmark)")
        r = subprocess.run([sys.executable, "-m", "venv", str(VENV)])
        if r.returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            # Debian's own python3 needs python3-venv for ensurepip.
            if os.geteuid() == 0 and shutil.which("apt-get"):
                say("installing python3-venv")
                subprocess.run(["apt-get", "install", "-y", "-q", "python3-venv"], check=True)
                subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            else:
                raise BenchError("python3 -m venv failed (install python3-venv)")
    if subprocess.run([str(py), "-c", "import psycopg, matplotlib"],
                      capture_output=True).returncode != 0:
        say("pip install -r bench/requirements.txt")
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-r", str(HERE / "requirements.txt")], check=True)
    os.environ["LITEBASE_BENCH_BOOTSTRAPPED"] = "1"
    sys.stdout.flush()
    os.execv(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]])


# --------------------------------------------------------------------------
# Connection settings (same defaults as scripts/common.sh).
# --------------------------------------------------------------------------

PGPORT = os.environ.get("PGPORT", "54329")
if os.environ.get("PGHOST"):
    PGHOST = os.environ["PGHOST"]
else:
    _data = os.environ.get("PGDATA_DIR") or (
        f"/tmp/{EXT}-cluster-{PGPORT}" if os.geteuid() == 0 else str(REPO / ".cluster"))
    PGHOST = f"{_data}/socket"
PGUSER = os.environ.get("BENCH_PGUSER", "postgres")
DB = os.environ.get("BENCH_DB", "litebase_bench")


def pg_bindir():
    if os.environ.get("PG_BINDIR"):
        return os.environ["PG_BINDIR"]
    pg_config = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
    return subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                          check=True).stdout.strip()


def dsn(db):
    return f"host={PGHOST} port={PGPORT} user={PGUSER} dbname={db} application_name=litebase_bench"


def connect(db):
    import psycopg
    return psycopg.connect(dsn(db), autocommit=True)


# --------------------------------------------------------------------------
# Statistics helpers
# --------------------------------------------------------------------------

def pct(values, p):
    """Nearest-rank percentile of an unsorted list (p in 0..100)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]


def med(values):
    return statistics.median(values) if values else float("nan")


def parse_ts_ns(s):
    """RFC 3339 UTC with microseconds ('2026-11-30T00:52:34.659173Z') -> ns since epoch."""
    d = dt.datetime.fromisoformat(s)
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.timezone.utc)
    delta = d - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def rotations(items, reps):
    """Interleaved order: rep 0 A B C, rep 1 B C A, rep 2 C A B, ..."""
    n = len(items)
    return [[items[(r + i) % n] for i in range(n)] for r in range(reps)]


# --------------------------------------------------------------------------
# CPU accounting: where the 2 CPUs go during a run (machine, the delivery
# worker, the LISTEN client, pgbench).
# --------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid):
    """Fields of /proc/<pid>/stat after the command name: [0] state, [1] ppid,
    [11] utime, [12] stime, [13] cutime, [14] cstime (clock ticks)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _proc_ticks(pid):
    f = _stat_fields(pid)
    return int(f[11]) + int(f[12]) if f else None


def _server_ticks(postmaster):
    """CPU ticks of the postmaster, of its live children (backends, the worker)
    and of the children it already reaped (cutime/cstime)."""
    f = _stat_fields(postmaster)
    if not f:
        return None, {}
    own = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            g = _stat_fields(d)
            if g and g[1] == str(postmaster):
                kids[d] = int(g[11]) + int(g[12])
    return own, kids


def _machine_ticks():
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)  # idle + iowait
    return sum(parts[:8]) - idle, sum(parts[:8])


class CpuMeter:
    """CPU used between start() and stop(): the whole machine (% of all CPUs,
    unrelated processes included), the PostgreSQL server (every process of the
    cluster: seconds), and named processes and pgbench (% of one CPU)."""

    def __init__(self, postmaster=None):
        self.postmaster = postmaster

    def start(self, pids):
        self.pids = {k: v for k, v in pids.items() if v}
        self.t0 = time.monotonic()
        self.m0 = _machine_ticks()
        self.p0 = {k: _proc_ticks(v) for k, v in self.pids.items()}
        self.s0 = _server_ticks(self.postmaster) if self.postmaster else (None, {})
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.c0 = ru.ru_utime + ru.ru_stime
        return self

    def stop(self):
        dt_s = time.monotonic() - self.t0
        m1 = _machine_ticks()
        busy, total = m1[0] - self.m0[0], m1[1] - self.m0[1]
        out = {"seconds": dt_s, "machine": 100.0 * busy / total if total else float("nan")}
        for k, pid in self.pids.items():
            t1 = _proc_ticks(pid)
            if t1 is not None and self.p0[k] is not None:
                out[k] = 100.0 * (t1 - self.p0[k]) / CLK_TCK / dt_s
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["pgbench"] = 100.0 * (ru.ru_utime + ru.ru_stime - self.c0) / dt_s
        if self.s0[0] is not None:
            time.sleep(0.1)  # let the postmaster reap the backends pgbench just closed
            own1, kids1 = _server_ticks(self.postmaster)
            if own1 is not None:
                ticks = own1 - self.s0[0] + sum(t - self.s0[1].get(pid, 0) for pid, t in kids1.items())
                out["server_s"] = ticks / CLK_TCK
                out["server"] = 100.0 * out["server_s"] / dt_s
        return out


# --------------------------------------------------------------------------
# Child processes: a LISTEN client and paced publishers (spawned, so each has
# its own interpreter: no GIL shared with the other side of a measurement).
# Timestamps are CLOCK_MONOTONIC (time.monotonic_ns), one clock for every
# process on the machine, so times taken in different processes compare.
# --------------------------------------------------------------------------

def listener_main(conninfo, channel, record, stop_evt, ready_evt, counter, out):
    try:
        import psycopg
        mono, real = time.monotonic_ns, time.time_ns
        conn = psycopg.connect(conninfo, autocommit=True)
        conn.execute(f'LISTEN "{channel}"')
        ready_evt.set()
        recs = []
        n = 0
        while not stop_evt.is_set():
            for note in conn.notifies(timeout=0.1):
                if record:
                    recs.append((mono(), real(), note.payload))
                n += 1
                counter.value = n
        conn.close()
        out.send(("ok", n, recs))
    except BaseException:  # report to the parent, which fails the run
        out.send(("error", traceback.format_exc(), None))


def publisher_main(conninfo, stream, interval_ns, offset_ns, ready_evt, start_evt,
                   start_ns, end_ns, out):
    try:
        import psycopg
        mono = time.monotonic_ns
        conn = psycopg.connect(conninfo, autocommit=True)
        cur = conn.cursor()
        q = "SELECT streams.publish(%s, %s::jsonb)"
        # Warm up the connection and the prepared statement (outside the measurement).
        for _ in range(6):
            cur.execute("BEGIN")
            cur.execute(q, (stream, PAYLOAD), prepare=True)
            cur.fetchone()
            cur.execute("ROLLBACK")
        ready_evt.set()
        start_evt.wait()
        t_next, t_end = start_ns.value + offset_ns, end_ns.value
        recs = []
        while t_next < t_end:
            now = mono()
            if now < t_next:
                time.sleep((t_next - now) / 1e9)
            t_sched = t_next
            cur.execute("BEGIN")
            cur.execute(q, (stream, PAYLOAD), prepare=True)
            pos = cur.fetchone()[0]
            t_before = mono()
            cur.execute("COMMIT")
            t_after = mono()
            recs.append((pos, t_sched, t_before, t_after))
            t_next += interval_ns
        conn.close()
        out.send(("ok", recs))
    except BaseException:
        out.send(("error", traceback.format_exc()))


def _recv(pipe, timeout, what):
    if not pipe.poll(timeout):
        raise BenchError(f"{what}: no result within {timeout:.0f} s")
    msg = pipe.recv()
    if msg[0] != "ok":
        raise BenchError(f"{what} failed:\n{msg[1]}")
    return msg[1:]


class Listener:
    """A LISTEN client in its own process that drains (and optionally records)
    every notification on one channel until finish()."""

    def __init__(self, ctx, db, channel, record):
        self.stop, self.ready = ctx.Event(), ctx.Event()
        self.count = ctx.Value("q", 0, lock=False)
        self.rx, tx = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=listener_main, daemon=True,
                                args=(dsn(db), channel, record, self.stop, self.ready,
                                      self.count, tx))

    def start(self):
        self.proc.start()
        if not self.ready.wait(30):
            self.proc.kill()
            raise BenchError("LISTEN client did not start")
        return self

    def wait_count(self, n, timeout):
        deadline = time.monotonic() + timeout
        while self.count.value < n:
            if time.monotonic() > deadline or not self.proc.is_alive():
                return False
            time.sleep(0.02)
        return True

    def finish(self):
        self.stop.set()
        n, recs = _recv(self.rx, 120, "LISTEN client")
        self.proc.join(10)
        return n, recs


# --------------------------------------------------------------------------
# Server helpers
# --------------------------------------------------------------------------

class Bench:
    def __init__(self, cfg, quick, out_dir, log_dir):
        self.cfg, self.quick = cfg, quick
        self.out_dir, self.log_dir = out_dir, log_dir
        self.pgbench = os.path.join(pg_bindir(), "pgbench")
        self.ctx = mp.get_context("spawn")
        self.res = {"mode": "quick" if quick else "full", "config": cfg}
        self._log_seq = 0
        self.postmaster = None

    def find_postmaster(self):
        """The server's postmaster pid (the parent of our backend), when it runs here."""
        with connect("postgres") as c:
            pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        f = _stat_fields(pid)
        self.postmaster = int(f[1]) if f else None

    # -- database --------------------------------------------------------

    def recreate_db(self):
        with connect("postgres") as c:
            c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {DB}")
        with connect(DB) as c:
            c.execute(f"CREATE EXTENSION {EXT}")
            c.execute((HERE / "schema.sql").read_text())
        with connect(DB) as c:
            deadline = time.monotonic() + 30
            while True:
                st = self.status(c)
                if st["worker_state"] in ("idle", "delivering"):
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"the delivery worker of {DB} is not running: {st}")
                time.sleep(0.1)

    @staticmethod
    def status(c):
        row = c.execute("SELECT horizon, newest_position, delivered_position, lag_positions, "
                        "worker_state, worker_pid, extract(epoch FROM holder_age) * 1000 "
                        "FROM streams.status").fetchone()
        return dict(zip(["horizon", "newest", "delivered", "lag", "worker_state", "worker_pid", "holder_ms"],
                        row))

    def wait_delivered(self, c, timeout=120):
        """Wait until the worker delivered every position allocated so far;
        return the seconds it took."""
        t0 = time.monotonic()
        target = self.status(c)["newest"]
        while True:
            st = self.status(c)
            if (st["delivered"] or 0) >= target and (st["horizon"] or 0) >= target:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise BenchError(f"worker did not deliver up to position {target} in {timeout} s: {st}")
            time.sleep(0.005)

    def run_pgbench(self, script, clients, secs, tag, pids=None, pgoptions=None):
        self._log_seq += 1
        log = self.log_dir / f"{self._log_seq:03d}-pgbench-{tag}.log"
        cmd = [self.pgbench, "-n", "-f", str(HERE / script), "-c", str(clients),
               "-j", str(min(2, clients)), "-T", str(secs),
               "-h", PGHOST, "-p", str(PGPORT), "-U", PGUSER, DB]
        env = dict(os.environ, PGOPTIONS=pgoptions) if pgoptions else None
        meter = CpuMeter(self.postmaster).start(pids or {})
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        cpu = meter.stop()
        log.write_text(f"$ {' '.join(cmd)}\n\n{r.stdout}\n{r.stderr}")
        if r.returncode != 0:
            raise BenchError(f"pgbench failed (exit {r.returncode}), see {log}:\n{r.stderr[-2000:]}")
        tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", r.stdout)
        n = re.search(r"number of transactions actually processed: (\d+)", r.stdout)
        lat = re.search(r"latency average = ([0-9.]+) ms", r.stdout)
        if not (tps and n):
            raise BenchError(f"cannot parse pgbench output, see {log}")
        return dict(tps=float(tps.group(1)), xacts=int(n.group(1)),
                    latency_ms=float(lat.group(1)) if lat else None, cpu=cpu)

    def storage(self, c, plain_table):
        c.execute(f"VACUUM (ANALYZE) streams.event_log, streams.transactions, "
                  f"streams.horizon_state, {plain_table}")
        q = c.execute(f"""
            SELECT pg_total_relation_size('streams.event_log'),
                   pg_relation_size('streams.event_log'),
                   pg_indexes_size('streams.event_log'),
                   pg_total_relation_size('streams.transactions'),
                   pg_total_relation_size('streams.horizon_state'),
                   (SELECT count(*) FROM streams.event_log),
                   (SELECT count(*) FROM streams.transactions),
                   pg_total_relation_size('{plain_table}'),
                   pg_relation_size('{plain_table}'),
                   pg_indexes_size('{plain_table}'),
                   (SELECT count(*) FROM {plain_table}),
                   (SELECT count(*) FROM pg_index WHERE indrelid = 'streams.event_log'::regclass),
                   (SELECT count(*) FROM pg_index WHERE indrelid = '{plain_table}'::regclass)""").fetchone()
        (log_total, log_heap, log_idx, tx_total, hz_total, events, txs,
         plain_total, plain_heap, plain_idx, plain_rows, log_nidx, plain_nidx) = q
        ours = log_total + tx_total + hz_total
        return dict(
            events=events, transactions=txs, plain_rows=plain_rows,
            event_log_total=log_total, event_log_heap=log_heap, event_log_indexes=log_idx,
            event_log_index_count=log_nidx, plain_index_count=plain_nidx,
            transactions_total=tx_total, horizon_state_total=hz_total,
            plain_total=plain_total, plain_heap=plain_heap, plain_indexes=plain_idx,
            ours_per_event=ours / events, plain_per_row=plain_total / plain_rows,
            ratio=(ours / events) / (plain_total / plain_rows))

    # -- 1. publish throughput ------------------------------------------------

    def phase_throughput(self):
        cfg = self.cfg
        say(f"1. publish throughput: {', '.join(m[1] for m in METHODS)} at "
            f"{cfg['clients']} clients, {cfg['reps']} x {cfg['secs']} s each, interleaved")
        runs = {m[0]: {n: [] for n in cfg["clients"]} for m in METHODS}
        catchup = {n: [] for n in cfg["clients"]}
        batch = {m[0]: [] for m in BATCH_METHODS}
        notified_xacts = 0
        lst = Listener(self.ctx, DB, CHANNEL, record=False).start()
        try:
            with connect(DB) as c:
                pids = {"worker": self.status(c)["worker_pid"], "listener": lst.proc.pid}
                for clients in cfg["clients"]:
                    for order in rotations(METHODS, cfg["reps"]):
                        for key, label, script in order:
                            c.execute("CHECKPOINT")
                            r = self.run_pgbench(script, clients, cfg["secs"], f"{key}-c{clients}", pids)
                            if key == "publish":
                                r["catchup_s"] = self.wait_delivered(c)
                                catchup[clients].append(r["catchup_s"])
                            if key == "notify":
                                notified_xacts += r["xacts"]
                            runs[key][clients].append(r)
                            info(f"{label:<20} c={clients:<3} {r['tps']:>10,.0f} tps"
                                 + (f"  (delivered {r['catchup_s'] * 1000:.0f} ms after the run)"
                                    if "catchup_s" in r else ""))
                say("storage after the single-event runs (one event per transaction)")
                self.res["storage_single"] = self.storage(c, "bench_plain")
                for order in rotations(BATCH_METHODS, cfg["reps"]):
                    for key, label, script in order:
                        c.execute("CHECKPOINT")
                        r = self.run_pgbench(script, cfg["batch_clients"], cfg["secs"],
                                             f"{key}-c{cfg['batch_clients']}", pids)
                        if key == "publish_batch":
                            r["catchup_s"] = self.wait_delivered(c)
                        r["events_per_s"] = r["tps"] * BATCH_SIZE
                        batch[key].append(r)
                        info(f"{label:<36} c={cfg['batch_clients']:<3} "
                             f"{r['events_per_s']:>10,.0f} events/s")
                # Every notification must reach the LISTEN client exactly once:
                # one per event published on the channel, one per notify transaction.
                published = c.execute("SELECT count(*) FROM streams.event_log WHERE stream = %s",
                                      (CHANNEL,)).fetchone()[0]
                expected = published + notified_xacts
                lst.wait_count(expected, 60)
        finally:
            received, _ = lst.finish()
        self.res["throughput"] = dict(runs=runs, catchup=catchup, batch=batch,
                                      listener=dict(expected=expected, received=received))
        if received != expected:
            info(f"WARNING: the LISTEN client received {received:,} notifications, expected {expected:,}")

    # -- 2. latency and lag -----------------------------------------------------

    def phase_latency(self):
        cfg = self.cfg
        P, rate = cfg["lat_publishers"], cfg["lat_rate"]
        say(f"2a. delivery latency at {rate:,} events/s ({P} publisher processes, "
            f"{cfg['lat_secs']} s, first {cfg['lat_warmup']} s discarded)")
        with connect(DB) as c:
            self.wait_delivered(c)
        lst = Listener(self.ctx, DB, CHANNEL, record=True).start()
        interval = int(P * 1e9 / rate)
        start_evt = self.ctx.Event()
        start_ns, end_ns = self.ctx.Value("q", 0), self.ctx.Value("q", 0)
        pubs = []
        try:
            for i in range(P):
                ready = self.ctx.Event()
                rx, tx = self.ctx.Pipe(duplex=False)
                p = self.ctx.Process(target=publisher_main, daemon=True,
                                     args=(dsn(DB), CHANNEL, interval, i * interval // P, ready,
                                           start_evt, start_ns, end_ns, tx))
                p.start()
                pubs.append((p, ready, rx))
            for p, ready, _ in pubs:
                if not ready.wait(60):
                    raise BenchError("a publisher process did not start")
            t0 = time.monotonic_ns() + 200_000_000
            start_ns.value, end_ns.value = t0, t0 + int(cfg["lat_secs"] * 1e9)
            start_evt.set()
            sent = []
            for p, _, rx in pubs:
                (recs,) = _recv(rx, cfg["lat_secs"] + 120, "publisher")
                sent.extend(recs)
                p.join(10)
            lst.wait_count(len(sent), 30)
        finally:
            for p, _, _ in pubs:
                if p.is_alive():
                    p.kill()
            n, recs = lst.finish()
        recv = {}
        for mono_ns, real_ns, payload in recs:
            ev = json.loads(payload)
            recv[ev["position"]] = (mono_ns, real_ns, parse_ts_ns(ev["time"]))
        warm_end = t0 + int(cfg["lat_warmup"] * 1e9)
        measured = [r for r in sent if r[1] >= warm_end]
        missing = [r[0] for r in measured if r[0] not in recv]
        after, before, commit_lag, behind = [], [], [], []
        for pos, t_sched, t_before, t_after in measured:
            if pos in recv:
                mono_ns, real_ns, commit_ns = recv[pos]
                after.append((mono_ns - t_after) / 1e6)
                before.append((mono_ns - t_before) / 1e6)
                commit_lag.append((real_ns - commit_ns) / 1e6)
            behind.append((t_before - t_sched) / 1e6)
        span = (cfg["lat_secs"] - cfg["lat_warmup"])
        lat = dict(
            events=len(measured), achieved_rate=len(measured) / span, missing=len(missing),
            duplicates=n - len(recv), from_commit_returned_ms=after,
            from_before_commit_ms=before, commit_ts_to_received_ms=commit_lag,
            publisher_behind_schedule_ms=behind)
        self.res["latency"] = lat
        info(f"{len(measured):,} events at {lat['achieved_rate']:,.0f}/s: from COMMIT returned "
             f"p50 {pct(after, 50):.2f} ms, p99 {pct(after, 99):.2f} ms, max {max(after, default=float('nan')):.2f} ms")
        if missing:
            info(f"WARNING: {len(missing)} published events were never received (first: {missing[:5]})")

    def phase_lag(self, async_commit=False, max_backlog=None):
        """max_backlog: None keeps the server's setting (the default), a
        number sets it for this run."""
        cfg = self.cfg
        key, clients = ("lag_async", cfg["async_clients"]) if async_commit else ("lag", cfg["lag_clients"])
        if max_backlog is not None:
            key += "_backlog"
        say(f"2{'c' if async_commit else 'b'}. worker lag at the maximum rate: pgbench publish.sql, "
            f"{clients} clients{', synchronous_commit = off' if async_commit else ''}"
            f"{f', max_backlog = {max_backlog:,}' if max_backlog is not None else ''}, "
            f"{cfg['lag_secs']} s; streams.status sampled every 50 ms")
        with connect("postgres") as c:
            if max_backlog is not None:
                c.execute(f"ALTER SYSTEM SET litebase_streams.max_backlog = {max_backlog}")
                c.execute("SELECT pg_reload_conf()")
        # The reload reaches backends asynchronously: ask new sessions until
        # one has it (publishers of the run connect later still).
        deadline = time.monotonic() + 10
        while True:
            with connect("postgres") as c:
                setting = c.execute("SHOW litebase_streams.max_backlog").fetchone()[0]
            if max_backlog is None or int(setting) == max_backlog or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        try:
            self._lag_run(key, clients, async_commit)
        finally:
            if max_backlog is not None:
                with connect("postgres") as c:
                    c.execute("ALTER SYSTEM RESET litebase_streams.max_backlog")
                    c.execute("SELECT pg_reload_conf()")
        self.res[key]["max_backlog"] = int(setting)

    def _lag_run(self, key, clients, async_commit):
        cfg = self.cfg
        with connect(DB) as c:
            self.wait_delivered(c)
            c.execute("CHECKPOINT")
            st0 = self.status(c)
            first = st0["newest"]
        lst = Listener(self.ctx, DB, CHANNEL, record=True).start()
        samples, stop = [], threading.Event()

        def sampler():
            with connect(DB) as sc:
                t_next = time.monotonic()
                while not stop.is_set():
                    st = self.status(sc)
                    samples.append((time.monotonic(), st["newest"], st["delivered"], st["lag"],
                                    float(st["holder_ms"] or 0)))
                    t_next += 0.05
                    time.sleep(max(0.0, t_next - time.monotonic()))

        th = threading.Thread(target=sampler, daemon=True)
        try:
            th.start()
            r = self.run_pgbench("publish.sql", clients, cfg["lag_secs"],
                                 f"{key.replace('_', '-')}-publish-c{clients}",
                                 {"worker": st0["worker_pid"], "listener": lst.proc.pid},
                                 pgoptions="-c synchronous_commit=off" if async_commit else None)
            stop.set()
            th.join(5)
            with connect(DB) as c:
                r["catchup_s"] = self.wait_delivered(c)
                last = self.status(c)["newest"]
            lst.wait_count(last - first, 60)
        finally:
            stop.set()
            n, recs = lst.finish()
        # Samples taken while publishing: from the first to the last that saw new positions.
        moving = [s for s in samples if s[1] is not None and s[1] > first]
        lag_pos = [s[3] for s in moving if s[3] is not None]
        # How long the publishing transaction holding the horizon had been open
        # (0 when none): events behind it cannot be visible before it ends.
        holder_ms = [s[4] for s in moving]
        commit_lag = []
        for mono_ns, real_ns, payload in recs:
            ev = json.loads(payload)
            commit_lag.append((real_ns - parse_ts_ns(ev["time"])) / 1e6)
        tps = r["tps"]
        self.res[key] = dict(
            clients=clients, pgbench=r, samples=len(lag_pos), holder_age_ms=holder_ms, lag_positions=lag_pos,
            lag_positions_p50=pct(lag_pos, 50), lag_positions_p99=pct(lag_pos, 99),
            lag_positions_max=max(lag_pos, default=float("nan")),
            lag_positions_p99_ms_at_rate=pct(lag_pos, 99) / tps * 1000 if tps else float("nan"),
            received=n, expected=last - first, commit_ts_to_received_ms=commit_lag)
        info(f"{tps:,.0f} events/s; lag p50 {pct(lag_pos, 50):.0f} / p99 {pct(lag_pos, 99):.0f} positions; "
             f"commit -> received p50 {pct(commit_lag, 50):.1f} ms, p99 {pct(commit_lag, 99):.1f} ms")
        if n != last - first:
            info(f"WARNING: the LISTEN client received {n:,} of {last - first:,} notifications")

    def phase_standby(self):
        """A hot standby of the local cluster (pg_basebackup -R, streaming) while
        pgbench publishes at the maximum rate: the age of the newest event each
        server shows, sampled every 50 ms on both."""
        cfg = self.cfg
        say(f"2d. hot standby: how far behind the primary it shows events, pgbench publish.sql, "
            f"{cfg['lag_clients']} clients, {cfg['lag_secs']} s")
        bindir = pg_bindir()
        as_server = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        data = Path(f"/tmp/lbs-bench-standby-{os.getpid()}")
        shutil.rmtree(data, ignore_errors=True)
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        subprocess.run(as_server + [f"{bindir}/pg_basebackup", "-D", str(data), "-R", "-c", "fast", "-X", "stream",
                                    "-h", PGHOST, "-p", str(PGPORT), "-U", PGUSER], check=True, capture_output=True)
        opts = f"-p {port} -c listen_addresses='' -c unix_socket_directories={data}"
        subprocess.run(as_server + [f"{bindir}/pg_ctl", "-D", str(data), "-l", str(data / "standby.log"), "-w",
                                    "-o", opts, "start"], check=True, capture_output=True)
        newest_age = ("SELECT extract(epoch FROM clock_timestamp() - e.time) * 1000 FROM streams.events e "
                      "WHERE e.position = (SELECT max(position) FROM streams.events)")
        samples, stop = [], threading.Event()

        def sampler():
            import psycopg
            with connect(DB) as pc, psycopg.connect(
                    f"host={data} port={port} user={PGUSER} dbname={DB}", autocommit=True) as sc:
                t_next = time.monotonic()
                while not stop.is_set():
                    ages = [conn.execute(newest_age).fetchone() for conn in (pc, sc)]
                    if all(a and a[0] is not None for a in ages):
                        samples.append((float(ages[0][0]), float(ages[1][0])))
                    t_next += 0.05
                    time.sleep(max(0.0, t_next - time.monotonic()))

        th = threading.Thread(target=sampler, daemon=True)
        try:
            th.start()
            time.sleep(0.5)
            before = len(samples)
            r = self.run_pgbench("publish.sql", cfg["lag_clients"], cfg["lag_secs"], "standby-publish")
            after = len(samples)
        finally:
            stop.set()
            th.join(5)
            subprocess.run(as_server + [f"{bindir}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"],
                           capture_output=True)
            shutil.rmtree(data, ignore_errors=True)
        # Samples taken while events flowed (the primary's newest event younger
        # than a second); the standby's lag is how much older its newest event
        # was than the primary's at the same moment.
        flowing = [a for a in samples[before:after] if a[0] < 1000]
        during = dict(primary=[a[0] for a in flowing], standby=[a[1] for a in flowing],
                      behind=[a[1] - a[0] for a in flowing])
        self.res["standby"] = dict(pgbench=r, newest_age_ms=during)
        info(f"{r['tps']:,.0f} events/s; {len(flowing)} samples; the standby's newest event was older than the "
             f"primary's by p50 {pct(during['behind'], 50):.1f} / p99 {pct(during['behind'], 99):.1f} ms")

    # -- 3. replay and 4. storage of the big data set ------------------------------

    def phase_replay(self):
        cfg = self.cfg
        N, chunk = cfg["replay_events"], cfg["replay_chunk"]
        say(f"3. replay: {N:,} events (publish_batch, {chunk:,} per transaction, "
            f"{len(REPLAY_STREAMS)} streams), fresh database")
        self.recreate_db()
        arr = "ARRAY[" + ",".join(f"'{s}'" for s in REPLAY_STREAMS) + "]"
        gen = f"""
DO $$
DECLARE
    s text[] := {arr};
    i int;
BEGIN
    FOR i IN 0..{N // chunk - 1} LOOP
        PERFORM count(*) FROM streams.publish_batch(s[1 + i % {len(REPLAY_STREAMS)}],
            ARRAY(SELECT jsonb_build_object('order_id', 'ord_' || g, 'amount', (g % 10000) / 100.0)
                  FROM generate_series(i * {chunk} + 1, (i + 1) * {chunk}) g ORDER BY g));
        COMMIT;
    END LOOP;
END $$"""
        rep = {}
        with connect(DB) as c:
            t = time.monotonic()
            c.execute(gen)
            rep["generate_s"] = time.monotonic() - t
            rep["deliver_s"] = self.wait_delivered(c, timeout=600)
            info(f"published in {rep['generate_s']:.1f} s, all delivered "
                 f"{rep['deliver_s']:.1f} s later")
            n_final = c.execute("SELECT count(*) FROM streams.events").fetchone()[0]
            if n_final != N:
                raise BenchError(f"streams.events has {n_final} events, expected {N}")
            t = time.monotonic()
            c.execute("""CREATE TABLE bench_raw AS
                         SELECT position, stream, time, tx, data FROM streams.events ORDER BY position""")
            c.execute("ALTER TABLE bench_raw ADD PRIMARY KEY (position)")
            c.execute("CREATE INDEX ON bench_raw (stream, position)")
            c.execute("""INSERT INTO bench_plain (id, stream, tx, time, data)
                         SELECT position, stream, tx, time, data FROM streams.events ORDER BY position""")
            c.execute("VACUUM (ANALYZE) bench_raw")
            rep["copy_s"] = time.monotonic() - t
            say("storage of the replay data set")
            self.res["storage_batch"] = self.storage(c, "bench_plain")
            # Readers that are not the owner: one granted '*', one granted only
            # the prefix of one stream (the privilege test runs per row).
            c.execute("DROP ROLE IF EXISTS bench_reader_all")
            c.execute("DROP ROLE IF EXISTS bench_reader_prefix")
            c.execute("CREATE ROLE bench_reader_all; CREATE ROLE bench_reader_prefix")
            c.execute("SELECT streams.grant('read', '*', 'bench_reader_all')")
            c.execute(f"SELECT streams.grant('read', '{CHANNEL.split('.')[0]}.*', 'bench_reader_prefix')")
            queries = [
                ("replay", "streams.replay()",
                 f"SELECT * FROM streams.replay(max_events => {N})", N),
                ("replay_granted", "streams.replay() as a role granted '*'",
                 f"SELECT * FROM streams.replay(max_events => {N})", N, "bench_reader_all"),
                ("view", "streams.events view",
                 "SELECT * FROM streams.events WHERE position > 0 ORDER BY position", N),
                ("raw", "raw ordered scan of bench_raw",
                 "SELECT * FROM bench_raw ORDER BY position", N),
                ("replay_stream", "streams.replay(stream => ...), one stream",
                 f"SELECT * FROM streams.replay(stream => '{CHANNEL}', max_events => {N})", None),
                ("raw_stream", "raw ordered scan of one stream",
                 f"SELECT * FROM bench_raw WHERE stream = '{CHANNEL}' ORDER BY position", None),
                ("replay_stream_prefix", "one stream, as a role granted its prefix only",
                 f"SELECT * FROM streams.replay(stream => '{CHANNEL}', max_events => {N})", None,
                 "bench_reader_prefix"),
            ]
            queries = [q if len(q) == 5 else q + (None,) for q in queries]
            stream_n = c.execute("SELECT count(*) FROM bench_raw WHERE stream = %s",
                                 (CHANNEL,)).fetchone()[0]
            # Three ways to time each query:
            #   server: EXPLAIN (ANALYZE, TIMING OFF) of the SELECT *: every row is
            #           produced in full on the server and discarded there;
            #   count:  the same for SELECT count(*) FROM (<query>) s, where the planner
            #           may drop the columns nobody reads (an index-only scan on bench_raw);
            #   copy:   wall time of psql running COPY (<query>) TO STDOUT into /dev/null:
            #           rows formatted as text and sent to a client, as a consumer gets them.
            def count_sql(sql):
                return f"SELECT count(*) FROM ({sql}) s"

            def as_role(role, fn):
                if role:
                    c.execute(f"SET ROLE {role}")
                try:
                    return fn()
                finally:
                    if role:
                        c.execute("RESET ROLE")

            def explain_s(sql, role=None):
                plan = as_role(role, lambda: c.execute(
                    "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql).fetchone()[0])
                return plan[0]["Execution Time"] / 1000.0

            psql = os.path.join(pg_bindir(), "psql")

            def copy_s(sql, role=None):
                cmd = [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", PGHOST, "-p", str(PGPORT),
                       "-U", PGUSER, "-d", DB] + (["-c", f"SET ROLE {role}"] if role else []) + \
                      ["-c", f"COPY ({sql}) TO STDOUT"]
                t = time.monotonic()
                r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                if r.returncode != 0:
                    raise BenchError(f"psql COPY failed: {r.stderr[-1000:]}")
                return time.monotonic() - t

            forms = {"server": explain_s, "count": lambda q, r=None: explain_s(count_sql(q), r),
                     "copy": copy_s}
            plans, rep["plans"] = [], {}
            for key, label, sql, expect, role in queries:
                got = as_role(role, lambda: c.execute(count_sql(sql)).fetchone()[0])  # check the row count
                want = expect if expect is not None else stream_n
                if got != want:
                    raise BenchError(f"{label}: counted {got} rows, expected {want}")
                for form in ("server", "count"):
                    q = sql if form == "server" else count_sql(sql)
                    plan = as_role(role, lambda: c.execute("EXPLAIN " + q).fetchall())
                    rep["plans"].setdefault(key, {})[form] = [r[0] for r in plan]
                    plans.append(f"-- {label} ({form})\n{q}\n" + "\n".join(r[0] for r in plan) + "\n")
                for fn in forms.values():  # warm-up
                    fn(sql, role)
            (self.log_dir / "replay-plans.txt").write_text("\n".join(plans))
            times = {form: {q[0]: [] for q in queries} for form in forms}
            for order in rotations(queries, cfg["replay_reps"]):
                for key, label, sql, _, role in order:
                    for form, fn in forms.items():
                        times[form][key].append(fn(sql, role))
        rep["rows"] = {q[0]: (q[3] if q[3] is not None else stream_n) for q in queries}
        rep["labels"] = {q[0]: q[1] for q in queries}
        rep["sql"] = {q[0]: q[2] for q in queries}
        rep["times_s"] = times
        rep["events_per_s"] = {form: {k: rep["rows"][k] / med(v) for k, v in t.items()}
                               for form, t in times.items()}
        self.res["replay"] = rep
        for k, label in rep["labels"].items():
            info(f"{label:<44} " + "  ".join(
                f"{form} {rep['events_per_s'][form][k]:>11,.0f}/s" for form in forms))

    # -- 5. the log's cost as it grows (LARGE=1) ------------------------------------

    def phase_growth(self):
        """Grow one log to each size in cfg["growth_sizes"] and measure, at each:
        publish throughput, replay of the newest 100k events, replay of one
        stream, `since` lookups, storage per event and the primary key's depth."""
        cfg = self.cfg
        sizes, chunk = cfg["growth_sizes"], cfg["growth_chunk"]
        window = min(100_000, sizes[0] // 10)
        say(f"5. growth: one log grown to {', '.join(f'{n:,}' for n in sizes)} events "
            f"(publish_batch, {chunk:,} per transaction, 10 streams)")
        self.recreate_db()
        points = []
        with connect(DB) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
            have = 0
            for size in sizes:
                t = time.monotonic()
                c.execute(f"""
DO $$
BEGIN
    FOR i IN {have // chunk}..{size // chunk - 1} LOOP
        PERFORM count(*) FROM streams.publish_batch('growth.' || (i % 10),
            ARRAY(SELECT jsonb_build_object('order_id', 'ord_' || g, 'amount', (g % 10000) / 100.0)
                  FROM generate_series(1, {chunk}) g));
        COMMIT;
    END LOOP;
END $$""")
                fill_s = time.monotonic() - t
                deliver_s = self.wait_delivered(c, timeout=3600)
                c.execute("VACUUM (ANALYZE) streams.event_log, streams.transactions")
                have = c.execute("SELECT count(*) FROM streams.event_log").fetchone()[0]
                newest = c.execute("SELECT streams.horizon()").fetchone()[0]
                info(f"{have:,} events: grown in {fill_s:.0f} s, delivered {deliver_s:.1f} s later")

                def explain(sql):
                    plan = c.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) " + sql).fetchone()[0][0]
                    top = plan["Plan"]
                    return plan["Execution Time"] / 1000.0, top.get("Shared Read Blocks", 0)

                def median_of(sql, reps=3):
                    explain(sql)  # warm-up
                    runs = [explain(sql) for _ in range(reps)]
                    return med([r[0] for r in runs]), med([r[1] for r in runs])

                newest_sql = f"SELECT * FROM streams.replay(after => {newest - window}, max_events => {window})"
                # The newest `window` events of the stream of the last chunk (every
                # tenth chunk is that stream's).
                stream = c.execute("SELECT stream FROM streams.event_log WHERE stream LIKE 'growth.%' "
                                   "ORDER BY position DESC LIMIT 1").fetchone()[0]
                stream_after = c.execute(
                    "SELECT position - 1 FROM streams.event_log WHERE stream = %s ORDER BY position DESC "
                    "OFFSET %s LIMIT 1", (stream, window - 1)).fetchone()[0]
                stream_sql = (f"SELECT * FROM streams.replay(stream => '{stream}', "
                              f"after => {stream_after}, max_events => {window})")
                stream_rows = c.execute(f"SELECT count(*) FROM ({stream_sql}) s").fetchone()[0]
                newest_s, newest_reads = median_of(newest_sql)
                stream_s, _ = median_of(stream_sql)
                # `since` at 20 points spread over the log's time range.
                lo, hi = c.execute("SELECT min(time), max(time) FROM streams.events").fetchone()
                since_ms = []
                for k in range(20):
                    at = lo + (hi - lo) * (k + 0.5) / 20
                    since_ms.append(explain(
                        f"SELECT * FROM streams.replay(since => '{at.isoformat()}', max_events => 100)")[0] * 1000)
                size_bytes = c.execute(
                    "SELECT pg_total_relation_size('streams.event_log') + "
                    "pg_total_relation_size('streams.transactions')").fetchone()[0]
                levels = c.execute("SELECT level + 1 FROM bt_metap('streams.event_log_pkey')").fetchone()[0]
                r = self.run_pgbench("publish.sql", 8, cfg["secs"], f"growth-{size}-publish-c8")
                point = dict(events=have, fill_s=fill_s, deliver_s=deliver_s, publish_tps=r["tps"],
                             replay_newest_eps=window / newest_s, replay_newest_read_blocks=newest_reads,
                             replay_stream_eps=stream_rows / stream_s, since_ms=med(since_ms),
                             bytes_per_event=size_bytes / have, btree_levels=levels,
                             relation_bytes=size_bytes)
                points.append(point)
                info(f"publish {r['tps']:,.0f} tps; replay newest {window:,}: {point['replay_newest_eps']:,.0f}/s; "
                     f"one stream {point['replay_stream_eps']:,.0f}/s; since {point['since_ms']:.2f} ms; "
                     f"{point['bytes_per_event']:.0f} B/event; primary key {levels} levels")
                have = c.execute("SELECT count(*) FROM streams.event_log").fetchone()[0]
            shared_buffers = c.execute("SHOW shared_buffers").fetchone()[0]
        self.res["growth"] = dict(window=window, chunk=chunk, points=points, shared_buffers=shared_buffers,
                                  measured_at=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))

    # -- environment ---------------------------------------------------------------

    def machine(self):
        cpu = "unknown"
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        ram = "unknown"
        try:
            kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
            ram = f"{kb / 1024 / 1024:.1f} GiB"
        except (OSError, AttributeError):
            pass
        names = ["shared_buffers", "synchronous_commit", "fsync", "track_commit_timestamp",
                 "wal_level", "max_wal_size", "checkpoint_timeout", "work_mem",
                 "litebase_streams.batch_size", "litebase_streams.idle_poll"]
        with connect("postgres") as c:
            version = c.execute("SHOW server_version").fetchone()[0]
            settings = {n: c.execute("SELECT current_setting(%s, true)", (n,)).fetchone()[0]
                        for n in names}
        git = ""
        try:
            head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--",
                                    "src", "sql", "Cargo.toml", "Cargo.lock"],
                                   capture_output=True, text=True).stdout.strip()
            git = head + (" (with uncommitted changes in src/ or sql/)" if dirty else "")
        except (OSError, subprocess.CalledProcessError):
            pass
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = float("nan")
        self.res["machine"] = dict(
            nproc=len(os.sched_getaffinity(0)), cpu=cpu, ram=ram, pg_version=version,
            settings=settings, git=git, kernel=platform.release(), load_at_start=load)


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

def f0(x):
    return f"{x:,.0f}"


def fx(x):
    return f"{x:.2f}x"


def fms(x):
    return f"{x:.2f} ms" if x < 10 else f"{x:.1f} ms"


def verdict(ok):
    return "PASS" if ok else "**FALLS SHORT**"


def reps_str(vals, fmt=f0):
    return " / ".join(fmt(v) for v in vals)


def make_plots(res, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp = res["throughput"]["runs"]
    clients = res["config"]["clients"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for (key, label, _), color in zip(METHODS, ["tab:blue", "tab:gray", "tab:red"]):
        meds = [med([r["tps"] for r in tp[key][n]]) for n in clients]
        lo = [m - min(r["tps"] for r in tp[key][n]) for m, n in zip(meds, clients)]
        hi = [max(r["tps"] for r in tp[key][n]) - m for m, n in zip(meds, clients)]
        ax.errorbar(clients, meds, yerr=[lo, hi], marker="o", capsize=3, label=label, color=color)
        for x, y in zip(clients, meds):
            ax.annotate(f0(y), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(clients)
    ax.set_xticklabels([str(n) for n in clients])
    ax.set_xlabel("pgbench clients (-j 2)")
    ax.set_ylabel("transactions (events) per second")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Publish throughput, one event per transaction (median of {res['config']['reps']}, "
                 "bars: min-max)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "bench-throughput.png")
    plt.close(fig)

    lat, lag = res["latency"], res["lag"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110)

    def cdf(ax, vals, label, color):
        s_ = sorted(vals)
        if s_:
            ax.plot(s_, [(i + 1) / len(s_) for i in range(len(s_))], label=label, color=color)

    def marks(ax, vals, color):
        for p in (50, 99):
            x = pct(vals, p)
            ax.plot([x], [p / 100], marker="o", ms=3, color=color)
            ax.annotate(f"p{p} {x:.2f}", (x, p / 100), textcoords="offset points",
                        xytext=(5, -10 if p == 99 else 0), fontsize=7, color=color)

    after = lat["from_commit_returned_ms"]
    cdf(a1, after, "from COMMIT returned", "tab:blue")
    cdf(a1, lat["from_before_commit_ms"], "from before COMMIT", "tab:orange")
    cdf(a1, lat["commit_ts_to_received_ms"], "from commit timestamp", "tab:green")
    marks(a1, after, "tab:blue")
    right = max(6.0, pct(lat["from_before_commit_ms"], 99) * 1.6)
    a1.set_xlim(max(-1.0, min(0.0, min(after, default=0))), right)
    for x, t in [(1, "p50 target"), (5, "p99 target")]:
        a1.axvline(x, color="gray", ls="--", lw=0.8)
        a1.text(x, 0.3, f" {t}", fontsize=7, color="gray", rotation=90, va="bottom")
    a1.set_xlabel("notification received after ... (ms; tail beyond the axis: see the title)")
    a1.set_ylabel("fraction of events (CDF)")
    a1.set_title(f"Delivery latency at {lat['achieved_rate']:,.0f} events/s ({lat['events']:,} events; "
                 f"max {max(after, default=float('nan')):.1f} ms)", fontsize=9)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=7, loc="lower right")
    cl = lag["commit_ts_to_received_ms"]
    cdf(a2, cl, "synchronous commit", "tab:green")
    marks(a2, cl, "tab:green")
    right = pct(cl, 99) * 1.6 if cl else 1
    la = res.get("lag_async")
    if la:
        ca = la["commit_ts_to_received_ms"]
        cdf(a2, ca, f"synchronous_commit = off, {la['clients']} clients "
                    f"({la['pgbench']['tps']:,.0f} events/s)", "tab:purple")
        marks(a2, ca, "tab:purple")
        right = max(right, pct(ca, 99) * 1.6 if ca else 1)
    if right >= 100:
        a2.axvline(100, color="gray", ls="--", lw=0.8)
        a2.text(100, 0.3, " p99 target", fontsize=7, color="gray", rotation=90, va="bottom")
        right = max(right, 110)
    a2.set_xlim(0, right)
    a2.set_xlabel("commit timestamp -> received (ms; p99 target: 100 ms)")
    a2.set_title(f"At the maximum rate ({lag['pgbench']['tps']:,.0f} events/s, "
                 f"{res['config']['lag_clients']} clients; max {max(cl, default=float('nan')):.1f} ms)",
                 fontsize=9)
    a2.grid(alpha=0.3)
    a2.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out_dir / "bench-latency.png")
    plt.close(fig)


def plan_shape(lines):
    """'Sort <- Hash Join <- Index Scan using event_log_pkey on event_log e ...' from EXPLAIN text."""
    nodes = []
    for line in lines:
        mt = re.match(r"\s*(?:->\s*)?([A-Z][A-Za-z ]+?(?: using \S+)?(?: on \S+(?: \w+)?)?)\s+\(cost", line)
        if mt:
            nodes.append(mt.group(1))
    return ", ".join(nodes)


def shortfall_notes(res, top, pub, plain, notif, cpu_med, cpu_us):
    cfg = res["config"]
    short = {x["name"] for x in res["targets"] if not x["pass_"]}
    notes = []
    if any(n.startswith("publish vs plain") for n in short):
        notes.append(
            f"**publish vs plain INSERT ({top} clients):** the CPUs were "
            f"{cpu_med('publish', top, 'machine'):.0f}% busy during publish runs and "
            f"{cpu_med('plain', top, 'machine'):.0f}% during plain INSERT runs; the server spent "
            f"{cpu_us('publish', top):.0f} µs of CPU per published event against "
            f"{cpu_us('plain', top):.0f} µs per plain INSERT "
            f"({cpu_us('publish', top) / cpu_us('plain', top):.2f}x). The delivery worker "
            f"alone took {cpu_med('publish', top, 'worker'):.0f}% of one CPU (per round it inserts "
            "into `streams.transactions`, NOTIFYs each event and updates `streams.horizon_state`); "
            "most of the rest is the publish path itself (privilege check, position "
            "allocation, the INSERT through SPI). The Python LISTEN client used another "
            f"{cpu_med('publish', top, 'listener'):.0f}% of one CPU, outside the server.")
    if any(n.startswith("publish vs INSERT + pg_notify") for n in short):
        notes.append(
            f"**publish vs INSERT + pg_notify ({top} clients):** INSERT + pg_notify ran at "
            f"{notif:,.0f} tps, {notif / plain:.2f}x plain INSERT ({plain:,.0f} tps), so 6x needs "
            f"publish at {6 * notif / plain:.2f}x plain INSERT; it reached {pub / plain:.2f}x.")
    if any(n.startswith("delivery latency") for n in short):
        lat = res["latency"]
        notes.append(
            f"**delivery latency:** p99 from COMMIT returned {pct(lat['from_commit_returned_ms'], 99):.2f} ms, "
            f"publishers behind schedule p99 {pct(lat['publisher_behind_schedule_ms'], 99):.2f} ms "
            "(the clients, server and listener share the machine's CPUs).")
    if any(n.startswith("lag p99") for n in short):
        for key in ("lag", "lag_async"):
            lag = res.get(key)
            if lag:
                notes.append(
                    f"**lag at the maximum rate ({'synchronous_commit = off' if key == 'lag_async' else 'synchronous commit'}):** "
                    f"the worker used {lag['pgbench']['cpu'].get('worker', float('nan')):.0f}% "
                    f"of one CPU at {lag['pgbench']['tps']:,.0f} events/s; `lag_positions` p99 "
                    f"{lag['lag_positions_p99']:,.0f}.")
    if any(n.startswith("replay") for n in short):
        rep = res["replay"]
        e = rep["events_per_s"]
        notes.append(
            "**replay:** `streams.replay()` is inlined into the query and reads through the "
            "`streams.events` view, which joins each event with `streams.transactions` for its "
            "commit time (the time is known only after the event's row was written, and rows are "
            "never updated); that per-row lookup is the difference. The view's plan nodes here: "
            f"`{plan_shape(rep['plans']['view']['server'])}` against `{plan_shape(rep['plans']['raw']['server'])}` "
            f"for the raw scan. Received by a client (COPY), the gap narrows to "
            f"{e['copy']['replay'] / e['copy']['raw']:.2f}x (replay) and "
            f"{e['copy']['view'] / e['copy']['raw']:.2f}x (view), since formatting and sending rows "
            "costs the same on both sides.")
    if any(n.startswith("storage per event") for n in short):
        for key, what in [("storage_single", "one event per transaction"),
                          ("storage_batch", f"{cfg['replay_chunk']:,} events per transaction")]:
            st = res[key]
            if st["ratio"] <= 1.2:
                continue
            e = st["events"]
            notes.append(
                f"**storage, {what}:** {st['ours_per_event']:.0f} B per event against "
                f"{st['plain_per_row']:.0f} B; `streams.transactions` (one row, one btree and "
                f"one BRIN entry per publishing transaction) accounts for {st['transactions_total'] / e:.0f} B "
                f"of it, `event_log` for {st['event_log_total'] / e:.0f} B (heap "
                f"{st['event_log_heap'] / e:.0f} B, {st['event_log_index_count']} indexes "
                f"{st['event_log_indexes'] / e:.0f} B; bench_plain: heap "
                f"{st['plain_heap'] / st['plain_rows']:.0f} B, {st['plain_index_count']} indexes "
                f"{st['plain_indexes'] / st['plain_rows']:.0f} B).")
    if any(n.startswith("every published event") for n in short):
        notes.append("**live delivery lost or duplicated notifications:** see sections 1 and 2; "
                     "latency figures cover the events that arrived.")
    return notes


def write_report(res, out_dir):
    quick, elapsed = res["mode"] == "quick", res["elapsed_s"]
    cfg, m = res["config"], res["machine"]
    tp = res["throughput"]
    runs, batch = tp["runs"], tp["batch"]
    clients = cfg["clients"]
    top = max(clients)
    L = []
    w = L.append
    w("# litebase_streams benchmarks")
    w("")
    if quick:
        w("> **Smoke run** (`make bench QUICK=1`): short runs, one repetition, small data set. "
          "The figures are not meaningful; the committed report is `docs/benchmarks.md` "
          "(`make bench`).")
        w("")
    w(f"Generated by `make bench{' QUICK=1' if quick else ''}` (bench/bench.py) on "
      f"{res['generated_at']} in {elapsed / 60:.1f} min"
      + (f", commit {m['git']}" if m["git"] else "") + ".")
    w("")
    s = m["settings"]
    w(f"**Machine:** {m['nproc']} CPUs ({m['cpu']}), {m['ram']} RAM, Linux {m['kernel']}, "
      f"load average {m['load_at_start']:.2f} at start. "
      f"**PostgreSQL {m['pg_version']}**: shared_buffers={s['shared_buffers']}, "
      f"synchronous_commit={s['synchronous_commit']}, fsync={s['fsync']}, "
      f"track_commit_timestamp={s['track_commit_timestamp']}, wal_level={s['wal_level']}, "
      f"max_wal_size={s['max_wal_size']}, work_mem={s['work_mem']}, "
      f"litebase_streams.batch_size={s['litebase_streams.batch_size']}, "
      f"idle_poll={s['litebase_streams.idle_poll']}. Server, pgbench and the Python clients share "
      f"the same {m['nproc']} CPUs.")
    w("")

    # ---- targets
    def tps_med(key, n):
        return med([r["tps"] for r in runs[key][n]])

    def cpu_med(key, n, what):
        v = [r["cpu"].get(what) for r in runs[key][n] if r["cpu"].get(what) is not None]
        return med(v) if v else float("nan")

    def cpu_us(key, n):
        """Server CPU time per event (every process of the cluster, µs)."""
        v = [r["cpu"]["server_s"] * 1e6 / r["xacts"] for r in runs[key][n] if "server_s" in r["cpu"]]
        return med(v) if v else float("nan")

    pub, plain, notif = (tps_med(k, top) for k in ("publish", "plain", "notify"))
    lat, lag, lag_async, rep = res["latency"], res["lag"], res["lag_async"], res["replay"]
    lag_backlog = res["lag_async_backlog"]
    eps = rep["events_per_s"]["server"]
    after = lat["from_commit_returned_ms"]
    ss, sb = res["storage_single"], res["storage_batch"]
    targets = [
        (f"publish vs plain INSERT, {top} clients", fx(pub / plain), ">= 0.95x", pub / plain >= 0.95),
        (f"publish vs INSERT + pg_notify, {top} clients", fx(pub / notif), ">= 6x", pub / notif >= 6),
        (f"delivery latency p50 at {cfg['lat_rate']:,} events/s (from COMMIT returned)",
         fms(pct(after, 50)), "<= 1 ms", pct(after, 50) <= 1),
        (f"delivery latency p99 at {cfg['lat_rate']:,} events/s (from COMMIT returned)",
         fms(pct(after, 99)), "<= 5 ms", pct(after, 99) <= 5),
        ("lag p99 at the maximum rate (commit timestamp -> received)",
         fms(pct(lag["commit_ts_to_received_ms"], 99)), "<= 100 ms",
         pct(lag["commit_ts_to_received_ms"], 99) <= 100),
        (f"lag p99 at the maximum rate, synchronous_commit = off, {lag_async['clients']} clients "
         "(commit timestamp -> received)",
         fms(pct(lag_async["commit_ts_to_received_ms"], 99)), "<= 100 ms",
         pct(lag_async["commit_ts_to_received_ms"], 99) <= 100),
        (f"the same without backpressure, max_backlog = {lag_backlog['max_backlog']:,} "
         f"({f0(lag_backlog['pgbench']['tps'])} vs {f0(lag_async['pgbench']['tps'])} events/s with)",
         fms(pct(lag_backlog["commit_ts_to_received_ms"], 99)), "<= 100 ms",
         pct(lag_backlog["commit_ts_to_received_ms"], 99) <= 100),
        ("replay: streams.replay() vs raw ordered scan", fx(eps["replay"] / eps["raw"]), ">= 0.8x",
         eps["replay"] / eps["raw"] >= 0.8),
        ("replay as a role granted '*' vs the owner's replay", fx(eps["replay_granted"] / eps["replay"]),
         ">= 0.9x", eps["replay_granted"] / eps["replay"] >= 0.9),
        ("replay: streams.events view vs raw ordered scan", fx(eps["view"] / eps["raw"]), ">= 0.8x",
         eps["view"] / eps["raw"] >= 0.8),
        ("storage per event vs bench_plain, one event per transaction", fx(ss["ratio"]), "<= 1.2x",
         ss["ratio"] <= 1.2),
        (f"storage per event vs bench_plain, {cfg['replay_chunk']:,} events per transaction",
         fx(sb["ratio"]), "<= 1.2x", sb["ratio"] <= 1.2),
    ]
    li = tp["listener"]
    lost = (li["expected"] - li["received"]) + lat["missing"] + sum(
        run["expected"] - run["received"] for run in (lag, lag_async, lag_backlog))
    extra = lat["duplicates"]
    complete = li["expected"] == li["received"] and lat["missing"] == 0 and extra == 0 \
        and all(run["expected"] == run["received"] for run in (lag, lag_async, lag_backlog))
    targets.append(("every published event received by the LISTEN client, exactly once "
                    "(all runs)", "yes" if complete else f"no: {lost:,} missing, {extra:,} duplicated",
                    "yes", complete))
    targets.extend(consume.targets(res, sys.modules[__name__]))
    res["targets"] = [dict(name=t[0], value=t[1], target=t[2], pass_=t[3]) for t in targets]
    w("## Targets")
    w("")
    w("| what | measured | target | verdict |")
    w("| --- | --- | --- | --- |")
    for name, val, tgt, ok in targets:
        w(f"| {name} | {val} | {tgt} | {verdict(ok)} |")
    w("")
    short = [t for t in targets if not t[3]]
    if short:
        w(f"**{len(short)} of {len(targets)} targets fall short:** "
          + "; ".join(f"{t[0]}: {t[1]} (target {t[2]})" for t in short) + ".")
    else:
        w(f"All {len(targets)} targets are met.")
    if quick:
        w("")
        w("(Smoke run: verdicts on 2-second runs mean little.)")
    w("")
    notes = shortfall_notes(res, top, pub, plain, notif, cpu_med, cpu_us)
    notes += consume.notes(res, {t[0] for t in targets if not t[3]})
    if notes:
        w("What the run shows about the shortfalls (measured, see the sections below):")
        w("")
        for n_ in notes:
            w(f"- {n_}")
        w("")

    # ---- 1. throughput
    w("## 1. Publish throughput")
    w("")
    w(f"`pgbench -n -f <script> -c N -j 2 -T {cfg['secs']}` (`-j 1` for one client), "
      + (f"{cfg['reps']} repetitions per cell, methods interleaved in rotating order (A B C, "
         "B C A, C A B), each after a `CHECKPOINT`; median tps, individual runs in brackets. "
         if cfg["reps"] > 1 else "one run per cell, each after a `CHECKPOINT`. ")
      + "One event (row) per transaction. "
      "The delivery worker is running and a LISTEN client drains `payment.success` in its own "
      "process throughout. Scripts: `bench/publish.sql`, `bench/plain_insert.sql`, "
      "`bench/in_tx_notify.sql`; table `bench_plain` in `bench/schema.sql`.")
    w("")
    w("| clients | streams.publish | plain INSERT | INSERT + pg_notify | publish / plain | publish / notify |")
    w("| --- | --- | --- | --- | --- | --- |")
    for n in clients:
        a, b, c_ = (tps_med(k, n) for k in ("publish", "plain", "notify"))
        cells = [f"{f0(tps_med(k, n))} ({reps_str([r['tps'] for r in runs[k][n]])})"
                 if cfg["reps"] > 1 else f0(tps_med(k, n)) for k in ("publish", "plain", "notify")]
        w(f"| {n} | {cells[0]} | {cells[1]} | {cells[2]} | {fx(a / b)} | {fx(a / c_)} |")
    w("")
    cu = [x for n in clients for x in tp["catchup"][n]]
    w(f"After each publish run the worker had delivered every event within "
      f"{max(cu) * 1000:.0f} ms of pgbench finishing (median {med(cu) * 1000:.0f} ms).")
    if li["received"] == li["expected"]:
        w(f"The LISTEN client received exactly the {li['received']:,} notifications expected "
          "(one per published event plus one per INSERT + pg_notify transaction).")
    else:
        w(f"**The LISTEN client received {li['received']:,} notifications, expected "
          f"{li['expected']:,}.**")
    w("")
    w("CPU during the runs (medians). *Server*: every process of the PostgreSQL cluster "
      "(backends, the delivery worker, background processes), in % of one CPU and in µs per "
      "event; *worker*: the delivery worker alone; *listener*: the Python LISTEN client; "
      f"*machine*: share of all {m['nproc']} CPUs busy, unrelated processes on this shared "
      "machine included.")
    w("")
    w("| clients | server CPU per event: publish / plain / notify | server: publish / plain / notify "
      "| publish: worker / listener | notify: listener | machine busy: publish / plain / notify |")
    w("| --- | --- | --- | --- | --- | --- |")

    def cpu(key, n, what):
        v = cpu_med(key, n, what)
        return "n/a" if v != v else f"{v:.0f}%"

    for n in clients:
        ks = ("publish", "plain", "notify")
        w(f"| {n} | " + " / ".join(f"{cpu_us(k, n):.0f} µs" for k in ks) + " | "
          + " / ".join(cpu(k, n, "server") for k in ks) + " | "
          f"{cpu('publish', n, 'worker')} / {cpu('publish', n, 'listener')} | "
          f"{cpu('notify', n, 'listener')} | "
          + " / ".join(cpu(k, n, "machine") for k in ks) + " |")
    w("")
    w("![throughput](bench-throughput.png)")
    w("")
    bp = med([r["events_per_s"] for r in batch["publish_batch"]])
    bi = med([r["events_per_s"] for r in batch["plain_batch"]])
    w(f"**Batches** ({cfg['batch_clients']} clients, 100 events per transaction; "
      "`bench/publish_batch.sql`, `bench/plain_insert_batch.sql`):")
    w("")
    w("| method | events/s | runs | server CPU per event |")
    w("| --- | --- | --- | --- |")
    for key, label, _ in BATCH_METHODS:
        v = [r["events_per_s"] for r in batch[key]]
        cu_ = [r["cpu"]["server_s"] * 1e6 / (r["xacts"] * BATCH_SIZE) for r in batch[key]
               if "server_s" in r["cpu"]]
        w(f"| {label} | {f0(med(v))} | {reps_str(v)} | "
          + (f"{med(cu_):.1f} µs" if cu_ else "n/a") + " |")
    w(f"| ratio publish_batch / INSERT | {fx(bp / bi)} | | |")
    w("")

    # ---- 2. latency
    w("## 2. Delivery latency and lag")
    w("")
    w(f"**Paced load.** {cfg['lat_publishers']} publisher processes, each committing one "
      f"`streams.publish` per transaction on a fixed schedule ({cfg['lat_rate']:,} events/s in "
      f"total) for {cfg['lat_secs']} s, the first {cfg['lat_warmup']} s discarded; a LISTEN "
      f"client in another process timestamps every notification. All timestamps are "
      "CLOCK_MONOTONIC, one clock for every process on the machine. \"From COMMIT returned\" "
      "starts when the publisher's COMMIT call returns (the figure the targets use); \"from "
      "before COMMIT\" starts right before it is sent; \"from commit timestamp\" compares the "
      "event's `time` (the server's commit timestamp, taken before the commit's WAL flush) "
      "with the wall clock at receipt.")
    w("")
    w(f"Events measured: {lat['events']:,} at {lat['achieved_rate']:,.0f} events/s achieved; "
      f"received: all but {lat['missing']}; duplicates: {lat['duplicates']}. Publishers were "
      f"behind their schedule by p99 {fms(pct(lat['publisher_behind_schedule_ms'], 99))}.")
    w("")
    w("| measured from | p50 | p90 | p99 | p99.9 | max |")
    w("| --- | --- | --- | --- | --- | --- |")
    for key, label in [("from_commit_returned_ms", "COMMIT returned"),
                       ("from_before_commit_ms", "before COMMIT"),
                       ("commit_ts_to_received_ms", "commit timestamp")]:
        v = lat[key]
        w(f"| {label} | {fms(pct(v, 50))} | {fms(pct(v, 90))} | {fms(pct(v, 99))} | "
          f"{fms(pct(v, 99.9))} | {fms(max(v))} |")
    neg = sum(1 for v in after if v < 0)
    if neg:
        w("")
        w(f"{neg} notification(s) ({100 * neg / len(after):.1f}%) arrived before the publisher "
          "saw its COMMIT return (negative latency from that point).")
    w("")
    for key in ("lag", "lag_async", "lag_async_backlog"):
        lag = res.get(key)
        if not lag:
            continue
        lp = lag["pgbench"]
        cl = lag["commit_ts_to_received_ms"]
        clients = lag.get("clients", cfg["lag_clients"])
        if key == "lag":
            w(f"**Maximum rate.** `pgbench -f bench/publish.sql -c {clients} -j 2 -T {cfg['lag_secs']}`: "
              f"{f0(lp['tps'])} events/s.")
        elif key == "lag_async_backlog":
            w(f"**Asynchronous commit without backpressure.** The same with `litebase_streams.max_backlog = "
              f"{lag['max_backlog']:,}` (publishers never wait for the worker): {f0(lp['tps'])} events/s.")
        else:
            w(f"**Maximum rate, asynchronous commit.** The same with `PGOPTIONS='-c synchronous_commit=off'` "
              f"and {clients} clients, `litebase_streams.max_backlog` at its default ({lag['max_backlog']:,}: "
              f"a transaction's first publish waits while that many final positions await the worker): "
              f"{f0(lp['tps'])} events/s.")
        w(f"`streams.status` sampled every 50 ms ({lag['samples']} samples while positions advanced); the "
          f"LISTEN client timestamps every notification ({lag['received']:,} of {lag['expected']:,} received).")
        w("")
        w("| lag | p50 | p99 | max |")
        w("| --- | --- | --- | --- |")
        w(f"| `lag_positions` (newest allocated - delivered) | {f0(lag['lag_positions_p50'])} | "
          f"{f0(lag['lag_positions_p99'])} | {f0(lag['lag_positions_max'])} |")
        w(f"| same, in ms at {f0(lp['tps'])} events/s | {fms(lag['lag_positions_p50'] / lp['tps'] * 1000)} | "
          f"{fms(lag['lag_positions_p99'] / lp['tps'] * 1000)} | "
          f"{fms(lag['lag_positions_max'] / lp['tps'] * 1000)} |")
        w(f"| commit timestamp -> received | {fms(pct(cl, 50))} | {fms(pct(cl, 99))} | {fms(max(cl))} |")
        ha = lag.get("holder_age_ms")
        if ha:
            w(f"| age of the open transaction holding the horizon (`holder_age`) | {fms(pct(ha, 50))} | "
              f"{fms(pct(ha, 99))} | {fms(max(ha))} |")
        w("")
        wc = lp["cpu"]
        w(f"`lag_positions` counts positions allocated by transactions still in flight, so it is "
          f"never zero under load; after pgbench stopped, the worker delivered the rest in "
          f"{lp['catchup_s'] * 1000:.0f} ms. CPU during the run: machine {wc['machine']:.0f}% busy, "
          f"worker {wc.get('worker', float('nan')):.0f}% of one CPU, LISTEN client "
          f"{wc.get('listener', float('nan')):.0f}%, pgbench {wc['pgbench']:.0f}%.")
        w("")
    sb_ = res.get("standby")
    if sb_:
        w(f"**Hot standby.** A streaming standby of the same cluster (`pg_basebackup -R`) while "
          f"`pgbench -f bench/publish.sql -c {cfg['lag_clients']}` publishes at {f0(sb_['pgbench']['tps'])} "
          "events/s: the age of the newest event each server shows in `streams.events` "
          "(wall clock minus its commit time), sampled on both every 50 ms while events flowed; "
          "\"standby behind\" is how much older the standby's newest event was at the same moment.")
        w("")
        w("| age of the newest visible event | p50 | p99 | max |")
        w("| --- | --- | --- | --- |")
        for name, label in (("primary", "primary"), ("standby", "standby"), ("behind", "standby behind")):
            v = sb_["newest_age_ms"][name]
            w(f"| {label} | {fms(pct(v, 50))} | {fms(pct(v, 99))} | {fms(max(v, default=float('nan')))} |")
        w("")
    w("")
    w("![latency](bench-latency.png)")
    w("")

    # ---- 3. replay
    N = cfg["replay_events"]
    w("## 3. Replay throughput")
    w("")
    w(f"Data set: {N:,} events (payload like `{{\"order_id\":\"ord_1\",\"amount\":0.01}}`) "
      f"published with `streams.publish_batch` in a DO block, {cfg['replay_chunk']:,} events per "
      f"transaction (COMMIT per chunk), rotating over {len(REPLAY_STREAMS)} streams: "
      f"{rep['generate_s']:.1f} s to publish ({f0(N / rep['generate_s'])} events/s), all "
      f"delivered {rep['deliver_s']:.1f} s later. `bench_raw` is `CREATE TABLE AS SELECT` of the "
      "same rows (`position, stream, time, tx, data`) with a primary key on `position` and an "
      "index on `(stream, position)`; every table vacuumed. Each query is timed three ways, "
      f"median of {cfg['replay_reps']} interleaved runs after a warm-up:")
    w("")
    w("- **server** (the figure the targets use): `EXPLAIN (ANALYZE, TIMING OFF)` of the query "
      "itself, execution time: every row is read from the table (or produced by the function) "
      "on the server and discarded there, nothing is sent;")
    w("- **count(\\*)**: the same for `SELECT count(*) FROM (<query>) s`. Here the planner may "
      "drop the columns nobody reads: on `bench_raw` this becomes an index-only scan that never "
      "visits the table, so it is not a like-for-like baseline;")
    w("- **to client**: wall time of `psql -c \"COPY (<query>) TO STDOUT\" > /dev/null`, rows "
      "formatted as text and sent over the socket, as a consumer receives them (includes psql's "
      "connection set-up).")
    w("")
    w("| query | rows | server | events/s | vs raw | count(\\*): events/s | vs raw | to client: events/s | vs raw |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = [("replay", "raw"), ("replay_granted", "raw"), ("view", "raw"), ("raw", "raw"),
            ("replay_stream", "raw_stream"), ("replay_stream_prefix", "raw_stream"), ("raw_stream", "raw_stream")]
    for key, base in [r for r in rows if r[0] in rep["labels"]]:
        e = rep["events_per_s"]
        t = med(rep["times_s"]["server"][key])
        w(f"| {rep['labels'][key]}: `{rep['sql'][key]}` | {f0(rep['rows'][key])} | "
          f"{t * 1000:,.0f} ms | {f0(e['server'][key])} | {fx(e['server'][key] / e['server'][base])} | "
          f"{f0(e['count'][key])} | {fx(e['count'][key] / e['count'][base])} | "
          f"{f0(e['copy'][key])} | {fx(e['copy'][key] / e['copy'][base])} |")
    w("")
    w("The rows \"as a role granted ...\" run the same query after `SET ROLE` to a role that is "
      "neither owner nor superuser: row-level security on the log applies the read grants "
      "(`'*'`: one boolean test per row; a prefix: a pattern match per row).")
    w("")
    w(f"Plans: `{res['log_dir']}/replay-plans.txt`.")
    w("")

    # ---- 4. storage
    w("## 4. Storage")
    w("")
    w("Bytes per event: `pg_total_relation_size` (heap, TOAST, indexes, free-space and "
      "visibility maps) of `streams.event_log` + `streams.transactions` + "
      "`streams.horizon_state`, divided by the number of events, against `bench_plain`'s total "
      "size divided by its rows, after `VACUUM (ANALYZE)`.")
    w("")
    w("| data set | events | streams tables | of which event_log heap / indexes / transactions | bench_plain | of which heap / indexes | ratio |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    for label, st in [("one event per transaction (the pgbench runs of section 1; bench_plain: "
                       "the plain INSERT and INSERT + pg_notify runs)", ss),
                      (f"replay data set ({cfg['replay_chunk']:,} events per transaction; "
                       "bench_plain: a copy of the same rows)", sb)]:
        e = st["events"]
        w(f"| {label} | {f0(e)} | {st['ours_per_event']:.1f} B | "
          f"{st['event_log_heap'] / e:.1f} / {st['event_log_indexes'] / e:.1f} / "
          f"{st['transactions_total'] / e:.1f} B | {st['plain_per_row']:.1f} B "
          f"({f0(st['plain_rows'])} rows) | "
          f"{st['plain_heap'] / st['plain_rows']:.1f} / {st['plain_indexes'] / st['plain_rows']:.1f} B | "
          f"{fx(st['ratio'])} |")
    w("")
    w(f"`event_log` has {sb['event_log_index_count']} indexes, `bench_plain` "
      f"{sb['plain_index_count']} (primary key, `(stream, id)`); `streams.transactions` holds one "
      "row per publishing transaction (commit time, first position).")
    w("")

    # ---- growth (make bench LARGE=1; kept from the last such run)
    g = res.get("growth")
    if g:
        pts = g["points"]
        w("## 5. The log's cost as it grows")
        w("")
        w(f"`make bench LARGE=1`, measured {g['measured_at']}: one log grown with `publish_batch` "
          f"({g['chunk']:,} events per transaction, 10 streams) and measured at each size: publish "
          f"throughput (`pgbench -f bench/publish.sql -c 8`), replay of the newest {g['window']:,} events and "
          f"of one stream's newest {g['window']:,} (server-side EXPLAIN ANALYZE, median of 3, warm cache), "
          "a `since` lookup (`replay(since => ..., max_events => 100)` at 20 points over the log's time "
          f"range, median), storage per event and the depth of `event_log`'s primary key. "
          f"shared_buffers: {g['shared_buffers']}.")
        w("")
        w("| events | publish (events/s) | replay newest (events/s) | blocks read from disk | "
          "replay one stream (events/s) | `since` lookup | bytes/event | primary key levels | grown in |")
        w("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for pt in pts:
            w(f"| {f0(pt['events'])} | {f0(pt['publish_tps'])} | {f0(pt['replay_newest_eps'])} | "
              f"{f0(pt['replay_newest_read_blocks'])} | {f0(pt['replay_stream_eps'])} | "
              f"{pt['since_ms']:.2f} ms | {pt['bytes_per_event']:.0f} | {pt['btree_levels']} | "
              f"{pt['fill_s']:.0f} s |")
        first, last = pts[0], pts[-1]
        w("")
        w(f"From {f0(first['events'])} to {f0(last['events'])} events (target: within 10%): publish "
          f"{fx(last['publish_tps'] / first['publish_tps'])}, replay of the newest events "
          f"{fx(last['replay_newest_eps'] / first['replay_newest_eps'])}, replay of one stream "
          f"{fx(last['replay_stream_eps'] / first['replay_stream_eps'])}, `since` lookup "
          f"{fx(last['since_ms'] / first['since_ms'])} the time. Publish figures come from separate "
          "short runs on a shared machine and move by about 10% between runs of the same size.")
        w("")

    # ---- 6. subscriptions (bench/consume.py)
    consume.section(res, w, sys.modules[__name__])

    # ---- how to run
    w("## Reproduce")
    w("")
    w("```sh")
    w("make bench           # installs prerequisites, builds and installs the release build, starts")
    w("                     # the local cluster, runs everything (~9 min), rewrites this file")
    w("make bench QUICK=1   # smoke run (< 1 min), report in target/bench-quick/")
    w("make bench LARGE=1   # also section 5: grows a log to 50M events (about 25 more minutes, ~12 GB")
    w("                     # of disk); later runs keep its figures from docs/bench-growth.json")
    w("python3 bench/bench.py --report-only   # redraw this file and the plots from target/bench/results.json")
    w("python3 bench/bench.py --only consume  # section 6 alone, merged into target/bench/results.json")
    w("```")
    w("")
    w(f"Everything runs in a database `{DB}` that is dropped and recreated (again before the "
      "replay data set) and dropped at the end. pgbench logs and query plans go to "
      f"`{res['log_dir']}/`, every raw figure to `{res['work_dir']}/results.json`.")
    (out_dir / "benchmarks.md").write_text("\n".join(L) + "\n")


# --------------------------------------------------------------------------

def load_results(path):
    """results.json as the report expects it (JSON turned the client counts into strings)."""
    res = json.loads(path.read_text())
    tp = res["throughput"]
    tp["runs"] = {k: {int(n): v for n, v in by_n.items()} for k, by_n in tp["runs"].items()}
    tp["catchup"] = {int(n): v for n, v in tp["catchup"].items()}
    return res


def report(res, out_dir):
    say("report and plots")
    make_plots(res, out_dir)
    write_report(res, out_dir)
    for t in res["targets"]:
        info(f"[{'PASS' if t['pass_'] else 'FALLS SHORT'}] {t['name']}: {t['value']} (target {t['target']})")
    say(f"wrote {out_dir / 'benchmarks.md'}, bench-throughput.png, bench-latency.png")


def run_only(b, phase, work_dir, out_dir):
    """--only consume: that phase alone, its figures merged into the last
    run's results.json (the other sections keep theirs)."""
    consume.phase(b, sys.modules[__name__])
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    path = work_dir / "results.json"
    res = load_results(path) if path.exists() else None
    if res is not None:
        res["consume"] = b.res["consume"]
        res["config"].update({k: b.cfg[k] for k in consume.FULL})
        path.write_text(json.dumps(res, indent=1, default=str))
        try:
            return report(res, out_dir)
        except KeyError as e:  # results.json of an older bench.py
            say(f"{path.relative_to(REPO)} lacks {e} (an older run): report not redrawn")
    else:
        path.write_text(json.dumps(b.res, indent=1, default=str))
        say(f"no earlier run in {work_dir.relative_to(REPO)}: figures in results.json, report not redrawn")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: short, one repetition, small data")
    ap.add_argument("--out", help="report directory (default docs/, or target/bench-quick/ with --quick)")
    ap.add_argument("--large", action="store_true",
                    help="also grow one log to 1M, 10M and 50M events and measure at each (about 25 more "
                         "minutes; the figures are kept in docs/bench-growth.json for later reports)")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: redraw the report and plots from the last run's results.json")
    ap.add_argument("--only", choices=["consume"],
                    help="run only this phase (consume: section 6) and merge its figures into the last "
                         "run's results.json; the report is redrawn when that file has a whole run")
    args = ap.parse_args()
    bootstrap()
    t_start = time.monotonic()
    cfg = dict(QUICK if args.quick else FULL)
    out_dir = Path(args.out) if args.out else (REPO / "target" / "bench-quick" if args.quick
                                               else REPO / "docs")
    work_dir = REPO / "target" / ("bench-quick" if args.quick else "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report(load_results(work_dir / "results.json"), out_dir)
        return
    log_dir = work_dir / "logs"
    if not args.only:  # --only keeps the last run's logs, which its report points to
        shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    say(f"{'quick smoke run' if args.quick else 'full run'}{f' of {args.only} only' if args.only else ''}: "
        f"server {PGHOST}:{PGPORT}, database {DB}, report {out_dir}")
    b = Bench(cfg, args.quick, out_dir, log_dir)
    b.res["log_dir"] = str(log_dir.relative_to(REPO))
    b.res["work_dir"] = str(work_dir.relative_to(REPO))
    b.machine()
    b.find_postmaster()
    if args.only:
        return run_only(b, args.only, work_dir, out_dir)
    b.recreate_db()
    b.phase_throughput()
    b.phase_latency()
    b.phase_lag()
    b.phase_lag(async_commit=True)
    b.phase_lag(async_commit=True, max_backlog=ASYNC_MAX_BACKLOG)
    b.phase_standby()
    b.phase_replay()
    consume.phase(b, sys.modules[__name__])
    if args.large or args.quick:
        b.phase_growth()
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    b.res["elapsed_s"] = time.monotonic() - t_start
    b.res["generated_at"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    growth_file = out_dir / "bench-growth.json"
    if "growth" in b.res and not args.quick:
        growth_file.write_text(json.dumps(b.res["growth"], indent=1, default=str) + "\n")
    elif "growth" not in b.res and growth_file.exists():
        b.res["growth"] = json.loads(growth_file.read_text())
    (work_dir / "results.json").write_text(json.dumps(b.res, indent=1, default=str))
    report(b.res, out_dir)


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"ERROR: bench: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # a failed query or connection: the harness broke
        if type(e).__module__.startswith("psycopg"):
            print(f"ERROR: bench: {type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(1)
        raise
    except KeyboardInterrupt:
        sys.exit(130)
