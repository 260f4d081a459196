"""6. Subscriptions (streams.poll / streams.ack); --only consume runs just this.

run(b) measures with bench/common.py's helpers (connect, dsn, say, CpuMeter,
publisher_main, ...); the report side (values, notes, section) reads only
results.json's "consume" entry.

  6a. consume throughput over the same preloaded events, one consumer, 1,000
      events per transaction, methods interleaved: an ordered subscription
      (BEGIN; poll; ack; COMMIT), streams.replay() pages with the cursor in a
      table of the consumer's own (updated in the same transaction), and PgQ 3
      (next_batch / get_batch_events / finish_batch). Each is timed as a
      Python client (one statement per round trip, rows decoded) and as the
      same loop in a PL/pgSQL procedure (CALLed once: no client, the server's
      cost alone).
  6b. competing consumers: an unordered subscription drained by 1, 2 and 4
      consumer processes, 100 events per transaction; every event must be
      consumed exactly once.
  6c. long-poll wake-up latency: a consumer long-polling an ordered
      subscription (wait => '10s') while publishers commit 1,000 events/s, one
      per transaction; time from the publisher's COMMIT returning to the poll
      returning the event (CLOCK_MONOTONIC in both processes, as section 2).
"""

import os
import resource
import shutil
import subprocess
import time
import traceback

import common as H

ORDER = 60
OWN_DB = True

STREAM = "bench.consume"         # 6a: one stream, one event per transaction
COMPETE_STREAM = "bench.compete"  # 6b
WAKE_STREAM = "bench.wake"        # 6c
QUEUE = "bench_consume"          # PgQ's copy of 6a's events
PGQ_PACKAGE = "postgresql-{major}-pgq3"

FULL = dict(consume_events=200_000, consume_batch=1000, consume_reps=3, consume_warmup=20_000,
            compete_events=50_000, compete_batch=100, compete_consumers=[1, 2, 4], compete_reps=3,
            wake_secs=20, wake_warmup=1.0, wake_publishers=8, wake_rate=1000)
QUICK = dict(consume_events=5_000, consume_batch=1000, consume_reps=1, consume_warmup=2_000,
             compete_events=3_000, compete_batch=100, compete_consumers=[1, 2, 4], compete_reps=1,
             wake_secs=1.5, wake_warmup=0.5, wake_publishers=4, wake_rate=1000)

METHODS = [
    ("subscription", "ordered subscription: poll + ack"),
    ("replay", "replay() pages + own cursor table"),
    ("pgq", "PgQ 3: next_batch / get_batch_events / finish_batch"),
]

# The data of event i (the same for the stream and the PgQ queue).
DATA_SQL = "jsonb_build_object('order_id', 'ord_' || i, 'amount', (i % 10000) / 100.0)"

# The server-side form of each consumer loop: a procedure CALLed once that
# does what the client does, batch by batch, COMMIT after each; every row is
# fetched into a record (all columns computed), nothing is sent to a client.
PROCEDURES = """
CREATE TABLE bench_cursor (name text PRIMARY KEY, position bigint NOT NULL);

CREATE PROCEDURE bench_consume_subscription(sub text, batch int, INOUT n bigint DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    k int;
    last bigint;
BEGIN
    LOOP
        k := 0;
        FOR r IN SELECT * FROM streams.poll(sub, batch) LOOP
            last := r.position;
            k := k + 1;
        END LOOP;
        EXIT WHEN k = 0;
        PERFORM streams.ack(sub, last);
        COMMIT;
        n := n + k;
    END LOOP;
END $$;

CREATE PROCEDURE bench_consume_replay(cursor_name text, stream text, batch int, INOUT n bigint DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    k int;
    last bigint;
BEGIN
    SELECT c.position INTO last FROM bench_cursor c WHERE c.name = cursor_name;
    LOOP
        k := 0;
        FOR r IN SELECT * FROM streams.replay(stream, after => last, max_events => batch) LOOP
            last := r.position;
            k := k + 1;
        END LOOP;
        EXIT WHEN k = 0;
        UPDATE bench_cursor SET position = last WHERE name = cursor_name;
        COMMIT;
        n := n + k;
    END LOOP;
END $$;

CREATE PROCEDURE bench_consume_pgq(queue text, consumer text, total bigint, INOUT n bigint DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    batch bigint;
BEGIN
    WHILE n < total LOOP
        batch := pgq.next_batch(queue, consumer);
        EXIT WHEN batch IS NULL;
        FOR r IN SELECT * FROM pgq.get_batch_events(batch) LOOP
            n := n + 1;
        END LOOP;
        PERFORM pgq.finish_batch(batch);
        COMMIT;
    END LOOP;
END $$;
"""


def _cpu_self():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# --------------------------------------------------------------------------
# PgQ: the Debian package, installed on first use like the bench's venv.
# --------------------------------------------------------------------------

def ensure_pgq(c):
    """None when the pgq extension can be created, else why not (the report
    shows it). Installs postgresql-<major>-pgq3 with apt-get when root."""
    def available():
        return c.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pgq'").fetchone() is not None

    if available():
        return None
    major = c.execute("SELECT current_setting('server_version_num')::int / 10000").fetchone()[0]
    pkg = PGQ_PACKAGE.format(major=major)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"the pgq extension is not installed and this is not root with apt-get (install {pkg})"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", pkg]
    H.say(f"apt-get install {pkg} (PgQ, for section 6)")
    try:
        r = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:  # a stale package list: update once and try again
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
            r = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"apt-get install {pkg} failed: {e}"
    if r.returncode != 0 or not available():
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
        return f"apt-get install {pkg} failed: {tail[0]}"
    return None


# --------------------------------------------------------------------------
# Child processes (spawned, like common.py's: one interpreter each)
# --------------------------------------------------------------------------

def competing_main(conninfo, sub, batch, target, total, ready_evt, start_evt, deadline_s, out):
    """Poll + ack the unordered subscription `sub` until the consumers
    together consumed `target` events and a poll returns nothing (so events
    delivered twice do not end the run early); send the positions consumed.
    Gives up after deadline_s (the parent reports what is missing)."""
    try:
        import psycopg
        mono = time.monotonic_ns
        conn = psycopg.connect(conninfo, autocommit=True)
        cur = conn.cursor()
        poll = "SELECT * FROM streams.poll(%s, %s)"
        ack = "SELECT streams.ack(%s, %s)"
        for _ in range(2):  # prepare the statements; the rollback returns the claims
            cur.execute("BEGIN")
            cur.execute(poll, (sub, 1), prepare=True)
            cur.fetchall()
            cur.execute("ROLLBACK")
        ready_evt.set()
        start_evt.wait()
        cpu0, t_end, deadline = time.process_time(), mono(), time.monotonic() + deadline_s
        positions, polls, empty, gave_up = [], 0, 0, False
        while True:
            cur.execute("BEGIN")
            cur.execute(poll, (sub, batch), prepare=True)
            rows = cur.fetchall()
            if rows:
                cur.execute(ack, (sub, rows[-1][0]), prepare=True)
            cur.execute("COMMIT")
            polls += 1
            if rows:
                t_end = mono()
                positions.extend(r[0] for r in rows)
                with total.get_lock():
                    total.value += len(rows)
            else:
                empty += 1
                if total.value >= target:
                    break
                if time.monotonic() > deadline:
                    gave_up = True
                    break
                # The other consumers hold what is left: wait for their commits.
                time.sleep(0.0005)
        cpu = time.process_time() - cpu0
        conn.close()
        out.send(("ok", positions, polls, empty, t_end, cpu, gave_up))
    except BaseException:
        out.send(("error", traceback.format_exc()))


def waker_main(conninfo, sub, batch, wait, ready_evt, stop_evt, out):
    """Long-poll the ordered subscription `sub` until stop_evt; for each
    poll that returned events: (time it was sent, time it returned, time the
    COMMIT after the ack returned, their positions)."""
    try:
        import psycopg
        mono = time.monotonic_ns
        conn = psycopg.connect(conninfo, autocommit=True)
        cur = conn.cursor()
        poll = "SELECT * FROM streams.poll(%s, %s, %s::interval)"
        ack = "SELECT streams.ack(%s, %s)"
        for _ in range(6):  # warm up: nothing to return, no wait
            cur.execute("BEGIN")
            cur.execute(poll, (sub, batch, "0"), prepare=True)
            cur.fetchall()
            cur.execute("COMMIT")
        ready_evt.set()
        recs, empty = [], 0
        while not stop_evt.is_set():
            cur.execute("BEGIN")
            t_sent = mono()
            cur.execute(poll, (sub, batch, wait), prepare=True)
            rows = cur.fetchall()
            t = mono()
            if rows:
                cur.execute(ack, (sub, rows[-1][0]), prepare=True)
            else:
                empty += 1
            cur.execute("COMMIT")
            if rows:
                recs.append((t_sent, t, mono(), [r[0] for r in rows]))
        conn.close()
        out.send(("ok", recs, empty))
    except BaseException:
        out.send(("error", traceback.format_exc()))


# --------------------------------------------------------------------------
# The phase
# --------------------------------------------------------------------------

def run(b):
    cfg = b.cfg
    N, batch = cfg["consume_events"], cfg["consume_batch"]
    H.say(f"6. subscriptions: {N:,} events in one stream (one per transaction), consumed {batch:,} "
          "per transaction by an ordered subscription, replay() pages and PgQ; competing consumers; "
          "long-poll wake-up; fresh database")
    b.recreate_db()
    res = dict(measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), events=N, batch=batch,
               config={k: cfg[k] for k in FULL})
    with H.connect(H.DB) as c:
        res["pgq_skipped"] = ensure_pgq(c)
        if res["pgq_skipped"] is None:
            try:
                c.execute("CREATE EXTENSION pgq")
                res["pgq_version"] = c.execute("SELECT pgq.version()").fetchone()[0]
            except Exception as e:  # noqa: BLE001 (any failure: skip PgQ, say why)
                res["pgq_skipped"] = f"CREATE EXTENSION pgq failed: {type(e).__name__}: {e}"
        if res["pgq_skipped"]:
            H.info(f"PgQ skipped: {res['pgq_skipped']}")
        c.execute(PROCEDURES)
        res["preload"] = _preload(b, c, cfg, res["pgq_skipped"] is None)
    methods = [m for m in METHODS if m[0] != "pgq" or res["pgq_skipped"] is None]
    res["labels"] = {k: label for k, label in METHODS}
    res["throughput"] = _throughput(b, cfg, methods)
    res["compete"] = _compete(b, cfg)
    res["wake"] = _wake(b, cfg)
    b.res["consume"] = res


def _preload(b, c, cfg, with_pgq):
    N, M = cfg["consume_events"], cfg["compete_events"]
    out = {}
    t = time.monotonic()
    # Not measured: asynchronous commit makes the one-event transactions cheap.
    c.execute("SET synchronous_commit = off")
    for stream, n in ((STREAM, N), (COMPETE_STREAM, M)):
        c.execute(f"""
DO $$
BEGIN
    FOR i IN 1..{n} LOOP
        PERFORM streams.publish('{stream}', {DATA_SQL});
        COMMIT;
    END LOOP;
END $$""")
    out["stream_s"] = time.monotonic() - t
    out["deliver_s"] = b.wait_delivered(c, timeout=600)
    out["first"], out["last"] = c.execute(
        "SELECT min(position) - 1, max(position) FROM streams.event_log WHERE stream = %s", (STREAM,)).fetchone()
    out["compete_first"], out["compete_last"] = c.execute(
        "SELECT min(position) - 1, max(position) FROM streams.event_log WHERE stream = %s",
        (COMPETE_STREAM,)).fetchone()
    if out["last"] - out["first"] != N or out["compete_last"] - out["compete_first"] != M:
        raise H.BenchError(f"preload: unexpected positions {out}")
    H.info(f"published {N + M:,} events in {out['stream_s']:.1f} s, delivered {out['deliver_s']:.1f} s later")
    if with_pgq:
        # Ticks cut PgQ's batches: pgq.ticker() after every `batch` events, as
        # a pgqd would while they arrive (max_count = the batch size; no
        # time-based ticks). One consumer per round, all registered first.
        c.execute("SELECT pgq.create_queue(%s)", (QUEUE,))
        for k, v in (("ticker_max_count", str(cfg["consume_batch"])), ("ticker_max_lag", "1 day"),
                     ("ticker_idle_period", "1 day")):
            c.execute("SELECT pgq.set_queue_config(%s, %s, %s)", (QUEUE, k, v))
        for r in range(2 * cfg["consume_reps"] + 1):  # the warm-up, then client and server rounds
            c.execute("SELECT pgq.register_consumer(%s, %s)", (QUEUE, f"c{r}"))
        t = time.monotonic()
        c.execute(f"""
DO $$
BEGIN
    FOR i IN 1..{N} LOOP
        PERFORM pgq.insert_event('{QUEUE}', '{STREAM}', ({DATA_SQL})::text);
        COMMIT;
        IF i % {cfg['consume_batch']} = 0 THEN
            PERFORM pgq.ticker();
            COMMIT;
        END IF;
    END LOOP;
END $$""")
        out["pgq_s"] = time.monotonic() - t
        out["pgq_ticks"] = c.execute(
            "SELECT count(*) FROM pgq.tick t JOIN pgq.queue q ON q.queue_id = t.tick_queue "
            "WHERE q.queue_name = %s", (QUEUE,)).fetchone()[0]
        H.info(f"PgQ: {N:,} events in {out['pgq_s']:.1f} s, {out['pgq_ticks']:,} ticks")
    c.execute("RESET synchronous_commit")
    c.execute("VACUUM (ANALYZE)")
    c.execute("CHECKPOINT")
    return out


class _Consumer:
    """One method's consumer, client side (Python, one statement per round
    trip) and server side (its procedure). Each round starts from the first
    preloaded event with a state of its own: a new subscription, cursor row
    or PgQ consumer."""

    def __init__(self, key, c, cfg, first):
        self.key, self.c, self.cur = key, c, c.cursor()
        self.batch, self.first, self.rounds = cfg["consume_batch"], first, 0

    def new_round(self):
        self.rounds += 1
        name = f"r{self.rounds}"
        if self.key == "subscription":
            self.name = f"bench.consume.{name}"
            self.c.execute("SELECT streams.create_subscription(%s, %s, after => %s)",
                           (self.name, STREAM, self.first))
        elif self.key == "replay":
            self.name = name
            self.c.execute("INSERT INTO bench_cursor VALUES (%s, %s)", (name, self.first))
        else:
            self.name = f"c{self.rounds - 1}"

    def client(self, limit):
        """Consume up to `limit` events; the count and the last position."""
        cur, n, last = self.cur, 0, None
        if self.key == "replay":
            last = self.first
        while n < limit:
            if self.key == "subscription":
                cur.execute("BEGIN")
                cur.execute("SELECT * FROM streams.poll(%s, %s)", (self.name, self.batch), prepare=True)
                rows = cur.fetchall()
                if rows:
                    cur.execute("SELECT streams.ack(%s, %s)", (self.name, rows[-1][0]), prepare=True)
                cur.execute("COMMIT")
                if rows:
                    last = rows[-1][0]
            elif self.key == "replay":
                cur.execute("BEGIN")
                cur.execute("SELECT * FROM streams.replay(%s, after => %s, max_events => %s)",
                            (STREAM, last, self.batch), prepare=True)
                rows = cur.fetchall()
                if rows:
                    last = rows[-1][0]
                    cur.execute("UPDATE bench_cursor SET position = %s WHERE name = %s", (last, self.name),
                                prepare=True)
                cur.execute("COMMIT")
            else:
                cur.execute("BEGIN")
                cur.execute("SELECT pgq.next_batch(%s, %s)", (QUEUE, self.name), prepare=True)
                batch_id = cur.fetchone()[0]
                rows = []
                if batch_id is not None:
                    cur.execute("SELECT * FROM pgq.get_batch_events(%s)", (batch_id,), prepare=True)
                    rows = cur.fetchall()
                    cur.execute("SELECT pgq.finish_batch(%s)", (batch_id,), prepare=True)
                cur.execute("COMMIT")
                if batch_id is None:
                    break
                if rows:
                    last = rows[-1][0]
            if not rows and self.key != "pgq":
                break
            n += len(rows)
        return n, last

    def server(self, total):
        if self.key == "subscription":
            q, args = "CALL bench_consume_subscription(%s, %s)", (self.name, self.batch)
        elif self.key == "replay":
            q, args = "CALL bench_consume_replay(%s, %s, %s)", (self.name, STREAM, self.batch)
        else:
            q, args = "CALL bench_consume_pgq(%s, %s, %s)", (QUEUE, self.name, total)
        return self.c.execute(q, args).fetchone()[0], None


def _throughput(b, cfg, methods):
    N, reps = cfg["consume_events"], cfg["consume_reps"]
    H.say(f"6a. consume throughput: {', '.join(m[1] for m in methods)}; {N:,} events each, "
          f"{reps} round(s) per form, interleaved")
    out = {form: {m[0]: [] for m in methods} for form in ("client", "server")}
    with H.connect(H.DB) as c:
        first = c.execute("SELECT min(position) - 1 FROM streams.event_log WHERE stream = %s",
                          (STREAM,)).fetchone()[0]
        worker = b.status(c)["worker_pid"]
        consumers = {m[0]: _Consumer(m[0], H.connect(H.DB), cfg, first) for m in methods}
        try:
            for con in consumers.values():  # warm-up: prepared statements, caches
                con.new_round()
                con.client(cfg["consume_warmup"])
            for order in H.rotations(methods, reps):
                for form in ("client", "server"):
                    for key, label in order:
                        con = consumers[key]
                        con.new_round()
                        c.execute("CHECKPOINT")
                        meter = H.CpuMeter(b.postmaster).start({"worker": worker})
                        cpu0, t0 = _cpu_self(), time.monotonic()
                        n, last = con.client(N) if form == "client" else con.server(N)
                        secs = time.monotonic() - t0
                        client_cpu = _cpu_self() - cpu0
                        cpu = meter.stop()
                        if n != N or (last is not None and key != "pgq" and last != first + N):
                            raise H.BenchError(f"{label} ({form}): consumed {n} events up to {last}, "
                                               f"expected {N} up to {first + N}")
                        r = dict(events=n, seconds=secs, events_per_s=n / secs, cpu=cpu,
                                 client_cpu_us=client_cpu * 1e6 / n if form == "client" else None,
                                 server_cpu_us=cpu["server_s"] * 1e6 / n if "server_s" in cpu else None)
                        out[form][key].append(r)
                        H.info(f"{form:<6} {label:<52} {r['events_per_s']:>10,.0f} events/s")
        finally:
            for con in consumers.values():
                con.c.close()
    return out


def _compete(b, cfg):
    M, batch, ns = cfg["compete_events"], cfg["compete_batch"], cfg["compete_consumers"]
    H.say(f"6b. competing consumers: an unordered subscription, {M:,} events, {batch} per transaction, "
          f"{', '.join(map(str, ns))} consumer processes, {cfg['compete_reps']} round(s), interleaved")
    runs = {n: [] for n in ns}
    with H.connect(H.DB) as c:
        first = c.execute("SELECT min(position) - 1 FROM streams.event_log WHERE stream = %s",
                          (COMPETE_STREAM,)).fetchone()[0]
        expected = set(range(first + 1, first + M + 1))
        for rnd, order in enumerate(H.rotations(ns, cfg["compete_reps"])):
            for n in order:
                sub = f"bench.compete.r{rnd}.c{n}"
                c.execute("SELECT streams.create_subscription(%s, %s, after => %s, ordered => false)",
                          (sub, COMPETE_STREAM, first))
                total = b.ctx.Value("q", 0)
                start = b.ctx.Event()
                procs = []
                try:
                    for _ in range(n):
                        ready = b.ctx.Event()
                        rx, tx = b.ctx.Pipe(duplex=False)
                        p = b.ctx.Process(target=competing_main, daemon=True,
                                          args=(H.dsn(H.DB), sub, batch, M, total, ready, start, 60, tx))
                        p.start()
                        procs.append((p, ready, rx))
                    for p, ready, _ in procs:
                        if not ready.wait(60):
                            raise H.BenchError("a competing consumer did not start")
                    c.execute("CHECKPOINT")
                    meter = H.CpuMeter(b.postmaster).start({})
                    t0 = time.monotonic_ns()
                    start.set()
                    results = [H._recv(rx, 360, "competing consumer") for _, _, rx in procs]
                    cpu = meter.stop()
                    for p, _, _ in procs:
                        p.join(10)
                finally:
                    for p, _, _ in procs:
                        if p.is_alive():
                            p.kill()
                got = [pos for r in results for pos in r[0]]
                distinct = set(got)
                if distinct - expected:
                    raise H.BenchError(f"competing consumers ({n}): {len(distinct - expected)} event(s) "
                                       f"of another stream")
                secs = (max(r[3] for r in results) - t0) / 1e9
                r = dict(events=len(distinct), seconds=secs, events_per_s=len(distinct) / secs,
                         duplicates=len(got) - len(distinct), missing=len(expected - distinct),
                         gave_up=sum(1 for x in results if x[5]),
                         per_consumer=[len(x[0]) for x in results], polls=sum(x[1] for x in results),
                         empty_polls=sum(x[2] for x in results),
                         client_cpu_us=sum(x[4] for x in results) * 1e6 / len(got), cpu=cpu,
                         server_cpu_us=cpu["server_s"] * 1e6 / len(got) if "server_s" in cpu else None)
                runs[n].append(r)
                H.info(f"{n} consumer(s): {r['events_per_s']:>10,.0f} events/s "
                       f"(per consumer {', '.join(f'{x:,}' for x in r['per_consumer'])}; "
                       f"{r['empty_polls']:,} empty polls)")
                if r["duplicates"] or r["missing"]:
                    H.info(f"WARNING: {r['duplicates']:,} event(s) consumed twice, {r['missing']:,} never "
                           f"consumed{' (gave up after 60 s)' if r['gave_up'] else ''}")
    return dict(events=M, batch=batch, nproc=len(os.sched_getaffinity(0)),
                runs=[dict(consumers=n, runs=runs[n]) for n in ns])


def _wake(b, cfg):
    P, rate = cfg["wake_publishers"], cfg["wake_rate"]
    H.say(f"6c. long-poll wake-up at {rate:,} events/s ({P} publisher processes, {cfg['wake_secs']} s, "
          f"first {cfg['wake_warmup']} s discarded); one consumer, poll(wait => '10s')")
    sub = "bench.wake"
    with H.connect(H.DB) as c:
        b.wait_delivered(c)
        c.execute("SELECT streams.create_subscription(%s, %s)", (sub, WAKE_STREAM))
        c.execute("CHECKPOINT")
    ready, stop = b.ctx.Event(), b.ctx.Event()
    crx, ctx_ = b.ctx.Pipe(duplex=False)
    consumer = b.ctx.Process(target=waker_main, daemon=True,
                             args=(H.dsn(H.DB), sub, cfg["consume_batch"], "10s", ready, stop, ctx_))
    interval = int(P * 1e9 / rate)
    start_evt = b.ctx.Event()
    start_ns, end_ns = b.ctx.Value("q", 0), b.ctx.Value("q", 0)
    pubs = []
    try:
        consumer.start()
        if not ready.wait(60):
            raise H.BenchError("the long-polling consumer did not start")
        for i in range(P):
            pready = b.ctx.Event()
            rx, tx = b.ctx.Pipe(duplex=False)
            p = b.ctx.Process(target=H.publisher_main, daemon=True,
                              args=(H.dsn(H.DB), WAKE_STREAM, interval, i * interval // P, pready,
                                    start_evt, start_ns, end_ns, tx))
            p.start()
            pubs.append((p, pready, rx))
        for p, pready, _ in pubs:
            if not pready.wait(60):
                raise H.BenchError("a publisher process did not start")
        t0 = time.monotonic_ns() + 200_000_000
        start_ns.value, end_ns.value = t0, t0 + int(cfg["wake_secs"] * 1e9)
        start_evt.set()
        sent = []
        for p, _, rx in pubs:
            (recs,) = H._recv(rx, cfg["wake_secs"] + 120, "publisher")
            sent.extend(recs)
            p.join(10)
        # Let the consumer take the last events, then wake it once more to stop.
        last_pos = max((r[0] for r in sent), default=0)
        with H.connect(H.DB) as c:
            deadline = time.monotonic() + 30
            while c.execute("SELECT position FROM streams.subscriptions WHERE name = %s",
                            (sub,)).fetchone()[0] < last_pos and time.monotonic() < deadline:
                time.sleep(0.02)
            stop.set()
            c.execute("SELECT streams.publish(%s, '{}')", (WAKE_STREAM,))
        recs, empty = H._recv(crx, 60, "long-polling consumer")
        consumer.join(10)
    finally:
        for p, _, _ in pubs:
            if p.is_alive():
                p.kill()
        if consumer.is_alive():
            consumer.kill()
    got, dupes = {}, 0
    for t_sent, t, _, positions in recs:
        for pos in positions:
            dupes += pos in got
            got[pos] = (t_sent, t)
    warm_end = t0 + int(cfg["wake_warmup"] * 1e9)
    measured = [r for r in sent if r[1] >= warm_end]
    after, before, behind, waiting, busy = [], [], [], [], []
    for pos, t_sched, t_before, t_after in measured:
        if pos in got:
            t_sent, t = got[pos]
            after.append((t - t_after) / 1e6)
            before.append((t - t_before) / 1e6)
            # Committed while the poll that returned it was already sent (the
            # consumer was waiting), or before (it was busy with the last batch).
            (waiting if t_after >= t_sent else busy).append((t - t_after) / 1e6)
        behind.append((t_before - t_sched) / 1e6)
    sizes = [len(r[3]) for r in recs]
    span = cfg["wake_secs"] - cfg["wake_warmup"]
    w = dict(events=len(measured), achieved_rate=len(measured) / span,
             missing=sum(1 for r in measured if r[0] not in got), duplicates=dupes,
             from_commit_returned_ms=after, from_before_commit_ms=before, publisher_behind_schedule_ms=behind,
             while_waiting_ms=waiting, while_busy_ms=busy,
             ack_commit_ms=[(r[2] - r[1]) / 1e6 for r in recs],
             poll_cycle_ms=[(b_[0] - a_[0]) / 1e6 for a_, b_ in zip(recs, recs[1:])],
             polls=len(recs), empty_polls=empty, events_per_poll=sizes)
    H.info(f"{len(measured):,} events at {w['achieved_rate']:,.0f}/s: from COMMIT returned p50 "
           f"{H.pct(after, 50):.2f} ms, p99 {H.pct(after, 99):.2f} ms; {len(recs):,} polls returned events "
           f"(mean {H.med(sizes) if sizes else 0:.0f} per poll)")
    if w["missing"] or dupes:
        H.info(f"WARNING: {w['missing']} event(s) never returned, {dupes} returned twice")
    return w


# --------------------------------------------------------------------------
# Report (called from bench/report.py; reads res["consume"] only)
# --------------------------------------------------------------------------

def _eps(runs):
    return H.med([r["events_per_s"] for r in runs]) if runs else float("nan")


def values(res):
    con = res.get("consume")
    if not con:
        return {}
    tp = con["throughput"]["client"]
    s, r = _eps(tp["subscription"]), _eps(tp["replay"])
    w = con["wake"]
    ok_wake = w["missing"] == 0 and w["duplicates"] == 0
    cruns = [x for e in con["compete"]["runs"] for x in e["runs"]]
    c_dup, c_miss = sum(x.get("duplicates", 0) for x in cruns), sum(x.get("missing", 0) for x in cruns)
    return {
        "consume_vs_replay": dict(value=s / r, batch=f"{con['batch']:,}"),
        "compete_exactly_once": dict(value=not (c_dup or c_miss),
                                     shown=f"no: {c_dup:,} consumed twice, {c_miss:,} never"),
        "wake_exactly_once": dict(value=ok_wake,
                                  shown=f"no: {w['missing']:,} missing, {w['duplicates']:,} duplicated"),
    }


def notes(res, short):
    """Shortfall notes for the report's summary."""
    con = res.get("consume")
    out = []
    if not con:
        return out
    tc, ts = con["throughput"]["client"], con["throughput"]["server"]

    def cpu(runs):
        v = [x["server_cpu_us"] for x in runs if x.get("server_cpu_us") is not None]
        return H.med(v) if v else float("nan")

    if "consume_vs_replay" in short:
        out.append(
            f"**consume:** the subscription consumer reached {_eps(tc['subscription']):,.0f} events/s against "
            f"{_eps(tc['replay']):,.0f} for replay() pages; the server spent {cpu(tc['subscription']):.1f} µs of "
            f"CPU per event against {cpu(tc['replay']):.1f} µs. Without a client (the loops as procedures) the "
            f"ratio is {_eps(ts['subscription']) / _eps(ts['replay']):.2f}x.")
    if "compete_exactly_once" in short:
        bad = [(e["consumers"], x) for e in con["compete"]["runs"] for x in e["runs"]
               if x.get("duplicates") or x.get("missing")]
        out.append(
            "**competing consumers:** events of an unordered subscription were delivered again after a "
            "committed ack, in " + ", ".join(f"a run with {n} consumers ({x['duplicates']} twice, "
                                             f"{x['missing']} never)" for n, x in bad)
            + " (none in the runs with one consumer). See section 6.")
    return out


def section(res, w):
    con = res.get("consume")
    if not con:
        return
    fx, f0, fms, pct, med = H.fx, H.f0, H.fms, H.pct, H.med
    cfg = con["config"]
    N, batch = con["events"], con["batch"]
    pre = con["preload"]
    tp = con["throughput"]
    methods = [m for m in METHODS if m[0] in tp["client"]]
    w("## 6. Subscriptions")
    w("")
    w(f"Measured {con['measured_at']}, in a fresh database: {N:,} events published to one stream "
      f"(`{STREAM}`), one per transaction, and {cfg['compete_events']:,} to another (`{COMPETE_STREAM}`), "
      f"{pre['stream_s']:.1f} s with `synchronous_commit = off` (not measured); then `VACUUM (ANALYZE)` "
      "and a `CHECKPOINT` before each run.")
    w("")
    w(f"**Consume throughput.** One consumer takes {batch:,} events per transaction and records its "
      "progress in the same transaction, from the first event to the last; "
      + (f"{cfg['consume_reps']} rounds, methods in rotating order, median (runs in brackets)"
         if cfg["consume_reps"] > 1 else "one round") + ":")
    w("")
    w(f"- **ordered subscription**: `BEGIN; SELECT * FROM streams.poll('s', {batch}); "
      "SELECT streams.ack('s', <last position>); COMMIT;` (a new subscription per round, `after =>` the "
      "position before the first event);")
    w(f"- **replay() pages + own cursor table**: `BEGIN; SELECT * FROM streams.replay('{STREAM}', "
      f"after => <last>, max_events => {batch}); UPDATE bench_cursor SET position = <last> ...; COMMIT;` "
      "(the cursor kept in the client between batches and written each batch, not read or locked: "
      "it offers a single consumer nothing a subscription adds, such as exclusion of a second consumer);")
    if con["pgq_skipped"]:
        w(f"- **PgQ 3: not measured**: {con['pgq_skipped']}.")
    else:
        w(f"- **PgQ {con.get('pgq_version', '3')}** (the Debian package `postgresql-15-pgq3`, no pgqd): the same "
          f"{N:,} events inserted with `pgq.insert_event` one per transaction ({pre['pgq_s']:.1f} s), with "
          f"`pgq.ticker()` called after every {batch:,} (queue `ticker_max_count` = {batch:,}, no time-based "
          f"ticks: {pre['pgq_ticks']:,} ticks), as a ticker daemon would while they arrive, so each batch holds "
          f"{batch:,} events; the consumer runs `BEGIN; SELECT pgq.next_batch(q, c); SELECT * FROM "
          "pgq.get_batch_events(<batch>); SELECT pgq.finish_batch(<batch>); COMMIT;` (a consumer registered "
          "per round before the events). The ticks are made during the load, not during the timed runs.")
    w("")
    w("Each is timed two ways: **client**, a Python (psycopg 3) consumer in one process, one statement per "
      "round trip with prepared statements, rows decoded (`jsonb` and `timestamptz` into Python objects; "
      "PgQ's `ev_data` stays text), wall time; and **server**, the same loop as a PL/pgSQL procedure "
      "(`bench_consume_*` in bench/phases/consume.py) CALLed once, every row fetched into a record, COMMIT per "
      "batch: the database's cost with no client. *Server CPU*: every process of the cluster, per event.")
    w("")
    w("| method | client: events/s | vs replay pages | server CPU / event | client CPU / event "
      "| server: events/s | vs replay pages |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    rc, rs = _eps(tp["client"]["replay"]), _eps(tp["server"]["replay"])

    def cell(runs):
        v = [x["events_per_s"] for x in runs]
        return f0(med(v)) + (f" ({H.reps_str(v)})" if len(v) > 1 else "")

    def us(runs, k):
        v = [x[k] for x in runs if x.get(k) is not None]
        return f"{med(v):.1f} µs" if v else "n/a"

    for key, label in methods:
        c_, s_ = tp["client"][key], tp["server"][key]
        w(f"| {label} | {cell(c_)} | {fx(_eps(c_) / rc)} | {us(c_, 'server_cpu_us')} | "
          f"{us(c_, 'client_cpu_us')} | {cell(s_)} | {fx(_eps(s_) / rs)} |")
    w("")
    w("The target (>= 0.7x) is on the client figure, as a consumer sees it; the server figure shows the "
      "database's share without the client's decoding, which costs the same for both stream methods.")
    w("")
    cp = con["compete"]
    cruns = [x for e in cp["runs"] for x in e["runs"]]
    c_dup, c_miss = sum(x.get("duplicates", 0) for x in cruns), sum(x.get("missing", 0) for x in cruns)
    exact = ("every event was consumed exactly once in every run." if not (c_dup or c_miss) else
             f"**{c_dup:,} event(s) were consumed twice (committed by two transactions) and {c_miss:,} never, "
             f"over {len(cruns)} runs** (per run in the table).")
    w(f"**Competing consumers.** An unordered subscription (`ordered => false`) over the "
      f"{cp['events']:,} events of `{COMPETE_STREAM}`, drained by 1, 2 and 4 consumer processes "
      f"(Python, one connection each), each `BEGIN; poll(s, {cp['batch']}); ack(s, <last>); COMMIT;` "
      "until they consumed every event together (and a poll returned none); events/s: distinct events "
      "from the start signal to the last commit. The positions each consumer committed are compared "
      f"with the stream's: {exact} The machine has {cp['nproc']} CPUs, "
      "shared by the server, the consumers and the rest of the machine, so more consumers than CPUs "
      "cannot scale linearly.")
    w("")
    w("| consumers | events/s | vs 1 consumer | server CPU / event | consumer CPU / event | empty polls "
      "| consumed twice / never |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    one = _eps(cp["runs"][0]["runs"])
    for entry in cp["runs"]:
        rr = entry["runs"]
        w(f"| {entry['consumers']} | {cell(rr)} | {fx(_eps(rr) / one)} | {us(rr, 'server_cpu_us')} | "
          f"{us(rr, 'client_cpu_us')} | {f0(med([x['empty_polls'] for x in rr]))} | "
          + "; ".join(f"{x.get('duplicates', 0)} / {x.get('missing', 0)}" for x in rr) + " |")
    w("")
    four = [e for e in cp["runs"] if e["consumers"] == 4]
    if four:
        w(f"Scaling, 4 consumers vs 1: **{fx(_eps(four[0]['runs']) / one)}** on {cp['nproc']} CPUs "
          "(empty polls: a consumer found every remaining chunk claimed by another and retried after 0.5 ms).")
        w("")
    wk = con["wake"]
    a = wk["from_commit_returned_ms"]
    w(f"**Long-poll wake-up.** One consumer process loops `BEGIN; SELECT * FROM streams.poll(s, {batch}, "
      "wait => '10s'); ack; COMMIT;` on an ordered subscription while "
      f"{cfg['wake_publishers']} publisher processes commit one `streams.publish` per transaction on a fixed "
      f"schedule ({cfg['wake_rate']:,} events/s in total) for {cfg['wake_secs']} s, the first "
      f"{cfg['wake_warmup']} s discarded: the method of section 2, with the poll's return in place of the "
      "notification's arrival (CLOCK_MONOTONIC in both processes). An event that commits while the consumer "
      "is busy with the previous batch waits for its next poll.")
    w("")
    w(f"Events measured: {wk['events']:,} at {wk['achieved_rate']:,.0f} events/s achieved; returned: all but "
      f"{wk['missing']}; duplicates: {wk['duplicates']}; {wk['polls']:,} polls returned events, "
      f"{med(wk['events_per_poll']):.0f} per poll (median), {wk['empty_polls']} returned none. Publishers "
      f"were behind their schedule by p99 {fms(pct(wk['publisher_behind_schedule_ms'], 99))}.")
    w("")
    w("| poll returned the event, measured from | p50 | p90 | p99 | max |")
    w("| --- | --- | --- | --- | --- |")
    rows = [("from_commit_returned_ms", "COMMIT returned (all events)"), ("from_before_commit_ms", "before COMMIT"),
            ("while_waiting_ms", "COMMIT returned, events committed while the poll waited"),
            ("while_busy_ms", "COMMIT returned, events committed while the consumer was busy")]
    for key, label in rows:
        v = wk.get(key)
        if v is None:
            continue
        if key.startswith("while"):
            label += f" ({len(v):,})"
        w(f"| {label} | {fms(pct(v, 50))} | {fms(pct(v, 90))} | {fms(pct(v, 99))} | "
          f"{fms(max(v, default=float('nan')))} |")
    lat = res.get("latency")
    if lat and lat.get("from_commit_returned_ms"):
        la = lat["from_commit_returned_ms"]
        w(f"| *for comparison, section 2's LISTEN client (from COMMIT returned)* | {fms(pct(la, 50))} | "
          f"{fms(pct(la, 90))} | {fms(pct(la, 99))} | {fms(max(la))} |")
    w("")
    if wk.get("ack_commit_ms"):
        ac, cy = wk["ack_commit_ms"], wk["poll_cycle_ms"]
        w(f"\"While the poll waited\": the event's publisher saw its COMMIT return after the consumer sent the poll "
          "that returned it, so this is the wake-up itself (the worker moves the horizon, wakes the poll, which "
          "reads the events); \"while busy\": it committed while the consumer was still acking and committing "
          f"the previous batch (ack + COMMIT took p50 {fms(pct(ac, 50))}, p99 {fms(pct(ac, 99))}; one poll "
          f"cycle p50 {fms(pct(cy, 50))}) and waited for the next poll.")
        w("")
