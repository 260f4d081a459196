"""4b. The partitioned log (issue 27) against non-partitioned controls, side
by side in one run:

  publish   streams.publish (bench/publish.sql) on the partitioned log vs the
            same row INSERTed into bench_log_plain, a non-partitioned table of
            the log's shape (the columns, the indexes the 0.2.0 log had), and
            into bench_log_parted, that table partitioned with one partition
            (bench/partitions_schema.sql): partition routing apart from the
            rest; part_clients, part_reps x part_secs, rotating order.
  replay    part_events events published with publish_batch into a log of
            part_size-wide partitions; the first part_replay_events of them
            read back server-side (EXPLAIN ANALYZE: planning + execution) from
            streams.event_log and from bench_log_plain, a copy of the same rows
            (INSERT ... SELECT): in pages of part_page (ORDER BY position
            LIMIT) and as one ordered scan.
  drop      on the same log, with part_drop_clients publishing at
            part_drop_rate (pgbench -R, per-transaction log), retention set to
            max_age 0 seconds: how long the worker's drop of the oldest
            partition held or awaited its lock (pg_locks, sampled), and the
            publishers' latency p99 around it against before.
"""

import subprocess
import time

from common import (DB, HERE, PGHOST, PGPORT, PGUSER, BenchError, connect, f0, fms, fx, info, med, pct,
                    reps_str, rotations, say)
from phases.publish import runs_server_us
from phases.replay import plan_shape

ORDER = 45
OWN_DB = True
FULL = dict(part_clients=8, part_reps=3, part_secs=8, part_size=1_000_000, part_events=2_100_000,
            part_replay_events=1_000_000, part_page=1000, part_chunk=1000, part_drop_clients=4,
            part_drop_rate=1000, part_drop_before_s=10, part_drop_wait_s=20, part_drop_after_s=1)
QUICK = dict(part_clients=8, part_reps=1, part_secs=1, part_size=10_000, part_events=25_000,
             part_replay_events=10_000, part_page=1000, part_chunk=1000, part_drop_clients=4,
             part_drop_rate=1000, part_drop_before_s=2, part_drop_wait_s=10, part_drop_after_s=1)

# The single-event writes (pgbench scripts in bench/), in report order.
METHODS = [
    ("publish", "streams.publish (partitioned log)", "publish.sql"),
    ("plain", "INSERT into bench_log_plain", "partitions_plain_insert.sql"),
    ("parted", "INSERT into bench_log_parted (1 partition)", "partitions_parted_insert.sql"),
]
# The two tables replay reads, in report order.
TABLES = [("log", "streams.event_log"), ("plain", "bench_log_plain")]
# How long pgbench runs before the measured part of the drop's "before" window.
DROP_WARMUP_S = 1.0
# Pause between two samples of pg_locks (the sampler runs the whole time, before the drop as during it).
SAMPLE_PAUSE_S = 0.002


def run(b):
    cfg = b.cfg
    say(f"4b. the partitioned log: publish vs INSERT into non-partitioned and 1-partition controls at "
        f"{cfg['part_clients']} clients; replay of {cfg['part_replay_events']:,} events; retention dropping "
        f"a partition of {cfg['part_size']:,} positions")
    b.res["partitions"] = out = {}
    out["publish"] = _publish(b)
    b.recreate_db()
    with connect(DB) as c:
        c.execute((HERE / "partitions_schema.sql").read_text())
        c.execute("SELECT streams.set_partition_size(%s)", (cfg["part_size"],))
        out["replay"] = _replay(b, c)
    out["drop"] = _drop(b)


def _partitions(c):
    cols = ["partition", "oid", "first_position", "end_position", "size", "tablespace", "state"]
    rows = c.execute("SELECT partition::text, partition::oid, first_position, end_position, size, "
                     "tablespace, state FROM streams.partitions ORDER BY first_position NULLS FIRST").fetchall()
    return [dict(zip(cols, r)) for r in rows]


# --------------------------------------------------------------------------
# Publish
# --------------------------------------------------------------------------

def _publish(b):
    cfg = b.cfg
    clients = cfg["part_clients"]
    b.recreate_db()
    out = dict(clients=clients, reps=cfg["part_reps"], secs=cfg["part_secs"], runs={m[0]: [] for m in METHODS},
               catchup=[])
    with connect(DB) as c:
        c.execute((HERE / "partitions_schema.sql").read_text())
        # The first publish waits for the worker to make the first partition: before the runs.
        c.execute("SELECT streams.publish('bench.warmup', '{}')")
        b.wait_delivered(c)
        pids = {"worker": b.status(c)["worker_pid"]}
        for order in rotations(METHODS, cfg["part_reps"]):
            for key, label, script in order:
                c.execute("CHECKPOINT")
                r = b.run_pgbench(script, clients, cfg["part_secs"], f"partitions-{key}-c{clients}", pids)
                if key == "publish":
                    r["catchup_s"] = b.wait_delivered(c)
                    out["catchup"].append(r["catchup_s"])
                out["runs"][key].append(r)
                info(f"{label:<44} c={clients:<3} {r['tps']:>10,.0f} tps")
        out["partitions"] = _partitions(c)
    return out


# --------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------

def _replay(b, c):
    cfg = b.cfg
    total, n, page, chunk = cfg["part_events"], cfg["part_replay_events"], cfg["part_page"], cfg["part_chunk"]
    out = dict(events=total, replay_events=n, page=page, chunk=chunk)
    t = time.monotonic()
    c.execute(f"""
DO $$
BEGIN
FOR i IN 0..{total // chunk - 1} LOOP
    PERFORM count(*) FROM streams.publish_batch('payment.' || (i % 10),
        ARRAY(SELECT jsonb_build_object('order_id', 'ord_' || g, 'amount', (g % 10000) / 100.0)
              FROM generate_series(i * {chunk} + 1, (i + 1) * {chunk}) g ORDER BY g));
    COMMIT;
END LOOP;
END $$""")
    out["generate_s"] = time.monotonic() - t
    out["deliver_s"] = b.wait_delivered(c, timeout=600)
    # The first n positions, copied into the control.
    last = c.execute("SELECT position FROM streams.event_log ORDER BY position OFFSET %s LIMIT 1",
                     (n - 1,)).fetchone()[0]
    t = time.monotonic()
    c.execute("INSERT INTO bench_log_plain SELECT * FROM streams.event_log WHERE position <= %s ORDER BY position",
              (last,))
    out["copy_s"] = time.monotonic() - t
    c.execute("VACUUM (ANALYZE) streams.event_log, bench_log_plain")
    out["partitions"] = _partitions(c)
    info(f"{total:,} events published in {out['generate_s']:.1f} s into {len(out['partitions'])} partitions, "
         f"{n:,} copied into bench_log_plain in {out['copy_s']:.1f} s")
    # Page k reads the rows after the (k * page)-th: the same rows from both tables.
    afters = [0] + [r[0] for r in c.execute(
        "SELECT position FROM (SELECT position, row_number() OVER (ORDER BY position) AS k FROM bench_log_plain) s "
        "WHERE k %% %s = 0 AND k < %s ORDER BY position", (page, n)).fetchall()]
    pages = [(a, min(page, n - i * page)) for i, a in enumerate(afters)]
    out["pages"] = len(pages)

    def page_sql(table, after, limit):
        return f"SELECT * FROM {table} WHERE position > {after} ORDER BY position LIMIT {limit}"

    def scan_sql(table):
        return page_sql(table, 0, n)

    for _, table in TABLES:
        got = c.execute(f"SELECT count(*), sum(position) FROM ({scan_sql(table)}) s").fetchone()
        want = (n, c.execute(f"SELECT sum(position) FROM ({scan_sql('bench_log_plain')}) s").fetchone()[0])
        if tuple(got) != want:
            raise BenchError(f"{table}: the first {n:,} events are {got}, expected {want} (count, sum of positions)")

    def explain_s(sql):
        """(planning, execution) seconds of one query."""
        plan = c.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql).fetchone()[0][0]
        return plan["Planning Time"] / 1000.0, plan["Execution Time"] / 1000.0

    def pages_s(table):
        each = [explain_s(page_sql(table, a, lim)) for a, lim in pages]
        return sum(x[0] for x in each), sum(x[1] for x in each)

    forms = {"pages": pages_s, "scan": lambda table: explain_s(scan_sql(table))}
    out["plans"] = {key: {"page": [r[0] for r in c.execute("EXPLAIN " + page_sql(table, afters[-1], page))],
                          "scan": [r[0] for r in c.execute("EXPLAIN " + scan_sql(table))]}
                    for key, table in TABLES}
    (b.log_dir / "partitions-plans.txt").write_text("\n".join(
        f"-- {table} ({form})\n" + "\n".join(out["plans"][key][form]) + "\n"
        for key, table in TABLES for form in ("page", "scan")))
    for _, table in TABLES:  # warm-up
        for fn in forms.values():
            fn(table)
    times = {form: {key: [] for key, _ in TABLES} for form in forms}  # planning + execution
    planning = {form: {key: [] for key, _ in TABLES} for form in forms}
    for order in rotations(TABLES, cfg["part_reps"]):
        for key, table in order:
            for form, fn in forms.items():
                plan_s, exec_s = fn(table)
                times[form][key].append(plan_s + exec_s)
                planning[form][key].append(plan_s)
    out["times_s"], out["planning_s"] = times, planning
    out["events_per_s"] = {form: {k: n / med(v) for k, v in t.items()} for form, t in times.items()}
    for form in forms:
        e = out["events_per_s"][form]
        info(f"replay {form:<5} streams.event_log {e['log']:>11,.0f}/s, bench_log_plain {e['plain']:>11,.0f}/s: "
             f"{fx(e['log'] / e['plain'])}; planning " + " / ".join(
                 f"{med(planning[form][k]) * 1000:,.1f} ms" for k, _ in TABLES))
    return out


# --------------------------------------------------------------------------
# A partition dropped by retention while publishers run
# --------------------------------------------------------------------------

def _drop(b):
    cfg = b.cfg
    clients, rate = cfg["part_drop_clients"], cfg["part_drop_rate"]
    before_s, wait_s, after_s = cfg["part_drop_before_s"], cfg["part_drop_wait_s"], cfg["part_drop_after_s"]
    out = dict(clients=clients, rate=rate, before_s=before_s, after_s=after_s)
    with connect(DB) as c, connect(DB) as sampler:
        parts = _partitions(c)
        full = [p for p in parts if p["state"] == "full"]
        if not full or parts[0]["state"] != "full":
            raise BenchError(f"no full partition to drop: {parts}")
        first = parts[0]
        out["partition"] = first["partition"]
        out["partition_bytes"] = first["size"]
        out["partition_events"] = c.execute("SELECT count(*) FROM streams.event_log WHERE position < %s",
                                            (first["end_position"],)).fetchone()[0]
        out["partitions_before"] = parts
        watched = [c.execute("SELECT 'streams.event_log'::regclass::oid").fetchone()[0]] + [p["oid"] for p in full]
        c.execute("CHECKPOINT")
        b._log_seq += 1
        prefix = b.log_dir / f"{b._log_seq:03d}-pgbench-partitions-drop"
        secs = int(DROP_WARMUP_S + before_s + wait_s + 0.999)
        cmd = [b.pgbench, "-n", "-f", str(HERE / "publish.sql"), "-c", str(clients), "-j", str(min(2, clients)),
               "-R", str(rate), "-T", str(secs), "-l", f"--log-prefix={prefix}",
               "-h", PGHOST, "-p", str(PGPORT), "-U", PGUSER, DB]
        say(f"retention dropping {first['partition']} ({out['partition_events']:,} events, "
            f"{first['size'] / 2**20:,.0f} MiB) while pgbench -f publish.sql -c {clients} -R {rate} -T {secs} -l "
            "publishes")
        samples, t_set, t_gone = [], None, None
        q = ("SELECT (SELECT count(*) FROM pg_class WHERE oid = %s::oid) > 0, "
             "count(*) FILTER (WHERE l.granted), count(*) FILTER (WHERE NOT l.granted), "
             "(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND application_name = 'pgbench' AND wait_event_type = 'Lock') "
             "FROM pg_locks l WHERE l.locktype = 'relation' AND l.mode = 'AccessExclusiveLock' "
             "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
             "AND l.relation = ANY(%s::oid[])")
        with open(f"{prefix}.out", "w") as lf:
            lf.write(f"$ {' '.join(cmd)}\n\n")
            lf.flush()
            t_start = time.time()
            load = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
            try:
                while load.poll() is None:
                    t0 = time.time()
                    exists, held, awaited, waiting = sampler.execute(q, (first["oid"], watched)).fetchone()
                    samples.append(((t0 + time.time()) / 2, exists, held, awaited, waiting))
                    if t_set is None and t0 >= t_start + DROP_WARMUP_S + before_s:
                        t_set = time.time()
                        c.execute("SELECT streams.set_retention(max_age => '0 seconds')")
                    if t_gone is None and t_set is not None and not exists:
                        t_gone = samples[-1][0]
                        out["partitions_at_gone"] = _partitions(sampler)
                    time.sleep(SAMPLE_PAUSE_S)
            finally:
                if load.poll() is None:
                    load.kill()
                load.wait()
        if load.returncode != 0:
            raise BenchError(f"pgbench failed (exit {load.returncode}), see {prefix}.out")
        if t_set is None:
            raise BenchError(f"pgbench ended before retention was set, see {prefix}.out")
        deadline = time.monotonic() + 60
        while t_gone is None:  # the drop came after the load ended: its time, no latency under load
            if c.execute("SELECT count(*) FROM pg_class WHERE oid = %s::oid", (first["oid"],)).fetchone()[0] == 0:
                t_gone = time.time()
                out["partitions_at_gone"] = _partitions(c)
            elif time.monotonic() > deadline:
                raise BenchError(f"retention did not drop {first['partition']} within {time.time() - t_set:.0f} s "
                                 f"of streams.set_retention(max_age => '0 seconds')")
            else:
                time.sleep(0.05)
        out["partitions_after"] = _partitions(c)
        out["storage"] = dict(zip(["first_position", "cut_at"], c.execute(
            "SELECT first_position, cut_at::text FROM streams.storage").fetchone()))
    out["under_load"] = bool(samples) and t_gone <= samples[-1][0]
    out.update(_drop_window(samples, t_set, t_gone, out["under_load"]))
    # Dropped with the first (seen just after it was gone), and by the end of the run.
    out["dropped"], out["dropped_by_end"] = (
        [p["partition"] for p in out["partitions_before"] if p["partition"] not in {x["partition"] for x in after}]
        for after in (out["partitions_at_gone"], out["partitions_after"]))
    xacts = _pgbench_log(prefix)
    before = [x for x in xacts if t_start + DROP_WARMUP_S <= x[0] < t_set]
    during = [x for x in xacts if out["drop_start"] <= x[0] <= t_gone + after_s] \
        if out["under_load"] and t_gone + after_s <= t_start + secs else []
    out["before_ms"], out["during_ms"] = _lat_stats(before), _lat_stats(during)
    out["before_tps"] = len(before) / (t_set - t_start - DROP_WARMUP_S)
    out["set_to_gone_s"] = t_gone - t_set
    out["drop_start"] -= t_set  # relative to set_retention from here on
    info(f"{' and '.join(out['dropped'])} dropped {out['set_to_gone_s']:.1f} s after set_retention "
         f"({len(out['dropped_by_end'])} by the end of the run); the drop's lock "
         + (f"seen for {out['drop_ms']:.1f} ms" if out["seen"] else
            f"never seen (under the {out['gap_ms']:.1f} ms between samples)" if out["under_load"] else
            "not sampled (the load had ended)")
         + f", up to {out['publishers_waiting']} publishers waiting on a lock; latency p99 "
         + (f"{out['during_ms']['p99']:.2f} ms during (n={out['during_ms']['n']:,}) vs "
            if out["during_ms"] else "not measured during (the load had ended) vs ")
         + f"{out['before_ms']['p99']:.2f} ms before (n={out['before_ms']['n']:,})")
    return out


def _drop_window(samples, t_set, t_gone, under_load):
    """From the pg_locks samples: the stretch of consecutive samples showing an
    AccessExclusiveLock (held or awaited) on the log or a partition that ends
    where the partition disappears. Unseen (the drop fell between two
    samples): it started after the last sample that still saw the partition.
    Not under load (gone after the sampling ended): nothing to say."""
    gaps = [b_[0] - a[0] for a, b_ in zip(samples, samples[1:])]
    gap_ms = med(gaps) * 1000 if gaps else float("nan")
    if not under_load:
        return dict(seen=False, drop_start=t_gone, drop_ms=None, held_ms=None, publishers_waiting=0,
                    gap_ms=gap_ms, samples=len(samples))
    gone = next(i for i, s in enumerate(samples) if s[0] >= t_gone)
    i = gone
    while i > 0 and samples[i - 1][0] > t_set and samples[i - 1][2] + samples[i - 1][3] > 0:
        i -= 1
    stretch = samples[i:gone]
    seen = bool(stretch)
    start = stretch[0][0] if seen else (samples[gone - 1][0] if gone else t_set)
    held = [s[0] for s in stretch if s[2] > 0]
    return dict(seen=seen, drop_start=start, drop_ms=(t_gone - start) * 1000,
                held_ms=(t_gone - held[0]) * 1000 if held else 0.0,
                publishers_waiting=max((s[4] for s in stretch), default=0), gap_ms=gap_ms, samples=len(samples))


def _pgbench_log(prefix):
    """(completion time, latency ms, schedule lag ms) of every transaction
    in pgbench's per-transaction logs (-l -R; one file per thread: client_id
    xact_no latency_us script_no epoch_s epoch_us schedule_lag_us). With -R
    the latency counts from the transaction's scheduled start: a stall shows
    as the wait of the transactions due meanwhile; the lag is how late it
    started."""
    out = []
    for path in sorted(prefix.parent.glob(prefix.name + ".[0-9]*")):
        for line in path.read_text().splitlines():
            f = line.split()
            if len(f) >= 7 and f[2] != "skipped":
                out.append((int(f[4]) + int(f[5]) / 1e6, int(f[2]) / 1000.0, int(f[6]) / 1000.0))
    if not out:
        raise BenchError(f"no pgbench transaction log at {prefix}.*")
    return out


def _lat_stats(xacts):
    """Latency from the scheduled start, and in the transaction (without the schedule lag)."""
    if not xacts:
        return None
    lat, own = [x[1] for x in xacts], [x[1] - x[2] for x in xacts]
    return dict(n=len(lat), p50=pct(lat, 50), p99=pct(lat, 99), max=max(lat), own_p99=pct(own, 99))


# --------------------------------------------------------------------------
# Report (reads res["partitions"]; an older results.json has none)
# --------------------------------------------------------------------------

IDS = ["partitions_publish_vs_plain", "partitions_routing", "partitions_replay_pages", "partitions_replay_scan"]


def _tps(pub, key):
    return med([r["tps"] for r in pub["runs"][key]])


def values(res):
    p = res.get("partitions")
    if not p:
        return {k: None for k in IDS}
    pub, rep = p["publish"], p["replay"]
    e = rep["events_per_s"]
    n = dict(n=f0(rep["replay_events"]), page=f0(rep["page"]))
    return {
        "partitions_publish_vs_plain": dict(value=_tps(pub, "publish") / _tps(pub, "plain"), clients=pub["clients"]),
        "partitions_routing": dict(value=_tps(pub, "parted") / _tps(pub, "plain"), clients=pub["clients"]),
        "partitions_replay_pages": dict(value=e["pages"]["log"] / e["pages"]["plain"], **n),
        "partitions_replay_scan": dict(value=e["scan"]["log"] / e["scan"]["plain"], **n),
    }


def notes(res, short):
    if not short & set(IDS):
        return []
    p = res["partitions"]
    pub, rep = p["publish"], p["replay"]
    cpu = {k: runs_server_us(pub["runs"][k]) for k, _, _ in METHODS}
    return ["**the partitioned log:** server CPU per transaction at "
            f"{pub['clients']} clients: publish {cpu['publish']:.0f} µs, INSERT into the non-partitioned control "
            f"{cpu['plain']:.0f} µs, into the 1-partition control {cpu['parted']:.0f} µs. Replay plans: a page of "
            f"the log `{plan_shape(rep['plans']['log']['page'])}` against "
            f"`{plan_shape(rep['plans']['plain']['page'])}`; the scan "
            f"`{plan_shape(rep['plans']['log']['scan'])}` against `{plan_shape(rep['plans']['plain']['scan'])}`."]


def _ms_row(w, label, st):
    w(f"| {label} | {f0(st['n'])} | {fms(st['p50'])} | {fms(st['p99'])} | {fms(st['max'])} | {fms(st['own_p99'])} |"
      if st else f"| {label} | 0 | | | | |")


def section(res, w):
    p = res.get("partitions")
    if not p:
        return
    cfg = res["config"]
    pub, rep, dr = p["publish"], p["replay"], p["drop"]
    w("## 4b. The partitioned log")
    w("")
    w("`streams.event_log` is partitioned by range of position. Its controls (`bench/partitions_schema.sql`): "
      "`bench_log_plain`, a table with the columns of `streams.event_log` and the indexes the 0.2.0 log had "
      "(primary key on `position`, `(stream, position)`, BRIN on `tx` with the extension's operator class), "
      "not partitioned; and `bench_log_parted`, the same partitioned by range of `position` with one "
      "partition that takes every position. Each in a fresh database.")
    w("")
    w(f"**Publish**, one event per transaction, `pgbench -n -f <script> -c {pub['clients']} -j 2 -T {pub['secs']}`: "
      "`bench/publish.sql` (the first partition made by a publish before the runs), the same row INSERTed "
      "into `bench_log_plain` (`bench/partitions_plain_insert.sql`) and into `bench_log_parted` "
      "(`bench/partitions_parted_insert.sql`), "
      + (f"{pub['reps']} repetitions interleaved in rotating order, each after a `CHECKPOINT`; median tps, runs "
         "in brackets." if pub["reps"] > 1 else "one run each, after a `CHECKPOINT`."))
    w("")
    w("| write | tps | vs INSERT into bench_log_plain | server CPU per transaction |")
    w("| --- | --- | --- | --- |")
    base = _tps(pub, "plain")
    for key, label, _ in METHODS:
        v = [r["tps"] for r in pub["runs"][key]]
        w(f"| {label} | {f0(med(v))}" + (f" ({reps_str(v)})" if len(v) > 1 else "")
          + f" | {fx(med(v) / base)} | {runs_server_us(pub['runs'][key]):.0f} µs |")
    w("")
    e, t = rep["events_per_s"], rep["times_s"]
    w(f"**Replay**: {rep['events']:,} events published with `streams.publish_batch` ({rep['chunk']:,} per "
      f"transaction, 10 streams) into partitions of {cfg['part_size']:,} positions "
      f"(`streams.set_partition_size`; {len(rep['partitions'])} partitions), {rep['generate_s']:.1f} s; the "
      f"first {rep['replay_events']:,} copied into `bench_log_plain` (`INSERT ... SELECT`, "
      f"{rep['copy_s']:.1f} s), both vacuumed. Each read server-side (`EXPLAIN (ANALYZE, TIMING OFF)`, "
      f"planning + execution time), median of {len(t['pages']['log'])} interleaved runs after a warm-up: "
      f"{rep['pages']:,} pages `SELECT * FROM <table> WHERE position > $after ORDER BY position LIMIT "
      f"{rep['page']}` (the same page bounds on both), and one `... WHERE position > 0 ORDER BY position "
      f"LIMIT {rep['replay_events']}`.")
    w("")
    w("| read | streams.event_log | of it planning | bench_log_plain | of it planning | partitioned vs not |")
    w("| --- | --- | --- | --- | --- | --- |")
    pl = rep["planning_s"]
    for form, label in (("pages", f"{rep['pages']:,} pages of {rep['page']:,}"), ("scan", "one ordered scan")):
        w(f"| {label} | {med(t[form]['log']) * 1000:,.0f} ms ({f0(e[form]['log'])} events/s) | "
          f"{med(pl[form]['log']) * 1000:,.1f} ms | "
          f"{med(t[form]['plain']) * 1000:,.0f} ms ({f0(e[form]['plain'])} events/s) | "
          f"{med(pl[form]['plain']) * 1000:,.1f} ms | {fx(e[form]['log'] / e[form]['plain'])} |")
    w("")
    w(f"Plans: `{res['log_dir']}/partitions-plans.txt`.")
    w("")
    w(f"**Dropping a partition** of the same log: {dr['partition']} ({dr['partition_events']:,} events, "
      f"{dr['partition_bytes'] / 2**20:,.0f} MiB with its indexes) while `pgbench -f bench/publish.sql "
      f"-c {dr['clients']} -R {dr['rate']} -l` publishes; after {dr['before_s']} s, "
      "`streams.set_retention(max_age => '0 seconds')`. The worker dropped "
      f"{' and '.join(dr['dropped'])} {dr['set_to_gone_s']:.1f} s later (its maintenance runs every few seconds"
      + (f"; {len(dr['dropped_by_end'])} partitions by the end of the run" if dr["dropped_by_end"] != dr["dropped"]
         else "") + "). "
      "A client sampled `pg_locks` throughout (every "
      f"{dr['gap_ms']:.1f} ms, median): "
      + (f"the drop's AccessExclusiveLock on the log or the partition, awaited or held, was seen for "
         f"{dr['drop_ms']:.1f} ms ({dr['held_ms']:.1f} ms of it held) before the partition was gone, with up to "
         f"{dr['publishers_waiting']} publishers waiting on a lock." if dr["seen"] else
         "the drop's lock fell between two samples (it took less than the time between them)."
         if dr["under_load"] else "**the drop came after the load had ended**: no figures under load.")
      + f" Publish latency (from the scheduled start, pgbench's log), before: the {dr['before_s']} s before "
      f"`set_retention` ({f0(dr['before_tps'])} transactions/s done of the {f0(dr['rate'])} asked); during: from "
      f"the drop's start to {dr['after_s']} s after the partition was gone:")
    w("")
    w("| publishers | transactions | p50 | p99 | max | p99 in the transaction (without the schedule lag) |")
    w("| --- | --- | --- | --- | --- | --- |")
    _ms_row(w, "before the drop", dr["before_ms"])
    _ms_row(w, "during the drop", dr["during_ms"])
    w("")
    st = dr["storage"]
    w(f"Afterwards `streams.storage`: first_position {st['first_position']:,}, cut_at {st['cut_at']}."
      if st["first_position"] is not None else "Afterwards `streams.storage` shows no cut.")
    w("")
