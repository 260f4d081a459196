#!/usr/bin/env python3
"""What the ordered subscription consumer's gap to PgQ's batch consumer is
made of, measured side by side on the dev cluster (`make start`).

    target/bench-venv/bin/python bench/consume-gap.py [--events N] [--rounds R]

Creates the database litebase_consume_gap (dropped at the end), publishes N
events (default 200,000) to one stream, one per transaction, with payloads
like make bench section 6's, and copies them into a PgQ 3 queue (one insert_event per transaction,
a tick after every 1,000, as section 6 does). Then, R rounds (default 5),
each method in turn, a Python consumer (psycopg, one statement per round
trip, every payload decoded with json.loads) takes all N events, 1,000 per
transaction:

  subscription  BEGIN; poll(s, 1000); ack(s, last); COMMIT
  pgq           BEGIN; next_batch; get_batch_events; finish_batch; COMMIT
  replay        BEGIN; replay(after => cursor, max_events => 1000);
                UPDATE the cursor row; COMMIT

Printed per method: events/s, and microseconds per event in each step
(the poll's step includes its wait for the worker's flushed commit of the
delivery, which streams._delivery_waits() reports apart).

Then two costs that PostgreSQL itself charges the subscription and not
PgQ, each measured directly:

  flush     the poll's wait for the worker's commit of the delivery, as
            flushed WAL (attempts must survive a crash: issue 24 point 1).
  jsonb     sending `data` as jsonb rather than text: the same 1,000 rows
            selected from two plain tables that differ only in that
            column's type (jsonb, as the log stores it, vs text, as PgQ's
            ev_data), fetched 100 times per round, interleaved.

and the gap to PgQ minus them: negative means the subscription does its
own work in less time than PgQ does its own.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as H  # noqa: E402

from psycopg.types.string import TextLoader  # noqa: E402

DB = "litebase_consume_gap"
STREAM = "bench.consume"
QUEUE = "gap_queue"
BATCH = 1000
DATA_SQL = "jsonb_build_object('order_id', 'ord_' || i, 'amount', (i % 10000) / 100.0)"


def connect():
    c = H.connect(DB)
    # Every method decodes its payloads with json.loads from str (as make
    # bench section 6 does): psycopg's own jsonb loader would time psycopg.
    c.adapters.register_loader("jsonb", TextLoader)
    return c


def setup(n, rounds):
    with H.connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
    with H.connect(DB) as c:
        c.execute("CREATE EXTENSION litebase_streams")
        c.execute("CREATE EXTENSION pgq")
        c.execute("SET synchronous_commit = off")
        # One event per transaction, as make bench section 6 publishes them.
        c.execute(f"""
DO $$ BEGIN
    FOR i IN 1..{n} LOOP
        PERFORM streams.publish('{STREAM}', {DATA_SQL});
        COMMIT;
    END LOOP;
END $$""")
        c.execute("SELECT pgq.create_queue(%s)", (QUEUE,))
        for k, v in (("ticker_max_count", str(BATCH)), ("ticker_max_lag", "1 day"), ("ticker_idle_period", "1 day")):
            c.execute("SELECT pgq.set_queue_config(%s, %s, %s)", (QUEUE, k, v))
        for r in range(rounds + 1):
            c.execute("SELECT pgq.register_consumer(%s, %s)", (QUEUE, f"c{r}"))
        c.execute(f"""
DO $$ BEGIN
    FOR i IN 1..{n} LOOP
        PERFORM pgq.insert_event('{QUEUE}', '{STREAM}', ({DATA_SQL})::text);
        COMMIT;
        IF i % {BATCH} = 0 THEN PERFORM pgq.ticker(); COMMIT; END IF;
    END LOOP;
END $$""")
        c.execute("SELECT streams.wait((SELECT max(position) FROM streams.event_log), '120s')")
        c.execute("CREATE TABLE gap_cursor (name text PRIMARY KEY, position bigint NOT NULL)")
        # The output-cost pair: the first 1,000 events with data as jsonb and as text.
        c.execute(f"CREATE TABLE gap_jsonb AS SELECT * FROM streams.replay('{STREAM}', after => 0, max_events => {BATCH})")
        c.execute("CREATE TABLE gap_text AS SELECT position, stream, time, tx, data::text AS data, type, key, headers "
                  "FROM gap_jsonb")
        c.execute("RESET synchronous_commit")
        c.execute("VACUUM (ANALYZE)")
        c.execute("CHECKPOINT")


class Steps:
    """Seconds spent in each step of a consumer's loop, summed over its batches."""
    NAMES = ("begin", "read", "decode", "settle", "commit")

    def __init__(self):
        self.s = {}

    def add(self, step, seconds):
        self.s[step] = self.s.get(step, 0.0) + seconds

    def lap(self, *clocks):
        """One batch: the clock before each step and after the last."""
        for step, start, end in zip(self.NAMES, clocks, clocks[1:]):
            self.add(step, end - start)


def clock():
    return time.perf_counter()


def run_subscription(c, r, n, steps):
    name = f"gap{r}"
    c.execute("SELECT streams.create_subscription(%s, %s, after => 0)", (name, STREAM))
    w0 = c.execute("SELECT waited_us FROM streams._delivery_waits()").fetchone()[0]
    cur, got = c.cursor(), 0
    while got < n:
        t0 = clock()
        cur.execute("BEGIN")
        t1 = clock()
        cur.execute("SELECT * FROM streams.poll(%s, %s)", (name, BATCH), prepare=True)
        rows = cur.fetchall()
        t2 = clock()
        for row in rows:
            json.loads(row[4])
        t3 = clock()
        if not rows:
            cur.execute("COMMIT")
            break
        cur.execute("SELECT streams.ack(%s, %s)", (name, rows[-1][0]), prepare=True)
        t4 = clock()
        cur.execute("COMMIT")
        t5 = clock()
        steps.lap(t0, t1, t2, t3, t4, t5)
        got += len(rows)
    w1 = c.execute("SELECT waited_us FROM streams._delivery_waits()").fetchone()[0]
    steps.add("flush wait (in read)", (w1 - w0) / 1e6)
    return got


def run_pgq(c, r, n, steps):
    cur, got = c.cursor(), 0
    while got < n:
        t0 = clock()
        cur.execute("BEGIN")
        cur.execute("SELECT pgq.next_batch(%s, %s)", (QUEUE, f"c{r}"), prepare=True)
        batch = cur.fetchone()[0]
        if batch is None:
            cur.execute("COMMIT")
            break
        t1 = clock()
        cur.execute("SELECT * FROM pgq.get_batch_events(%s)", (batch,), prepare=True)
        rows = cur.fetchall()
        t2 = clock()
        data = [d.name for d in cur.description].index("ev_data")
        for row in rows:
            json.loads(row[data])
        t3 = clock()
        cur.execute("SELECT pgq.finish_batch(%s)", (batch,), prepare=True)
        t4 = clock()
        cur.execute("COMMIT")
        t5 = clock()
        steps.lap(t0, t1, t2, t3, t4, t5)
        got += len(rows)
    return got


def run_replay(c, r, n, steps):
    name = f"gap{r}"
    c.execute("INSERT INTO gap_cursor VALUES (%s, 0)", (name,))
    cur, got, last = c.cursor(), 0, 0
    while got < n:
        t0 = clock()
        cur.execute("BEGIN")
        t1 = clock()
        cur.execute("SELECT * FROM streams.replay(%s, after => %s, max_events => %s)", (STREAM, last, BATCH),
                    prepare=True)
        rows = cur.fetchall()
        t2 = clock()
        for row in rows:
            json.loads(row[4])
        t3 = clock()
        if not rows:
            cur.execute("COMMIT")
            break
        last = rows[-1][0]
        cur.execute("UPDATE gap_cursor SET position = %s WHERE name = %s", (last, name), prepare=True)
        t4 = clock()
        cur.execute("COMMIT")
        t5 = clock()
        steps.lap(t0, t1, t2, t3, t4, t5)
        got += len(rows)
    return got


def output_cost(c):
    """Seconds per event to select the 1,000 rows with data as jsonb, and as text."""
    cur, out = c.cursor(), {}
    for table in ("gap_jsonb", "gap_text"):
        t0 = clock()
        for _ in range(100):
            cur.execute(f"SELECT * FROM {table}", prepare=True)
            cur.fetchall()
        out[table] = (clock() - t0) / (100 * BATCH)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n, rounds = args.events - args.events % BATCH, args.rounds
    H.say(f"setting up {DB}: {n:,} events, and a PgQ queue of the same")
    setup(n, rounds)
    methods = (("subscription", run_subscription), ("pgq", run_pgq), ("replay", run_replay))
    rates = {m: [] for m, _ in methods}
    per_event = {m: [] for m, _ in methods}
    jsonb, text = [], []
    try:
        conns = {m: connect() for m, _ in methods}
        with connect() as oc:
            for r in range(rounds):
                order = methods[r % 3:] + methods[:r % 3]
                for m, run in order:
                    steps = Steps()
                    t0 = clock()
                    got = run(conns[m], r, n, steps)
                    secs = clock() - t0
                    if got != n:
                        raise SystemExit(f"{m}: consumed {got} events, expected {n}")
                    rates[m].append(n / secs)
                    per_event[m].append({k: v * 1e6 / n for k, v in steps.s.items()})
                    H.info(f"round {r + 1} {m:12} {n / secs:9,.0f} events/s  "
                           + "  ".join(f"{k} {v * 1e6 / n:.2f}" for k, v in steps.s.items()) + "  (us/event)")
                cost = output_cost(oc)
                jsonb.append(cost["gap_jsonb"] * 1e6)
                text.append(cost["gap_text"] * 1e6)
                H.info(f"round {r + 1} select of 1,000 rows: data as jsonb {jsonb[-1]:.3f}, as text {text[-1]:.3f} "
                       "us/event")
        for c in conns.values():
            c.close()
    finally:
        with H.connect("postgres") as c:
            c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")

    med = statistics.median
    sub, pgq, replay = (med(rates[m]) for m in ("subscription", "pgq", "replay"))
    us = {m: 1e6 / med(rates[m]) for m in rates}
    steps = {m: {k: med(d[k] for d in per_event[m]) for k in per_event[m][0]} for m in per_event}
    flush = steps["subscription"]["flush wait (in read)"]
    out = med(jsonb) - med(text)
    gap = us["subscription"] - us["pgq"]
    print()
    print(f"medians of {rounds} rounds, {n:,} events each, {BATCH:,} per transaction")
    for m in ("subscription", "pgq", "replay"):
        print(f"  {m:12} {med(rates[m]):9,.0f} events/s  {us[m]:.2f} us/event: "
              + ", ".join(f"{k} {v:.2f}" for k, v in steps[m].items()))
    print(f"  subscription / pgq    {sub / pgq:.2f}x")
    print(f"  subscription / replay {sub / replay:.2f}x")
    print(f"gap to PgQ:                                  {gap:+.2f} us/event")
    print(f"  the poll's wait for the flushed delivery:  {flush:.2f} us/event")
    print(f"  data sent as jsonb rather than text:       {out:.2f} us/event "
          f"(select of the same rows: {med(jsonb):.3f} vs {med(text):.3f})")
    print(f"  the gap without these two:                 {gap - flush - out:+.2f} us/event")


if __name__ == "__main__":
    main()
