"""2b/2c. The worker's lag while pgbench publishes at the maximum rate, with
synchronous commit, with synchronous_commit = off, and the latter again with
backpressure off (litebase_streams.max_backlog = 0); streams.status sampled
every 50 ms, a LISTEN client timestamping every notification."""

import json
import threading
import time

from common import (CHANNEL, DB, Listener, connect, f0, fms, info, parse_ts_ns, pct, say)

ORDER = 21
FULL = dict(lag_clients=16, lag_secs=15, async_clients=32)
QUICK = dict(lag_clients=16, lag_secs=2, async_clients=32)

# litebase_streams.max_backlog for the second asynchronous-commit lag run:
# off, to show what the default backpressure buys.
ASYNC_MAX_BACKLOG = 0
RUNS = ("lag", "lag_async", "lag_async_backlog")


def run(b):
    _lag(b)
    _lag(b, async_commit=True)
    _lag(b, async_commit=True, max_backlog=ASYNC_MAX_BACKLOG)


def _lag(b, async_commit=False, max_backlog=None):
    """max_backlog: None keeps the server's setting (the default), a
    number sets it for this run."""
    cfg = b.cfg
    key, clients = ("lag_async", cfg["async_clients"]) if async_commit else ("lag", cfg["lag_clients"])
    if max_backlog is not None:
        key += "_backlog"
    say(f"2{'c' if async_commit else 'b'}. worker lag at the maximum rate: pgbench publish.sql, "
        f"{clients} clients{', synchronous_commit = off' if async_commit else ''}"
        f"{f', max_backlog = {max_backlog:,}' if max_backlog is not None else ''}, "
        f"{cfg['lag_secs']} s; streams.status sampled every 50 ms")
    with connect("postgres") as c:
        if max_backlog is not None:
            c.execute(f"ALTER SYSTEM SET litebase_streams.max_backlog = {max_backlog}")
            c.execute("SELECT pg_reload_conf()")
    # The reload reaches backends asynchronously: ask new sessions until
    # one has it (publishers of the run connect later still).
    deadline = time.monotonic() + 10
    while True:
        with connect("postgres") as c:
            setting = c.execute("SHOW litebase_streams.max_backlog").fetchone()[0]
        if max_backlog is None or int(setting) == max_backlog or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    try:
        _lag_run(b, key, clients, async_commit)
    finally:
        if max_backlog is not None:
            with connect("postgres") as c:
                c.execute("ALTER SYSTEM RESET litebase_streams.max_backlog")
                c.execute("SELECT pg_reload_conf()")
    b.res[key]["max_backlog"] = int(setting)

def _lag_run(b, key, clients, async_commit):
    cfg = b.cfg
    with connect(DB) as c:
        b.wait_delivered(c)
        c.execute("CHECKPOINT")
        st0 = b.status(c)
        first = st0["newest"]
    lst = Listener(b.ctx, DB, CHANNEL, record=True).start()
    samples, stop = [], threading.Event()

    def sampler():
        with connect(DB) as sc:
            t_next = time.monotonic()
            while not stop.is_set():
                st = b.status(sc)
                samples.append((time.monotonic(), st["newest"], st["delivered"], st["lag"],
                                float(st["holder_ms"] or 0)))
                t_next += 0.05
                time.sleep(max(0.0, t_next - time.monotonic()))

    th = threading.Thread(target=sampler, daemon=True)
    try:
        th.start()
        r = b.run_pgbench("publish.sql", clients, cfg["lag_secs"],
                          f"{key.replace('_', '-')}-publish-c{clients}",
                          {"worker": st0["worker_pid"], "listener": lst.proc.pid},
                          pgoptions="-c synchronous_commit=off" if async_commit else None)
        stop.set()
        th.join(5)
        with connect(DB) as c:
            r["catchup_s"] = b.wait_delivered(c)
            last = b.status(c)["newest"]
        lst.wait_count(last - first, 60)
    finally:
        stop.set()
        n, recs = lst.finish()
    # Samples taken while publishing: from the first to the last that saw new positions.
    moving = [s for s in samples if s[1] is not None and s[1] > first]
    lag_pos = [s[3] for s in moving if s[3] is not None]
    # How long the publishing transaction holding the horizon had been open
    # (0 when none): events behind it cannot be visible before it ends.
    holder_ms = [s[4] for s in moving]
    commit_lag = []
    for mono_ns, real_ns, payload in recs:
        ev = json.loads(payload)
        commit_lag.append((real_ns - parse_ts_ns(ev["time"])) / 1e6)
    tps = r["tps"]
    b.res[key] = dict(
        clients=clients, pgbench=r, samples=len(lag_pos), holder_age_ms=holder_ms, lag_positions=lag_pos,
        lag_positions_p50=pct(lag_pos, 50), lag_positions_p99=pct(lag_pos, 99),
        lag_positions_max=max(lag_pos, default=float("nan")),
        lag_positions_p99_ms_at_rate=pct(lag_pos, 99) / tps * 1000 if tps else float("nan"),
        received=n, expected=last - first, commit_ts_to_received_ms=commit_lag)
    info(f"{tps:,.0f} events/s; lag p50 {pct(lag_pos, 50):.0f} / p99 {pct(lag_pos, 99):.0f} positions; "
         f"commit -> received p50 {pct(commit_lag, 50):.1f} ms, p99 {pct(commit_lag, 99):.1f} ms")
    if n != last - first:
        info(f"WARNING: the LISTEN client received {n:,} of {last - first:,} notifications")


# --------------------------------------------------------------------------
# Report (reads res["lag"], res["lag_async"], res["lag_async_backlog"])
# --------------------------------------------------------------------------

def values(res):
    lag, lag_async, lag_backlog = (res[k] for k in RUNS)
    return {
        "lag_p99": dict(value=pct(lag["commit_ts_to_received_ms"], 99)),
        "lag_async_p99": dict(value=pct(lag_async["commit_ts_to_received_ms"], 99),
                              clients=lag_async["clients"]),
        "lag_backlog_p99": dict(value=pct(lag_backlog["commit_ts_to_received_ms"], 99),
                                max_backlog=f"{lag_backlog['max_backlog']:,}",
                                tps=f0(lag_backlog["pgbench"]["tps"]),
                                tps_with=f0(lag_async["pgbench"]["tps"])),
    }


def delivery(res):
    """(events lost, events duplicated, every event received exactly once) in this phase."""
    return (sum(res[k]["expected"] - res[k]["received"] for k in RUNS), 0,
            all(res[k]["expected"] == res[k]["received"] for k in RUNS))


def notes(res, short):
    out = []
    if short & {"lag_p99", "lag_async_p99"}:
        for key in ("lag", "lag_async"):
            lag = res.get(key)
            if lag:
                out.append(
                    f"**lag at the maximum rate ({'synchronous_commit = off' if key == 'lag_async' else 'synchronous commit'}):** "
                    f"the worker used {lag['pgbench']['cpu'].get('worker', float('nan')):.0f}% "
                    f"of one CPU at {lag['pgbench']['tps']:,.0f} events/s; `lag_positions` p99 "
                    f"{lag['lag_positions_p99']:,.0f}.")
    return out


def section(res, w):
    cfg = res["config"]
    for key in ("lag", "lag_async", "lag_async_backlog"):
        lag = res.get(key)
        if not lag:
            continue
        lp = lag["pgbench"]
        cl = lag["commit_ts_to_received_ms"]
        clients = lag.get("clients", cfg["lag_clients"])
        if key == "lag":
            w(f"**Maximum rate.** `pgbench -f bench/publish.sql -c {clients} -j 2 -T {cfg['lag_secs']}`: "
              f"{f0(lp['tps'])} events/s.")
        elif key == "lag_async_backlog":
            w(f"**Asynchronous commit without backpressure.** The same with `litebase_streams.max_backlog = "
              f"{lag['max_backlog']:,}` (publishers never wait for the worker): {f0(lp['tps'])} events/s.")
        else:
            w(f"**Maximum rate, asynchronous commit.** The same with `PGOPTIONS='-c synchronous_commit=off'` "
              f"and {clients} clients, `litebase_streams.max_backlog` at its default ({lag['max_backlog']:,}: "
              f"a transaction's first publish waits while that many final positions await the worker): "
              f"{f0(lp['tps'])} events/s. An event becomes final (visible, notified) only once its commit "
              "record is flushed to disk (the worker's round commits synchronously, flushing the WAL up to "
              "the publishers' commits before it), so the latencies below include that flush; the "
              "publishers do not wait for it.")
        w(f"`streams.status` sampled every 50 ms ({lag['samples']} samples while positions advanced); the "
          f"LISTEN client timestamps every notification ({lag['received']:,} of {lag['expected']:,} received).")
        w("")
        w("| lag | p50 | p99 | max |")
        w("| --- | --- | --- | --- |")
        w(f"| `lag_positions` (newest allocated - delivered) | {f0(lag['lag_positions_p50'])} | "
          f"{f0(lag['lag_positions_p99'])} | {f0(lag['lag_positions_max'])} |")
        w(f"| same, in ms at {f0(lp['tps'])} events/s | {fms(lag['lag_positions_p50'] / lp['tps'] * 1000)} | "
          f"{fms(lag['lag_positions_p99'] / lp['tps'] * 1000)} | "
          f"{fms(lag['lag_positions_max'] / lp['tps'] * 1000)} |")
        w(f"| commit timestamp -> received | {fms(pct(cl, 50))} | {fms(pct(cl, 99))} | {fms(max(cl))} |")
        ha = lag.get("holder_age_ms")
        if ha:
            w(f"| age of the open transaction holding the horizon (`holder_age`) | {fms(pct(ha, 50))} | "
              f"{fms(pct(ha, 99))} | {fms(max(ha))} |")
        w("")
        wc = lp["cpu"]
        w(f"`lag_positions` counts positions allocated by transactions still in flight, so it is "
          f"never zero under load; after pgbench stopped, the worker delivered the rest in "
          f"{lp['catchup_s'] * 1000:.0f} ms. CPU during the run: machine {wc['machine']:.0f}% busy, "
          f"worker {wc.get('worker', float('nan')):.0f}% of one CPU, LISTEN client "
          f"{wc.get('listener', float('nan')):.0f}%, pgbench {wc['pgbench']:.0f}%.")
        w("")
