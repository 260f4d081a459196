"""1. Publish throughput (pgbench, 1/8/32 clients): streams.publish vs a plain
INSERT of the same row vs INSERT + pg_notify in the same transaction, with the
delivery worker running and a LISTEN client draining "payment.success";
publish_batch of 100 events vs a 100-row INSERT; publish vs plain INSERT at
sync_off_clients with synchronous_commit = off (PGOPTIONS for pgbench, as the
lag runs of section 2 set it); PgQ's pgq.insert_event as a peer at
pgq_clients (skipped, with the reason in the report, where the pgq extension
cannot be installed); publish with an envelope (type, key, traceparent),
with an idempotency key and with expected_prev beside publish without, at
envelope_clients. Also measures the storage of the one-event-per-transaction
runs (section 4)."""

from common import (CHANNEL, DB, Listener, connect, f0, fx, info, med, reps_str, rotations, say)
from phases.consume import ensure_pgq

ORDER = 10
FULL = dict(secs=8, reps=3, clients=[1, 8, 32], batch_clients=8, sync_off_clients=32, pgq_clients=[1, 8, 32],
            envelope_clients=8)
# The smoke run installs PgQ and creates its queue but runs no PgQ pgbench: it
# must stay under a minute (make test), and was at 55-58 s without it.
QUICK = dict(secs=1, reps=1, clients=[1, 32], batch_clients=8, sync_off_clients=32, pgq_clients=[],
             envelope_clients=8)

# The three single-event methods (pgbench scripts in bench/), in report order.
METHODS = [
    ("publish", "streams.publish", "publish.sql"),
    ("plain", "plain INSERT", "plain_insert.sql"),
    ("notify", "INSERT + pg_notify", "in_tx_notify.sql"),
]
BATCH_METHODS = [
    ("publish_batch", "streams.publish_batch (100 events)", "publish_batch.sql"),
    ("plain_batch", "100-row INSERT", "plain_insert_batch.sql"),
]
BATCH_SIZE = 100
# Publish vs plain INSERT again at cfg["sync_off_clients"], with synchronous_commit = off.
SYNC_OFF_METHODS = METHODS[:2]
SYNC_OFF = "-c synchronous_commit=off"
# Publish with what issue 25 added, against publish without, at cfg["envelope_clients"].
ENVELOPE_METHODS = [
    ("publish", "publish", "publish.sql"),
    ("envelope", "publish + type, key, traceparent", "publish_envelope.sql"),
    ("idempotent", "publish + idempotency_key", "publish_idempotent.sql"),
    ("head", "read the head + publish", "publish_head.sql"),
    ("expected", "read the head + publish + expected_prev", "publish_expected.sql"),
]
# What each is compared with: expected_prev with the same read of the head.
ENVELOPE_BASELINE = dict(envelope="publish", idempotent="publish", head="publish", expected="head")
# The peer, at cfg["pgq_clients"], interleaved with the three above.
PGQ_METHOD = ("pgq", "PgQ insert_event", "pgq_insert.sql")
PGQ_QUEUE = "bench_publish"


def _setup_pgq(b):
    """Install PgQ and create its queue: {"skipped": None or why not, ...}."""
    out = dict(skipped=None, queue=PGQ_QUEUE)
    with connect(DB) as c:
        out["skipped"] = ensure_pgq(c)
        if out["skipped"] is None:
            try:
                c.execute("CREATE EXTENSION IF NOT EXISTS pgq")
                out["version"] = c.execute("SELECT pgq.version()").fetchone()[0]
                c.execute("SELECT pgq.create_queue(%s)", (PGQ_QUEUE,))
            except Exception as e:  # noqa: BLE001 (any failure: skip PgQ, say why)
                out["skipped"] = f"PgQ setup failed: {type(e).__name__}: {e}"
    if out["skipped"] is None and not b.cfg["pgq_clients"]:
        out["skipped"] = f"not run in a smoke run (PgQ {out['version']} installed, queue `{PGQ_QUEUE}` created)"
    if out["skipped"]:
        info(f"PgQ insert_event skipped: {out['skipped']}")
    return out


def run(b):
    cfg = b.cfg
    say(f"1. publish throughput: {', '.join(m[1] for m in METHODS)} at "
        f"{cfg['clients']} clients, {PGQ_METHOD[1]} at {cfg['pgq_clients']}, "
        f"{cfg['reps']} x {cfg['secs']} s each, interleaved")
    pgq = _setup_pgq(b)
    runs = {m[0]: {n: [] for n in cfg["clients"]} for m in METHODS}
    if pgq["skipped"] is None:
        runs["pgq"] = {n: [] for n in cfg["clients"] if n in cfg["pgq_clients"]}
    catchup = {n: [] for n in cfg["clients"]}
    batch = {m[0]: [] for m in BATCH_METHODS}
    notified_xacts = 0
    lst = Listener(b.ctx, DB, CHANNEL, record=False).start()
    try:
        with connect(DB) as c:
            pids = {"worker": b.status(c)["worker_pid"], "listener": lst.proc.pid}
            for clients in cfg["clients"]:
                methods = METHODS + ([PGQ_METHOD] if clients in runs.get("pgq", {}) else [])
                for order in rotations(methods, cfg["reps"]):
                    for key, label, script in order:
                        c.execute("CHECKPOINT")
                        r = b.run_pgbench(script, clients, cfg["secs"], f"{key}-c{clients}", pids)
                        if key == "publish":
                            r["catchup_s"] = b.wait_delivered(c)
                            catchup[clients].append(r["catchup_s"])
                        if key == "notify":
                            notified_xacts += r["xacts"]
                        runs[key][clients].append(r)
                        info(f"{label:<20} c={clients:<3} {r['tps']:>10,.0f} tps"
                             + (f"  (delivered {r['catchup_s'] * 1000:.0f} ms after the run)"
                                if "catchup_s" in r else ""))
            say("storage after the single-event runs (one event per transaction)")
            b.res["storage_single"] = b.storage(c, "bench_plain")
            for order in rotations(BATCH_METHODS, cfg["reps"]):
                for key, label, script in order:
                    c.execute("CHECKPOINT")
                    r = b.run_pgbench(script, cfg["batch_clients"], cfg["secs"],
                                  f"{key}-c{cfg['batch_clients']}", pids)
                    if key == "publish_batch":
                        r["catchup_s"] = b.wait_delivered(c)
                    r["events_per_s"] = r["tps"] * BATCH_SIZE
                    batch[key].append(r)
                    info(f"{label:<36} c={cfg['batch_clients']:<3} "
                         f"{r['events_per_s']:>10,.0f} events/s")
            sync_off = _sync_off(b, c, pids)
            envelope = _envelope(b, c, pids)
            # Every notification must reach the LISTEN client exactly once:
            # one per event published on the channel, one per notify transaction.
            published = c.execute("SELECT count(*) FROM streams.event_log WHERE stream = %s",
                                  (CHANNEL,)).fetchone()[0]
            expected = published + notified_xacts
            lst.wait_count(expected, 60)
    finally:
        received, _ = lst.finish()
    b.res["throughput"] = dict(runs=runs, catchup=catchup, batch=batch, sync_off=sync_off, envelope=envelope,
                               listener=dict(expected=expected, received=received), pgq=pgq)
    if received != expected:
        info(f"WARNING: the LISTEN client received {received:,} notifications, expected {expected:,}")


def _sync_off(b, c, pids):
    """Publish vs plain INSERT with synchronous_commit = off for pgbench's
    sessions (the server's setting is untouched, nothing to undo)."""
    clients = b.cfg["sync_off_clients"]
    say(f"publish vs plain INSERT, synchronous_commit = off, {clients} clients")
    out = dict(clients=clients, runs={m[0]: [] for m in SYNC_OFF_METHODS}, catchup=[])
    for order in rotations(SYNC_OFF_METHODS, b.cfg["reps"]):
        for key, label, script in order:
            c.execute("CHECKPOINT")
            r = b.run_pgbench(script, clients, b.cfg["secs"], f"{key}-sync-off-c{clients}", pids,
                              pgoptions=SYNC_OFF)
            if key == "publish":
                r["catchup_s"] = b.wait_delivered(c)
                out["catchup"].append(r["catchup_s"])
            out["runs"][key].append(r)
            info(f"{label:<20} c={clients:<3} {r['tps']:>10,.0f} tps, synchronous_commit = off"
                 + (f"  (delivered {r['catchup_s'] * 1000:.0f} ms after the run)" if "catchup_s" in r else ""))
    return out


def _envelope(b, c, pids):
    """publish without and with an envelope, an idempotency key or
    expected_prev, interleaved, at cfg["envelope_clients"]."""
    clients = b.cfg["envelope_clients"]
    say(f"publish with an envelope, an idempotency key, expected_prev, {clients} clients")
    out = dict(clients=clients, runs={m[0]: [] for m in ENVELOPE_METHODS})
    for order in rotations(ENVELOPE_METHODS, b.cfg["reps"]):
        for key, label, script in order:
            c.execute("CHECKPOINT")
            r = b.run_pgbench(script, clients, b.cfg["secs"], f"{key}-envelope-c{clients}", pids)
            out["runs"][key].append(r)
            info(f"{label:<34} c={clients:<3} {r['tps']:>10,.0f} tps")
    return out


def envelope_med(res, key):
    return med([r["tps"] for r in res["throughput"]["envelope"]["runs"][key]])


# --------------------------------------------------------------------------
# Report (reads res["throughput"] only)
# --------------------------------------------------------------------------

def _top(res):
    return max(res["config"]["clients"])


def tps_med(res, key, n):
    return med([r["tps"] for r in res["throughput"]["runs"][key][n]])


def runs_cpu(runs, what):
    """Median CPU share of these pgbench runs: "machine" (% of all CPUs),
    "server", "worker", "listener" (% of one CPU)."""
    v = [r["cpu"][what] for r in runs if r["cpu"].get(what) is not None]
    return med(v) if v else float("nan")


def runs_server_us(runs, per_xact=1):
    """Median server CPU time per event of these pgbench runs (every process
    of the cluster, µs; per_xact events per transaction)."""
    v = [r["cpu"]["server_s"] * 1e6 / (r["xacts"] * per_xact) for r in runs if "server_s" in r["cpu"]]
    return med(v) if v else float("nan")


def cpu_med(res, key, n, what):
    return runs_cpu(res["throughput"]["runs"][key][n], what)


def cpu_us(res, key, n):
    """Server CPU time per event (every process of the cluster, µs)."""
    return runs_server_us(res["throughput"]["runs"][key][n])


def worker_us(res, n):
    """The delivery worker's CPU time per delivered event in the publish runs
    at n clients (its CPU during the run / the events published in it, µs)."""
    v = [r["cpu"]["worker"] / 100 * r["cpu"]["seconds"] * 1e6 / r["xacts"]
         for r in res["throughput"]["runs"]["publish"][n] if r["cpu"].get("worker") is not None]
    return med(v) if v else float("nan")


def _pgq_clients(res):
    """Client counts at which PgQ insert_event ran (none in an older results.json)."""
    return [n for n in res["config"]["clients"] if n in res["throughput"]["runs"].get("pgq", {})]


def batch_med(res, key):
    return med([r["events_per_s"] for r in res["throughput"]["batch"][key]])


def sync_off_med(res, key):
    return med([r["tps"] for r in res["throughput"]["sync_off"]["runs"][key]])


def values(res):
    top, clients = _top(res), res["config"]["clients"]
    pub, plain, notif = (tps_med(res, k, top) for k in ("publish", "plain", "notify"))
    so = res["throughput"].get("sync_off")  # none in an older results.json
    out = {
        "publish_vs_plain": dict(value=pub / plain, top=top),
        # The lowest ratio: as fast at every client count.
        "publish_vs_plain_lowest": dict(
            value=min(tps_med(res, "publish", n) / tps_med(res, "plain", n) for n in clients),
            clients="/".join(str(n) for n in clients)),
        "publish_async_vs_plain": dict(value=sync_off_med(res, "publish") / sync_off_med(res, "plain"),
                                       clients=so["clients"]) if so else None,
        "publish_vs_notify": dict(value=pub / notif, top=top),
        "batch_vs_insert": dict(value=batch_med(res, "publish_batch") / batch_med(res, "plain_batch"),
                                clients=res["config"]["batch_clients"]),
        "worker_us": dict(value=worker_us(res, top), top=top),
    }
    env = res["throughput"].get("envelope")  # none in an older results.json
    for key in ("envelope", "idempotent", "expected"):
        out[f"{key}_vs_publish"] = dict(value=envelope_med(res, key) / envelope_med(res, ENVELOPE_BASELINE[key]),
                                        clients=env["clients"]) if env else None
    pq = _pgq_clients(res)
    if pq:  # the lowest ratio: ahead at every client count
        out["publish_vs_pgq"] = dict(value=min(tps_med(res, "publish", n) / tps_med(res, "pgq", n) for n in pq),
                                     clients="/".join(str(n) for n in pq))
    else:
        out["publish_vs_pgq"] = None  # not measured
    return out


def delivery(res):
    """(events lost, events duplicated, every event received exactly once) in this phase."""
    li = res["throughput"]["listener"]
    return li["expected"] - li["received"], 0, li["expected"] == li["received"]


def notes(res, short):
    top = _top(res)
    pub, plain, notif = (tps_med(res, k, top) for k in ("publish", "plain", "notify"))
    out = []
    if "publish_vs_plain" in short:
        out.append(
            f"**publish vs plain INSERT ({top} clients):** the CPUs were "
            f"{cpu_med(res, 'publish', top, 'machine'):.0f}% busy during publish runs and "
            f"{cpu_med(res, 'plain', top, 'machine'):.0f}% during plain INSERT runs; the server spent "
            f"{cpu_us(res, 'publish', top):.0f} µs of CPU per published event against "
            f"{cpu_us(res, 'plain', top):.0f} µs per plain INSERT "
            f"({cpu_us(res, 'publish', top) / cpu_us(res, 'plain', top):.2f}x). The delivery worker "
            f"alone took {cpu_med(res, 'publish', top, 'worker'):.0f}% of one CPU (per round it reads the newly final events, "
            "inserts their commit times into `streams.commit_times`, NOTIFYs each event and updates "
            "`streams.horizon_state`); "
            "most of the rest is the publish path itself (privilege check, position "
            "allocation, the INSERT through SPI). The Python LISTEN client used another "
            f"{cpu_med(res, 'publish', top, 'listener'):.0f}% of one CPU, outside the server.")
    if "publish_vs_plain_lowest" in short:
        out.append(
            "**publish vs plain INSERT, every client count:** " + "; ".join(
                f"{n} client{'s' if n != 1 else ''}: {tps_med(res, 'publish', n) / tps_med(res, 'plain', n):.2f}x "
                f"(server CPU per event {cpu_us(res, 'publish', n):.0f} µs against {cpu_us(res, 'plain', n):.0f} µs)"
                for n in res["config"]["clients"]) + ".")
    if "publish_async_vs_plain" in short:
        so = res["throughput"]["sync_off"]
        pub_runs, plain_runs = so["runs"]["publish"], so["runs"]["plain"]
        out.append(
            f"**publish vs plain INSERT, synchronous_commit = off ({so['clients']} clients):** "
            f"{sync_off_med(res, 'publish'):,.0f} against {sync_off_med(res, 'plain'):,.0f} tps; the CPUs were "
            f"{runs_cpu(pub_runs, 'machine'):.0f}% busy during publish runs and "
            f"{runs_cpu(plain_runs, 'machine'):.0f}% during plain INSERT runs; the server spent "
            f"{runs_server_us(pub_runs):.0f} µs of CPU per published event against "
            f"{runs_server_us(plain_runs):.0f} µs per plain INSERT, the delivery worker "
            f"{runs_cpu(pub_runs, 'worker'):.0f}% of one CPU.")
    if "batch_vs_insert" in short:
        batch = res["throughput"]["batch"]
        out.append(
            f"**publish_batch vs a 100-row INSERT ({res['config']['batch_clients']} clients):** server CPU per event "
            f"{runs_server_us(batch['publish_batch'], BATCH_SIZE):.1f} µs against "
            f"{runs_server_us(batch['plain_batch'], BATCH_SIZE):.1f} µs.")
    for key in ("envelope", "idempotent", "expected"):
        if f"{key}_vs_publish" in short:
            env = res["throughput"]["envelope"]
            base = ENVELOPE_BASELINE[key]
            out.append(
                f"**{key} vs {base} ({env['clients']} clients):** {envelope_med(res, key):,.0f} against "
                f"{envelope_med(res, base):,.0f} tps; the server spent "
                f"{runs_server_us(env['runs'][key]):.0f} µs of CPU per event against "
                f"{runs_server_us(env['runs'][base]):.0f} µs.")
    if "publish_vs_notify" in short:
        out.append(
            f"**publish vs INSERT + pg_notify ({top} clients):** INSERT + pg_notify ran at "
            f"{notif:,.0f} tps, {notif / plain:.2f}x plain INSERT ({plain:,.0f} tps), so 6x needs "
            f"publish at {6 * notif / plain:.2f}x plain INSERT; it reached {pub / plain:.2f}x.")
    if "publish_vs_pgq" in short:
        pq = _pgq_clients(res)
        out.append(
            "**publish vs PgQ insert_event:** " + "; ".join(
                f"{n} clients: {tps_med(res, 'publish', n) / tps_med(res, 'pgq', n):.2f}x "
                f"(server CPU per event {cpu_us(res, 'publish', n):.0f} µs against {cpu_us(res, 'pgq', n):.0f} µs)"
                for n in pq) + ".")
    if "worker_us" in short:
        out.append(
            f"**worker CPU per delivered event ({top} clients):** {worker_us(res, top):.1f} µs, the delivery "
            f"worker at {cpu_med(res, 'publish', top, 'worker'):.0f}% of one CPU for "
            f"{tps_med(res, 'publish', top):,.0f} events/s.")
    return out


def section(res, w):
    cfg, m = res["config"], res["machine"]
    tp = res["throughput"]
    runs, batch = tp["runs"], tp["batch"]
    clients = cfg["clients"]
    li = tp["listener"]
    w("## 1. Publish throughput")
    w("")
    w(f"`pgbench -n -f <script> -c N -j 2 -T {cfg['secs']}` (`-j 1` for one client), "
      + (f"{cfg['reps']} repetitions per cell, methods interleaved in rotating order (A B C, "
         "B C A, C A B), each after a `CHECKPOINT`; median tps, individual runs in brackets. "
         if cfg["reps"] > 1 else "one run per cell, each after a `CHECKPOINT`. ")
      + "One event (row) per transaction. "
      "The delivery worker is running and a LISTEN client drains `payment.success` in its own "
      "process throughout. Scripts: `bench/publish.sql`, `bench/plain_insert.sql`, "
      "`bench/in_tx_notify.sql`; table `bench_plain` in `bench/schema.sql`.")
    pgq, pq = tp.get("pgq"), _pgq_clients(res)
    if pgq and pgq.get("skipped"):
        w("")
        w(f"**PgQ `insert_event`: not measured**: {pgq['skipped']}.")
    elif pq:
        w("")
        w(f"**PgQ {pgq.get('version', '3')}** `insert_event` (the Debian package `postgresql-15-pgq3`), "
          f"interleaved with the others at {', '.join(str(n) for n in pq)} clients: `bench/pgq_insert.sql`, "
          f"one event per transaction into queue `{pgq['queue']}`, the same type and payload; no consumer "
          "and no ticker run, so this is the producer's cost alone.")
    w("")

    def cell(k, n):
        if n not in runs[k]:
            return "n/a"
        return (f"{f0(tps_med(res, k, n))} ({reps_str([r['tps'] for r in runs[k][n]])})"
                if cfg["reps"] > 1 else f0(tps_med(res, k, n)))

    if pq:
        w("| clients | streams.publish | plain INSERT | PgQ insert_event | INSERT + pg_notify | publish / plain "
          "| publish / PgQ | publish / notify |")
        w("| --- | --- | --- | --- | --- | --- | --- | --- |")
    else:
        w("| clients | streams.publish | plain INSERT | INSERT + pg_notify | publish / plain | publish / notify |")
        w("| --- | --- | --- | --- | --- | --- |")
    for n in clients:
        a, b, c_ = (tps_med(res, k, n) for k in ("publish", "plain", "notify"))
        if pq:
            vs_pgq = fx(a / tps_med(res, "pgq", n)) if n in runs["pgq"] else "n/a"
            w(f"| {n} | {cell('publish', n)} | {cell('plain', n)} | {cell('pgq', n)} | {cell('notify', n)} | "
              f"{fx(a / b)} | {vs_pgq} | {fx(a / c_)} |")
        else:
            w(f"| {n} | {cell('publish', n)} | {cell('plain', n)} | {cell('notify', n)} | {fx(a / b)} | "
              f"{fx(a / c_)} |")
    w("")
    cu = [x for n in clients for x in tp["catchup"][n]]
    w(f"After each publish run the worker had delivered every event within "
      f"{max(cu) * 1000:.0f} ms of pgbench finishing (median {med(cu) * 1000:.0f} ms).")
    if li["received"] == li["expected"]:
        w(f"The LISTEN client received exactly the {li['received']:,} notifications expected "
          "(one per published event plus one per INSERT + pg_notify transaction).")
    else:
        w(f"**The LISTEN client received {li['received']:,} notifications, expected "
          f"{li['expected']:,}.**")
    w("")
    w("CPU during the runs (medians). *Server*: every process of the PostgreSQL cluster "
      "(backends, the delivery worker, background processes), in % of one CPU and in µs per "
      "event; *worker*: the delivery worker alone; *listener*: the Python LISTEN client; "
      f"*machine*: share of all {m['nproc']} CPUs busy, unrelated processes on this shared "
      "machine included.")
    w("")
    w("| clients | server CPU per event: publish / plain / notify | server: publish / plain / notify "
      "| publish: worker / listener | notify: listener | machine busy: publish / plain / notify |")
    w("| --- | --- | --- | --- | --- | --- |")

    def cpu(key, n, what):
        v = cpu_med(res, key, n, what)
        return "n/a" if v != v else f"{v:.0f}%"

    for n in clients:
        ks = ("publish", "plain", "notify")
        w(f"| {n} | " + " / ".join(f"{cpu_us(res, k, n):.0f} µs" for k in ks) + " | "
          + " / ".join(cpu(k, n, "server") for k in ks) + " | "
          f"{cpu('publish', n, 'worker')} / {cpu('publish', n, 'listener')} | "
          f"{cpu('notify', n, 'listener')} | "
          + " / ".join(cpu(k, n, "machine") for k in ks) + " |")
    w("")
    if pq:
        w("PgQ insert_event, server CPU per event: " + "; ".join(
            f"{n} client{'s' if n != 1 else ''} {cpu_us(res, 'pgq', n):.0f} µs" for n in pq) + ".")
        w("")
    w("Delivery worker CPU per delivered event (its CPU time during each publish run divided by the events "
      "published in it, median): " + "; ".join(f"{n} client{'s' if n != 1 else ''} {worker_us(res, n):.1f} µs" for n in clients) + ".")
    w("")
    w("![throughput](bench-throughput.png)")
    w("")
    bp = med([r["events_per_s"] for r in batch["publish_batch"]])
    bi = med([r["events_per_s"] for r in batch["plain_batch"]])
    w(f"**Batches** ({cfg['batch_clients']} clients, 100 events per transaction; "
      "`bench/publish_batch.sql`, `bench/plain_insert_batch.sql`):")
    w("")
    w("| method | events/s | runs | server CPU per event |")
    w("| --- | --- | --- | --- |")
    for key, label, _ in BATCH_METHODS:
        v = [r["events_per_s"] for r in batch[key]]
        cu_ = runs_server_us(batch[key], BATCH_SIZE)
        w(f"| {label} | {f0(med(v))} | {reps_str(v)} | " + ("n/a" if cu_ != cu_ else f"{cu_:.1f} µs") + " |")
    w(f"| ratio publish_batch / INSERT | {fx(bp / bi)} | | |")
    w("")
    so = tp.get("sync_off")
    if so:
        w(f"**`synchronous_commit = off`** ({so['clients']} clients, `PGOPTIONS='{SYNC_OFF}'` for pgbench's "
          "sessions, the server's setting untouched; `bench/publish.sql` and `bench/plain_insert.sql`, "
          + ("interleaved in rotating order" if cfg["reps"] > 1 else "one run each")
          + ", each after a `CHECKPOINT`, in the same run as the table above):")
        w("")
        w("| method | tps | runs | server CPU per event | worker |")
        w("| --- | --- | --- | --- | --- |")
        for key, label, _ in SYNC_OFF_METHODS:
            v = [r["tps"] for r in so["runs"][key]]
            wk = runs_cpu(so["runs"][key], "worker") if key == "publish" else float("nan")
            w(f"| {label} | {f0(med(v))} | {reps_str(v)} | {runs_server_us(so['runs'][key]):.0f} µs | "
              + ("" if wk != wk else f"{wk:.0f}% of one CPU") + " |")
        w(f"| ratio publish / plain INSERT | {fx(sync_off_med(res, 'publish') / sync_off_med(res, 'plain'))} | | | |")
        w("")
        w(f"After each of these publish runs the worker had delivered every event within "
          f"{max(so['catchup']) * 1000:.0f} ms of pgbench finishing. With these publishers an event becomes "
          "final (visible, notified) only once its commit record is flushed to disk: the worker's round "
          "commits synchronously, which flushes the WAL up to the publishers' commits before it. The "
          "publishers do not wait for that flush, so these rates do not include it; what it adds to "
          "delivery latency is in section 2.")
        w("")
    env = tp.get("envelope")
    if env:
        w(f"**The envelope, idempotency keys, expected version** ({env['clients']} clients; "
          "`bench/publish.sql`, `bench/publish_envelope.sql`, `bench/publish_idempotent.sql`, "
          "`bench/publish_expected.sql`, "
          + ("interleaved in rotating order" if cfg["reps"] > 1 else "one run each")
          + ", each after a `CHECKPOINT`, in the same run as the tables above; a new idempotency key per "
          "publish, and each expected_prev writer appends to a stream of its own after reading its newest position):")
        w("")
        w("| method | tps | runs | server CPU per event | ratio |")
        w("| --- | --- | --- | --- | --- |")
        for key, label, _ in ENVELOPE_METHODS:
            v = [r["tps"] for r in env["runs"][key]]
            base = ENVELOPE_BASELINE.get(key)
            ratio = f"{fx(envelope_med(res, key) / envelope_med(res, base))} of {base}" if base else ""
            w(f"| {label} | {f0(med(v))} | {reps_str(v)} | {runs_server_us(env['runs'][key]):.0f} µs | {ratio} |")
        w("")


def plots(res, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp = res["throughput"]["runs"]
    clients = res["config"]["clients"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    lines = list(zip(METHODS, ["tab:blue", "tab:gray", "tab:red"]))
    if _pgq_clients(res):
        lines.insert(2, (PGQ_METHOD, "tab:green"))
    for (key, label, _), color in lines:
        ns = [n for n in clients if n in tp[key]]
        meds = [med([r["tps"] for r in tp[key][n]]) for n in ns]
        lo = [m - min(r["tps"] for r in tp[key][n]) for m, n in zip(meds, ns)]
        hi = [max(r["tps"] for r in tp[key][n]) - m for m, n in zip(meds, ns)]
        ax.errorbar(ns, meds, yerr=[lo, hi], marker="o", capsize=3, label=label, color=color)
        for x, y in zip(ns, meds):
            ax.annotate(f0(y), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(clients)
    ax.set_xticklabels([str(n) for n in clients])
    ax.set_xlabel("pgbench clients (-j 2)")
    ax.set_ylabel("transactions (events) per second")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Publish throughput, one event per transaction (median of {res['config']['reps']}, "
                 "bars: min-max)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "bench-throughput.png")
    plt.close(fig)
