"""2a. Delivery latency: commit -> notification received at a paced 1,000
events/s (paced publisher processes, a LISTEN client timestamping every
notification). Its report opens section 2 and draws bench-latency.png (with
the lag runs' figures)."""

import json
import time

from common import (CHANNEL, DB, BenchError, Listener, _recv, connect, dsn, fms, info, parse_ts_ns, pct,
                    publisher_main, say)

ORDER = 20
FULL = dict(lat_rate=1000, lat_secs=20, lat_warmup=1.0, lat_publishers=8)
QUICK = dict(lat_rate=1000, lat_secs=2, lat_warmup=0.5, lat_publishers=8)


def run(b):
    cfg = b.cfg
    P, rate = cfg["lat_publishers"], cfg["lat_rate"]
    say(f"2a. delivery latency at {rate:,} events/s ({P} publisher processes, "
        f"{cfg['lat_secs']} s, first {cfg['lat_warmup']} s discarded)")
    with connect(DB) as c:
        b.wait_delivered(c)
    lst = Listener(b.ctx, DB, CHANNEL, record=True).start()
    interval = int(P * 1e9 / rate)
    start_evt = b.ctx.Event()
    start_ns, end_ns = b.ctx.Value("q", 0), b.ctx.Value("q", 0)
    pubs = []
    try:
        for i in range(P):
            ready = b.ctx.Event()
            rx, tx = b.ctx.Pipe(duplex=False)
            p = b.ctx.Process(target=publisher_main, daemon=True,
                                 args=(dsn(DB), CHANNEL, interval, i * interval // P, ready,
                                       start_evt, start_ns, end_ns, tx))
            p.start()
            pubs.append((p, ready, rx))
        for p, ready, _ in pubs:
            if not ready.wait(60):
                raise BenchError("a publisher process did not start")
        t0 = time.monotonic_ns() + 200_000_000
        start_ns.value, end_ns.value = t0, t0 + int(cfg["lat_secs"] * 1e9)
        start_evt.set()
        sent = []
        for p, _, rx in pubs:
            (recs,) = _recv(rx, cfg["lat_secs"] + 120, "publisher")
            sent.extend(recs)
            p.join(10)
        lst.wait_count(len(sent), 30)
    finally:
        for p, _, _ in pubs:
            if p.is_alive():
                p.kill()
        n, recs = lst.finish()
    recv = {}
    for mono_ns, real_ns, payload in recs:
        ev = json.loads(payload)
        recv[ev["position"]] = (mono_ns, real_ns, parse_ts_ns(ev["time"]))
    warm_end = t0 + int(cfg["lat_warmup"] * 1e9)
    measured = [r for r in sent if r[1] >= warm_end]
    missing = [r[0] for r in measured if r[0] not in recv]
    after, before, commit_lag, behind = [], [], [], []
    for pos, t_sched, t_before, t_after in measured:
        if pos in recv:
            mono_ns, real_ns, commit_ns = recv[pos]
            after.append((mono_ns - t_after) / 1e6)
            before.append((mono_ns - t_before) / 1e6)
            commit_lag.append((real_ns - commit_ns) / 1e6)
        behind.append((t_before - t_sched) / 1e6)
    span = (cfg["lat_secs"] - cfg["lat_warmup"])
    lat = dict(
        events=len(measured), achieved_rate=len(measured) / span, missing=len(missing),
        duplicates=n - len(recv), from_commit_returned_ms=after,
        from_before_commit_ms=before, commit_ts_to_received_ms=commit_lag,
        publisher_behind_schedule_ms=behind)
    b.res["latency"] = lat
    info(f"{len(measured):,} events at {lat['achieved_rate']:,.0f}/s: from COMMIT returned "
         f"p50 {pct(after, 50):.2f} ms, p99 {pct(after, 99):.2f} ms, max {max(after, default=float('nan')):.2f} ms")
    if missing:
        info(f"WARNING: {len(missing)} published events were never received (first: {missing[:5]})")


# --------------------------------------------------------------------------
# Report (reads res["latency"]; the plot also res["lag"] and res["lag_async"])
# --------------------------------------------------------------------------

def values(res):
    after = res["latency"]["from_commit_returned_ms"]
    rate = f"{res['config']['lat_rate']:,}"
    return {
        "latency_p50": dict(value=pct(after, 50), rate=rate),
        "latency_p99": dict(value=pct(after, 99), rate=rate),
    }


def delivery(res):
    """(events lost, events duplicated, every event received exactly once) in this phase."""
    lat = res["latency"]
    return lat["missing"], lat["duplicates"], lat["missing"] == 0 and lat["duplicates"] == 0


def notes(res, short):
    if not short & {"latency_p50", "latency_p99"}:
        return []
    lat = res["latency"]
    return [f"**delivery latency:** p99 from COMMIT returned {pct(lat['from_commit_returned_ms'], 99):.2f} ms, "
            f"publishers behind schedule p99 {pct(lat['publisher_behind_schedule_ms'], 99):.2f} ms "
            "(the clients, server and listener share the machine's CPUs)."]


def section(res, w):
    cfg, lat = res["config"], res["latency"]
    after = lat["from_commit_returned_ms"]
    w("## 2. Delivery latency and lag")
    w("")
    w(f"**Paced load.** {cfg['lat_publishers']} publisher processes, each committing one "
      f"`streams.publish` per transaction on a fixed schedule ({cfg['lat_rate']:,} events/s in "
      f"total) for {cfg['lat_secs']} s, the first {cfg['lat_warmup']} s discarded; a LISTEN "
      f"client in another process timestamps every notification. All timestamps are "
      "CLOCK_MONOTONIC, one clock for every process on the machine. \"From COMMIT returned\" "
      "starts when the publisher's COMMIT call returns (the figure the targets use); \"from "
      "before COMMIT\" starts right before it is sent; \"from commit timestamp\" compares the "
      "event's `time` (the server's commit timestamp, taken before the commit's WAL flush) "
      "with the wall clock at receipt.")
    w("")
    w(f"Events measured: {lat['events']:,} at {lat['achieved_rate']:,.0f} events/s achieved; "
      f"received: all but {lat['missing']}; duplicates: {lat['duplicates']}. Publishers were "
      f"behind their schedule by p99 {fms(pct(lat['publisher_behind_schedule_ms'], 99))}.")
    w("")
    w("| measured from | p50 | p90 | p99 | p99.9 | max |")
    w("| --- | --- | --- | --- | --- | --- |")
    for key, label in [("from_commit_returned_ms", "COMMIT returned"),
                       ("from_before_commit_ms", "before COMMIT"),
                       ("commit_ts_to_received_ms", "commit timestamp")]:
        v = lat[key]
        w(f"| {label} | {fms(pct(v, 50))} | {fms(pct(v, 90))} | {fms(pct(v, 99))} | "
          f"{fms(pct(v, 99.9))} | {fms(max(v))} |")
    neg = sum(1 for v in after if v < 0)
    if neg:
        w("")
        w(f"{neg} notification(s) ({100 * neg / len(after):.1f}%) arrived before the publisher "
          "saw its COMMIT return (negative latency from that point).")
    w("")


def plots(res, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lat, lag = res["latency"], res["lag"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110)

    def cdf(ax, vals, label, color):
        s_ = sorted(vals)
        if s_:
            ax.plot(s_, [(i + 1) / len(s_) for i in range(len(s_))], label=label, color=color)

    def marks(ax, vals, color):
        for p in (50, 99):
            x = pct(vals, p)
            ax.plot([x], [p / 100], marker="o", ms=3, color=color)
            ax.annotate(f"p{p} {x:.2f}", (x, p / 100), textcoords="offset points",
                        xytext=(5, -10 if p == 99 else 0), fontsize=7, color=color)

    after = lat["from_commit_returned_ms"]
    cdf(a1, after, "from COMMIT returned", "tab:blue")
    cdf(a1, lat["from_before_commit_ms"], "from before COMMIT", "tab:orange")
    cdf(a1, lat["commit_ts_to_received_ms"], "from commit timestamp", "tab:green")
    marks(a1, after, "tab:blue")
    right = max(6.0, pct(lat["from_before_commit_ms"], 99) * 1.6)
    a1.set_xlim(max(-1.0, min(0.0, min(after, default=0))), right)
    for x, t in [(1, "p50 target"), (5, "p99 target")]:
        a1.axvline(x, color="gray", ls="--", lw=0.8)
        a1.text(x, 0.3, f" {t}", fontsize=7, color="gray", rotation=90, va="bottom")
    a1.set_xlabel("notification received after ... (ms; tail beyond the axis: see the title)")
    a1.set_ylabel("fraction of events (CDF)")
    a1.set_title(f"Delivery latency at {lat['achieved_rate']:,.0f} events/s ({lat['events']:,} events; "
                 f"max {max(after, default=float('nan')):.1f} ms)", fontsize=9)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=7, loc="lower right")
    cl = lag["commit_ts_to_received_ms"]
    cdf(a2, cl, "synchronous commit", "tab:green")
    marks(a2, cl, "tab:green")
    right = pct(cl, 99) * 1.6 if cl else 1
    la = res.get("lag_async")
    if la:
        ca = la["commit_ts_to_received_ms"]
        cdf(a2, ca, f"synchronous_commit = off, {la['clients']} clients "
                    f"({la['pgbench']['tps']:,.0f} events/s)", "tab:purple")
        marks(a2, ca, "tab:purple")
        right = max(right, pct(ca, 99) * 1.6 if ca else 1)
    if right >= 100:
        a2.axvline(100, color="gray", ls="--", lw=0.8)
        a2.text(100, 0.3, " p99 target", fontsize=7, color="gray", rotation=90, va="bottom")
        right = max(right, 110)
    a2.set_xlim(0, right)
    a2.set_xlabel("commit timestamp -> received (ms; p99 target: 100 ms)")
    a2.set_title(f"At the maximum rate ({lag['pgbench']['tps']:,.0f} events/s, "
                 f"{res['config']['lag_clients']} clients; max {max(cl, default=float('nan')):.1f} ms)",
                 fontsize=9)
    a2.grid(alpha=0.3)
    a2.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out_dir / "bench-latency.png")
    plt.close(fig)
