"""3. Replay throughput over N events (1M): streams.replay(), the
streams.events view and a raw ordered scan of a plain copy of the same rows,
each timed server-side, as count(*) and as COPY to a client; a filtered
replay of one stream (types => ..., filter => ...: 10% of its events match)
against the unfiltered one. Also measures the storage of that data set
(section 4)."""

import os
import re
import subprocess
import time

from common import (CHANNEL, DB, PGHOST, PGPORT, PGUSER, BenchError, connect, f0, fx, info, med, pg_bindir,
                    rotations, say)

ORDER = 30
OWN_DB = True
FULL = dict(replay_events=1_000_000, replay_chunk=1000, replay_reps=3)
QUICK = dict(replay_events=10_000, replay_chunk=1000, replay_reps=1)

# The expected row count of a filtered query: counted from the log itself.
FILTERED = object()

# Streams of the replay data set (events rotate over them, one stream per chunk).
REPLAY_STREAMS = [
    "payment.success", "payment.failed", "order.created", "order.shipped", "user.signup",
    "user.login", "cart.updated", "invoice.sent", "refund.issued", "stock.changed",
]


def run(b):
    cfg = b.cfg
    N, chunk = cfg["replay_events"], cfg["replay_chunk"]
    say(f"3. replay: {N:,} events (publish_batch, {chunk:,} per transaction, "
        f"{len(REPLAY_STREAMS)} streams), fresh database")
    b.recreate_db()
    arr = "ARRAY[" + ",".join(f"'{s}'" for s in REPLAY_STREAMS) + "]"
    gen = f"""
DO $$
DECLARE
s text[] := {arr};
i int;
BEGIN
FOR i IN 0..{N // chunk - 1} LOOP
    PERFORM count(*) FROM streams.publish_batch(s[1 + i % {len(REPLAY_STREAMS)}],
        ARRAY(SELECT jsonb_build_object('order_id', 'ord_' || g, 'amount', (g % 10000) / 100.0,
                                        'region', 'r' || (g % 10))
              FROM generate_series(i * {chunk} + 1, (i + 1) * {chunk}) g ORDER BY g),
        type => 't' || ((i / {len(REPLAY_STREAMS)}) % 10));
    COMMIT;
END LOOP;
END $$"""
    rep = {}
    with connect(DB) as c:
        t = time.monotonic()
        c.execute(gen)
        rep["generate_s"] = time.monotonic() - t
        rep["deliver_s"] = b.wait_delivered(c, timeout=600)
        info(f"published in {rep['generate_s']:.1f} s, all delivered "
             f"{rep['deliver_s']:.1f} s later")
        n_final = c.execute("SELECT count(*) FROM streams.events").fetchone()[0]
        if n_final != N:
            raise BenchError(f"streams.events has {n_final} events, expected {N}")
        t = time.monotonic()
        c.execute("""CREATE TABLE bench_raw AS
                     SELECT position, stream, time, tx, data FROM streams.events ORDER BY position""")
        c.execute("ALTER TABLE bench_raw ADD PRIMARY KEY (position)")
        c.execute("CREATE INDEX ON bench_raw (stream, position)")
        c.execute("""INSERT INTO bench_plain (id, stream, tx, time, data)
                     SELECT position, stream, tx, time, data FROM streams.events ORDER BY position""")
        c.execute("VACUUM (ANALYZE) bench_raw")
        rep["copy_s"] = time.monotonic() - t
        say("storage of the replay data set")
        b.res["storage_batch"] = b.storage(c, "bench_plain")
        # Readers that are not the owner: one granted '*', one granted only
        # the prefix of one stream (the privilege test runs per row).
        c.execute("DROP ROLE IF EXISTS bench_reader_all")
        c.execute("DROP ROLE IF EXISTS bench_reader_prefix")
        c.execute("CREATE ROLE bench_reader_all; CREATE ROLE bench_reader_prefix")
        c.execute("SELECT streams.grant('read', '*', 'bench_reader_all')")
        c.execute(f"SELECT streams.grant('read', '{CHANNEL.split('.')[0]}.*', 'bench_reader_prefix')")
        queries = [
            ("replay", "streams.replay()",
             f"SELECT * FROM streams.replay(max_events => {N})", N),
            ("replay_granted", "streams.replay() as a role granted '*'",
             f"SELECT * FROM streams.replay(max_events => {N})", N, "bench_reader_all"),
            ("view", "streams.events view",
             "SELECT * FROM streams.events WHERE position > 0 ORDER BY position", N),
            ("raw", "raw ordered scan of bench_raw",
             "SELECT * FROM bench_raw ORDER BY position", N),
            # A control, not a target: the raw scan computing one column per
            # row, as the view computes "time". Without a computed column the
            # scan returns its rows unprojected, never taking them apart.
            ("raw_computed", "raw ordered scan computing one column",
             "SELECT position, stream, time + interval '0' AS time, tx, data FROM bench_raw ORDER BY position", N),
            ("replay_stream", "streams.replay(stream => ...), one stream",
             f"SELECT * FROM streams.replay(stream => '{CHANNEL}', max_events => {N})", None),
            ("raw_stream", "raw ordered scan of one stream",
             f"SELECT * FROM bench_raw WHERE stream = '{CHANNEL}' ORDER BY position", None),
            ("replay_stream_prefix", "one stream, as a role granted its prefix only",
             f"SELECT * FROM streams.replay(stream => '{CHANNEL}', max_events => {N})", None,
             "bench_reader_prefix"),
            # Filtered: 10% of the stream's events have the type, 10% the region.
            ("replay_stream_types", "one stream, types => one of ten",
             f"SELECT * FROM streams.replay(stream => '{CHANNEL}', types => ARRAY['t0'], max_events => {N})",
             FILTERED),
            ("replay_stream_filter", "one stream, filter => data @> {\"region\":\"r3\"}",
             f"SELECT * FROM streams.replay(stream => '{CHANNEL}', filter => '{{\"region\":\"r3\"}}', "
             f"max_events => {N})", FILTERED),
        ]
        queries = [q if len(q) == 5 else q + (None,) for q in queries]
        stream_n = c.execute("SELECT count(*) FROM bench_raw WHERE stream = %s",
                             (CHANNEL,)).fetchone()[0]
        # What a filtered query must return, counted without the filters.
        filtered_n = {
            "replay_stream_types": c.execute("SELECT count(*) FROM streams.event_log WHERE stream = %s AND type = 't0'",
                                             (CHANNEL,)).fetchone()[0],
            "replay_stream_filter": c.execute(
                "SELECT count(*) FROM streams.event_log WHERE stream = %s AND data->>'region' = 'r3'",
                (CHANNEL,)).fetchone()[0],
        }
        # Three ways to time each query:
        #   server: EXPLAIN (ANALYZE, TIMING OFF) of the SELECT *: every row is
        #           produced in full on the server and discarded there;
        #   count:  the same for SELECT count(*) FROM (<query>) s, where the planner
        #           may drop the columns nobody reads (an index-only scan on bench_raw);
        #   copy:   wall time of psql running COPY (<query>) TO STDOUT into /dev/null:
        #           rows formatted as text and sent to a client, as a consumer gets them.
        def count_sql(sql):
            return f"SELECT count(*) FROM ({sql}) s"

        def as_role(role, fn):
            if role:
                c.execute(f"SET ROLE {role}")
            try:
                return fn()
            finally:
                if role:
                    c.execute("RESET ROLE")

        def explain_s(sql, role=None):
            plan = as_role(role, lambda: c.execute(
                "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql).fetchone()[0])
            return plan[0]["Execution Time"] / 1000.0

        psql = os.path.join(pg_bindir(), "psql")

        def copy_s(sql, role=None):
            cmd = [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", PGHOST, "-p", str(PGPORT),
                   "-U", PGUSER, "-d", DB] + (["-c", f"SET ROLE {role}"] if role else []) + \
                  ["-c", f"COPY ({sql}) TO STDOUT"]
            t = time.monotonic()
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                raise BenchError(f"psql COPY failed: {r.stderr[-1000:]}")
            return time.monotonic() - t

        forms = {"server": explain_s, "count": lambda q, r=None: explain_s(count_sql(q), r),
                 "copy": copy_s}
        plans, rep["plans"] = [], {}
        for key, label, sql, expect, role in queries:
            got = as_role(role, lambda: c.execute(count_sql(sql)).fetchone()[0])  # check the row count
            want = filtered_n[key] if expect is FILTERED else expect if expect is not None else stream_n
            if got != want:
                raise BenchError(f"{label}: counted {got} rows, expected {want}")
            for form in ("server", "count"):
                q = sql if form == "server" else count_sql(sql)
                plan = as_role(role, lambda: c.execute("EXPLAIN " + q).fetchall())
                rep["plans"].setdefault(key, {})[form] = [r[0] for r in plan]
                plans.append(f"-- {label} ({form})\n{q}\n" + "\n".join(r[0] for r in plan) + "\n")
            for fn in forms.values():  # warm-up
                fn(sql, role)
        (b.log_dir / "replay-plans.txt").write_text("\n".join(plans))
        times = {form: {q[0]: [] for q in queries} for form in forms}
        for order in rotations(queries, cfg["replay_reps"]):
            for key, label, sql, _, role in order:
                for form, fn in forms.items():
                    times[form][key].append(fn(sql, role))
    rep["rows"] = {q[0]: (filtered_n[q[0]] if q[3] is FILTERED else q[3] if q[3] is not None else stream_n)
                   for q in queries}
    rep["labels"] = {q[0]: q[1] for q in queries}
    rep["sql"] = {q[0]: q[2] for q in queries}
    rep["times_s"] = times
    rep["events_per_s"] = {form: {k: rep["rows"][k] / med(v) for k, v in t.items()}
                           for form, t in times.items()}
    b.res["replay"] = rep
    for k, label in rep["labels"].items():
        info(f"{label:<44} " + "  ".join(
            f"{form} {rep['events_per_s'][form][k]:>11,.0f}/s" for form in forms))


# --------------------------------------------------------------------------
# Report (reads res["replay"])
# --------------------------------------------------------------------------

def values(res):
    rep = res["replay"]
    eps = rep["events_per_s"]["server"]
    return {
        "replay_vs_raw": dict(value=eps["replay"] / eps["raw"]),
        "replay_granted_vs_owner": dict(value=eps["replay_granted"] / eps["replay"]),
        "view_vs_raw": dict(value=eps["view"] / eps["raw"]),
        "replay_stream_vs_raw": dict(value=eps["replay_stream"] / eps["raw_stream"],
                                     n=f0(rep["rows"]["replay_stream"])) if "replay_stream" in eps else None,
    }


def plan_shape(lines):
    """'Sort <- Hash Join <- Index Scan using event_log_pkey on event_log e ...' from EXPLAIN text."""
    nodes = []
    for line in lines:
        mt = re.match(r"\s*(?:->\s*)?([A-Z][A-Za-z ]+?(?: using \S+)?(?: on \S+(?: \w+)?)?)\s+\(cost", line)
        if mt:
            nodes.append(mt.group(1))
    return ", ".join(nodes)


def notes(res, short):
    if not short & {"replay_vs_raw", "replay_granted_vs_owner", "view_vs_raw", "replay_stream_vs_raw"}:
        return []
    rep = res["replay"]
    e = rep["events_per_s"]
    one_stream = computed = ""
    if "raw_computed" in e["server"]:
        computed = (
            " Server-side, the raw scan returns its rows as stored, never taking them apart; the same "
            "scan computing one column per row (`time + interval '0'`), as the view computes `time`, "
            f"runs at {e['server']['raw_computed'] / e['server']['raw']:.2f}x the plain raw scan, and the "
            f"view at {e['server']['view'] / e['server']['raw_computed']:.2f}x that scan.")
    if "replay_stream_vs_raw" in short:
        one_stream = (
            f" One stream: `{plan_shape(rep['plans']['replay_stream']['server'])}` against "
            f"`{plan_shape(rep['plans']['raw_stream']['server'])}`; to a client "
            f"{e['copy']['replay_stream'] / e['copy']['raw_stream']:.2f}x.")
    return [
        "**replay:** `streams.replay()` is inlined into the query and reads through the "
        "`streams.events` view, which adds the horizon test and each event's commit time "
        "(`streams._commit_time(position)`: an array lookup in the `streams.commit_times` row it "
        "read last) to the scan of `streams.event_log`. The view's plan nodes here: "
        f"`{plan_shape(rep['plans']['view']['server'])}` against `{plan_shape(rep['plans']['raw']['server'])}` "
        f"for the raw scan. Received by a client (COPY), the gap narrows to "
        f"{e['copy']['replay'] / e['copy']['raw']:.2f}x (replay) and "
        f"{e['copy']['view'] / e['copy']['raw']:.2f}x (view), since formatting and sending rows "
        "costs the same on both sides." + computed + one_stream]


def section(res, w):
    cfg, rep = res["config"], res["replay"]
    N = cfg["replay_events"]
    w("## 3. Replay throughput")
    w("")
    w(f"Data set: {N:,} events (payload like `{{\"order_id\":\"ord_1\",\"amount\":0.01}}`) "
      f"published with `streams.publish_batch` in a DO block, {cfg['replay_chunk']:,} events per "
      f"transaction (COMMIT per chunk), rotating over {len(REPLAY_STREAMS)} streams: "
      f"{rep['generate_s']:.1f} s to publish ({f0(N / rep['generate_s'])} events/s), all "
      f"delivered {rep['deliver_s']:.1f} s later. `bench_raw` is `CREATE TABLE AS SELECT` of the "
      "same rows (`position, stream, time, tx, data`) with a primary key on `position` and an "
      "index on `(stream, position)`; every table vacuumed. Each query is timed three ways, "
      f"median of {cfg['replay_reps']} interleaved runs after a warm-up:")
    w("")
    w("- **server** (the figure the targets use): `EXPLAIN (ANALYZE, TIMING OFF)` of the query "
      "itself, execution time: every row is read from the table (or produced by the function) "
      "on the server and discarded there, nothing is sent;")
    w("- **count(\\*)**: the same for `SELECT count(*) FROM (<query>) s`. Here the planner may "
      "drop the columns nobody reads: on `bench_raw` this becomes an index-only scan that never "
      "visits the table, so it is not a like-for-like baseline;")
    w("- **to client**: wall time of `psql -c \"COPY (<query>) TO STDOUT\" > /dev/null`, rows "
      "formatted as text and sent over the socket, as a consumer receives them (includes psql's "
      "connection set-up).")
    w("")
    w("| query | rows | server | events/s | vs raw | count(\\*): events/s | vs raw | to client: events/s | vs raw |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = [("replay", "raw"), ("replay_granted", "raw"), ("view", "raw"), ("raw", "raw"), ("raw_computed", "raw"),
            ("replay_stream", "raw_stream"), ("replay_stream_prefix", "raw_stream"), ("raw_stream", "raw_stream")]
    for key, base in [r for r in rows if r[0] in rep["labels"]]:
        e = rep["events_per_s"]
        t = med(rep["times_s"]["server"][key])
        w(f"| {rep['labels'][key]}: `{rep['sql'][key]}` | {f0(rep['rows'][key])} | "
          f"{t * 1000:,.0f} ms | {f0(e['server'][key])} | {fx(e['server'][key] / e['server'][base])} | "
          f"{f0(e['count'][key])} | {fx(e['count'][key] / e['count'][base])} | "
          f"{f0(e['copy'][key])} | {fx(e['copy'][key] / e['copy'][base])} |")
    w("")
    filtered = [k for k in ("replay_stream_types", "replay_stream_filter") if k in rep["labels"]]
    if filtered:
        w("**Filtered replay of one stream** (every event of the data set has a `type`, `t0` to `t9` by "
          "chunk, and a `region`, `r0` to `r9`, in its data; 10% of the stream's events match each filter). "
          "The filtered replay scans the same (stream, position) range and tests each event, so its time "
          "against the unfiltered replay is what the filter costs or saves; no GIN or expression index:")
        w("")
        w("| query | rows | server | vs unfiltered (time) | to client | vs unfiltered (time) |")
        w("| --- | --- | --- | --- | --- | --- |")
        base_s = {form: med(rep["times_s"][form]["replay_stream"]) for form in ("server", "copy")}
        for key in ["replay_stream"] + filtered:
            ts = {form: med(rep["times_s"][form][key]) for form in ("server", "copy")}
            w(f"| {rep['labels'][key]}: `{rep['sql'][key]}` | {f0(rep['rows'][key])} | {ts['server'] * 1000:,.0f} ms | "
              f"{fx(ts['server'] / base_s['server'])} | {ts['copy'] * 1000:,.0f} ms | {fx(ts['copy'] / base_s['copy'])} |")
        w("")
    w("The rows \"as a role granted ...\" run the same query after `SET ROLE` to a role that is "
      "neither owner nor superuser: row-level security on the log applies the read grants "
      "(`'*'`: one boolean test per row; a prefix: a pattern match per row).")
    w("")
    w(f"Plans: `{res['log_dir']}/replay-plans.txt`.")
    w("")

