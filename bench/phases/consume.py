"""6. Subscriptions (streams.poll / streams.ack); --only consume runs just this.

run(b) measures with bench/common.py's helpers (connect, dsn, say, CpuMeter,
publisher_main, ...); the report side (values, notes, section) reads only
results.json's "consume" entry.

  6a. consume throughput over the same preloaded events, one consumer, 1,000
      events per transaction, methods interleaved: an ordered subscription
      (BEGIN; poll; ack; COMMIT), streams.replay() pages with the cursor in a
      table of the consumer's own (updated in the same transaction), and PgQ 3
      (next_batch / get_batch_events / finish_batch); beside them the same
      subscription consumed under leases (autocommit poll(lease => ...), then
      ack(s, <last>, <lease id>)). Each is timed as a Python client (one
      statement per round trip, rows decoded, every payload into a dict) and
      as the same loop in a PL/pgSQL procedure (CALLed once: no client, the
      server's cost alone).
  6b. competing consumers: an unordered subscription drained by 1, 2 and 4
      consumer processes, 100 events per transaction; every event must be
      consumed exactly once.
  6c. long-poll wake-up latency: a consumer long-polling an ordered
      subscription (wait => '10s') while publishers commit 1,000 events/s, one
      per transaction; time from the publisher's COMMIT returning to the poll
      returning the event (CLOCK_MONOTONIC in both processes, as section 2).
  6d. order per key: a subscription with key => 'order_id' over events of 50
      order ids interleaved, drained by 1, 2 and 4 consumer processes as in
      6b; every event exactly once, each key's events committed in position
      order.
  6e. the cost of attempt tracking: in 6a's subscription runs, the time the
      consumer's polls waited for their deliveries to be written down
      (streams._delivery_waits() of its backend, before and after).
  6f. what the client gap to PgQ is made of: beside 6e's wait, the cost of
      sending `data` as jsonb rather than text (PgQ's ev_data), the same
      1,000 events selected from two plain tables that differ only in that
      column's type, fetched by the same client, interleaved.
"""

import json
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
KEYED_STREAM = "bench.keyed"      # 6d
KEY = "order_id"                  # 6d: the subscription's key, a path into data
QUEUE = "bench_consume"          # PgQ's copy of 6a's events
PGQ_PACKAGE = "postgresql-{major}-pgq3"

FULL = dict(consume_events=200_000, consume_batch=1000, consume_reps=3, consume_warmup=20_000,
            compete_events=50_000, compete_batch=100, compete_consumers=[1, 2, 4], compete_reps=3,
            wake_secs=20, wake_warmup=1.0, wake_publishers=8, wake_rate=1000,
            keyed_events=50_000, keyed_keys=50, lease="1 minute")
QUICK = dict(consume_events=5_000, consume_batch=1000, consume_reps=1, consume_warmup=2_000,
             compete_events=3_000, compete_batch=100, compete_consumers=[1, 2, 4], compete_reps=1,
             wake_secs=1.5, wake_warmup=0.5, wake_publishers=4, wake_rate=1000,
             keyed_events=3_000, keyed_keys=50, lease="1 minute")

METHODS = [
    ("subscription", "ordered subscription: poll + ack"),
    ("replay", "replay() pages + own cursor table"),
    ("pgq", "PgQ 3: next_batch / get_batch_events / finish_batch"),
    ("lease", "leased subscription: poll(lease) + ack(lease)"),
]
LABELS = dict(METHODS)
SHORT = dict(subscription="the ordered subscription", replay="replay() pages", pgq="PgQ",
             lease="the leased subscription")  # in the report's notes
LEASE_ID = 9  # poll's 10th column
DATA = 4  # data: the 5th column of poll and replay
# The methods whose polls write their deliveries down (6e).
TRACKED = ("subscription", "lease")

# The data of event i (the same for the stream and the PgQ queue); 6d's
# stream has {keys} order ids, interleaved.
DATA_SQL = "jsonb_build_object('order_id', 'ord_' || i, 'amount', (i % 10000) / 100.0)"
KEYED_DATA_SQL = "jsonb_build_object('order_id', 'ord_' || (i % {keys}), 'amount', (i % 10000) / 100.0)"

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

CREATE PROCEDURE bench_consume_lease(sub text, batch int, lease_for interval, INOUT n bigint DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    k int;
    last bigint;
    lid bigint;
BEGIN
    LOOP
        k := 0;
        FOR r IN SELECT * FROM streams.poll(sub, batch, lease => lease_for) LOOP
            last := r.position;
            lid := r.lease_id;
            k := k + 1;
        END LOOP;
        EXIT WHEN k = 0;
        COMMIT;
        PERFORM streams.ack(sub, last, lid);
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
    """Poll + ack the subscription `sub` (unordered, or ordered per key)
    until the consumers together consumed `target` events and a poll returns
    nothing (so events delivered twice do not end the run early); send, for
    each transaction that consumed events, (the time its poll returned, the
    time its COMMIT was sent, the positions). Gives up after deadline_s (the
    parent reports what is missing)."""
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
        batches, polls, empty, gave_up = [], 0, 0, False
        while True:
            cur.execute("BEGIN")
            cur.execute(poll, (sub, batch), prepare=True)
            rows = cur.fetchall()
            t_polled = mono()
            if rows:
                cur.execute(ack, (sub, rows[-1][0]), prepare=True)
            t_commit = mono()
            cur.execute("COMMIT")
            polls += 1
            if rows:
                t_end = mono()
                batches.append((t_polled, t_commit, [r[0] for r in rows]))
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
        out.send(("ok", batches, polls, empty, t_end, cpu, gave_up))
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
          "per transaction by an ordered subscription (also under leases), replay() pages and PgQ; "
          "competing consumers; long-poll wake-up; order per key; fresh database")
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
    res["output"] = _output_cost(cfg)
    res["compete"] = _compete(b, cfg)
    res["wake"] = _wake(b, cfg)
    res["keyed"] = _keyed(b, cfg)
    b.res["consume"] = res


def _span(c, stream):
    """(the position before the stream's first event, its last position)."""
    return c.execute("SELECT min(position) - 1, max(position) FROM streams.event_log WHERE stream = %s",
                     (stream,)).fetchone()


def _preload(b, c, cfg, with_pgq):
    N = cfg["consume_events"]
    # (stream, events, the data of event i, the prefix of its first/last in out)
    streams = [(STREAM, N, DATA_SQL, ""), (COMPETE_STREAM, cfg["compete_events"], DATA_SQL, "compete_"),
               (KEYED_STREAM, cfg["keyed_events"], KEYED_DATA_SQL.format(keys=cfg["keyed_keys"]), "keyed_")]
    out = {}
    t = time.monotonic()
    # Not measured: asynchronous commit makes the one-event transactions cheap.
    c.execute("SET synchronous_commit = off")
    for stream, n, data, _ in streams:
        c.execute(f"""
DO $$
BEGIN
    FOR i IN 1..{n} LOOP
        PERFORM streams.publish('{stream}', {data});
        COMMIT;
    END LOOP;
END $$""")
    out["stream_s"] = time.monotonic() - t
    out["deliver_s"] = b.wait_delivered(c, timeout=600)
    for stream, n, _, tag in streams:
        out[f"{tag}first"], out[f"{tag}last"] = _span(c, stream)
        if out[f"{tag}last"] - out[f"{tag}first"] != n:
            raise H.BenchError(f"preload: unexpected positions {out}")
    H.info(f"published {sum(s[1] for s in streams):,} events in {out['stream_s']:.1f} s, "
           f"delivered {out['deliver_s']:.1f} s later")
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
    trip, every event's payload decoded) and server side (its procedure).
    Each round starts from the first preloaded event with a state of its
    own: a new subscription, cursor row or PgQ consumer."""

    def __init__(self, key, c, cfg, first, waits):
        if key != "pgq":
            # Every method decodes its payloads with the same json.loads from
            # str: psycopg's own jsonb loader (a Python function over bytes)
            # costs about 2.5 us more per event than json.loads of PgQ's text,
            # and would time psycopg, not the database.
            from psycopg.types.string import TextLoader
            c.adapters.register_loader("jsonb", TextLoader)
        self.key, self.c, self.cur = key, c, c.cursor()
        self.batch, self.first, self.rounds, self.lease = cfg["consume_batch"], first, 0, cfg["lease"]
        self.tracked = waits and key in TRACKED  # 6e: read streams._delivery_waits()

    def new_round(self):
        self.rounds += 1
        name = f"r{self.rounds}"
        if self.key in TRACKED:
            self.name = f"bench.{self.key}.{name}"
            self.c.execute("SELECT streams.create_subscription(%s, %s, after => %s)",
                           (self.name, STREAM, self.first))
        elif self.key == "replay":
            self.name = name
            self.c.execute("INSERT INTO bench_cursor VALUES (%s, %s)", (name, self.first))
        else:
            self.name = f"c{self.rounds - 1}"

    def waits(self):
        """6e: (deliveries, µs waited for them to be written) of this
        connection's backend so far; None for a method that writes none."""
        if not self.tracked:
            return None
        return self.c.execute("SELECT deliveries, waited_us FROM streams._delivery_waits()").fetchone()

    def client(self, limit):
        """Consume up to `limit` events; the count and the last position
        (of the stream; PgQ's: the first, unchanged)."""
        step, n, self.last = getattr(self, f"_step_{self.key}"), 0, self.first
        while n < limit:
            rows = step()
            if rows is None:  # nothing left
                break
            n += len(rows)
        return n, self.last

    def _taken(self, rows):
        """A stream method's batch, its payloads decoded: rows, or None when
        it was empty."""
        if not rows:
            return None
        for r in rows:
            json.loads(r[DATA])
        self.last = rows[-1][0]
        return rows

    def _step_subscription(self):
        cur = self.cur
        cur.execute("BEGIN")
        cur.execute("SELECT * FROM streams.poll(%s, %s)", (self.name, self.batch), prepare=True)
        rows = self._taken(cur.fetchall())
        if rows:
            cur.execute("SELECT streams.ack(%s, %s)", (self.name, rows[-1][0]), prepare=True)
        cur.execute("COMMIT")
        return rows

    def _step_lease(self):
        """Autocommit: the poll lets go of the subscription once the lease is
        written; the 3-argument ack settles the lease's events."""
        cur = self.cur
        cur.execute("SELECT * FROM streams.poll(%s, %s, lease => %s::interval)",
                    (self.name, self.batch, self.lease), prepare=True)
        rows = self._taken(cur.fetchall())
        if rows:
            cur.execute("SELECT streams.ack(%s, %s, %s)", (self.name, rows[-1][0], rows[-1][LEASE_ID]),
                        prepare=True)
        return rows

    def _step_replay(self):
        cur = self.cur
        cur.execute("BEGIN")
        cur.execute("SELECT * FROM streams.replay(%s, after => %s, max_events => %s)",
                    (STREAM, self.last, self.batch), prepare=True)
        rows = self._taken(cur.fetchall())
        if rows:
            cur.execute("UPDATE bench_cursor SET position = %s WHERE name = %s", (rows[-1][0], self.name),
                        prepare=True)
        cur.execute("COMMIT")
        return rows

    def _step_pgq(self):
        """A batch (maybe empty), None when next_batch has none. ev_data is
        text: decoded here, in the batch's transaction, as the streams'
        methods decode their jsonb (fetched as text)."""
        cur = self.cur
        cur.execute("BEGIN")
        cur.execute("SELECT pgq.next_batch(%s, %s)", (QUEUE, self.name), prepare=True)
        batch_id = cur.fetchone()[0]
        rows = []
        if batch_id is not None:
            cur.execute("SELECT * FROM pgq.get_batch_events(%s)", (batch_id,), prepare=True)
            rows = cur.fetchall()
            data = [d.name for d in cur.description].index("ev_data")
            for r in rows:
                json.loads(r[data])
            cur.execute("SELECT pgq.finish_batch(%s)", (batch_id,), prepare=True)
        cur.execute("COMMIT")
        return None if batch_id is None else rows

    def server(self, total):
        if self.key == "subscription":
            q, args = "CALL bench_consume_subscription(%s, %s)", (self.name, self.batch)
        elif self.key == "lease":
            q, args = "CALL bench_consume_lease(%s, %s, %s)", (self.name, self.batch, self.lease)
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
        first = _span(c, STREAM)[0]
        worker = b.status(c)["worker_pid"]
        waits = c.execute("SELECT to_regprocedure('streams._delivery_waits()') IS NOT NULL").fetchone()[0]
        if not waits:
            H.info("streams._delivery_waits() is missing (an older build): 6e not measured")
        consumers = {m[0]: _Consumer(m[0], H.connect(H.DB), cfg, first, waits) for m in methods}
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
                        w0 = con.waits()
                        meter = H.CpuMeter(b.postmaster).start({"worker": worker})
                        cpu0, t0 = _cpu_self(), time.monotonic()
                        n, last = con.client(N) if form == "client" else con.server(N)
                        secs = time.monotonic() - t0
                        client_cpu = _cpu_self() - cpu0
                        cpu = meter.stop()
                        w1 = con.waits()
                        if n != N or (last is not None and key != "pgq" and last != first + N):
                            raise H.BenchError(f"{label} ({form}): consumed {n} events up to {last}, "
                                               f"expected {N} up to {first + N}")
                        r = dict(events=n, seconds=secs, events_per_s=n / secs, cpu=cpu,
                                 client_cpu_us=client_cpu * 1e6 / n if form == "client" else None,
                                 server_cpu_us=cpu["server_s"] * 1e6 / n if "server_s" in cpu else None)
                        if w0 is not None:
                            r.update(deliveries=w1[0] - w0[0], waited_us=w1[1] - w0[1])
                        out[form][key].append(r)
                        H.info(f"{form:<6} {label:<52} {r['events_per_s']:>10,.0f} events/s"
                               + (f", waited {r['waited_us'] / n:.2f} µs per event for {r['deliveries']:,} "
                                  "deliveries to be written" if w0 is not None else ""))
        finally:
            for con in consumers.values():
                con.c.close()
    return out


def _output_cost(cfg):
    """6f: µs per event to select 1,000 of 6a's events with data as jsonb, and
    the same rows with data as text (medians of interleaved rounds)."""
    batch, rounds = cfg["consume_batch"], 2 * cfg["consume_reps"] + 1
    H.say(f"6f. the same {batch:,} events fetched from two tables, data jsonb vs text; {rounds} rounds of 100")
    with H.connect(H.DB) as c:
        from psycopg.types.string import TextLoader
        c.adapters.register_loader("jsonb", TextLoader)  # as _Consumer does
        first = _span(c, STREAM)[0]
        c.execute("DROP TABLE IF EXISTS bench_out_jsonb, bench_out_text")
        c.execute("CREATE TABLE bench_out_jsonb AS SELECT * FROM streams.replay(%s, after => %s, max_events => %s)",
                  (STREAM, first, batch))
        c.execute("CREATE TABLE bench_out_text AS SELECT position, stream, time, tx, data::text AS data, type, key, "
                  "headers FROM bench_out_jsonb")
        c.execute("VACUUM (ANALYZE) bench_out_jsonb, bench_out_text")
        cur, out = c.cursor(), {"jsonb": [], "text": []}
        for _ in range(rounds):
            for kind in ("jsonb", "text"):
                t = time.perf_counter()
                for _ in range(100):
                    cur.execute(f"SELECT * FROM bench_out_{kind}", prepare=True)
                    cur.fetchall()
                out[kind].append((time.perf_counter() - t) * 1e6 / (100 * batch))
        c.execute("DROP TABLE bench_out_jsonb, bench_out_text")
    res = {k: H.med(v) for k, v in out.items()}
    H.info(f"data as jsonb {res['jsonb']:.3f} µs per event, as text {res['text']:.3f}")
    return res


def _compete(b, cfg):
    M = cfg["compete_events"]
    H.say(f"6b. competing consumers: an unordered subscription, {M:,} events, {cfg['compete_batch']} per "
          f"transaction, {', '.join(map(str, cfg['compete_consumers']))} consumer processes, "
          f"{cfg['compete_reps']} round(s), interleaved")
    return _competing(b, cfg, COMPETE_STREAM, M, dict(ordered=False))


def _keyed(b, cfg):
    M = cfg["keyed_events"]
    H.say(f"6d. order per key: a subscription with key => '{KEY}', {M:,} events of {cfg['keyed_keys']} order "
          f"ids interleaved, {cfg['compete_batch']} per poll, {', '.join(map(str, cfg['compete_consumers']))} "
          f"consumer processes, {cfg['compete_reps']} round(s), interleaved")
    with H.connect(H.DB) as c:
        keys = dict(c.execute("SELECT position, data->>%s FROM streams.event_log WHERE stream = %s",
                              (KEY, KEYED_STREAM)).fetchall())
    return dict(_competing(b, cfg, KEYED_STREAM, M, dict(key=KEY), keys), keys=cfg["keyed_keys"], key=KEY)


def _competing(b, cfg, stream, M, options, keys=None):
    """A subscription over the M events of `stream`, made with `options`
    (create_subscription's named arguments), drained by each number of
    consumer processes of compete_consumers, rounds interleaved; keys
    ({position: key}): each key's order is checked too."""
    batch, ns = cfg["compete_batch"], cfg["compete_consumers"]
    named = "".join(f", {k} => %s" for k in options)
    runs = {n: [] for n in ns}
    with H.connect(H.DB) as c:
        first = _span(c, stream)[0]
        expected = set(range(first + 1, first + M + 1))
        for rnd, order in enumerate(H.rotations(ns, cfg["compete_reps"])):
            for n in order:
                sub = f"{stream}.r{rnd}.c{n}"
                c.execute(f"SELECT streams.create_subscription(%s, %s, after => %s{named})",
                          (sub, stream, first, *options.values()))
                results, t0, cpu = _drain(b, c, sub, n, batch, M)
                r = _drained(results, t0, cpu, expected, n)
                if keys is not None:
                    r.update(_key_order(results, keys))
                runs[n].append(r)
                _say_run(n, r)
    return dict(events=M, batch=batch, nproc=len(os.sched_getaffinity(0)),
                runs=[dict(consumers=n, runs=runs[n]) for n in ns])


def _drain(b, c, sub, n, batch, target):
    """n competing_main processes drain `sub` (target events in all) from
    one start signal: their results, the start (monotonic ns), the CPU."""
    total = b.ctx.Value("q", 0)
    start = b.ctx.Event()
    procs = []
    try:
        for _ in range(n):
            ready = b.ctx.Event()
            rx, tx = b.ctx.Pipe(duplex=False)
            p = b.ctx.Process(target=competing_main, daemon=True,
                              args=(H.dsn(H.DB), sub, batch, target, total, ready, start, 60, tx))
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
    return results, t0, cpu


def _drained(results, t0, cpu, expected, n):
    """One run's figures from its consumers' results: events/s (distinct
    events, from the start signal to the last commit), consumed twice or
    never, polls, CPU per event."""
    got = [pos for x in results for bt in x[0] for pos in bt[2]]
    distinct = set(got)
    if distinct - expected:
        raise H.BenchError(f"{n} consumer(s): {len(distinct - expected)} event(s) of another stream")
    polls, empty = sum(x[1] for x in results), sum(x[2] for x in results)
    secs = (max(x[3] for x in results) - t0) / 1e9
    return dict(events=len(distinct), seconds=secs, events_per_s=len(distinct) / secs,
                duplicates=len(got) - len(distinct), missing=len(expected - distinct),
                gave_up=sum(1 for x in results if x[5]),
                per_consumer=[sum(len(bt[2]) for bt in x[0]) for x in results], polls=polls,
                empty_polls=empty, events_per_poll=len(got) / max(1, polls - empty),
                client_cpu_us=sum(x[4] for x in results) * 1e6 / len(got), cpu=cpu,
                server_cpu_us=cpu["server_s"] * 1e6 / len(got) if "server_s" in cpu else None)


def _key_order(results, keys):
    """Each key's events in the order their transactions sent COMMIT (the
    transactions of one key run one after another, so this is their commit
    order), within a transaction as its poll returned them: out_of_order
    counts an event committed after a later one of its key; overlapping, a
    poll that returned a key's event before the transaction that had the
    key's previous one sent its COMMIT (the key handed out while held)."""
    by_key = {}
    for i, x in enumerate(results):
        for j, (t_polled, t_commit, positions) in enumerate(x[0]):
            for pos in positions:
                by_key.setdefault(keys[pos], []).append((t_commit, t_polled, pos, (i, j)))
    out_of_order = overlapping = 0
    for recs in by_key.values():
        recs.sort(key=lambda rec: rec[0])  # stable: a transaction's events stay in poll order
        for (c0, _, p0, tx0), (_, t1, p1, tx1) in zip(recs, recs[1:]):
            out_of_order += p1 <= p0
            overlapping += tx1 != tx0 and t1 <= c0
    return dict(out_of_order=out_of_order, overlapping=overlapping)


def _say_run(n, r):
    H.info(f"{n} consumer(s): {r['events_per_s']:>10,.0f} events/s "
           f"(per consumer {', '.join(f'{x:,}' for x in r['per_consumer'])}; {r['events_per_poll']:.1f} events "
           f"per poll; {r['empty_polls']:,} empty polls)")
    if r["duplicates"] or r["missing"]:
        H.info(f"WARNING: {r['duplicates']:,} event(s) consumed twice, {r['missing']:,} never "
               f"consumed{' (gave up after 60 s)' if r['gave_up'] else ''}")
    if r.get("out_of_order") or r.get("overlapping"):
        H.info(f"WARNING: {r['out_of_order']:,} event(s) committed after a later one of their key, "
               f"{r['overlapping']:,} poll(s) returned a key another transaction still held")


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


def _stat(runs, k, fmt):
    """The median of a figure over runs, formatted; n/a when no run has it."""
    v = [x[k] for x in runs if x.get(k) is not None]
    return fmt.format(H.med(v)) if v else "n/a"


def _cell(runs):
    v = [x["events_per_s"] for x in runs]
    return H.f0(H.med(v)) + (f" ({H.reps_str(v)})" if len(v) > 1 else "")


def _runs(cp):
    """Every run of a _competing result (6b, 6d)."""
    return [x for e in cp["runs"] for x in e["runs"]]


def _exactness(cp):
    """(events consumed twice, never) over every run."""
    runs = _runs(cp)
    return sum(x.get("duplicates", 0) for x in runs), sum(x.get("missing", 0) for x in runs)


def _key_faults(kd):
    """6d: (events committed out of their key's order, polls of a held key) over every run."""
    runs = _runs(kd)
    return sum(x["out_of_order"] for x in runs), sum(x["overlapping"] for x in runs)


def _vs_one(cp, n):
    """n consumers' events/s vs one's; None when either was not measured."""
    by = {e["consumers"]: e["runs"] for e in cp["runs"]}
    return _eps(by[n]) / _eps(by[1]) if by.get(n) and by.get(1) else None


def _waits(runs):
    """6e over one method's runs (medians): µs its polls waited per event for
    the deliveries to be written, µs per event in all, the waited share (%)
    and the deliveries; None when not measured."""
    runs = [x for x in runs or [] if x.get("waited_us") is not None]
    if not runs:
        return None
    med = H.med
    return dict(waited_us=med([x["waited_us"] / x["events"] for x in runs]),
                total_us=med([x["seconds"] * 1e6 / x["events"] for x in runs]),
                share=med([100 * x["waited_us"] / (x["seconds"] * 1e6) for x in runs]),
                deliveries=med([x["deliveries"] for x in runs]))


def values(res):
    con = res.get("consume")
    if not con:
        return {}
    tp = con["throughput"]["client"]
    s, batch = _eps(tp["subscription"]), f"{con['batch']:,}"
    w = con["wake"]
    ok_wake = w["missing"] == 0 and w["duplicates"] == 0
    c_dup, c_miss = _exactness(con["compete"])
    kd = con.get("keyed")
    k2 = _vs_one(kd, 2) if kd else None
    at = _waits(tp["subscription"])
    out = {
        "consume_vs_pgq": dict(value=s / _eps(tp["pgq"]), batch=batch) if tp.get("pgq") else None,
        "consume_vs_replay": dict(value=s / _eps(tp["replay"]), batch=batch),
        "compete_exactly_once": dict(value=not (c_dup or c_miss),
                                     shown=f"no: {c_dup:,} consumed twice, {c_miss:,} never"),
        "wake_exactly_once": dict(value=ok_wake,
                                  shown=f"no: {w['missing']:,} missing, {w['duplicates']:,} duplicated"),
        "keyed_scaling_2": dict(value=k2, keys=kd["keys"], batch=kd["batch"]) if k2 is not None else None,
        "keyed_exactly_once": None,
        "attempt_share": dict(value=at["share"], waited=f"{at['waited_us']:.2f} µs", total=f"{at['total_us']:.2f} µs",
                              batch=batch) if at else None,
    }
    if kd:
        (k_dup, k_miss), (k_order, k_held) = _exactness(kd), _key_faults(kd)
        out["keyed_exactly_once"] = dict(
            value=not (k_dup or k_miss or k_order or k_held),
            shown=f"no: {k_dup:,} consumed twice, {k_miss:,} never, {k_order:,} out of key order, "
                  f"{k_held:,} polls of a held key")
    return out


def notes(res, short):
    """Shortfall notes for the report's summary."""
    con = res.get("consume")
    out = []
    if not con:
        return out
    tc, ts = con["throughput"]["client"], con["throughput"]["server"]

    def cpu(runs):
        return _stat(runs, "server_cpu_us", "{:.1f} µs")

    behind = [k for k in ("pgq", "replay") if f"consume_vs_{k}" in short]
    if behind:
        out.append(
            f"**consume:** the subscription consumer reached {_eps(tc['subscription']):,.0f} events/s against "
            + " and ".join(f"{_eps(tc[k]):,.0f} for {SHORT[k]}" for k in behind)
            + f"; the server spent {cpu(tc['subscription'])} of CPU per event against "
            + " and ".join(cpu(tc[k]) for k in behind) + ". Without a client (the loops as procedures) the "
            "ratio is " + " and ".join(f"{_eps(ts['subscription']) / _eps(ts[k]):.2f}x" for k in behind) + ".")
        g = _gap(con)
        if g is not None and "consume_vs_pgq" in short:
            out.append(
                f"**consume vs PgQ:** of the client gap of {g['gap']:.2f} µs per event, the poll's wait for the "
                f"flushed delivery (attempts that survive a crash) is {g['wait']:.2f} µs and sending data as jsonb "
                f"rather than text {g['jsonb']:.2f} µs; the rest is {g['rest']:+.2f} µs. See section 6.")
    if "compete_exactly_once" in short:
        out.append(_faults_note("competing consumers", "an unordered subscription", con["compete"]))
    kd = con.get("keyed")
    if "keyed_scaling_2" in short:
        by = {e["consumers"]: e["runs"] for e in kd["runs"]}
        out.append(
            f"**per-key consumers:** 2 consumers reached {_eps(by[2]):,.0f} events/s against {_eps(by[1]):,.0f} "
            f"for one, with {_stat(by[2], 'events_per_poll', '{:.1f}')} events per poll against "
            f"{_stat(by[1], 'events_per_poll', '{:.1f}')} ({_stat(by[2], 'empty_polls', '{:,.0f}')} empty polls) "
            f"and {_stat(by[2], 'server_cpu_us', '{:.1f} µs')} of server CPU per event against "
            f"{_stat(by[1], 'server_cpu_us', '{:.1f} µs')}. See section 6.")
    if "keyed_exactly_once" in short:
        out.append(_faults_note("per-key consumers", "a subscription ordered per key", kd))
    if "attempt_share" in short:
        at = _waits(tc["subscription"])
        out.append(
            f"**attempt tracking:** the ordered subscription's client polls waited {at['waited_us']:.2f} µs per "
            f"event ({at['deliveries']:,.0f} deliveries written per {con['events']:,} events) of "
            f"{at['total_us']:.2f} µs per event in all. See section 6.")
    return out


def _faults_note(who, what, cp):
    """A shortfall note on the runs of cp (6b, 6d) that lost, repeated or reordered events."""
    bad = [(e["consumers"], x) for e in cp["runs"] for x in e["runs"]
           if x.get("duplicates") or x.get("missing") or x.get("out_of_order") or x.get("overlapping")]
    return (f"**{who}:** events of {what} were delivered again after a committed ack, never, or out of their "
            "key's order, in " + ", ".join(
                f"a run with {n} consumers ({x['duplicates']} twice, {x['missing']} never"
                + (f", {x['out_of_order']} out of key order, {x['overlapping']} polls of a held key"
                   if "out_of_order" in x else "") + ")" for n, x in bad)
            + ". See section 6.")



def section(res, w):
    con = res.get("consume")
    if not con:
        return
    w("## 6. Subscriptions")
    w("")
    _section_throughput(con, w)
    _section_compete(con, w)
    _section_wake(res, con, w)
    _section_keyed(con, w)
    _section_attempts(con, w)
    _section_gap(con, w)


def _section_throughput(con, w):
    fx = H.fx
    cfg = con["config"]
    N, batch = con["events"], con["batch"]
    pre = con["preload"]
    tp = con["throughput"]
    methods = [m for m in METHODS if m[0] in tp["client"]]
    keyed = (f", and {cfg['keyed_events']:,} to a third (`{KEYED_STREAM}`) whose order ids cycle through "
             f"{cfg['keyed_keys']} values" if "keyed" in con else "")
    w(f"Measured {con['measured_at']}, in a fresh database: {N:,} events published to one stream "
      f"(`{STREAM}`), one per transaction, {cfg['compete_events']:,} to another (`{COMPETE_STREAM}`){keyed}, "
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
    if "lease" in tp["client"]:
        w(f"- **leased subscription**: in autocommit, "
          f"`SELECT * FROM streams.poll('s', {batch}, lease => '{cfg['lease']}');` then "
          "`SELECT streams.ack('s', <last position>, <lease_id>);`: two transactions per batch, the poll's "
          "(which lets go of the subscription once the lease is written) and the ack's (a new subscription "
          "per round).")
    w("")
    w("Each is timed two ways: **client**, a Python (psycopg 3) consumer in one process, one statement per "
      "round trip with prepared statements, rows decoded: `timestamptz` into datetimes and every event's "
      "payload into a dict by the same `json.loads` of a str, row by row in the batch's transaction (the "
      "streams' `jsonb` is fetched as text: psycopg's own jsonb loader, a Python function over bytes, costs "
      "more per event than `json.loads` of PgQ's text `ev_data`, and would time psycopg), as a consumer of "
      "the payload must), wall time; and **server**, the same loop as a PL/pgSQL procedure "
      "(`bench_consume_*` in bench/phases/consume.py) CALLed once, every row fetched into a record and "
      "nothing decoded, COMMIT per batch (the leased one: after the poll and after the ack): the database's "
      "cost with no client. *Server CPU*: every process of the cluster, per event.")
    w("")
    w("| method | client: events/s | vs replay pages | vs PgQ | server CPU / event | client CPU / event "
      "| server: events/s | vs replay pages | vs PgQ |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def vs(runs, form, base):
        return fx(_eps(runs) / _eps(tp[form][base])) if tp[form].get(base) else "n/a"

    for key, label in methods:
        c_, s_ = tp["client"][key], tp["server"][key]
        w(f"| {label} | {_cell(c_)} | {vs(c_, 'client', 'replay')} | {vs(c_, 'client', 'pgq')} | "
          f"{_stat(c_, 'server_cpu_us', '{:.1f} µs')} | {_stat(c_, 'client_cpu_us', '{:.1f} µs')} | "
          f"{_cell(s_)} | {vs(s_, 'server', 'replay')} | {vs(s_, 'server', 'pgq')} |")
    w("")
    w("The targets (the ordered subscription vs replay pages and vs PgQ) are on the client figures, as a "
      "consumer sees them; the server figures show the database's share without the client, whose decoding "
      "costs the same for every method (each decodes every payload once).")
    w("")


def _consumers_table(w, cp, keyed=False):
    """6b and 6d: one row per number of consumers."""
    cols = ["consumers", "events/s", "vs 1 consumer", "server CPU / event", "consumer CPU / event",
            "events per poll", "empty polls", "consumed twice / never"]
    if keyed:
        cols.append("out of key order / polls of a held key")
    w("| " + " | ".join(cols) + " |")
    w("|" + " --- |" * len(cols))
    one = _eps(cp["runs"][0]["runs"])
    for entry in cp["runs"]:
        rr = entry["runs"]
        cells = [str(entry["consumers"]), _cell(rr), H.fx(_eps(rr) / one), _stat(rr, "server_cpu_us", "{:.1f} µs"),
                 _stat(rr, "client_cpu_us", "{:.1f} µs"), _stat(rr, "events_per_poll", "{:.1f}"),
                 _stat(rr, "empty_polls", "{:,.0f}"),
                 "; ".join(f"{x.get('duplicates', 0)} / {x.get('missing', 0)}" for x in rr)]
        if keyed:
            cells.append("; ".join(f"{x['out_of_order']} / {x['overlapping']}" for x in rr))
        w("| " + " | ".join(cells) + " |")
    w("")


def _exact_text(cp):
    """Whether every event was consumed exactly once (a clause, no full stop)."""
    c_dup, c_miss = _exactness(cp)
    return ("every event was consumed exactly once in every run" if not (c_dup or c_miss) else
            f"**{c_dup:,} event(s) were consumed twice (committed by two transactions) and {c_miss:,} never, "
            f"over {len(_runs(cp))} runs** (per run in the table)")


def _section_compete(con, w):
    cp = con["compete"]
    w(f"**Competing consumers.** An unordered subscription (`ordered => false`) over the "
      f"{cp['events']:,} events of `{COMPETE_STREAM}`, drained by 1, 2 and 4 consumer processes "
      f"(Python, one connection each), each `BEGIN; poll(s, {cp['batch']}); ack(s, <last>); COMMIT;` "
      "until they consumed every event together (and a poll returned none); events/s: distinct events "
      "from the start signal to the last commit. The positions each consumer committed are compared "
      f"with the stream's: {_exact_text(cp)}. The machine has {cp['nproc']} CPUs, "
      "shared by the server, the consumers and the rest of the machine, so more consumers than CPUs "
      "cannot scale linearly.")
    w("")
    _consumers_table(w, cp)
    four = _vs_one(cp, 4)
    if four is not None:
        w(f"Scaling, 4 consumers vs 1: **{H.fx(four)}** on {cp['nproc']} CPUs "
          "(empty polls: a consumer found every remaining chunk claimed by another and retried after 0.5 ms).")
        w("")


def _section_wake(res, con, w):
    fms, pct, med = H.fms, H.pct, H.med
    cfg, batch = con["config"], con["batch"]
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


def _section_keyed(con, w):
    kd = con.get("keyed")
    if not kd:
        return
    k_order, k_held = _key_faults(kd)
    order = ("and each key's events were committed in position order, none polled while "
             "another transaction held its key." if not (k_order or k_held) else
             f"and **{k_order:,} event(s) were committed after a later one of their key, {k_held:,} poll(s) "
             "returned a key another transaction still held** (per run in the table).")
    w(f"**Order per key.** A subscription with `key => '{kd['key']}'` over the {kd['events']:,} events of "
      f"`{KEYED_STREAM}`, whose order ids cycle through {kd['keys']} values (`'ord_' || (i % {kd['keys']})`: "
      "consecutive events have different keys), drained like the competing consumers above by 1, 2 and 4 "
      f"processes, each `BEGIN; poll(s, {kd['batch']}); ack(s, <last>); COMMIT;` (a fresh subscription per "
      "run, `after =>` the position before the first event). A poll takes only the keys no other open "
      "transaction holds and returns at most 16 runs of consecutive positions, so with interleaved keys "
      "and more than one consumer it returns fewer events than asked. Each consumer records, per "
      "transaction, when its poll returned and when it sent COMMIT; each key's events are put in the order "
      "their transactions sent COMMIT (the transactions of one key run one after another, so that is their "
      "commit order) and must have increasing positions, and no poll may return a key's event before the "
      "transaction with the key's previous event sent its COMMIT. "
      f"Over the stream's positions, {_exact_text(kd)}, {order}")
    w("")
    _consumers_table(w, kd, keyed=True)
    ratios = [(n, _vs_one(kd, n)) for n in (2, 4)]
    ratios = [f"{n} consumers vs 1: **{H.fx(r)}**" for n, r in ratios if r is not None]
    if ratios:
        w(f"Scaling, {', '.join(ratios)} on {kd['nproc']} CPUs.")
        w("")


def _gap(con):
    """6f: the client figures per event (µs): subscription, PgQ, the gap, the
    poll's wait for the flushed delivery, jsonb output, and what is left."""
    tp, out = con["throughput"]["client"], con.get("output")
    at = _waits(tp.get("subscription"))
    if not tp.get("pgq") or not out or not at:
        return None
    sub, pgq = 1e6 / _eps(tp["subscription"]), 1e6 / _eps(tp["pgq"])
    jsonb = out["jsonb"] - out["text"]
    return dict(sub=sub, pgq=pgq, gap=sub - pgq, wait=at["waited_us"], jsonb=jsonb,
                rest=sub - pgq - at["waited_us"] - jsonb)


def _section_gap(con, w):
    g = _gap(con)
    if g is None:
        return
    out = con["output"]
    w("**What the client gap to PgQ is made of.** Two costs that PostgreSQL itself charges the ordered subscription "
      "and not PgQ's consumer: the poll's wait for the worker's flushed commit of the delivery (6e: the "
      "attempts must survive a crash, so no event is handed out before that WAL flush; PgQ counts no attempts), "
      "and sending `data` as `jsonb`, the log's type, where PgQ's `ev_data` is text (`jsonb_out` on the "
      "server: the same 1,000 events selected by the same client from two tables that differ only in that "
      f"column's type, {out['jsonb']:.3f} µs vs {out['text']:.3f} µs per event, medians of interleaved rounds). "
      "What is left is the subscription's own work against PgQ's (negative: less).")
    w("")
    w("| per event, client (medians) | µs |")
    w("| --- | --- |")
    for label, key in (("ordered subscription", "sub"), ("PgQ's batch consumer", "pgq"), ("gap", "gap"),
                       ("of it: the poll's wait for the flushed delivery", "wait"),
                       ("of it: data sent as jsonb rather than text", "jsonb"), ("the rest", "rest")):
        w(f"| {label} | {g[key]:+.2f} |" if key in ("gap", "rest") else f"| {label} | {g[key]:.2f} |")
    w("")
    w("`target/bench-venv/bin/python bench/consume-gap.py` measures the same on the dev cluster in half a minute, "
      "with each step of each method's loop.")
    w("")


def _section_attempts(con, w):
    tp = con["throughput"]
    tracked = [(k, LABELS[k]) for k in TRACKED if k in tp["client"]]
    if not any(_waits(tp[form][k]) for k, _ in tracked for form in ("client", "server")):
        w("**Attempt tracking: not measured** (`streams._delivery_waits()` is missing: a build before it).")
        w("")
        return
    w("**Attempt tracking.** Every poll that returns events counts an attempt for each: the database's worker "
      "writes the delivery down in a transaction of its own, committed and flushed, while the poll reads the "
      "events, and the poll returns none before that commit (a leased poll waits for it before it reads: its "
      "lease must be written first). The consumer's backend counts how long its polls still waited for it "
      "(`streams._delivery_waits()`: deliveries, µs waited), read on the consumer's connection before and after "
      "each of the consume throughput runs above; per event, median over the rounds. *Share*: the wait's part "
      "of the run's wall time, what attempt tracking costs a consumer over polling without it.")
    w("")
    w("| consumer | form | events/s | vs transaction-scoped | deliveries written | waited / event "
      "| total / event | share |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for form in ("client", "server"):
        base = _eps(tp[form].get("subscription"))
        for key, label in tracked:
            runs, at = tp[form][key], _waits(tp[form][key])
            figs = (f"{at['deliveries']:,.0f} | {at['waited_us']:.2f} µs | {at['total_us']:.2f} µs | "
                    f"{at['share']:.1f}%" if at else "n/a | n/a | n/a | n/a")
            w(f"| {label} | {form} | {_cell(runs)} | {H.fx(_eps(runs) / base)} | {figs} |")
    w("")
    w("The target is on the ordered subscription's client share.")
    w("")
