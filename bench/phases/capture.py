"""1c. Table capture (issue 26): what streams.capture costs a writer, and how
long the snapshot() handoff takes.

Three tables of the same columns in the database of section 1:
bench_orders_plain (uncaptured), bench_orders (streams.capture(.., 'bench.orders')),
and bench_orders_outbox, whose AFTER ... FOR EACH ROW trigger INSERTs
to_jsonb(NEW) into an outbox table and calls pg_notify: the hand-rolled
alternative. Measured, interleaved in rotating order, each after a CHECKPOINT:

  * a single-row INSERT into each (bench/capture_*.sql) at capture_clients;
  * a bulk_rows-row INSERT ... SELECT into the uncaptured and the captured
    table, bulk_reps times each (the tables are truncated before each run,
    and each captured run's events are delivered before the next starts);
  * the handoff: bench_big (handoff_rows rows) is captured, handoff_writers
    pgbench clients change it at handoff_rate transactions per second
    (bench/capture_writer.sql), and a consumer takes snapshot(), COPYs the
    table, commits, then follows streams.replay after the position, skipping
    also_visible, applying each change to its copy. Timed: the copy, and the
    catch-up (until a page reaches the horizon). When the writers stop and
    the consumer has caught up, its copy must equal the table.

The delivery worker runs throughout. The phase's tables are dropped at the end."""

import threading
import time

from common import DB, connect, f0, fx, info, med, reps_str, rotations, say
from phases.tpcb import tps_cell_str, tps_med

ORDER = 17
FULL = dict(capture_clients=[8, 32], bulk_rows=100_000, bulk_reps=3, handoff_rows=1_000_000,
            handoff_writers=4, handoff_rate=500, handoff_secs=40)
QUICK = dict(capture_clients=[8], bulk_rows=10_000, bulk_reps=1, handoff_rows=20_000,
             handoff_writers=2, handoff_rate=200, handoff_secs=3)

STREAM = "bench.orders"  # the stream of SETUP's capture
BIG_STREAM = "bench.big"
# The single-row INSERTs (pgbench scripts in bench/), in report order.
METHODS = [
    ("plain", "INSERT, uncaptured", "capture_plain.sql"),
    ("captured", "INSERT, captured", "capture_captured.sql"),
    ("outbox", "INSERT, row trigger + outbox + pg_notify", "capture_outbox.sql"),
    ("by_hand", "INSERT + publish of the row, one statement", "capture_publish.sql"),
]
BULK_METHODS = [("plain", "bench_orders_plain"), ("captured", "bench_orders")]
TABLES = ["bench_orders_plain", "bench_orders", "bench_orders_outbox", "bench_outbox", "bench_big"]

SETUP = """
CREATE TABLE bench_orders_plain (
    id bigserial PRIMARY KEY, customer text NOT NULL, amount numeric NOT NULL, status text NOT NULL,
    created timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_orders (LIKE bench_orders_plain INCLUDING ALL);
CREATE TABLE bench_orders_outbox (LIKE bench_orders_plain INCLUDING ALL);
ALTER TABLE bench_orders ALTER id SET DEFAULT nextval(pg_get_serial_sequence('bench_orders_plain', 'id'));
ALTER TABLE bench_orders_outbox ALTER id SET DEFAULT nextval(pg_get_serial_sequence('bench_orders_plain', 'id'));
CREATE TABLE bench_outbox (
    id bigserial PRIMARY KEY, stream text NOT NULL, tx xid8 NOT NULL DEFAULT pg_current_xact_id(),
    time timestamptz NOT NULL DEFAULT now(), data jsonb NOT NULL);
CREATE FUNCTION bench_outbox_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d jsonb := jsonb_build_object('op', lower(TG_OP), 'new', to_jsonb(NEW));
BEGIN
    INSERT INTO bench_outbox(stream, data) VALUES (TG_TABLE_NAME, d);
    PERFORM pg_notify('bench_outbox', d::text);
    RETURN NULL;
END $$;
CREATE TRIGGER bench_outbox_row AFTER INSERT OR UPDATE OR DELETE ON bench_orders_outbox
    FOR EACH ROW EXECUTE FUNCTION bench_outbox_row();
SELECT streams.capture('bench_orders', 'bench.orders');
"""


def run(b):
    cfg = b.cfg
    say(f"1c. table capture: single-row INSERT uncaptured / captured / outbox trigger at "
        f"{cfg['capture_clients']} clients, {cfg['bulk_rows']:,}-row INSERT ... SELECT, "
        f"the handoff of a {cfg['handoff_rows']:,}-row table")
    out = {}
    with connect(DB) as c:
        _drop(c)
        c.execute(SETUP)
        b.wait_delivered(c)
        pids = {"worker": b.status(c)["worker_pid"]}
        out["single"] = _single(b, c, pids)
        out["bulk"] = _bulk(b, c)
        out["handoff"] = _handoff(b, c)
        _drop(c)
    b.res["capture"] = out


def _drop(c):
    c.execute(f"DROP TABLE IF EXISTS {', '.join(TABLES)}")
    c.execute("DROP FUNCTION IF EXISTS bench_outbox_row()")


def _single(b, c, pids):
    cfg = b.cfg
    cells = []
    for clients in cfg["capture_clients"]:
        cell = {"clients": clients, **{m[0]: [] for m in METHODS}}
        for order in rotations(METHODS, cfg["reps"]):
            for key, label, script in order:
                c.execute("CHECKPOINT")
                r = b.run_pgbench(script, clients, cfg["secs"], f"capture-{key}-c{clients}", pids)
                if key in ("captured", "by_hand"):
                    r["catchup_s"] = b.wait_delivered(c)
                cell[key].append(r)
                info(f"{label:<42} c={clients:<3} {r['tps']:>10,.0f} tps")
        cells.append(cell)
    return dict(cells=cells, reps=cfg["reps"], secs=cfg["secs"])


def _bulk(b, c):
    cfg = b.cfg
    rows = cfg["bulk_rows"]
    runs = {m[0]: [] for m in BULK_METHODS}
    for order in rotations(BULK_METHODS, cfg["bulk_reps"]):
        for key, table in order:
            c.execute(f"TRUNCATE {table}")
            b.wait_delivered(c)
            c.execute("CHECKPOINT")
            t = time.monotonic()
            c.execute(f"INSERT INTO {table}(customer, amount, status) "
                      f"SELECT 'cus_' || g % 1000, g % 100, 'paid' FROM generate_series(1, {rows}) g")
            took = time.monotonic() - t
            runs[key].append(took)
            if key == "captured":
                b.wait_delivered(c)
            info(f"{rows:,}-row INSERT ... SELECT, {key:<9} {took:6.2f} s, {rows / took:>10,.0f} rows/s")
    events = c.execute("SELECT count(*) FROM streams.event_log WHERE stream = %s AND type = 'insert'",
                       (STREAM,)).fetchone()[0]
    return dict(rows=rows, runs=runs, events=events)


def _handoff(b, c):
    cfg = b.cfg
    rows = cfg["handoff_rows"]
    t = time.monotonic()
    c.execute("CREATE TABLE bench_big (id bigserial PRIMARY KEY, v bigint NOT NULL, pad text NOT NULL)")
    c.execute(f"INSERT INTO bench_big(v, pad) SELECT 0, md5(g::text) FROM generate_series(1, {rows}) g")
    c.execute("VACUUM ANALYZE bench_big")
    c.execute("SELECT streams.capture('bench_big', %s)", (BIG_STREAM,))
    load_s = time.monotonic() - t
    info(f"bench_big: {rows:,} rows loaded and captured in {load_s:.1f} s")
    writers = {}

    def write():
        writers["r"] = b.run_pgbench("capture_writer.sql", cfg["handoff_writers"], cfg["handoff_secs"],
                                     "capture-handoff-writers",
                                     options=("-R", str(cfg["handoff_rate"]), "-D", f"rows={rows}"))

    thread = threading.Thread(target=write)
    thread.start()
    try:
        time.sleep(min(5, cfg["handoff_secs"] / 4))  # writers well under way
        res = _consume(c, thread)
    finally:
        thread.join()
    res.update(rows=rows, load_s=load_s, writers=cfg["handoff_writers"], rate=cfg["handoff_rate"],
               writer_tps=writers["r"]["tps"] if "r" in writers else None, secs=cfg["handoff_secs"])
    info(f"handoff: snapshot + copy {res['copy_s']:.2f} s ({res['copied']:,} rows, "
         f"{res['also_visible']} also visible), caught up {res['catchup_s']:.2f} s later, "
         f"{res['applied']:,} changes applied, copy equals the table: {res['equal']}")
    return res


def _consume(c, writers):
    """The consumer of docs/capture.md, timed."""
    import psycopg
    from common import dsn

    t0 = time.monotonic()
    with psycopg.connect(dsn(DB), autocommit=True) as cc:
        cc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        position, also_visible, _ = cc.execute("SELECT * FROM streams.snapshot(%s)", (BIG_STREAM,)).fetchone()
        copy = {}
        with cc.cursor().copy("COPY bench_big (id, v, pad) TO STDOUT") as cp:
            for row in cp.rows():
                copy[int(row[0])] = (int(row[1]), row[2])
        cc.execute("COMMIT")
    copy_s = time.monotonic() - t0
    copied, skip = len(copy), set(also_visible)
    applied, after, catchup_s, final = 0, position, None, None
    while True:
        # A page short of 10,000 holds every event up to the horizon read before it.
        horizon = c.execute("SELECT streams.horizon()").fetchone()[0]
        page = c.execute("SELECT position, type, data FROM streams.replay(%s, after => %s, max_events => 10000)",
                         (BIG_STREAM, after)).fetchall()
        for pos, kind, data in page:
            after = pos
            if pos in skip:
                continue
            applied += 1
            if kind == "truncate":
                copy.clear()
                continue
            if "old" in data:
                copy.pop(data["old"]["id"], None)
            if "new" in data:
                copy[data["new"]["id"]] = (data["new"]["v"], data["new"]["pad"])
        if len(page) < 10000:
            if catchup_s is None:
                catchup_s = time.monotonic() - t0 - copy_s
            if final is not None and horizon >= final:
                break
            if final is None and not writers.is_alive():
                # The writers are done: every change is at or below the newest position now.
                final = c.execute("SELECT max(position) FROM streams.event_log").fetchone()[0]
            time.sleep(0.05)
    table = {int(i): (int(v), p) for i, v, p in c.execute("SELECT id, v, pad FROM bench_big")}
    return dict(copy_s=copy_s, copied=copied, also_visible=len(skip), catchup_s=catchup_s, applied=applied,
                equal=table == copy, table_rows=len(table))


# --------------------------------------------------------------------------
# Report (reads res["capture"] only; an older results.json has none)
# --------------------------------------------------------------------------

def _bulk_ratio(bulk):
    return med(bulk["runs"]["plain"]) / med(bulk["runs"]["captured"])


def values(res):
    cap = res.get("capture")
    if not cap:
        return {k: None for k in ("capture_vs_plain", "capture_vs_outbox", "capture_bulk_vs_plain",
                                  "capture_handoff_exact")}
    cells = cap["single"]["cells"]
    ns = "/".join(str(cell["clients"]) for cell in cells)
    ns = f"lowest of {ns}" if len(cells) > 1 else ns
    h = cap["handoff"]
    return {
        "capture_vs_plain": dict(value=min(tps_med(x, "captured") / tps_med(x, "plain") for x in cells), clients=ns),
        "capture_vs_outbox": dict(value=min(tps_med(x, "captured") / tps_med(x, "outbox") for x in cells),
                                  clients=ns),
        "capture_bulk_vs_plain": dict(value=_bulk_ratio(cap["bulk"]), rows=f0(cap["bulk"]["rows"])),
        "capture_handoff_exact": dict(value=h["equal"], rows=f0(h["rows"]),
                                      shown=None if h["equal"] else "the copy differs from the table"),
    }


def notes(res, short):
    cap = res.get("capture")
    if not cap or not {"capture_vs_plain", "capture_vs_outbox", "capture_bulk_vs_plain"} & set(short):
        return []
    return ["**Table capture:** " + "; ".join(
        f"{cell['clients']} clients: captured {fx(tps_med(cell, 'captured') / tps_med(cell, 'plain'))} of "
        f"uncaptured, {fx(tps_med(cell, 'captured') / tps_med(cell, 'outbox'))} of the outbox trigger"
        + (f", {fx(tps_med(cell, 'captured') / tps_med(cell, 'by_hand'))} of the same INSERT and publish by hand"
           if cell.get("by_hand") else "")
        for cell in cap["single"]["cells"]) + f"; bulk {fx(_bulk_ratio(cap['bulk']))}. A captured write is a "
        "write and an event: on this CPU-bound machine an event costs about what a row does, so the "
        "ratio to an uncaptured write stays near what a second INSERT would give."]


def section(res, w):
    cap = res.get("capture")
    if not cap:
        return
    single, bulk, h = cap["single"], cap["bulk"], cap["handoff"]
    reps = single["reps"]
    w("## 1c. Table capture")
    w("")
    w("Three tables of the same columns (`id bigserial PRIMARY KEY, customer text, amount numeric, status text, "
      "created timestamptz`) in the database of section 1: `bench_orders_plain`, uncaptured; `bench_orders`, "
      f"captured (`streams.capture('bench_orders', '{STREAM}')`: each row an event of the inserting "
      "transaction); and `bench_orders_outbox`, with the common hand-rolled alternative: an `AFTER INSERT OR "
      "UPDATE OR DELETE ... FOR EACH ROW` PL/pgSQL trigger that INSERTs `to_jsonb(NEW)` into an outbox table and "
      "calls `pg_notify` (`bench/phases/capture.py`). A single-row INSERT into each (`bench/capture_plain.sql`, "
      "`capture_captured.sql`, `capture_outbox.sql`), and, as what capture does written by hand, the INSERT "
      "into the uncaptured table and a `streams.publish` of the row as capture publishes it, in one statement "
      f"(`capture_publish.sql`): `pgbench -n -f <script> -c N -j 2 -T {single['secs']}`, "
      + (f"{reps} repetitions per cell, interleaved in rotating order, each after a `CHECKPOINT`; median tps, "
         "individual runs in brackets." if reps > 1 else "one run per cell, each after a `CHECKPOINT`.")
      + " The delivery worker runs throughout; each captured run's events were delivered before the next run.")
    w("")
    w("| clients | uncaptured | captured | outbox trigger | INSERT + publish by hand | captured / uncaptured | "
      "captured / outbox | captured / by hand | delivered after the captured runs |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    for cell in single["cells"]:
        p, c, o = (tps_med(cell, k) for k in ("plain", "captured", "outbox"))
        cu = max(r["catchup_s"] for r in cell["captured"])
        hand = f"{tps_cell_str(cell, 'by_hand', reps)} | " if cell.get("by_hand") else "- | "
        ratio = f"{fx(c / tps_med(cell, 'by_hand'))} | " if cell.get("by_hand") else "- | "
        w(f"| {cell['clients']} | {tps_cell_str(cell, 'plain', reps)} | {tps_cell_str(cell, 'captured', reps)} | "
          f"{tps_cell_str(cell, 'outbox', reps)} | {hand}{fx(c / p)} | {fx(c / o)} | {ratio}within {cu * 1000:.0f} ms |")
    w("")
    pr, cr = bulk["runs"]["plain"], bulk["runs"]["captured"]
    w(f"A {bulk['rows']:,}-row `INSERT ... SELECT` into the uncaptured and the captured table "
      f"({len(pr)} runs each, interleaved, each into the truncated table after a `CHECKPOINT`): "
      f"uncaptured {med(pr):.2f} s ({reps_str(pr, lambda x: f'{x:.2f}')}), captured {med(cr):.2f} s "
      f"({reps_str(cr, lambda x: f'{x:.2f}')}), **{fx(_bulk_ratio(bulk))}** of the uncaptured rate "
      f"({bulk['rows'] / med(cr):,.0f} rows and events per second). One statement, one trigger call: the rows "
      "are published 1,000 rows (or 16 MB) at a time in the statement's transaction.")
    w("")
    w(f"**The handoff.** `bench_big` ({h['rows']:,} rows: `id bigserial PRIMARY KEY, v bigint, pad text`, "
      f"loaded and captured in {h['load_s']:.1f} s) is changed by {h['writers']} pgbench clients at "
      f"{h['rate']} transactions per second for {h['secs']} s (`bench/capture_writer.sql`: 70% UPDATE, 20% "
      "INSERT, 10% DELETE; measured "
      + (f"{h['writer_tps']:,.0f} tps" if h.get("writer_tps") else "rate not recorded")
      + "). A consumer in Python (psycopg) opens a REPEATABLE READ transaction, calls `streams.snapshot()`, "
      "COPYs the table into a dict and commits, then follows `streams.replay` pages of 10,000 after the "
      f"snapshot's position, skipping `also_visible`, applying each change. Snapshot and copy: "
      f"**{h['copy_s']:.2f} s** ({h['copied']:,} rows; {h['also_visible']} positions also visible); caught up "
      f"(a page short of 10,000) **{h['catchup_s']:.2f} s** later. After the writers stopped it had applied "
      f"{h['applied']:,} changes, and its copy "
      + (f"**equals the table row for row** ({h['table_rows']:,} rows)." if h["equal"]
         else f"**differs from the table** ({h['table_rows']:,} rows).")
      + " The copy is the Python client's work (a dict of a million tuples); the server's part is the "
      "snapshot and a COPY.")
    w("")
