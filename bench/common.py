"""What every phase of bench/bench.py shares: connection settings, statistics,
CPU accounting, the LISTEN client and paced publishers (child processes), the
Bench object (database, pgbench, storage) and the report's number formats.

Phases (bench/phases/*.py) import what they use from here; bench.py is the
driver and bench/report.py the report writer.
"""

import datetime as dt
import multiprocessing as mp
import os
import platform
import re
import resource
import statistics
import subprocess
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = REPO / "bench"
EXT = "litebase_streams"
CHANNEL = "payment.success"
PAYLOAD = '{"order_id":"ord_123","amount":49.00}'


class BenchError(Exception):
    """The harness itself failed (not a missed target)."""


def say(msg):
    print(f"==> bench: {msg}", flush=True)


def info(msg):
    print(f"    {msg}", flush=True)



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


# The anchor of a paced run (publisher_main's anchor=True): the same row
# INSERTed into the plain table and a pg_notify in the same transaction, whose
# payload carries the row's id as "position" (the listener matches it to the
# commit as it matches a published event's notification).
ANCHOR_QUERY = ("WITH i AS (INSERT INTO bench_plain(stream, data) VALUES (%s, %s::jsonb) RETURNING id, data) "
                "SELECT i.id, pg_notify(%s, json_build_object('position', i.id, 'data', i.data)::text) FROM i")


def publisher_main(conninfo, stream, interval_ns, offset_ns, ready_evt, start_evt,
                   start_ns, end_ns, out, anchor=False, settings=None):
    """One paced publisher: a transaction of one streams.publish on `stream`
    every interval_ns; anchor=True: ANCHOR_QUERY instead (the INSERT and a
    pg_notify on the channel `stream`). settings: session settings, e.g.
    {"synchronous_commit": "off"}."""
    try:
        import psycopg
        mono = time.monotonic_ns
        conn = psycopg.connect(conninfo, autocommit=True)
        cur = conn.cursor()
        for name, value in (settings or {}).items():
            cur.execute("SELECT set_config(%s, %s, false)", (name, value))
        if anchor:
            q, params = ANCHOR_QUERY, (stream, PAYLOAD, stream)
        else:
            q, params = "SELECT streams.publish(%s, %s::jsonb)", (stream, PAYLOAD)
        # Warm up the connection and the prepared statement (outside the measurement).
        for _ in range(6):
            cur.execute("BEGIN")
            cur.execute(q, params, prepare=True)
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
            cur.execute(q, params, prepare=True)
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
            f = _stat_fields(pid)  # while the backend lives (it exits with the connection)
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

    def init_pgbench(self, scale):
        """pgbench -i at this scale in the bench database (pgbench_accounts,
        _branches, _tellers, _history; vacuumed, with primary keys); returns
        the seconds it took."""
        self._log_seq += 1
        log = self.log_dir / f"{self._log_seq:03d}-pgbench-init-s{scale}.log"
        cmd = [self.pgbench, "-i", "-q", "-s", str(scale), "-h", PGHOST, "-p", str(PGPORT), "-U", PGUSER, DB]
        t = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        took = time.monotonic() - t
        log.write_text(f"$ {' '.join(cmd)}\n\n{r.stdout}\n{r.stderr}")
        if r.returncode != 0:
            raise BenchError(f"pgbench -i failed (exit {r.returncode}), see {log}:\n{r.stderr[-2000:]}")
        return took

    def run_pgbench(self, script, clients, secs, tag, pids=None, pgoptions=None, options=()):
        """options: more pgbench options (e.g. ("-s", "10") for a script that reads :scale)."""
        self._log_seq += 1
        log = self.log_dir / f"{self._log_seq:03d}-pgbench-{tag}.log"
        cmd = [self.pgbench, "-n", "-f", str(HERE / script), "-c", str(clients),
               "-j", str(min(2, clients)), "-T", str(secs), *options,
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
        c.execute(f"VACUUM (ANALYZE) streams.event_log, streams.commit_times, "
                  f"streams.horizon_state, {plain_table}")
        # The log is partitioned (its own size is 0): the sums over its
        # partitions, through pg_partition_tree (a plain table is its own leaf).
        q = c.execute(f"""
            WITH leaf AS (SELECT t.relid FROM pg_partition_tree('streams.event_log') t WHERE t.isleaf)
            SELECT (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint FROM leaf),
                   (SELECT coalesce(sum(pg_relation_size(relid)), 0)::bigint FROM leaf),
                   (SELECT coalesce(sum(pg_indexes_size(relid)), 0)::bigint FROM leaf),
                   pg_total_relation_size('streams.commit_times'),
                   pg_total_relation_size('streams.horizon_state'),
                   (SELECT count(*) FROM streams.event_log),
                   (SELECT count(*) FROM streams.commit_times),
                   pg_total_relation_size('{plain_table}'),
                   pg_relation_size('{plain_table}'),
                   pg_indexes_size('{plain_table}'),
                   (SELECT count(*) FROM {plain_table}),
                   (SELECT max(n) FROM (SELECT count(i.indexrelid) AS n FROM leaf
                                        LEFT JOIN pg_index i ON i.indrelid = leaf.relid GROUP BY leaf.relid) x),
                   (SELECT count(*) FROM pg_index WHERE indrelid = '{plain_table}'::regclass)""").fetchone()
        (log_total, log_heap, log_idx, times_total, hz_total, events, time_rows,
         plain_total, plain_heap, plain_idx, plain_rows, log_nidx, plain_nidx) = q
        ours = log_total + times_total + hz_total
        return dict(
            events=events, commit_time_rows=time_rows, plain_rows=plain_rows,
            event_log_total=log_total, event_log_heap=log_heap, event_log_indexes=log_idx,
            event_log_index_count=log_nidx, plain_index_count=plain_nidx,
            commit_times_total=times_total, horizon_state_total=hz_total,
            plain_total=plain_total, plain_heap=plain_heap, plain_indexes=plain_idx,
            ours_per_event=ours / events, plain_per_row=plain_total / plain_rows,
            ratio=(ours / events) / (plain_total / plain_rows))

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
# Report number formats
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
