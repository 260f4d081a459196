"""2a. Delivery latency: commit -> notification received at a paced 1,000
events/s (paced publisher processes, a LISTEN client timestamping every
notification); then the same with the publishers at synchronous_commit = off,
streams.publish vs INSERT + pg_notify in the same transaction (an event is
final only once its commit record is flushed; the anchor notifies at commit).
Its report opens section 2 and draws bench-latency.png (with the lag runs'
figures)."""

import json
import time

from common import (CHANNEL, DB, BenchError, Listener, _recv, connect, dsn, fms, fx, info, parse_ts_ns, pct,
                    publisher_main, rotations, say)

ORDER = 20
FULL = dict(lat_rate=1000, lat_secs=20, lat_warmup=1.0, lat_publishers=8, lat_async_secs=10, lat_async_reps=2)
QUICK = dict(lat_rate=1000, lat_secs=2, lat_warmup=0.5, lat_publishers=8, lat_async_secs=2, lat_async_reps=1)


def run(b):
    cfg = b.cfg
    P, rate = cfg["lat_publishers"], cfg["lat_rate"]
    say(f"2a. delivery latency at {rate:,} events/s ({P} publisher processes, "
        f"{cfg['lat_secs']} s, first {cfg['lat_warmup']} s discarded)")
    t0, sent, n, recs = _paced(b, CHANNEL, cfg["lat_secs"])
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
    _async(b)


def _paced(b, channel, secs, anchor=False, settings=None):
    """One paced run: cfg["lat_publishers"] publisher processes at cfg["lat_rate"]
    events/s in total for secs, a LISTEN client on channel recording every
    notification. Returns (t0, the publishers' records, notifications received,
    the listener's records)."""
    cfg = b.cfg
    P, rate = cfg["lat_publishers"], cfg["lat_rate"]
    with connect(DB) as c:
        b.wait_delivered(c)
    lst = Listener(b.ctx, DB, channel, record=True).start()
    interval = int(P * 1e9 / rate)
    start_evt = b.ctx.Event()
    start_ns, end_ns = b.ctx.Value("q", 0), b.ctx.Value("q", 0)
    pubs = []
    try:
        for i in range(P):
            ready = b.ctx.Event()
            rx, tx = b.ctx.Pipe(duplex=False)
            p = b.ctx.Process(target=publisher_main, daemon=True,
                              args=(dsn(DB), channel, interval, i * interval // P, ready,
                                    start_evt, start_ns, end_ns, tx),
                              kwargs=dict(anchor=anchor, settings=settings))
            p.start()
            pubs.append((p, ready, rx))
        for p, ready, _ in pubs:
            if not ready.wait(60):
                raise BenchError("a publisher process did not start")
        t0 = time.monotonic_ns() + 200_000_000
        start_ns.value, end_ns.value = t0, t0 + int(secs * 1e9)
        start_evt.set()
        sent = []
        for p, _, rx in pubs:
            (recs,) = _recv(rx, secs + 120, "publisher")
            sent.extend(recs)
            p.join(10)
        lst.wait_count(len(sent), 30)
    finally:
        for p, _, _ in pubs:
            if p.is_alive():
                p.kill()
        n, recs = lst.finish()
    return t0, sent, n, recs


# The asynchronous-commit pair (issue 22, "final means durable"): publish vs
# the anchor INSERT + pg_notify, both with the publishers' sessions at
# synchronous_commit = off, at the same paced rate.
ASYNC_METHODS = (("publish", "`streams.publish`"),
                 ("notify", "INSERT + `pg_notify` in the same transaction"))
ASYNC_SETTINGS = {"synchronous_commit": "off"}
ANCHOR_CHANNEL = "bench.in_tx_notify"


def _async(b):
    cfg = b.cfg
    secs, reps = cfg["lat_async_secs"], cfg["lat_async_reps"]
    say(f"2a. delivery latency with synchronous_commit = off at {cfg['lat_rate']:,} events/s: "
        f"publish vs INSERT + pg_notify, {reps} x {secs} s each in rotating order")
    out = {k: dict(runs=[], from_commit_returned_ms=[], from_before_commit_ms=[],
                   publisher_behind_schedule_ms=[], events=0, missing=0, duplicates=0)
           for k, _ in ASYNC_METHODS}
    for order in rotations(ASYNC_METHODS, reps):
        for key, _ in order:
            anchor = key == "notify"
            t0, sent, n, recs = _paced(b, ANCHOR_CHANNEL if anchor else CHANNEL, secs,
                                       anchor=anchor, settings=ASYNC_SETTINGS)
            recv = {}
            for mono_ns, _, payload in recs:
                recv[json.loads(payload)["position"]] = mono_ns
            warm_end = t0 + int(cfg["lat_warmup"] * 1e9)
            measured = [r for r in sent if r[1] >= warm_end]
            after = [(recv[pos] - t_after) / 1e6 for pos, _, _, t_after in measured if pos in recv]
            before = [(recv[pos] - t_before) / 1e6 for pos, _, t_before, _ in measured if pos in recv]
            o = out[key]
            o["from_commit_returned_ms"] += after
            o["from_before_commit_ms"] += before
            o["publisher_behind_schedule_ms"] += [(t_before - t_sched) / 1e6 for _, t_sched, t_before, _ in measured]
            o["events"] += len(measured)
            o["missing"] += sum(1 for r in measured if r[0] not in recv)
            o["duplicates"] += n - len(recv)
            o["runs"].append(dict(events=len(measured), achieved_rate=len(measured) / (secs - cfg["lat_warmup"]),
                                  p50=pct(after, 50), p99=pct(after, 99)))
            info(f"{key:<8} synchronous_commit = off: {len(measured):,} events, from COMMIT returned "
                 f"p50 {pct(after, 50):.2f} ms, p99 {pct(after, 99):.2f} ms")
    out["secs"], out["reps"] = secs, reps
    b.res["latency_async"] = out


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
    runs = [res["latency"]] + [res["latency_async"][k] for k, _ in ASYNC_METHODS if "latency_async" in res]
    lost, dup = sum(r["missing"] for r in runs), sum(r["duplicates"] for r in runs)
    return lost, dup, lost == 0 and dup == 0


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
    la = res.get("latency_async")
    if la:
        _async_section(res, la, w)


def _async_section(res, la, w):
    cfg = res["config"]
    pub, anc = la["publish"]["from_commit_returned_ms"], la["notify"]["from_commit_returned_ms"]
    w(f"**Asynchronous commit: final means durable.** The same paced load ({cfg['lat_rate']:,} events/s, "
      f"{cfg['lat_publishers']} publisher processes, the same LISTEN client) with the publishers' sessions at "
      f"`synchronous_commit = off`: `streams.publish` against the anchor, the same row INSERTed into "
      f"`bench_plain` with a `pg_notify` in the same transaction (its payload carries the row's id), "
      f"{la['reps']} run{'s' if la['reps'] > 1 else ''} of {la['secs']} s each"
      + (", in rotating order" if la["reps"] > 1 else "") + f", the first {cfg['lat_warmup']} s of each "
      "discarded, figures over all runs. The anchor's notification goes out at its commit, before the "
      "commit record is on disk, so a crash can take back an event its listener already received. A "
      "published event becomes final (visible, notified) only once its commit record is flushed: the "
      "worker's round commits synchronously, which flushes the WAL up to every publisher's commit before "
      "it, and only then notifies. The difference is what that guarantee costs in latency; the publishers "
      "never wait for it.")
    w("")
    w("| synchronous_commit = off, measured from COMMIT returned | events | p50 | p90 | p99 | max | runs (p50) |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    for key, label in ASYNC_METHODS:
        o = la[key]
        v = o["from_commit_returned_ms"]
        w(f"| {label} | {o['events']:,} | {fms(pct(v, 50))} | {fms(pct(v, 90))} | {fms(pct(v, 99))} | "
          f"{fms(max(v, default=float('nan')))} | " + " / ".join(fms(r["p50"]) for r in o["runs"]) + " |")
    w(f"| ratio publish / INSERT + pg_notify | | {fx(pct(pub, 50) / pct(anc, 50))} | "
      f"{fx(pct(pub, 90) / pct(anc, 90))} | {fx(pct(pub, 99) / pct(anc, 99))} | | |")
    w("")
    missing = la["publish"]["missing"] + la["notify"]["missing"]
    dup = la["publish"]["duplicates"] + la["notify"]["duplicates"]
    w(f"Received: all but {missing}; duplicates: {dup}. Publishers behind their schedule by p99 "
      f"{fms(pct(la['publish']['publisher_behind_schedule_ms'], 99))} (publish) and "
      f"{fms(pct(la['notify']['publisher_behind_schedule_ms'], 99))} (INSERT + pg_notify). A figure, not a "
      "target: the anchor does not wait for the disk at all, so no ratio to it is a goal; the targets "
      "above hold for synchronous commit.")
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
