#!/usr/bin/env python3
"""Measure every figure of docs/operations.md on this machine.

    target/bench-venv/bin/python bench/measure-operations.py          # 6 to 10 minutes
    target/bench-venv/bin/python bench/measure-operations.py --quick  # a smoke run, about 1 minute

Needs the extension installed (`make install`) and Python with psycopg 3
(`make bench` creates target/bench-venv with it; or `pip install "psycopg[binary]"`).
It never touches the dev cluster: it creates throwaway clusters of its own with
initdb under /tmp (ports --port, --port + 1 and --port + 2; as root the servers
run as the `postgres` OS user), measures, stops them and deletes them (--keep
leaves them running). It needs about 4 GB of free space under /tmp. Results:
printed as it goes, and written to target/measure-operations/results.json
(--quick: results-quick.json).

What it measures, in order (the section of docs/operations.md in brackets):

  install    CREATE EXTENSION without the server settings and as a
             non-superuser (the errors), the restart, what the extension
             starts and allocates                             [Installing]
  slots      with max_worker_processes = 4: how many databases get a worker,
             the warnings of the next one, how soon it gets one when a slot
             frees                                            [Worker slots]
  latency    COMMIT returned -> streams.wait(position) returns, 1,000 samples
             paced and 1,000 back to back; how often the event is already in
             streams.events right after COMMIT                 [Visibility]
  hold       an open publishing transaction holding the horizon, ended by
             litebase_streams.hold_timeout                    [Visibility]
  notify     the largest data that still travels in a notification [Event size]
  settings   pg_settings of every litebase_streams.* setting; who may set them;
             max_event_size refusing an event                 [Settings]
  big        10, 50 and 200 MB events: publish time, memory, WAL, and how long
             they delay other events (next one after, and concurrent ones),
             with pglz and lz4, against a plain INSERT        [Event size]
  storage    bytes per event on disk, WAL and pg_commit_ts per event for 1, 10
             and 1,000 events per transaction (--events each, default
             1,000,000)                                       [Retention]
  tablespace moving the log to another tablespace, and what cannot be moved
                                                              [Retention]
  monitor    cost of streams.status and streams.subscriptions with a backlog
  backup     pg_dump / pg_restore of the one-per-transaction log into another
             cluster (time, size, identical events), what tx, eras,
             time_exact, log_id and subscriptions look like afterwards; a
             restore without the roles; pg_basebackup of a running cluster,
             and a copy that diverges from it                 [Backups]
  uninstall  DROP EXTENSION (time, space returned), and the extension left
             installed after the preload setting is removed   [Uninstalling]
"""

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

try:
    import psycopg
except ImportError:
    sys.exit("needs psycopg 3: run with target/bench-venv/bin/python (make bench creates it) "
             "or pip install 'psycopg[binary]'")

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "target" / "measure-operations"
EXT = "litebase_streams"
PG_CONFIG = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
AS_SERVER = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
USER = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
PAYLOAD = '{"order_id":"ord_123","amount":49.00}'  # the small event of docs/benchmarks.md

RESULTS = {}


def say(msg):
    print(f"\n==> {msg}", flush=True)


def info(msg):
    print(f"    {msg}", flush=True)


def pct(values, p):
    """Nearest-rank percentile (p in 0..100)."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]


def summary_ms(samples_s):
    ms = [x * 1000 for x in samples_s]
    return dict(n=len(ms), p50=pct(ms, 50), p90=pct(ms, 90), p99=pct(ms, 99), max=max(ms), mean=statistics.mean(ms))


def fmt_ms(s):
    return f"p50 {s['p50']:.2f} ms, p90 {s['p90']:.2f} ms, p99 {s['p99']:.2f} ms, max {s['max']:.2f} ms (n={s['n']})"


def error_of(fn):
    """Run fn; return the error's SQLSTATE, message and hint (None if it succeeds)."""
    try:
        fn()
    except psycopg.Error as e:
        return dict(sqlstate=e.sqlstate, message=e.diag.message_primary, hint=e.diag.message_hint)
    return None


class Cluster:
    """A throwaway PostgreSQL cluster under /tmp/lbs-ops-<port>."""

    def __init__(self, port):
        self.port = port
        self.dir = Path(f"/tmp/lbs-ops-{port}")
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.conf = {}

    def run_as_server(self, args, **kw):
        return subprocess.run(AS_SERVER + args, cwd="/", check=True, capture_output=True, text=True, **kw)

    def create(self, **conf):
        self.destroy()
        self.dir.mkdir(parents=True)
        if AS_SERVER:
            shutil.chown(self.dir, "postgres", "postgres")
        self.run_as_server([f"{BINDIR}/initdb", "-D", str(self.data), "--auth=trust", "-U", USER,
                            "--encoding=UTF8", "--locale=C.UTF-8"])
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("\ninclude_if_exists = 'ops.conf'\n")
        self.conf = dict(port=self.port, unix_socket_directories=f"'{self.dir}'", listen_addresses="''", **conf)
        self.write_conf()

    def write_conf(self):
        path = self.data / "ops.conf"
        path.write_text("".join(f"{k} = {v}\n" for k, v in self.conf.items()))
        if AS_SERVER:
            shutil.chown(path, "postgres", "postgres")

    def start(self):
        t0 = time.perf_counter()
        self.run_as_server([f"{BINDIR}/pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120", "start"])
        return time.perf_counter() - t0

    def stop(self, mode="fast"):
        t0 = time.perf_counter()
        self.run_as_server([f"{BINDIR}/pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "300", "stop"])
        return time.perf_counter() - t0

    def restart(self):
        return self.stop() + self.start()

    def running(self):
        return (self.data / "postmaster.pid").exists()

    def destroy(self):
        if self.running():
            try:
                self.stop("immediate")
            except subprocess.CalledProcessError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def dsn(self, db="postgres", user=None):
        return f"host={self.dir} port={self.port} user={user or USER} dbname={db}"

    def connect(self, db="postgres", user=None, autocommit=True, notices=None):
        conn = psycopg.connect(self.dsn(db, user), autocommit=autocommit)
        if notices is not None:
            conn.add_notice_handler(lambda d: notices.append(
                dict(severity=d.severity, sqlstate=d.sqlstate, message=d.message_primary, hint=d.message_hint)))
        return conn

    def one(self, db, sql, args=None):
        with self.connect(db) as c:
            return c.execute(sql, args).fetchone()

    def env(self):
        return dict(os.environ, PGHOST=str(self.dir), PGPORT=str(self.port), PGUSER=USER)

    def createdb(self, name, extension=True):
        with self.connect() as c:
            c.execute(f'CREATE DATABASE "{name}"')
        if extension:
            with self.connect(name) as c:
                c.execute(f"CREATE EXTENSION {EXT}")
            self.wait_for_worker(name)

    def wait_for_worker(self, db, timeout=30):
        deadline = time.monotonic() + timeout
        with self.connect(db) as c:
            while time.monotonic() < deadline:
                state = c.execute("SELECT worker_state FROM streams.status").fetchone()[0]
                if state in ("idle", "delivering"):
                    return state
                time.sleep(0.05)
        raise RuntimeError(f"no worker in database {db} after {timeout} s (state {state})")

    def wait_until_final(self, db, timeout=600):
        """Wait until every allocated position is final (the worker caught up)."""
        deadline = time.monotonic() + timeout
        with self.connect(db) as c:
            while time.monotonic() < deadline:
                h, n = c.execute("SELECT horizon, newest_position FROM streams.status").fetchone()
                if h >= n:
                    return h
                time.sleep(0.1)
        raise RuntimeError(f"{db}: horizon {h} never reached {n}")

    def log_lines(self, needle):
        if not self.log.exists():
            return []
        return [line.rstrip() for line in self.log.read_text(errors="replace").splitlines() if needle in line]


def dir_bytes(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def wal_lsn(conn):
    return conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]


def wal_bytes(conn, since):
    return int(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (since,)).fetchone()[0])


# --------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------

def phase_install(a):
    say("install: CREATE EXTENSION without the server settings, as a non-superuser, then the restart")
    a.create()
    a.start()
    with a.connect() as c:
        c.execute("CREATE DATABASE app")
        c.execute("CREATE ROLE app_owner LOGIN CREATEDB")
        c.execute("CREATE DATABASE owned OWNER app_owner")
    res = {}
    with a.connect("app") as c:
        res["without_settings"] = error_of(lambda: c.execute(f"CREATE EXTENSION {EXT}"))
    info(f"without shared_preload_libraries and track_commit_timestamp: {res['without_settings']}")
    a.stop()
    a.conf.update(shared_preload_libraries=f"'{EXT}'", track_commit_timestamp="on")
    a.write_conf()
    res["start_s"] = a.start()
    with a.connect("app") as c:
        t0 = time.perf_counter()
        c.execute(f"CREATE EXTENSION {EXT}")
        res["create_extension_s"] = time.perf_counter() - t0
        res["extension_version"] = c.execute(
            "SELECT extversion FROM pg_extension WHERE extname = %s", (EXT,)).fetchone()[0]
    with a.connect("owned", user="app_owner") as c:
        res["as_database_owner"] = error_of(lambda: c.execute(f"CREATE EXTENSION {EXT}"))
    info(f"as the database's owner (not a superuser): {res['as_database_owner']}")
    a.wait_for_worker("app")
    with a.connect() as c:
        res["processes"] = [r[0] for r in c.execute(
            "SELECT backend_type FROM pg_stat_activity WHERE backend_type LIKE 'litebase%' ORDER BY 1")]
        res["shared_memory_bytes"] = c.execute(
            "SELECT sum(allocated_size) FROM pg_shmem_allocations WHERE name LIKE 'litebase%'").fetchone()[0]
        res["max_worker_processes_default"] = int(c.execute("SHOW max_worker_processes").fetchone()[0])
        res["max_connections"] = int(c.execute("SHOW max_connections").fetchone()[0])
    info(f"server start {res['start_s']:.2f} s; CREATE EXTENSION {res['create_extension_s'] * 1000:.0f} ms; "
         f"processes: {res['processes']}; shared memory {res['shared_memory_bytes']:,} B "
         f"(max_connections = {res['max_connections']})")
    RESULTS["install"] = res


def phase_slots(a):
    say("worker slots: max_worker_processes = 4")
    res = {}
    a.stop()
    a.conf["max_worker_processes"] = 4
    a.write_conf()
    a.start()
    a.wait_for_worker("app")
    time.sleep(2)  # the launcher's start-up workers for databases without the extension have exited
    got, starved, notices = [], None, []
    for i in range(1, 6):
        name = f"slot{i}"
        with a.connect() as c:
            c.execute(f"CREATE DATABASE {name}")
        with a.connect(name, notices=notices) as c:
            before = len(notices)
            c.execute(f"CREATE EXTENSION {EXT}")
            warned = notices[before:]
        time.sleep(1.5)
        with a.connect(name) as c:
            state = c.execute("SELECT worker_state FROM streams.status").fetchone()[0]
        if warned or state == "no worker slot":
            starved = dict(db=name, create_extension_notices=warned, worker_state=state)
            break
        got.append(name)
    res["databases_with_a_worker"] = ["app"] + got
    with a.connect() as c:
        # Every process that holds a max_worker_processes slot.
        res["processes"] = [r[0] for r in c.execute(
            "SELECT backend_type FROM pg_stat_activity WHERE backend_type LIKE 'litebase%' "
            "OR backend_type = 'logical replication launcher' OR backend_type LIKE 'parallel worker%' ORDER BY 1")]
    info(f"with max_worker_processes = 4: workers for {res['databases_with_a_worker']}; processes {res['processes']}")
    if starved:
        pub_notices = []
        with a.connect(starved["db"], notices=pub_notices) as c:
            p = c.execute("SELECT streams.publish('ops.slot', '{}')").fetchone()[0]
            starved["publish_notices"] = pub_notices
            starved["visible_without_worker"] = c.execute("SELECT streams.wait(%s, '2s')", (p,)).fetchone()[0]
        info(f"{starved['db']}: {starved}")
        # Free a slot: DROP EXTENSION in a database that has a worker.
        t0 = time.perf_counter()
        with a.connect(got[0]) as c:
            c.execute(f"DROP EXTENSION {EXT}")
        a.wait_for_worker(starved["db"], timeout=60)
        starved["worker_after_drop_s"] = time.perf_counter() - t0
        with a.connect(starved["db"]) as c:
            starved["visible_after"] = c.execute("SELECT streams.wait(%s, '10s')", (p,)).fetchone()[0]
        info(f"DROP EXTENSION in {got[0]}: {starved['db']} had its worker {starved['worker_after_drop_s']:.2f} s later, "
             f"its earlier event visible: {starved['visible_after']}")
        res["starved"] = starved
    res["launcher_warnings"] = a.log_lines("no background worker slot for")[:2]
    res["worker_warnings"] = a.log_lines("no background worker serves")[:1]
    for i in range(1, 6):
        with a.connect() as c:
            c.execute(f"DROP DATABASE IF EXISTS slot{i}")
    a.stop()
    del a.conf["max_worker_processes"]
    a.write_conf()
    a.start()
    a.wait_for_worker("app")
    RESULTS["slots"] = res


def phase_latency(a, samples):
    say(f"visibility: COMMIT returned -> streams.wait(position) returned, {samples} samples")
    res = {}
    with a.connect("app") as c:
        c.execute("SELECT streams.publish('ops.warmup', '{}')")
        c.execute("SELECT streams.wait(streams.horizon() + 1, '1s')")
        for mode, pause in (("paced_10ms", 0.010), ("back_to_back", 0.0)):
            lat, rtt, immediate = [], [], 0
            for _ in range(samples):
                p = c.execute("SELECT streams.publish('ops.latency', %s)", (PAYLOAD,)).fetchone()[0]
                t1 = time.perf_counter()  # autocommit: COMMIT has returned
                ok = c.execute("SELECT streams.wait(%s, '5s')", (p,)).fetchone()[0]
                t2 = time.perf_counter()
                assert ok, p
                c.execute("SELECT streams.wait(%s, '5s')", (p,)).fetchone()  # already visible: one round trip
                rtt.append(time.perf_counter() - t2)
                lat.append(t2 - t1)
                if pause:
                    time.sleep(pause)
            # Without waiting: is the event in streams.events right after COMMIT returned?
            for _ in range(samples):
                p = c.execute("SELECT streams.publish('ops.latency', %s)", (PAYLOAD,)).fetchone()[0]
                if c.execute("SELECT EXISTS (SELECT FROM streams.events WHERE position = %s)", (p,)).fetchone()[0]:
                    immediate += 1
                c.execute("SELECT streams.wait(%s, '5s')", (p,))
                if pause:
                    time.sleep(pause)
            res[mode] = dict(commit_to_visible=summary_ms(lat), round_trip=summary_ms(rtt),
                             visible_at_once_fraction=immediate / samples)
            info(f"{mode}: commit -> wait returned {fmt_ms(res[mode]['commit_to_visible'])}; "
                 f"one round trip of wait on a visible event p50 {res[mode]['round_trip']['p50']:.2f} ms; "
                 f"in streams.events by the next statement without waiting: {immediate}/{samples}")
    RESULTS["latency"] = res


def phase_hold(a):
    say("horizon: an open publishing transaction, ended by litebase_streams.hold_timeout = '2s'")
    res = {}
    with a.connect() as c:
        c.execute("ALTER DATABASE app SET litebase_streams.hold_timeout = '2s'")
    holder = a.connect("app", autocommit=False)
    other = a.connect("app")
    try:
        holder.execute("SELECT streams.publish('ops.hold', '{}')")
        t_hold = time.perf_counter()
        p = other.execute("SELECT streams.publish('ops.hold', '{}')").fetchone()[0]
        t1 = time.perf_counter()
        visible_at_once = other.execute("SELECT EXISTS (SELECT FROM streams.events WHERE position = %s)",
                                        (p,)).fetchone()[0]
        time.sleep(0.5)
        row = other.execute("SELECT horizon, newest_position, holder_pid IS NOT NULL, holder_position, "
                            "extract(epoch FROM holder_age) FROM streams.status").fetchone()
        ok = other.execute("SELECT streams.wait(%s, '30s')", (p,)).fetchone()[0]
        t2 = time.perf_counter()
        res.update(visible_at_once=visible_at_once, status_during_hold=dict(
            horizon=row[0], newest_position=row[1], holder_shown=row[2], holder_position=row[3],
            holder_age_s=float(row[4]) if row[4] is not None else None),
            visible=ok, commit_to_visible_s=t2 - t1, hold_to_visible_s=t2 - t_hold)
        res["holder_next_statement"] = error_of(lambda: holder.execute("SELECT 1"))
    finally:
        holder.close()
        other.close()
    res["server_log"] = a.log_lines("held the horizon for")[-1:]
    with a.connect() as c:
        c.execute("ALTER DATABASE app RESET litebase_streams.hold_timeout")
    info(f"held event visible {res['commit_to_visible_s']:.2f} s after its COMMIT "
         f"({res['hold_to_visible_s']:.2f} s after the holder's publish); status during the hold: "
         f"{res['status_during_hold']}; the holder then got: {res['holder_next_statement']}")
    RESULTS["hold"] = res


def phase_notify(a):
    say("notifications: the largest data that travels in a notification")
    res = {}
    stream = "ops.notify"
    with a.connect("app") as listen, a.connect("app") as pub:
        listen.execute(f'LISTEN "{stream}"')
        sizes = list(range(7600, 8001, 10))
        for n in sizes:
            # data text as jsonb prints it: {"s": "xxx..."}
            pub.execute("SELECT streams.publish(%s, jsonb_build_object('s', repeat('x', %s)))", (stream, n - 9))
        got = {}
        for note in listen.notifies(timeout=10, stop_after=len(sizes)):
            ev = json.loads(note.payload)
            got[ev["position"]] = (len(note.payload.encode()), "data" in ev, ev.get("truncated", False))
        ordered = [got[k] for k in sorted(got)]
    with_data = [(n, g) for n, g in zip(sizes, ordered) if g[1]]
    truncated = [(n, g) for n, g in zip(sizes, ordered) if g[2]]
    res["largest_data_text_sent"] = with_data[-1][0] if with_data else None
    res["largest_payload_bytes"] = max(g[0] for _, g in with_data) if with_data else None
    res["smallest_data_text_truncated"] = truncated[0][0] if truncated else None
    res["stream_name_bytes"] = len(stream)
    info(f"stream '{stream}': data of {res['largest_data_text_sent']} bytes (jsonb text) still sent "
         f"(payload {res['largest_payload_bytes']} bytes); from {res['smallest_data_text_truncated']} bytes: "
         f"truncated")
    RESULTS["notify"] = res


def phase_settings(a):
    say("settings: pg_settings, and who may change them")
    res = {}
    with a.connect("app") as c:
        res["pg_settings"] = [dict(name=r[0], setting=r[1], unit=r[2], context=r[3], min=r[4], max=r[5])
                              for r in c.execute("SELECT name, setting, unit, context, min_val, max_val "
                                                 "FROM pg_settings WHERE name LIKE 'litebase_streams.%' ORDER BY 1")]
        c.execute("CREATE ROLE ops_publisher LOGIN")
        c.execute("SELECT streams.grant('publish', 'ops.*', 'ops_publisher')")
    for s in res["pg_settings"]:
        info(f"{s['name']}: {s['setting']}{s['unit'] or ''} ({s['context']}, {s['min']}..{s['max']})")
    with a.connect("app", user="ops_publisher") as c:
        res["publisher_sets_max_event_size"] = error_of(lambda: c.execute("SET litebase_streams.max_event_size = 0"))
        res["publisher_sets_hold_timeout"] = error_of(lambda: c.execute("SET litebase_streams.hold_timeout = 0"))
    with a.connect("app") as c:
        c.execute("SET litebase_streams.max_event_size = '1MB'")
        res["over_max_event_size"] = error_of(lambda: c.execute(
            "SELECT streams.publish('ops.big', jsonb_build_object('s', repeat('x', 2000000)))"))
        res["over_max_event_size_batch"] = error_of(lambda: c.execute(
            "SELECT streams.publish_batch('ops.big', ARRAY['{}'::jsonb, jsonb_build_object('s', repeat('x', 2000000))])"))
    info(f"a publisher's SET: {res['publisher_sets_max_event_size']}")
    info(f"over max_event_size: {res['over_max_event_size']}")
    RESULTS["settings"] = res


def vm_hwm_kib(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def phase_big(a, sizes_mb, reps):
    say(f"large events: {sizes_mb} MB of incompressible data, {reps} repetitions each")
    a.createdb("big")
    res = {}
    for mb in sizes_mb:
        blob = os.urandom(mb * 1024 * 1024 // 2).hex()
        text = json.dumps({"blob": blob})
        del blob
        for compression in ("pglz", "lz4"):
            runs = []
            for _ in range(reps):
                run = {}
                with a.connect("big") as big, a.connect("big") as small:
                    big.execute(f"SET default_toast_compression = {compression}")
                    pid = big.execute("SELECT pg_backend_pid()").fetchone()[0]
                    lsn = wal_lsn(small)
                    # 1. Publish it, COMMIT, then publish a small event: how long until each is visible.
                    t0 = time.perf_counter()
                    p = big.execute("SELECT streams.publish('ops.big', %s::text::jsonb)", (text,)).fetchone()[0]
                    t1 = time.perf_counter()
                    run["publish_s"] = t1 - t0
                    run["wal_bytes"] = wal_bytes(small, lsn)
                    run["publisher_peak_rss_mib"] = (vm_hwm_kib(pid) or 0) / 1024
                    q = small.execute("SELECT streams.publish('ops.small', %s)", (PAYLOAD,)).fetchone()[0]
                    t2 = time.perf_counter()
                    small.execute("SELECT streams.wait(%s, '60s')", (q,))
                    t3 = time.perf_counter()
                    run["next_event_commit_to_visible_ms"] = (t3 - t2) * 1000
                    run["big_commit_to_next_visible_ms"] = (t3 - t1) * 1000
                    run["stored_bytes"] = small.execute(
                        "SELECT pg_column_size(data) FROM streams.event_log WHERE position = %s", (p,)).fetchone()[0]
                    t4 = time.perf_counter()
                    small.execute("SELECT length(data::text) FROM streams.get(%s)", (p,)).fetchone()
                    run["get_s"] = time.perf_counter() - t4
                # 2. Small events published by others while it is being written.
                stop, ticks = threading.Event(), []

                def ticker():
                    with a.connect("big") as c:
                        while not stop.is_set():
                            q = c.execute("SELECT streams.publish('ops.tick', %s)", (PAYLOAD,)).fetchone()[0]
                            tc = time.perf_counter()
                            c.execute("SELECT streams.wait(%s, '120s')", (q,))
                            ticks.append((tc, time.perf_counter() - tc))
                            time.sleep(0.005)

                th = threading.Thread(target=ticker, daemon=True)
                th.start()
                time.sleep(0.3)
                with a.connect("big") as big:
                    big.execute(f"SET default_toast_compression = {compression}")
                    t0 = time.perf_counter()
                    big.execute("SELECT streams.publish('ops.big', %s::text::jsonb)", (text,))
                    t1 = time.perf_counter()
                time.sleep(0.3)
                stop.set()
                th.join()
                during = [d for (tc, d) in ticks if t0 <= tc <= t1]
                run["concurrent_publish_s"] = t1 - t0
                run["concurrent_events"] = len(during)
                run["concurrent_max_delay_ms"] = max(during) * 1000 if during else None
                normal = [d for (tc, d) in ticks if tc < t0]
                run["concurrent_before_p50_ms"] = pct(normal, 50) * 1000 if normal else None
                runs.append(run)
            # The baseline: a plain INSERT of the same value into a jsonb column.
            with a.connect("big") as c:
                c.execute("CREATE TABLE IF NOT EXISTS plain_big (data jsonb)")
                c.execute(f"SET default_toast_compression = {compression}")
                pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
                t0 = time.perf_counter()
                c.execute("INSERT INTO plain_big VALUES (%s::text::jsonb)", (text,))
                plain = dict(insert_s=time.perf_counter() - t0, peak_rss_mib=(vm_hwm_kib(pid) or 0) / 1024)
                c.execute("TRUNCATE plain_big")
            agg = {k: statistics.median([r[k] for r in runs if r[k] is not None])
                   for k in runs[0] if any(r[k] is not None for r in runs)}
            agg["concurrent_max_delay_ms_max"] = max(r["concurrent_max_delay_ms"] or 0 for r in runs)
            agg["runs"] = runs
            agg["plain_insert"] = plain
            res[f"{mb}MB_{compression}"] = agg
            info(f"{mb} MB, {compression}: publish {agg['publish_s']:.2f} s, stored {agg['stored_bytes'] / 2**20:.1f} MiB, "
                 f"WAL {agg['wal_bytes'] / 2**20:.0f} MiB, publisher peak RSS {agg['publisher_peak_rss_mib']:.0f} MiB; "
                 f"next event after its COMMIT visible in {agg['next_event_commit_to_visible_ms']:.2f} ms; "
                 f"events published meanwhile held back up to {agg['concurrent_max_delay_ms']:.0f} ms "
                 f"(median of runs; worst {agg['concurrent_max_delay_ms_max']:.0f} ms); streams.get {agg['get_s']:.2f} s; "
                 f"a plain INSERT of the same value: {plain['insert_s']:.2f} s, peak RSS {plain['peak_rss_mib']:.0f} MiB")
    kib = vm_hwm_kib(a.one("big", "SELECT streams.worker_pid()")[0])
    res["worker_peak_rss_mib"] = kib / 1024 if kib else None
    info(f"the worker's peak RSS after all of it: {res['worker_peak_rss_mib']} MiB")
    with a.connect("big") as c:
        res["jsonb_string_over_256MB"] = error_of(lambda: c.execute(
            "SELECT streams.publish('ops.big', jsonb_build_object('s', repeat('x', 270 * 1024 * 1024)))"))
    info(f"a 270 MiB string in an event: {res['jsonb_string_over_256MB']}")
    with a.connect() as c:
        c.execute("DROP DATABASE big")
    RESULTS["big"] = res


def sizes(conn):
    row = conn.execute("""
        WITH leaf AS (SELECT t.relid FROM pg_partition_tree('streams.event_log') t WHERE t.isleaf),
             ix AS (SELECT i.indexrelid, c.relname FROM leaf JOIN pg_index i ON i.indrelid = leaf.relid
                    JOIN pg_class c ON c.oid = i.indexrelid)
        SELECT (SELECT coalesce(sum(pg_table_size(relid)), 0) FROM leaf),
               (SELECT coalesce(sum(pg_relation_size(relid)), 0) FROM leaf),
               (SELECT coalesce(sum(pg_indexes_size(relid)), 0) FROM leaf),
               (SELECT coalesce(sum(pg_relation_size(indexrelid)), 0) FROM ix WHERE relname LIKE '%\_pkey'),
               (SELECT coalesce(sum(pg_relation_size(indexrelid)), 0) FROM ix WHERE relname LIKE '%\_stream\_position'),
               (SELECT coalesce(sum(pg_relation_size(indexrelid)), 0) FROM ix WHERE relname LIKE '%\_tx'),
               pg_total_relation_size('streams.commit_times'),
               (SELECT count(*) FROM streams.commit_times),
               pg_total_relation_size('streams.horizon_state'),
               pg_database_size(current_database())""").fetchone()
    keys = ["event_log_table", "event_log_heap_main", "event_log_indexes", "pkey", "stream_position", "tx_brin",
            "commit_times_total", "commit_time_rows", "horizon_state", "database"]
    return dict(zip(keys, [int(x) for x in row]))


def phase_storage(a, n_events):
    say(f"storage: {n_events:,} small events at 1, 10 and 1,000 per transaction")
    res = {}
    clients = 8
    for per_tx in (1, 10, 1000):
        db = f"st{per_tx}"
        a.createdb(db)
        with a.connect(db) as c:
            base = sizes(c)
            c.execute("CHECKPOINT")  # commit timestamps reach pg_commit_ts at checkpoints
            commit_ts = dir_bytes(a.data / "pg_commit_ts")
            lsn = wal_lsn(c)
            t0 = time.perf_counter()
            if per_tx < 1000:
                script = a.dir / f"publish_{per_tx}.sql"
                if per_tx == 1:
                    script.write_text(f"SELECT streams.publish('payment.success', '{PAYLOAD}');\n")
                else:
                    script.write_text(f"SELECT streams.publish_batch('payment.success', "
                                      f"array_fill('{PAYLOAD}'::jsonb, ARRAY[{per_tx}]));\n")
                transactions = n_events // per_tx
                env = dict(a.env(), PGOPTIONS="-c synchronous_commit=off")
                subprocess.run([f"{BINDIR}/pgbench", "-n", "-c", str(clients), "-j", "2",
                                "-t", str(transactions // clients), "-f", str(script), db],
                               env=env, check=True, capture_output=True, text=True)
            else:
                c.execute("SET synchronous_commit = off")
                for _ in range(n_events // per_tx):
                    c.execute(f"SELECT count(*) FROM streams.publish_batch('payment.success', "
                              f"array_fill(%s::jsonb, ARRAY[{per_tx}]))", (PAYLOAD,))
            fill_s = time.perf_counter() - t0
            a.wait_until_final(db)
            wal = wal_bytes(c, lsn)
            events = c.execute("SELECT count(*) FROM streams.event_log").fetchone()[0]
            c.execute("VACUUM (ANALYZE) streams.event_log, streams.commit_times")
            c.execute("CHECKPOINT")
            s = sizes(c)
            payload_bytes = c.execute("SELECT pg_column_size(%s::jsonb)", (PAYLOAD,)).fetchone()[0]
        per = {k: (s[k] - base[k]) / events for k in s if k not in ("commit_time_rows",)}
        commit_ts = dir_bytes(a.data / "pg_commit_ts") - commit_ts
        res[db] = dict(events=events, per_tx=per_tx, fill_s=fill_s, payload_jsonb_bytes=payload_bytes,
                       pg_commit_ts_bytes=commit_ts, transactions=transactions if per_tx < 1000 else n_events // per_tx,
                       commit_time_rows=s["commit_time_rows"], wal_bytes=wal, wal_per_event=wal / events,
                       sizes=s, per_event=per,
                       streams_per_event=(s["event_log_table"] + s["event_log_indexes"] + s["commit_times_total"]
                                          + s["horizon_state"]) / events)
        r = res[db]
        info(f"{per_tx} per transaction: {events:,} events in {fill_s:.0f} s; on disk {r['streams_per_event']:.0f} B/event "
             f"(event_log table {per['event_log_table']:.0f}, indexes {per['event_log_indexes']:.0f} "
             f"[pkey {per['pkey']:.0f}, stream {per['stream_position']:.0f}, tx brin {per['tx_brin']:.2f}], "
             f"commit_times {per['commit_times_total']:.1f} in {s['commit_time_rows']:,} rows); "
             f"{r['streams_per_event'] * 1e6 / 2**20:.0f} MiB per million; "
             f"WAL {r['wal_per_event']:.0f} B/event; pg_commit_ts grew {commit_ts:,} B "
             f"({commit_ts / max(1, r['transactions']):.1f} B per publishing transaction)")
    RESULTS["storage"] = res


def phase_tablespace(a):
    say("retention: moving a 1M-event log to another tablespace (ALTER TABLE ... SET TABLESPACE)")
    res = {}
    ts = a.dir / "tablespace"
    ts.mkdir()
    if AS_SERVER:
        shutil.chown(ts, "postgres", "postgres")
    db = "st10"
    with a.connect(db) as c:
        c.execute(f"CREATE TABLESPACE ops_ts LOCATION '{ts}'")
        before = checksum(c)
        moves = ["ALTER TABLE streams.event_log SET TABLESPACE ops_ts",
                 "ALTER INDEX streams.event_log_pkey SET TABLESPACE ops_ts",
                 "ALTER INDEX streams.event_log_stream_position SET TABLESPACE ops_ts",
                 "ALTER INDEX streams.event_log_tx SET TABLESPACE ops_ts",
                 "ALTER TABLE streams.commit_times SET TABLESPACE ops_ts",
                 "ALTER INDEX streams.commit_times_pkey SET TABLESPACE ops_ts",
                 "ALTER INDEX streams.commit_times_last_time SET TABLESPACE ops_ts"]
        t0 = time.perf_counter()
        with c.transaction():
            for m in moves:
                c.execute(m)
        res["move_s"] = time.perf_counter() - t0
        res["moved_bytes"] = dir_bytes(ts)
        p = c.execute("SELECT streams.publish('payment.success', %s)", (PAYLOAD,)).fetchone()[0]
        res["publish_after"] = c.execute("SELECT streams.wait(%s, '10s')", (p,)).fetchone()[0]
        res["events_unchanged"] = tuple(checksum(c)[:1]) == (before[0] + 1,)
    dump = subprocess.run([f"{BINDIR}/pg_dump", "-s", db], env=a.env(), check=True, capture_output=True,
                          text=True).stdout
    res["schema_dump_names_tablespace"] = "ops_ts" in dump
    # The whole database instead: its worker is connected to it.
    a.createdb("ts_whole")
    with a.connect() as c:
        res["alter_database_set_tablespace"] = error_of(lambda: c.execute(
            "ALTER DATABASE ts_whole SET TABLESPACE ops_ts"))
        c.execute("DROP DATABASE ts_whole")
    info(f"pg_dump -s names the tablespace: {res['schema_dump_names_tablespace']}; "
         f"ALTER DATABASE ... SET TABLESPACE with the worker connected: {res['alter_database_set_tablespace']}")
    info(f"moved {res['moved_bytes'] / 2**20:.0f} MiB in {res['move_s']:.1f} s (publishers and readers wait that long: "
         f"ACCESS EXCLUSIVE); publish afterwards: {res['publish_after']}; events: {res['events_unchanged']}")
    RESULTS["tablespace"] = res


def phase_monitor(a):
    say("monitoring: streams.status and streams.subscriptions with a 1M-event backlog")
    res = {}
    db = "st1"
    with a.connect(db) as c:
        c.execute("SELECT streams.create_subscription('billing', 'payment.*', after => 0)")
        c.execute("SELECT streams.create_subscription('audit', '*', after => 0)")
        with c.transaction():
            last = c.execute("SELECT max(position) FROM streams.poll('billing', max_events => 1000)").fetchone()[0]
            c.execute("SELECT streams.ack('billing', %s)", (last,))

        def timed(sql, n=5):
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                c.execute(sql).fetchall()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts) * 1000

        res["status_ms"] = timed("SELECT * FROM streams.status")
        res["subscriptions_ms"] = timed("SELECT * FROM streams.subscriptions", 3)
        res["subscriptions_lag_only_ms"] = timed("SELECT name, lag_time FROM streams.subscriptions", 3)
        res["subscriptions"] = [dict(name=r[0], position=r[1], pending=r[2]) for r in c.execute(
            "SELECT name, position, pending FROM streams.subscriptions ORDER BY name")]
        res["backlog"] = c.execute("SELECT count(*) FROM streams.event_log").fetchone()[0]
    info(f"streams.status {res['status_ms']:.2f} ms; streams.subscriptions {res['subscriptions_ms']:.0f} ms "
         f"(name, lag_time only: {res['subscriptions_lag_only_ms']:.0f} ms) "
         f"with {res['subscriptions']}")
    RESULTS["monitor"] = res


def checksum(conn):
    return conn.execute("""SELECT count(*), md5(string_agg(format('%s|%s|%s|%s|%s', position, stream, time, tx, data),
                                                         ',' ORDER BY position))
                           FROM streams.events""").fetchone()


def phase_backup(a, b):
    say("backup and restore")
    res = {}
    dump = a.dir / "st1.dump"
    # -- The big log: pg_dump -Fc, pg_restore into another cluster.
    with a.connect("st1") as c:
        before = checksum(c)
        res["log_id_dumped"] = str(c.execute("SELECT streams.log_id()").fetchone()[0])
        res["db_size"] = c.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    t0 = time.perf_counter()
    subprocess.run([f"{BINDIR}/pg_dump", "-Fc", "-f", str(dump), "st1"], env=a.env(), check=True)
    res["pg_dump_s"] = time.perf_counter() - t0
    res["dump_bytes"] = dump.stat().st_size
    plain_dump = a.dir / "st1.sql"
    subprocess.run([f"{BINDIR}/pg_dump", "-Fp", "-f", str(plain_dump), "st1"], env=a.env(), check=True)
    res["plain_dump_bytes"] = plain_dump.stat().st_size
    plain_dump.unlink()
    res["events"] = before[0]
    b.create(shared_preload_libraries=f"'{EXT}'", track_commit_timestamp="on")
    b.start()
    for jobs in (1, 2):
        db = f"restored_j{jobs}"
        with b.connect() as c:
            c.execute(f"CREATE DATABASE {db}")
        t0 = time.perf_counter()
        p = subprocess.run([f"{BINDIR}/pg_restore", "-j", str(jobs), "-d", db, str(dump)], env=b.env(),
                           capture_output=True, text=True)
        res[f"pg_restore_j{jobs}_s"] = time.perf_counter() - t0
        res[f"pg_restore_j{jobs}_rc"] = p.returncode
        res[f"pg_restore_j{jobs}_stderr"] = p.stderr.strip()[-2000:]
    b.wait_for_worker("restored_j1", timeout=120)
    b.wait_until_final("restored_j1")
    with b.connect("restored_j1") as c:
        after = checksum(c)
        res["identical_events"] = tuple(after) == tuple(before)
        res["log_id_restored"] = str(c.execute("SELECT streams.log_id()").fetchone()[0])
        res["subscriptions_restored"] = [dict(name=r[0], position=r[1], pending=r[2]) for r in c.execute(
            "SELECT name, position, pending FROM streams.subscriptions ORDER BY name")]
        res["era_bounds_before_a_new_event"] = c.execute("SELECT era_bounds FROM streams.horizon_state").fetchone()[0]
        q = c.execute("SELECT streams.publish('payment.success', %s)", (PAYLOAD,)).fetchone()[0]
        c.execute("SELECT streams.wait(%s, '10s')", (q,))
        res["new_position"] = q
        res["era_bounds"] = c.execute("SELECT era_bounds FROM streams.horizon_state").fetchone()[0]
        res["restored_db_size"] = c.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    info(f"{res['events']:,} events ({res['db_size'] / 2**20:.0f} MiB database): pg_dump -Fc {res['pg_dump_s']:.1f} s, "
         f"{res['dump_bytes'] / 2**20:.0f} MiB (plain SQL {res['plain_dump_bytes'] / 2**20:.0f} MiB); pg_restore into another cluster {res['pg_restore_j1_s']:.1f} s "
         f"(-j 2: {res['pg_restore_j2_s']:.1f} s, exit {res['pg_restore_j2_rc']}); identical events: "
         f"{res['identical_events']}; log_id changed: {res['log_id_restored'] != res['log_id_dumped']}; "
         f"era_bounds {res['era_bounds']}; subscriptions {res['subscriptions_restored']}")
    if res["pg_restore_j2_rc"]:
        info(f"pg_restore -j 2 stderr: {res['pg_restore_j2_stderr'][-600:]}")
    with b.connect() as c:
        c.execute("DROP DATABASE restored_j2")
    dump.unlink()

    # -- A small log: what tx, eras and time_exact mean after a restore.
    a.createdb("rs")
    small = a.dir / "rs.dump"
    with a.connect("rs") as c:
        first = c.execute("SELECT streams.publish('ops.restore', %s)", (PAYLOAD,)).fetchone()[0]
        c.execute("SELECT streams.wait(%s, '10s')", (first,))
        c.execute("SELECT streams.create_subscription('billing', 'ops.*', after => 0)")
        # A role with a grant and a subscription of its own: restored only where the role exists.
        c.execute("ALTER DATABASE rs SET litebase_streams.hold_timeout = '30s'")
        c.execute("CREATE ROLE ops_reader LOGIN")
        c.execute("SELECT streams.grant('read', 'ops.*', 'ops_reader')")
    with a.connect("rs", user="ops_reader") as c:
        c.execute("SELECT streams.create_subscription('reporting', 'ops.*', after => 0)")
    with a.connect("rs") as c:
        with a.connect("rs", autocommit=False) as holder:
            # An event committed but not yet final when the dump is taken:
            # a publishing transaction left open holds it back.
            holder.execute("SELECT streams.publish('ops.restore', %s)", (PAYLOAD,))
            late = c.execute("SELECT streams.publish('ops.restore', %s)", (PAYLOAD,)).fetchone()[0]
            subprocess.run([f"{BINDIR}/pg_dump", "-Fc", "-f", str(small), "rs"], env=a.env(), check=True)
            holder.commit()
        a.wait_until_final("rs")
        src = {r[0]: (r[1], str(r[2])) for r in c.execute("SELECT position, time, tx FROM streams.events")}
        src_txs = [int(str(r[0])) for r in c.execute("SELECT tx FROM streams.events ORDER BY position")]
    # Into a cluster without the role ops_reader: what pg_restore says, and what is left.
    with b.connect() as c:
        c.execute("CREATE DATABASE rs_noroles")
    p = subprocess.run([f"{BINDIR}/pg_restore", "-d", "rs_noroles", str(small)], env=b.env(),
                       capture_output=True, text=True)
    with b.connect("rs_noroles") as c:
        res["without_roles"] = dict(
            rc=p.returncode, errors=[line for line in p.stderr.splitlines() if "error" in line.lower()][:6],
            events=c.execute("SELECT count(*) FROM streams.event_log").fetchone()[0],
            grants=c.execute("SELECT count(*) FROM streams.stream_grants").fetchone()[0],
            subscriptions=[r[0] for r in c.execute("SELECT name FROM streams.subscription_state ORDER BY 1")])
    info(f"restored into a cluster without the role: {res['without_roles']}")
    # The roles first (pg_dumpall --roles-only), then the database.
    roles = subprocess.run([f"{BINDIR}/pg_dumpall", "--roles-only"], env=a.env(), check=True,
                           capture_output=True, text=True).stdout
    subprocess.run([f"{BINDIR}/psql", "-X", "-q", "-d", "postgres"], input=roles, env=b.env(),
                   capture_output=True, text=True)
    with b.connect() as c:
        c.execute("CREATE DATABASE rs")
    subprocess.run([f"{BINDIR}/pg_restore", "-d", "rs", str(small)], env=b.env(), check=True, capture_output=True)
    with b.connect("rs") as c:
        res["with_roles"] = dict(
            grants=c.execute("SELECT count(*) FROM streams.stream_grants").fetchone()[0],
            subscriptions=[r[0] for r in c.execute("SELECT name FROM streams.subscription_state ORDER BY 1")])
    res["with_roles"]["database_settings_restored"] = b.one(
        "postgres", "SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase "
                    "WHERE d.datname = 'rs'")[0]
    info(f"roles restored first: {res['with_roles']}")
    b.wait_for_worker("rs")
    with b.connect("rs") as c:
        new = c.execute("SELECT streams.publish('ops.restore', %s)", (PAYLOAD,)).fetchone()[0]
        c.execute("SELECT streams.wait(%s, '10s')", (new,))
        rows = c.execute("SELECT e.position, e.time, e.tx, streams._era(e.position, "
                         "(SELECT h.era_bounds FROM streams.horizon_state h)), "
                         "NOT EXISTS (SELECT FROM streams.commit_times c WHERE e.position = ANY (c.inexact)) "
                         "FROM streams.events e ORDER BY e.position").fetchall()
        era_bounds = c.execute("SELECT era_bounds FROM streams.horizon_state").fetchone()[0]
        next_xid = int(str(c.execute("SELECT pg_current_xact_id()").fetchone()[0]))
    events = []
    for pos, t, tx, era, exact in rows:
        events.append(dict(position=pos, tx=str(tx), era=era, time_exact=exact,
                           same_time_as_source=pos in src and src[pos][0] == t))
    res["small"] = dict(events=events, era_bounds=era_bounds, late_position=late, new_position=new,
                        source_txs=src_txs, restored_cluster_next_xid=next_xid,
                        server_log=b.log_lines("restored from another cluster")[-1:]
                        + b.log_lines("was lost before it was recorded")[-1:])
    info(f"small log restored into another cluster: era_bounds {era_bounds}; events {events}; "
         f"source tx ids {src_txs}, the restoring cluster's next xid {next_xid}")
    for line in res["small"]["server_log"]:
        info(f"log: {line}")
    # The same dump restored into the same cluster (another database): no new era.
    with a.connect() as c:
        c.execute("CREATE DATABASE rs_copy")
    subprocess.run([f"{BINDIR}/pg_restore", "-d", "rs_copy", str(small)], env=a.env(), check=True, capture_output=True)
    a.wait_for_worker("rs_copy")
    with a.connect("rs_copy") as c:
        q = c.execute("SELECT streams.publish('ops.restore', '{}')").fetchone()[0]
        c.execute("SELECT streams.wait(%s, '10s')", (q,))
        res["same_cluster_era_bounds"] = c.execute("SELECT era_bounds FROM streams.horizon_state").fetchone()[0]
    info(f"restored into the same cluster: era_bounds {res['same_cluster_era_bounds']}")
    small.unlink()

    # -- Physical: pg_basebackup of the running cluster A, started as a copy.
    copy = Cluster(a.port + 2)
    copy.destroy()
    copy.dir.mkdir(parents=True)
    if AS_SERVER:
        shutil.chown(copy.dir, "postgres", "postgres")
    with a.connect("rs") as c:
        src_log_id = str(c.execute("SELECT streams.log_id()").fetchone()[0])
        src_count = c.execute("SELECT count(*) FROM streams.events").fetchone()[0]
    t0 = time.perf_counter()
    copy.run_as_server([f"{BINDIR}/pg_basebackup", "-D", str(copy.data), "-X", "stream", "-c", "fast",
                        "-T", f"{a.dir / 'tablespace'}={copy.dir / 'tablespace'}",
                        "-h", str(a.dir), "-p", str(a.port), "-U", USER])
    res["pg_basebackup_s"] = time.perf_counter() - t0
    # The original goes on after the backup: the copy diverges (as after a point-in-time recovery,
    # or a failover to a standby that missed the newest commits).
    with a.connect("rs") as c:
        after_backup = [c.execute("SELECT streams.publish('ops.restore', '{\"on\": \"original\"}')").fetchone()[0]
                        for _ in range(3)]
    copy.conf = dict(a.conf, port=copy.port, unix_socket_directories=f"'{copy.dir}'")
    copy.write_conf()
    copy.start()
    copy.wait_for_worker("rs")
    with copy.connect("rs") as c:
        q = c.execute("SELECT streams.publish('ops.restore', '{}')").fetchone()[0]
        c.execute("SELECT streams.wait(%s, '10s')", (q,))
        res["physical_diverged"] = dict(original_published_after_backup=after_backup, copy_published=q)
        res["physical"] = dict(
            log_id_same=str(c.execute("SELECT streams.log_id()").fetchone()[0]) == src_log_id,
            events_same=c.execute("SELECT count(*) FROM streams.events").fetchone()[0] == src_count + 1,
            log_id=str(c.execute("SELECT streams.log_id()").fetchone()[0]),
            era_bounds=c.execute("SELECT era_bounds FROM streams.horizon_state").fetchone()[0],
            new_position=q)
    copy.destroy()
    info(f"pg_basebackup {res['pg_basebackup_s']:.1f} s; the copy: {res['physical']}; the original published "
         f"{after_backup} after the backup, the copy then gave position {q} to another event, same log_id")
    RESULTS["backup"] = res


def phase_uninstall(a):
    say("uninstall: DROP EXTENSION, then the preload setting removed")
    res = {}
    with a.connect("st1000") as c:
        before = c.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        n = c.execute("SELECT count(*) FROM streams.event_log").fetchone()[0]
        pid = c.execute("SELECT streams.worker_pid()").fetchone()[0]
        t0 = time.perf_counter()
        c.execute(f"DROP EXTENSION {EXT}")
        res["drop_s"] = time.perf_counter() - t0
        after = c.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        res["events_dropped"] = n
        res["freed_bytes"] = before - after
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]:
            time.sleep(0.05)
        res["worker_gone_after_s"] = time.perf_counter() - t0
    info(f"DROP EXTENSION with {n:,} events: {res['drop_s'] * 1000:.0f} ms, {res['freed_bytes'] / 2**20:.0f} MiB freed; "
         f"worker gone {res['worker_gone_after_s']:.2f} s after")
    # Remove the preload setting while st10 still has the extension.
    a.stop()
    del a.conf["shared_preload_libraries"]
    a.write_conf()
    a.start()
    with a.connect("st10") as c:
        res["without_preload"] = dict(
            publish=error_of(lambda: c.execute("SELECT streams.publish('ops.x', '{}')")),
            status=error_of(lambda: c.execute("SELECT * FROM streams.status")),
            read=error_of(lambda: c.execute("SELECT count(*) FROM streams.events")),
            drop=error_of(lambda: c.execute(f"DROP EXTENSION {EXT}")))
    info(f"extension still installed, preload removed: {res['without_preload']}")
    RESULTS["uninstall"] = res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=54410, help="first of three ports (default 54410)")
    ap.add_argument("--events", type=int, default=1_000_000, help="events per storage data set")
    ap.add_argument("--samples", type=int, default=1000, help="visibility latency samples per mode")
    ap.add_argument("--quick", action="store_true", help="smoke run: fewer events, samples and sizes")
    ap.add_argument("--keep", action="store_true", help="leave the clusters running afterwards")
    ap.add_argument("--only", nargs="+", metavar="PHASE", help="run these phases only (install is always run): "
                    "slots latency hold notify settings big storage tablespace monitor backup uninstall "
                    "(tablespace needs storage); results go to results-only.json")
    args = ap.parse_args()
    if args.quick:
        args.events, args.samples = min(args.events, 20_000), min(args.samples, 100)
    big_sizes, reps = ([10], 1) if args.quick else ([10, 50, 200], 3)

    started = time.time()
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    RESULTS["machine"] = dict(cpus=os.cpu_count(), cpu=cpu, kernel=platform.release(),
                              memory_gib=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
                              postgres=subprocess.run([f"{BINDIR}/postgres", "--version"], capture_output=True,
                                                      text=True).stdout.strip(),
                              measured_at=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              load_average_at_start=os.getloadavg(),
                              args=vars(args))
    say(f"machine: {RESULTS['machine']}")
    a, b = Cluster(args.port), Cluster(args.port + 1)
    try:
        phases = [
            ("slots", lambda: phase_slots(a)),
            ("latency", lambda: phase_latency(a, args.samples)),
            ("hold", lambda: phase_hold(a)),
            ("notify", lambda: phase_notify(a)),
            ("settings", lambda: phase_settings(a)),
            ("big", lambda: phase_big(a, big_sizes, reps)),
            ("storage", lambda: phase_storage(a, args.events)),
            ("tablespace", lambda: phase_tablespace(a)),
            ("monitor", lambda: phase_monitor(a)),
            ("backup", lambda: phase_backup(a, b)),
            ("uninstall", lambda: phase_uninstall(a)),
        ]
        phase_install(a)
        for name, phase in phases:
            if not args.only or name in args.only:
                phase()
    finally:
        RESULTS["duration_s"] = time.time() - started
        RESULTS["machine"]["load_average_at_end"] = os.getloadavg()
        OUT.mkdir(parents=True, exist_ok=True)
        out = OUT / ("results-only.json" if args.only else "results-quick.json" if args.quick else "results.json")
        out.write_text(json.dumps(RESULTS, indent=1, default=str))
        say(f"results: {out} ({RESULTS['duration_s'] / 60:.1f} min)")
        if not args.keep:
            a.destroy()
            b.destroy()


if __name__ == "__main__":
    main()
