"""1b. A publish inside an application transaction: pgbench's TPC-B-like
transaction (pgbench -i at tpcb_scale) alone, with one streams.publish before
END, and with the same row INSERTed into bench_plain instead, interleaved at
tpcb_clients, the repetitions and seconds of section 1. The delivery worker
runs and a LISTEN client drains "payment.success" throughout, as in section 1;
every event is delivered before the next run starts. The pgbench tables are
dropped at the end."""

from common import CHANNEL, DB, Listener, connect, f0, fx, info, med, reps_str, rotations, say
from phases.publish import runs_server_us

ORDER = 15
FULL = dict(tpcb_scale=10, tpcb_clients=[8, 32])
QUICK = dict(tpcb_scale=10, tpcb_clients=[8])

# What pgbench -i creates (dropped after the runs).
PGBENCH_TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]
# The three transactions (pgbench scripts in bench/), in report order.
METHODS = [
    ("plain", "TPC-B", "tpcb.sql"),
    ("publish", "TPC-B + publish", "tpcb_publish.sql"),
    ("insert", "TPC-B + INSERT", "tpcb_insert.sql"),
]


def run(b):
    cfg = b.cfg
    scale, reps, secs = cfg["tpcb_scale"], cfg["reps"], cfg["secs"]
    say(f"1b. TPC-B with a publish: {', '.join(m[1] for m in METHODS)} at {cfg['tpcb_clients']} clients, "
        f"scale {scale}, {reps} x {secs} s each, interleaved")
    init_s = b.init_pgbench(scale)
    info(f"pgbench -i -s {scale}: {init_s:.1f} s")
    cells = []
    lst = Listener(b.ctx, DB, CHANNEL, record=False).start()
    try:
        with connect(DB) as c:
            b.wait_delivered(c)
            published_before = _published(c)
            pids = {"worker": b.status(c)["worker_pid"], "listener": lst.proc.pid}
            for clients in cfg["tpcb_clients"]:
                cell = {"clients": clients, "catchup": []}
                cell.update({m[0]: [] for m in METHODS})
                for order in rotations(METHODS, reps):
                    for key, label, script in order:
                        c.execute("CHECKPOINT")
                        r = b.run_pgbench(script, clients, secs, f"tpcb-{key}-c{clients}", pids,
                                          options=("-s", str(scale)))
                        if key == "publish":
                            r["catchup_s"] = b.wait_delivered(c)
                            cell["catchup"].append(r["catchup_s"])
                        cell[key].append(r)
                        info(f"{label:<16} c={clients:<3} {r['tps']:>10,.0f} tps"
                             + (f"  (delivered {r['catchup_s'] * 1000:.0f} ms after the run)"
                                if "catchup_s" in r else ""))
                cells.append(cell)
            expected = _published(c) - published_before
            lst.wait_count(expected, 60)
            # The later phases (the hot standby's base backup among them) find
            # the database as section 1 left it, plus this phase's rows in
            # streams.event_log and bench_plain.
            c.execute(f"DROP TABLE {', '.join(PGBENCH_TABLES)}")
    finally:
        received, _ = lst.finish()
    b.res["tpcb"] = dict(scale=scale, reps=reps, secs=secs, init_s=init_s, cells=cells,
                         listener=dict(expected=expected, received=received))
    if received != expected:
        info(f"WARNING: the LISTEN client received {received:,} notifications, expected {expected:,}")


def _published(c):
    return c.execute("SELECT count(*) FROM streams.event_log WHERE stream = %s", (CHANNEL,)).fetchone()[0]


# --------------------------------------------------------------------------
# Report (reads res["tpcb"] only; an older results.json has none)
# --------------------------------------------------------------------------

def tps_med(cell, key):
    return med([r["tps"] for r in cell[key]])


def tps_cell_str(cell, key, reps):
    """A table cell: the median tps of cell[key]'s runs, the runs in brackets when repeated."""
    v = [r["tps"] for r in cell[key]]
    return f"{f0(med(v))} ({reps_str(v)})" if reps > 1 else f0(med(v))


def cpu_us(cell, key):
    """Server CPU time per transaction (every process of the cluster, µs)."""
    return runs_server_us(cell[key])


def _ratio(cell):
    return tps_med(cell, "publish") / tps_med(cell, "insert")


def values(res):
    tp = res.get("tpcb")
    if not tp:
        return {"tpcb_publish_vs_insert": None}
    ns = "/".join(str(cell["clients"]) for cell in tp["cells"])
    # The lowest ratio: as fast at every client count.
    return {"tpcb_publish_vs_insert": dict(value=min(_ratio(cell) for cell in tp["cells"]),
                                           clients=f"lowest of {ns}" if len(tp["cells"]) > 1 else ns)}


def delivery(res):
    """(events lost, events duplicated, every event received exactly once) in this phase."""
    li = res.get("tpcb", {}).get("listener")
    if not li:
        return 0, 0, True
    return li["expected"] - li["received"], 0, li["expected"] == li["received"]


def notes(res, short):
    if "tpcb_publish_vs_insert" not in short:
        return []
    return ["**TPC-B + publish vs TPC-B + INSERT:** " + "; ".join(
        f"{cell['clients']} clients: {fx(_ratio(cell))} (server CPU per transaction "
        f"{cpu_us(cell, 'publish'):.0f} µs against {cpu_us(cell, 'insert'):.0f} µs, "
        f"{cpu_us(cell, 'plain'):.0f} µs for TPC-B alone)"
        for cell in res["tpcb"]["cells"]) + "."]


def section(res, w):
    tp = res.get("tpcb")
    if not tp:
        return
    reps = tp["reps"]
    w("## 1b. TPC-B with a publish")
    w("")
    w(f"pgbench's TPC-B-like transaction (`pgbench -i -s {tp['scale']}`: {tp['scale'] * 100_000:,} accounts, "
      f"{tp['scale']} branches, {tp['init_s']:.1f} s to initialise; in the database of section 1, "
      "dropped after the runs) three ways, each a `-f` script: alone (`bench/tpcb.sql`, the built-in script "
      "written out), with `SELECT streams.publish('payment.success', ...)` before `END` "
      "(`bench/tpcb_publish.sql`), and with the same row INSERTed into `bench_plain` before `END` "
      f"(`bench/tpcb_insert.sql`). `pgbench -n -f <script> -s {tp['scale']} -c N -j 2 -T {tp['secs']}`, "
      + (f"{reps} repetitions per cell, the three interleaved in rotating order, each after a `CHECKPOINT`; "
         "median tps, individual runs in brackets. " if reps > 1 else "one run per cell, each after a `CHECKPOINT`. ")
      + "The delivery worker runs and a LISTEN client drains `payment.success` throughout, as in section 1.")
    w("")

    w("| clients | TPC-B | TPC-B + publish | TPC-B + INSERT | + publish / + INSERT | + publish / TPC-B "
      "| + INSERT / TPC-B | server CPU per transaction: TPC-B / + publish / + INSERT |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for cell in tp["cells"]:
        a, p, i = (tps_med(cell, k) for k in ("plain", "publish", "insert"))
        w(f"| {cell['clients']} | {tps_cell_str(cell, 'plain', reps)} | {tps_cell_str(cell, 'publish', reps)} | "
          f"{tps_cell_str(cell, 'insert', reps)} | {fx(p / i)} | {fx(p / a)} | {fx(i / a)} | "
          + " / ".join(f"{cpu_us(cell, k):.0f} µs" for k in ("plain", "publish", "insert")) + " |")
    w("")
    cu = [x for cell in tp["cells"] for x in cell["catchup"]]
    li = tp["listener"]
    w(f"After each TPC-B + publish run the worker had delivered every event within {max(cu) * 1000:.0f} ms "
      f"of pgbench finishing (median {med(cu) * 1000:.0f} ms); the next run started after that. "
      + (f"The LISTEN client received exactly the {li['received']:,} notifications expected."
         if li["received"] == li["expected"] else
         f"**The LISTEN client received {li['received']:,} notifications, expected {li['expected']:,}.**"))
    w("")
