"""2e. Readers and the worker beside a long-open snapshot (issue 22, finding 6).

Under a steady paced publish load (pgbench -R with bench/publish.sql), the same
measurements three times in one run: without an old snapshot; after a
REPEATABLE READ transaction (`BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT
count(*) FROM streams.events;`) has been held open for snap_hold_s beside the
load, while it is still open; and after its COMMIT and a VACUUM of
streams.horizon_state (a control). Each time: the client-side median of
streams.horizon() (one connection, prepared), of a 100-event page of
streams.events just behind the horizon, the worker's rounds per second
(streams.status.rounds), the LISTEN client's commit timestamp -> received,
and the size of streams.horizon_state (heap and index), which no vacuum can
shrink while the snapshot is open. Runs in its own database (recreated)."""

import json
import os
import subprocess
import time

from common import (CHANNEL, DB, HERE, PGHOST, PGPORT, PGUSER, BenchError, Listener, connect, dsn, f0, fms, fx,
                    info, med, parse_ts_ns, pct, say)

ORDER = 23
OWN_DB = True
FULL = dict(snap_rate=500, snap_clients=2, snap_warmup_s=15, snap_hold_s=300, snap_slices=10, snap_window_s=1.5,
            snap_horizon_calls=2000, snap_page_calls=500, snap_explains=100)
QUICK = dict(snap_rate=500, snap_clients=2, snap_warmup_s=3, snap_hold_s=20, snap_slices=3, snap_window_s=1,
             snap_horizon_calls=2000, snap_page_calls=300, snap_explains=30)

# The query of streams.horizon() (sql/streams.sql); the bench's superuser reads the table directly.
HORIZON_QUERY = "SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1"
PAGE = "SELECT * FROM streams.events WHERE position > %s::bigint ORDER BY position LIMIT 100"
# How far behind the horizon the page starts (a full page of 100 events).
PAGE_BEHIND = 200
HOLD_SQL = ("BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT count(*) FROM streams.events")
CONDITIONS = (("without", "without an old snapshot"),
              ("with", "with the snapshot open"),
              ("after", "after COMMIT and VACUUM"))


def _sizes(c):
    return c.execute("SELECT pg_relation_size('streams.horizon_state'), "
                     "pg_indexes_size('streams.horizon_state')").fetchone()


def _measure(b, label):
    """One set of measurements at the running load, in cfg["snap_slices"]
    slices (each: the worker's rounds over snap_window_s with nothing else
    running, then its share of the horizon() calls and of the pages), so that
    a burst of the shared disk or CPUs does not decide a figure; a LISTEN client
    records throughout."""
    cfg = b.cfg
    k = cfg["snap_slices"]
    out = dict(horizon_ms=[], page_ms=[], short_pages=0, rounds_per_s_slices=[], events_per_s_slices=[])
    clock = time.perf_counter_ns
    with connect(DB) as c:
        c.execute("CHECKPOINT")  # not one of its own in the middle of the measurements
        out["table_bytes"], out["index_bytes"] = _sizes(c)
        cur = c.cursor()
        for _ in range(20):  # warm-up: the connection, the prepared statements
            cur.execute("SELECT streams.horizon()", prepare=True)
            x = cur.fetchone()[0] - PAGE_BEHIND
            cur.execute(PAGE, (x,), prepare=True)
            cur.fetchall()
        lst = Listener(b.ctx, DB, CHANNEL, record=True).start()
        try:
            for _ in range(k):
                r0, n0 = c.execute("SELECT rounds, newest_position FROM streams.status").fetchone()
                t0 = time.monotonic()
                time.sleep(cfg["snap_window_s"])
                r1, n1 = c.execute("SELECT rounds, newest_position FROM streams.status").fetchone()
                t1 = time.monotonic()
                out["rounds_per_s_slices"].append((r1 - r0) / (t1 - t0))
                out["events_per_s_slices"].append((n1 - n0) / (t1 - t0))
                # streams.horizon(), one connection, a prepared statement.
                for _ in range(cfg["snap_horizon_calls"] // k):
                    t = clock()
                    cur.execute("SELECT streams.horizon()", prepare=True)
                    cur.fetchone()
                    out["horizon_ms"].append((clock() - t) / 1e6)
                # A 100-event page just behind the horizon (its start moved up every 50 calls).
                for i in range(cfg["snap_page_calls"] // k):
                    if i % 50 == 0:
                        x = cur.execute("SELECT streams.horizon()", prepare=True).fetchone()[0] - PAGE_BEHIND
                    t = clock()
                    cur.execute(PAGE, (x,), prepare=True)
                    rows = cur.fetchall()
                    out["page_ms"].append((clock() - t) / 1e6)
                    out["short_pages"] += len(rows) < 100
        finally:
            _, recs = lst.finish()
        out["table_bytes_end"], out["index_bytes_end"] = _sizes(c)
        # What the server does for them, apart from the client's round trip: the
        # buffers one execution touches and the median execution time (EXPLAIN
        # ANALYZE of horizon()'s query, which a SQL function with SET cannot inline,
        # and of the page).
        x = cur.execute("SELECT streams.horizon()").fetchone()[0] - PAGE_BEHIND
        for key, q, args in (("horizon", HORIZON_QUERY, None), ("page", PAGE, (x,))):
            times = []
            for _ in range(cfg["snap_explains"]):
                plan = cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q, args).fetchone()[0][0]
                times.append(plan["Execution Time"])
            top = plan["Plan"]
            out[f"{key}_buffers"] = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
            out[f"{key}_server_ms"] = med(times)
    out["rounds_per_s"] = med(out["rounds_per_s_slices"])
    out["events_per_s"] = med(out["events_per_s_slices"])
    out["commit_ts_to_received_ms"] = [(real_ns - parse_ts_ns(json.loads(p)["time"])) / 1e6
                                       for _, real_ns, p in recs]
    hz, pages, lat = out["horizon_ms"], out["page_ms"], out["commit_ts_to_received_ms"]
    info(f"{label:<8} horizon() median {med(hz) * 1000:.0f} µs, page median {med(pages):.2f} ms, "
         f"{out['rounds_per_s']:,.0f} rounds/s at {out['events_per_s']:,.0f} events/s (slices: "
         + " / ".join(f0(v) for v in out["rounds_per_s_slices"]) + f"), listener p50 "
         f"{pct(lat, 50):.1f} ms, buffers horizon {out['horizon_buffers']} / page {out['page_buffers']}, "
         f"server horizon {out['horizon_server_ms'] * 1000:.0f} µs / page {out['page_server_ms']:.2f} ms, horizon_state {out['table_bytes'] / 1024:,.0f} kB "
         f"(index {out['index_bytes'] / 1024:,.0f} kB)")
    return out


def run(b):
    import psycopg
    cfg = b.cfg
    say(f"2e. a long-open snapshot: pgbench publish.sql -R {cfg['snap_rate']} -c {cfg['snap_clients']}; "
        f"measured without, then with a REPEATABLE READ transaction open for {cfg['snap_hold_s']} s, then "
        "after its COMMIT")
    b.recreate_db()
    b._log_seq += 1
    log = b.log_dir / f"{b._log_seq:03d}-pgbench-snapshot-load.log"
    total = cfg["snap_warmup_s"] + cfg["snap_hold_s"] + 600  # ended below, when the measurements are done
    cmd = [b.pgbench, "-n", "-f", str(HERE / "publish.sql"), "-c", str(cfg["snap_clients"]),
           "-j", str(min(2, cfg["snap_clients"])), "-R", str(cfg["snap_rate"]), "-T", str(total),
           "-h", PGHOST, "-p", str(PGPORT), "-U", PGUSER, DB]
    res, growth, holder = {}, [], None
    with open(log, "w") as lf:
        lf.write(f"$ {' '.join(cmd)}\n(stopped with SIGINT once the measurements are done)\n\n")
        lf.flush()
        load = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
        try:
            def alive():
                if load.poll() is not None:
                    raise BenchError(f"the pgbench load exited early ({load.returncode}), see {log}")

            time.sleep(cfg["snap_warmup_s"])
            alive()
            res["without"] = _measure(b, "without")
            alive()
            holder = psycopg.connect(dsn(DB), autocommit=True)
            for q in HOLD_SQL:
                holder.execute(q)
            hpid = holder.execute("SELECT pg_backend_pid()").fetchone()[0]
            t_open = time.monotonic()
            with connect(DB) as c:
                while True:
                    age = time.monotonic() - t_open
                    growth.append((age, *_sizes(c)))
                    if age >= cfg["snap_hold_s"]:
                        break
                    alive()
                    time.sleep(min(10.0, cfg["snap_hold_s"] - age))
                # The snapshot really holds vacuum back: its xmin, how many transactions old.
                xmin_age = c.execute("SELECT age(backend_xmin) FROM pg_stat_activity WHERE pid = %s",
                                     (hpid,)).fetchone()[0]
            res["with"] = _measure(b, "with")
            res["with"]["snapshot_age_s"] = time.monotonic() - t_open
            res["with"]["xmin_age"] = xmin_age
            alive()
            holder.execute("COMMIT")
            holder.close()
            with connect(DB) as c:
                t = time.monotonic()
                c.execute("VACUUM streams.horizon_state")
                vacuum_s = time.monotonic() - t
            res["after"] = _measure(b, "after")
            res["after"]["vacuum_s"] = vacuum_s
            alive()
        finally:
            if holder is not None and not holder.closed:
                holder.close()
            if load.poll() is None:
                load.send_signal(2)
                try:
                    load.wait(30)
                except subprocess.TimeoutExpired:
                    load.kill()
                    load.wait()
    with connect(DB) as c:
        b.wait_delivered(c)
    b.res["snapshot"] = dict(runs=res, growth=growth)
    w, wo = res["with"], res["without"]
    info(f"with / without: horizon() {med(w['horizon_ms']) / med(wo['horizon_ms']):.2f}x, page "
         f"{med(w['page_ms']) / med(wo['page_ms']):.2f}x, rounds/s {w['rounds_per_s'] / wo['rounds_per_s']:.2f}x; "
         f"horizon_state {wo['table_bytes'] / 1024:,.0f} -> {w['table_bytes'] / 1024:,.0f} kB "
         f"({res['after']['table_bytes'] / 1024:,.0f} kB after COMMIT and VACUUM)")


# --------------------------------------------------------------------------
# Report (reads res["snapshot"])
# --------------------------------------------------------------------------

def _age(s):
    return f"{s / 60:.0f}-minute" if s >= 90 else f"{s:.0f}-second"


def values(res):
    sn = res.get("snapshot")
    if not sn:
        return {}
    w, wo = sn["runs"]["with"], sn["runs"]["without"]
    common_ = dict(age=_age(sn["growth"][-1][0]), rate=f"{res['config']['snap_rate']:,}")
    return {
        "snapshot_horizon_ratio": dict(value=med(w["horizon_ms"]) / med(wo["horizon_ms"]), **common_),
        "snapshot_page_ratio": dict(value=med(w["page_ms"]) / med(wo["page_ms"]), **common_),
    }


def notes(res, short):
    if not short & {"snapshot_horizon_ratio", "snapshot_page_ratio"}:
        return []
    sn = res["snapshot"]["runs"]
    return [f"**beside a long-open snapshot:** horizon_state grew from {sn['without']['table_bytes'] / 1024:,.0f} "
            f"to {sn['with']['table_bytes'] / 1024:,.0f} kB; the worker ran "
            f"{sn['with']['rounds_per_s']:,.0f} rounds/s with it, {sn['without']['rounds_per_s']:,.0f} without."]


def _kb(n):
    return f"{n / 1024:,.0f} kB"


def section(res, w):
    sn = res.get("snapshot")
    if not sn:
        return
    cfg = res["config"]
    r = sn["runs"]
    wi, wo, af = r["with"], r["without"], r["after"]
    age, age_end = sn["growth"][-1][0], wi["snapshot_age_s"]  # when the measurements began, ended
    w("## 2e. Beside a long-open snapshot")
    w("")
    w(f"A steady paced load (`pgbench -f bench/publish.sql -c {cfg['snap_clients']} -R {cfg['snap_rate']}`, "
      "in a database of its own) runs throughout. The same measurements three times: first without an old "
      f"snapshot; then, after `{HOLD_SQL[0]}; {HOLD_SQL[1]};` has been held open beside the load for "
      f"{age:.0f} s ({wi['xmin_age']:,} transactions behind by then), while it is still open (until "
      f"{age_end:.0f} s); then after its "
      "`COMMIT` and a `VACUUM streams.horizon_state`. Each time, after a `CHECKPOINT`, in "
      f"{cfg['snap_slices']} slices one after another: `streams.status.rounds` over {cfg['snap_window_s']} s "
      f"(the load alone), then 1/{cfg['snap_slices']} of {cfg['snap_horizon_calls']:,} calls of "
      f"`SELECT streams.horizon()` and of {cfg['snap_page_calls']:,} of a 100-event page "
      f"`{PAGE.replace('%s::bigint', '$x')}` ($x {PAGE_BEHIND} positions behind the horizon), on one "
      "connection (prepared statements), "
      "timed by the client; a LISTEN client records throughout; then EXPLAIN (ANALYZE, BUFFERS) of "
      f"horizon()'s query and of the page, {cfg['snap_explains']} times each (what the server does, without "
      "the round trip). The worker writes `streams.horizon_state` once per round; while the snapshot "
      "is open none of those versions can be pruned or vacuumed, so the table grows; readers and the worker "
      "find the newest version through an index on the horizon, so what they pay should not grow with it.")
    w("")
    w("| measured | without | with the snapshot open | ratio with / without | after COMMIT + VACUUM |")
    w("| --- | --- | --- | --- | --- |")

    def row(label, f, show, ratio=True):
        a, b_, c = f(wo), f(wi), f(af)
        w(f"| {label} | {show(a)} | {show(b_)} | {fx(b_ / a) if ratio and a else ''} | {show(c)} |")

    def us(v):
        return f"{v * 1000:.0f} µs" if v < 1 else fms(v)

    row("`streams.horizon()`, median", lambda x: med(x["horizon_ms"]), us)
    row("`streams.horizon()`, p99", lambda x: pct(x["horizon_ms"], 99), us)
    row("its query on the server (EXPLAIN ANALYZE), median", lambda x: x["horizon_server_ms"], us)
    row("its query: buffers per execution", lambda x: x["horizon_buffers"], f0)
    row("100-event page, median", lambda x: med(x["page_ms"]), fms)
    row("100-event page, p99", lambda x: pct(x["page_ms"], 99), fms)
    row("the page on the server (EXPLAIN ANALYZE), median", lambda x: x["page_server_ms"], fms)
    row("the page: buffers per execution", lambda x: x["page_buffers"], f0)
    row("worker rounds/s", lambda x: x["rounds_per_s"], f0)
    row("events/s published meanwhile", lambda x: x["events_per_s"], f0)
    row("LISTEN client, commit timestamp -> received, p50", lambda x: pct(x["commit_ts_to_received_ms"], 50), fms)
    row("LISTEN client, commit timestamp -> received, p99", lambda x: pct(x["commit_ts_to_received_ms"], 99), fms)
    row("`pg_relation_size('streams.horizon_state')` before these measurements", lambda x: x["table_bytes"], _kb)
    row("the same after them", lambda x: x["table_bytes_end"], _kb)
    row("its index (`pg_indexes_size`), before", lambda x: x["index_bytes"], _kb)
    w("")
    g = sn["growth"]
    short = sum(x["short_pages"] for x in (wo, wi, af))
    rate = (g[-1][1] - g[0][1]) / 1024 / ((g[-1][0] - g[0][0]) / 60) if len(g) > 1 and g[-1][0] > g[0][0] else 0
    reused = af["table_bytes_end"] <= af["table_bytes"] * 1.05
    w(f"What a long snapshot still costs: `streams.horizon_state` grew from {_kb(wo['table_bytes_end'])} "
      f"to {_kb(wi['table_bytes_end'])} while the transaction was open (about {rate:,.0f} kB a minute at this "
      f"load; its index from {_kb(wo['index_bytes_end'])} to {_kb(wi['index_bytes_end'])}): no version the "
      "worker wrote meanwhile can be pruned or vacuumed before the transaction ends, and the same holds for "
      "every other table updated meanwhile. Once it ended, a VACUUM "
      f"(here {af['vacuum_s'] * 1000:.0f} ms; autovacuum does it on its own) freed the dead versions"
      + (f": the table stayed at {_kb(af['table_bytes_end'])} through the last measurements (the space is "
         "reused; the file shrinks only when its last pages are empty)" if reused else
         f"; the table measured {_kb(af['table_bytes'])} after it and {_kb(af['table_bytes_end'])} at the end")
      + ". "
      f"The worker's rounds/s ratio, with / without: {fx(wi['rounds_per_s'] / wo['rounds_per_s'])} (a figure, "
      "not a target: a round waits for its commit's flush, so rounds/s follows the shared disk, and at a "
      "paced load a slower round merges more commits into the next one; the events/s row shows the load "
      "in the same windows). The \"after\" "
      "column is a control taken later in the same run."
      + (f" {short} page(s) returned fewer than 100 events." if short else ""))
    w("")
