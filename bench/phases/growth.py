"""5. The log's cost as it grows (make bench LARGE=1; a smoke run grows a
small log): one log grown to each size of growth_sizes and measured at each.
A full run without LARGE=1 reports the figures of the last LARGE=1 run, kept
in docs/bench-growth.json."""

import datetime as dt
import json
import time

from common import DB, connect, f0, fx, info, med, say

ORDER = 50
OWN_DB = True
OPTIONAL = True  # runs only with --large (or --quick), after every other phase
FULL = dict(growth_sizes=[1_000_000, 10_000_000, 50_000_000], growth_chunk=10_000)
QUICK = dict(growth_sizes=[20_000, 60_000], growth_chunk=10_000)


def run(b):
    """Grow one log to each size in cfg["growth_sizes"] and measure, at each:
    publish throughput, replay of the newest 100k events, replay of one
    stream, `since` lookups, storage per event and the primary key's depth."""
    cfg = b.cfg
    sizes, chunk = cfg["growth_sizes"], cfg["growth_chunk"]
    window = min(100_000, sizes[0] // 10)
    say(f"5. growth: one log grown to {', '.join(f'{n:,}' for n in sizes)} events "
        f"(publish_batch, {chunk:,} per transaction, 10 streams)")
    b.recreate_db()
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
            deliver_s = b.wait_delivered(c, timeout=3600)
            c.execute("VACUUM (ANALYZE) streams.event_log, streams.commit_times")
            have = c.execute("SELECT count(*) FROM streams.event_log").fetchone()[0]
            newest = c.execute("SELECT streams.horizon()").fetchone()[0]
            info(f"{have:,} events: grown in {fill_s:.0f} s, delivered {deliver_s:.1f} s later")

            def explain(sql):
                """Execution seconds, blocks read from disk, planning seconds."""
                plan = c.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) " + sql).fetchone()[0][0]
                return (plan["Execution Time"] / 1000.0, plan["Plan"].get("Shared Read Blocks", 0),
                        plan["Planning Time"] / 1000.0)

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
            # The same stream's events, filtered by data (one amount per
            # 10,000-event chunk matches): the scan of one stream's range
            # with a test per event.
            filter_sql = (f"SELECT * FROM streams.replay(stream => '{stream}', after => {stream_after}, "
                          f"""filter => '{{"amount": 12.34}}', max_events => {window})""")
            newest_s, newest_reads = median_of(newest_sql)
            stream_s, _ = median_of(stream_sql)
            filter_s, _ = median_of(filter_sql)
            # `since` at 20 points spread over the log's time range.
            lo, hi = c.execute("SELECT min(time), max(time) FROM streams.events").fetchone()
            since_ms, since_plan_ms = [], []
            for k in range(20):
                at = lo + (hi - lo) * (k + 0.5) / 20
                run_s, _, plan_s = explain(
                    f"SELECT * FROM streams.replay(since => '{at.isoformat()}', max_events => 100)")
                since_ms.append(run_s * 1000)
                since_plan_ms.append(plan_s * 1000)
            # The log is partitioned: its partitions' sizes, and the levels of
            # the deepest partition's primary key.
            size_bytes = c.execute(
                "SELECT (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0) "
                "        FROM pg_partition_tree('streams.event_log') t WHERE t.isleaf) + "
                "pg_total_relation_size('streams.commit_times')").fetchone()[0]
            size_bytes = int(size_bytes)  # sum() of bigints is a numeric
            levels = c.execute(
                "SELECT max(m.level) + 1 FROM pg_partition_tree('streams.event_log') t "
                "JOIN pg_index i ON i.indrelid = t.relid AND i.indisprimary "
                "CROSS JOIN LATERAL bt_metap(i.indexrelid::regclass::text) m WHERE t.isleaf").fetchone()[0]
            r = b.run_pgbench("publish.sql", 8, cfg["secs"], f"growth-{size}-publish-c8")
            point = dict(events=have, fill_s=fill_s, deliver_s=deliver_s, publish_tps=r["tps"],
                         replay_newest_eps=window / newest_s, replay_newest_read_blocks=newest_reads,
                         replay_stream_eps=stream_rows / stream_s, replay_filter_eps=stream_rows / filter_s,
                         since_ms=med(since_ms), since_plan_ms=med(since_plan_ms),
                         partitions=c.execute("SELECT count(*) FROM pg_partition_tree('streams.event_log') t "
                                              "WHERE t.isleaf").fetchone()[0],
                         bytes_per_event=size_bytes / have, btree_levels=levels,
                         relation_bytes=size_bytes)
            points.append(point)
            info(f"publish {r['tps']:,.0f} tps; replay newest {window:,}: {point['replay_newest_eps']:,.0f}/s; "
                 f"one stream {point['replay_stream_eps']:,.0f}/s; filtered {point['replay_filter_eps']:,.0f}/s; "
                 f"since {point['since_ms']:.2f} ms (+ {point['since_plan_ms']:.2f} ms planning, "
                 f"{point['partitions']} partitions); "
                 f"{point['bytes_per_event']:.0f} B/event; primary key {levels} levels")
            have = c.execute("SELECT count(*) FROM streams.event_log").fetchone()[0]
        shared_buffers = c.execute("SHOW shared_buffers").fetchone()[0]
    b.res["growth"] = dict(window=window, chunk=chunk, points=points, shared_buffers=shared_buffers,
                           measured_at=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def finish(res, out_dir, quick):
    """Keep a full LARGE=1 run's figures in docs/bench-growth.json; a full run
    without it reports those."""
    growth_file = out_dir / "bench-growth.json"
    if "growth" in res and not quick:
        growth_file.write_text(json.dumps(res["growth"], indent=1, default=str) + "\n")
    elif "growth" not in res and growth_file.exists():
        res["growth"] = json.loads(growth_file.read_text())


# --------------------------------------------------------------------------
# Report (reads res["growth"], when there is one)
# --------------------------------------------------------------------------

def section(res, w):
    g = res.get("growth")
    if g:
        pts = g["points"]
        w("## 5. The log's cost as it grows")
        w("")
        w(f"`make bench LARGE=1`, measured {g['measured_at']}: one log grown with `publish_batch` "
          f"({g['chunk']:,} events per transaction, 10 streams) and measured at each size: publish "
          f"throughput (`pgbench -f bench/publish.sql -c 8`), replay of the newest {g['window']:,} events and "
          f"of one stream's newest {g['window']:,} (server-side EXPLAIN ANALYZE, median of 3, warm cache), "
          "the same stream's range filtered by data (`filter => '{\"amount\": 12.34}'`, one event in "
          "10,000 matches; events of the stream scanned per second), "
          "a `since` lookup (`replay(since => ..., max_events => 100)` at 20 points over the log's time "
          "range, median; its execution, then its planning, which grows with the number of partitions: "
          "the start of a `since` is found when the query runs, so the planner cannot prune), "
          f"storage per event and the depth of the deepest partition's primary key. "
          f"shared_buffers: {g['shared_buffers']}.")
        w("")
        w("| events | partitions | publish (events/s) | replay newest (events/s) | blocks read from disk | "
          "replay one stream (events/s) | one stream filtered (events/s) | `since` lookup (planning) | "
          "bytes/event | primary key levels | grown in |")
        w("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for pt in pts:
            filtered = f0(pt["replay_filter_eps"]) if "replay_filter_eps" in pt else "-"
            planning = f" ({pt['since_plan_ms']:.2f} ms)" if "since_plan_ms" in pt else ""
            w(f"| {f0(pt['events'])} | {pt.get('partitions', '-')} | {f0(pt['publish_tps'])} | "
              f"{f0(pt['replay_newest_eps'])} | {f0(pt['replay_newest_read_blocks'])} | "
              f"{f0(pt['replay_stream_eps'])} | {filtered} | {pt['since_ms']:.2f} ms{planning} | "
              f"{pt['bytes_per_event']:.0f} | {pt['btree_levels']} | {pt['fill_s']:.0f} s |")
        first, last = pts[0], pts[-1]
        w("")
        w(f"From {f0(first['events'])} to {f0(last['events'])} events (target: within 10%): publish "
          f"{fx(last['publish_tps'] / first['publish_tps'])}, replay of the newest events "
          f"{fx(last['replay_newest_eps'] / first['replay_newest_eps'])}, replay of one stream "
          f"{fx(last['replay_stream_eps'] / first['replay_stream_eps'])}"
          + (f", one stream filtered {fx(last['replay_filter_eps'] / first['replay_filter_eps'])}"
             if "replay_filter_eps" in last and "replay_filter_eps" in first else "")
          + f" (target for the one-stream replays: at least 0.80x), `since` lookup "
          f"{fx(last['since_ms'] / first['since_ms'])} the time. Publish figures come from separate "
          "short runs on a shared machine and move by about 10% between runs of the same size.")
        w("")

