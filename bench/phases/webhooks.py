"""7. Webhooks (streams.create_webhook); --only webhooks runs just this.

The endpoint is tests/webhook_receiver.py --fast (the integration tests'
receiver, in its benchmark mode: answers 200 at once, verifies nothing, logs
every request with its arrival time in batches), one process per run,
started with this interpreter.

  7a. throughput to one endpoint: events preloaded into a stream, then a
      webhook created from before the first; events/s from the first
      request's arrival to the last's. One event per request (batch => 1)
      and up to 100 (batch => 100), interleaved.
  7b. the same with 10 webhooks on that many paths of one endpoint process,
      created in one transaction: total events/s across them.
  7c. commit-to-request latency at 1,000 events/s: paced publisher processes
      (common.publisher_main) commit one event per transaction; time from
      the publisher's COMMIT returning to the request carrying the event
      arriving (CLOCK_MONOTONIC in both processes, as section 2). The
      webhooks of wh_lat_batches (100: each request carries what is pending,
      up to 100); the report says so when a batch size left out delivered
      less than the rate in 7a (its backlog, hence its latency, would only
      grow).
  7d. 7c again while a second webhook on the same stream posts to a path
      that sleeps past webhook_timeout (its requests time out and retry).

Every run checks that the fast endpoints got every event once, in position
order. The phase sets webhook_allowed_hosts (127.0.0.1), webhook_timeout
and the retry backoff with ALTER SYSTEM and resets them at the end.
"""

import json
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common as H

ORDER = 70
OWN_DB = True

RECEIVER = H.REPO / "tests" / "webhook_receiver.py"
TP_STREAM = "bench.webhook.one"      # 7a
MULTI_STREAM = "bench.webhook.many"  # 7b
LAT_STREAM = "bench.webhook.lat"     # 7c, 7d

FULL = dict(wh_events=5_000, wh_multi_events=1_000, wh_endpoints=10, wh_batches=[1, 100], wh_reps=3,
            wh_lat_rate=1000, wh_lat_secs=10, wh_lat_warmup=1.0, wh_lat_publishers=8, wh_lat_batches=[100],
            wh_timeout_ms=1000, wh_slow_sleep=2.0, wh_retry_min_ms=200, wh_retry_max_ms=1000)
QUICK = dict(wh_events=600, wh_multi_events=100, wh_endpoints=10, wh_batches=[1, 100], wh_reps=1,
             wh_lat_rate=1000, wh_lat_secs=1.5, wh_lat_warmup=0.5, wh_lat_publishers=4, wh_lat_batches=[100],
             wh_timeout_ms=200, wh_slow_sleep=0.5, wh_retry_min_ms=100, wh_retry_max_ms=200)


# --------------------------------------------------------------------------
# The endpoint
# --------------------------------------------------------------------------

class Endpoint:
    """tests/webhook_receiver.py --fast on a free port of 127.0.0.1 with
    `paths` ({path: behaviour}, read once at start), in a directory of its own."""

    def __init__(self, paths):
        self.dir = tempfile.TemporaryDirectory(prefix="litebase-bench-webhooks-")
        d = Path(self.dir.name)
        (d / "config.json").write_text(json.dumps(paths))
        self.log = d / "requests.jsonl"
        with open(d / "stderr.txt", "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(RECEIVER), "--fast", "--port", "0", "--config", str(d / "config.json"),
                 "--log", str(self.log)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.pid = self.proc.pid
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.proc.kill()
            raise H.BenchError(f"{RECEIVER.name} did not start:\n{(d / 'stderr.txt').read_text()}")
        self.port = int(line.split()[2])

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self):
        """Stop it (SIGTERM: it writes its pending log lines first); every
        request as (path, status, arrival CLOCK_MONOTONIC ns, positions)."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        out = []
        with open(self.log, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                body = json.loads(r["body"]) if r["body"] else None
                events = body if isinstance(body, list) else [body] if body else []
                out.append((r["path"], r["status"], int(r["received_mono"] * 1e9),
                            [e["position"] for e in events]))
        self.dir.cleanup()
        return out


def _delivered(requests, path):
    """Positions answered 2xx on `path`, in arrival order, each with its
    request's arrival time."""
    return [(pos, t) for p, status, t, positions in requests if p == path and 200 <= status < 300
            for pos in positions]


def _check(delivered, expected):
    """(missing, duplicates, out of order) of the delivered positions against
    `expected` (ascending)."""
    got = [pos for pos, _ in delivered]
    distinct = set(got)
    order = sum(1 for a, b in zip(got, got[1:]) if b <= a)
    return len(set(expected) - distinct), len(got) - len(distinct), order


# --------------------------------------------------------------------------
# The server side
# --------------------------------------------------------------------------

def _settings(cfg):
    return {"webhook_allowed_hosts": "127.0.0.1", "webhook_timeout": str(cfg["wh_timeout_ms"]),
            "webhook_retry_min": str(cfg["wh_retry_min_ms"]), "webhook_retry_max": str(cfg["wh_retry_max_ms"])}


def _set(settings, reset=False):
    """ALTER SYSTEM SET (or RESET) the settings and reload. The reset retries
    for a minute while the server restarts: it must not outlive the run."""
    import psycopg
    deadline = time.monotonic() + 60
    while True:
        try:
            with H.connect("postgres") as c:
                for name, value in settings.items():
                    if reset:
                        c.execute(f"ALTER SYSTEM RESET litebase_streams.{name}")
                    else:
                        c.execute(f"ALTER SYSTEM SET litebase_streams.{name} = '{value}'")
                c.execute("SELECT pg_reload_conf()")
            break
        except psycopg.OperationalError:
            if not reset or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    if reset:
        return
    # The reload reaches sessions asynchronously: ask new ones until one has it.
    deadline = time.monotonic() + 10
    while True:
        with H.connect(H.DB) as c:
            seen = c.execute("SELECT current_setting('litebase_streams.webhook_allowed_hosts')").fetchone()[0]
        if seen == settings["webhook_allowed_hosts"]:
            return
        if time.monotonic() > deadline:
            raise H.BenchError(f"webhook_allowed_hosts is still {seen!r} after pg_reload_conf()")
        time.sleep(0.05)


def _preload(c, stream, n):
    """n events in `stream` (1,000 per transaction); their positions."""
    positions = []
    while len(positions) < n:
        k = min(1000, n - len(positions))
        positions += [r[0] for r in c.execute(
            "SELECT streams.publish_batch(%s, ARRAY(SELECT jsonb_build_object('order_id', 'ord_' || g, "
            "'amount', (g %% 10000) / 100.0) FROM generate_series(1, %s) g))", (stream, k)).fetchall()]
    return positions


def _wait_position(c, names, position, timeout):
    """Wait until every webhook in `names` delivered through `position`."""
    deadline = time.monotonic() + timeout
    while True:
        rows = c.execute("SELECT name, position, state, last_error FROM streams.webhooks WHERE name = ANY(%s)",
                         (names,)).fetchall()
        if len(rows) == len(names) and all(r[1] >= position for r in rows):
            return
        if time.monotonic() > deadline:
            raise H.BenchError(f"webhooks did not deliver through {position} in {timeout} s: {rows}")
        time.sleep(0.01)


# --------------------------------------------------------------------------
# The phase
# --------------------------------------------------------------------------

def run(b):
    cfg = b.cfg
    H.say(f"7. webhooks: throughput to 1 and {cfg['wh_endpoints']} endpoints (batch "
          f"{' / '.join(map(str, cfg['wh_batches']))}), latency at {cfg['wh_lat_rate']:,} events/s, "
          "with a slow neighbour; fresh database")
    b.recreate_db()
    settings = _settings(cfg)
    _set(settings)
    try:
        res = dict(measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   config={k: cfg[k] for k in FULL})
        with H.connect(H.DB) as c:
            c.execute("SET synchronous_commit = off")  # the preload is not measured
            one = _preload(c, TP_STREAM, cfg["wh_events"])
            many = _preload(c, MULTI_STREAM, cfg["wh_multi_events"])
            b.wait_delivered(c)
        res["throughput"] = _throughput(b, cfg, one, many)
        res["latency"] = [_latency(b, cfg, batch, slow) for slow in (False, True) for batch in cfg["wh_lat_batches"]]
        b.res["webhooks"] = res
    finally:
        _set(settings, reset=True)


def _throughput(b, cfg, one, many):
    n_end, batches = cfg["wh_endpoints"], cfg["wh_batches"]
    H.say(f"7a/7b. {len(one):,} events to one endpoint, {len(many):,} to each of {n_end} at once; "
          f"batch {' / '.join(map(str, batches))}; {cfg['wh_reps']} round(s), interleaved")
    out = {"one": {n: [] for n in batches}, "many": {n: [] for n in batches}}
    with H.connect(H.DB) as c:
        for rnd, order in enumerate(H.rotations(batches, cfg["wh_reps"])):
            for batch in order:
                for kind, positions, count in (("one", one, 1), ("many", many, n_end)):
                    paths = [f"/{kind}/{i}" for i in range(count)]
                    stream = TP_STREAM if kind == "one" else MULTI_STREAM
                    r = _deliver(b, c, f"r{rnd}.b{batch}.{kind}", stream, paths, positions, batch)
                    out[kind][batch].append(r)
                    H.info(f"batch {batch:>3}, {count:>2} endpoint(s): {r['events_per_s']:>10,.0f} events/s "
                           f"({r['events'] / r['requests']:.1f} per request; receiver "
                           f"{r['cpu'].get('receiver', float('nan')):.0f}% of a CPU)")
    return out


def _deliver(b, c, tag, stream, paths, positions, batch):
    """Webhooks (one per path) on `stream` from before `positions[0]`; the
    figures of delivering every position to each."""
    ep = Endpoint({p: {} for p in paths})
    names = [f"bench.{tag}.{i}" for i in range(len(paths))]
    try:
        meter = H.CpuMeter(b.postmaster).start({"receiver": ep.pid})
        with c.transaction():  # all start together
            for name, path in zip(names, paths):
                c.execute("SELECT streams.create_webhook(%s, %s, %s, after => %s, batch => %s)",
                          (name, stream, ep.url(path), positions[0] - 1, batch))
        t_created = time.monotonic_ns()
        _wait_position(c, names, positions[-1], timeout=600)
        cpu = meter.stop()
    finally:
        try:
            for name in names:
                c.execute("SELECT streams.drop_webhook(%s)", (name,))
        finally:  # also when the server went away: no receiver outlives the run
            requests = ep.stop()
    first = min(t for _, _, t, _ in requests)
    last = max(t for _, _, t, _ in requests)
    # Events after the first request (whose events were sent at time 0).
    first_events = sum(len(pos) for _, _, t, pos in requests if t == first)
    total = len(positions) * len(paths)
    checks = [_check(_delivered(requests, p), positions) for p in paths]
    return dict(events=total, requests=len(requests), seconds=(last - first) / 1e9,
                events_per_s=(total - first_events) / ((last - first) / 1e9) if last > first else float("nan"),
                first_request_ms=(first - t_created) / 1e6, cpu=cpu,
                server_cpu_us=cpu["server_s"] * 1e6 / total if "server_s" in cpu else None,
                missing=sum(x[0] for x in checks), duplicates=sum(x[1] for x in checks),
                out_of_order=sum(x[2] for x in checks))


def _latency(b, cfg, batch, slow):
    P, rate = cfg["wh_lat_publishers"], cfg["wh_lat_rate"]
    H.say(f"7{'d' if slow else 'c'}. latency at {rate:,} events/s, batch {batch} ({P} publisher processes, "
          f"{cfg['wh_lat_secs']} s, first {cfg['wh_lat_warmup']} s discarded)"
          + (f"; a second webhook's endpoint sleeps {cfg['wh_slow_sleep']} s (webhook_timeout "
             f"{cfg['wh_timeout_ms']} ms)" if slow else ""))
    paths = {"/fast": {}}
    if slow:
        paths["/slow"] = {"sleep": cfg["wh_slow_sleep"]}
    ep = Endpoint(paths)
    fast, sleeper = f"bench.lat.b{batch}{'.slow' if slow else ''}", f"bench.lat.b{batch}.sleeper"
    interval = int(P * 1e9 / rate)
    start_evt = b.ctx.Event()
    start_ns, end_ns = b.ctx.Value("q", 0), b.ctx.Value("q", 0)
    pubs = []
    try:
        with H.connect(H.DB) as c:
            with c.transaction():
                c.execute("SELECT streams.create_webhook(%s, %s, %s, batch => %s)",
                          (fast, LAT_STREAM, ep.url("/fast"), batch))
                if slow:
                    c.execute("SELECT streams.create_webhook(%s, %s, %s, batch => %s)",
                              (sleeper, LAT_STREAM, ep.url("/slow"), batch))
            for i in range(P):
                ready = b.ctx.Event()
                rx, tx = b.ctx.Pipe(duplex=False)
                p = b.ctx.Process(target=H.publisher_main, daemon=True,
                                  args=(H.dsn(H.DB), LAT_STREAM, interval, i * interval // P, ready,
                                        start_evt, start_ns, end_ns, tx))
                p.start()
                pubs.append((p, ready, rx))
            for p, ready, _ in pubs:
                if not ready.wait(60):
                    raise H.BenchError("a publisher process did not start")
            t0 = time.monotonic_ns() + 200_000_000
            start_ns.value, end_ns.value = t0, t0 + int(cfg["wh_lat_secs"] * 1e9)
            start_evt.set()
            sent = []
            for p, _, rx in pubs:
                (recs,) = H._recv(rx, cfg["wh_lat_secs"] + 120, "publisher")
                sent.extend(recs)
                p.join(10)
            # A webhook slower than the publishers (batch 1) drains its backlog now.
            _wait_position(c, [fast], max(r[0] for r in sent), timeout=600)
            sleeper_state = None
            if slow:
                sleeper_state = c.execute("SELECT state, position, attempts, last_error FROM streams.webhooks "
                                          "WHERE name = %s", (sleeper,)).fetchone()
            for name in [fast] + ([sleeper] if slow else []):
                c.execute("SELECT streams.drop_webhook(%s)", (name,))
    finally:
        for p, _, _ in pubs:
            if p.is_alive():
                p.kill()
        requests = ep.stop()
    got = {}
    for pos, t in _delivered(requests, "/fast"):
        got.setdefault(pos, t)
    missing, dupes, order = _check(_delivered(requests, "/fast"), sorted(r[0] for r in sent))
    warm_end = t0 + int(cfg["wh_lat_warmup"] * 1e9)
    measured = [r for r in sent if r[1] >= warm_end]
    after = [(got[pos] - t_after) / 1e6 for pos, _, _, t_after in measured if pos in got]
    behind = [(t_before - t_sched) / 1e6 for _, t_sched, t_before, _ in measured]
    fast_requests = [r for r in requests if r[0] == "/fast"]
    span = cfg["wh_lat_secs"] - cfg["wh_lat_warmup"]
    out = dict(batch=batch, slow_neighbour=slow, events=len(measured), achieved_rate=len(measured) / span,
               from_commit_returned_ms=after, publisher_behind_schedule_ms=behind,
               requests=len(fast_requests),
               events_per_request=sum(len(r[3]) for r in fast_requests) / max(1, len(fast_requests)),
               missing=missing, duplicates=dupes, out_of_order=order)
    if slow:
        out["sleeper_requests"] = sum(1 for r in requests if r[0] == "/slow")
        out["sleeper_state"] = list(sleeper_state)
    H.info(f"{len(measured):,} events at {out['achieved_rate']:,.0f}/s: from COMMIT returned p50 "
           f"{H.pct(after, 50):.2f} ms, p99 {H.pct(after, 99):.2f} ms; {out['events_per_request']:.1f} events "
           "per request" + (f"; the sleeper got {out['sleeper_requests']} request(s), state "
                            f"{sleeper_state[0]}" if slow else ""))
    if missing or dupes or order:
        H.info(f"WARNING: {missing} event(s) never delivered, {dupes} twice, {order} out of order")
    return out


# --------------------------------------------------------------------------
# Report (called from bench/report.py; reads res["webhooks"] only)
# --------------------------------------------------------------------------

def _eps(runs):
    return H.med([r["events_per_s"] for r in runs]) if runs else float("nan")


def _best(by_batch, key):
    """(batch, figure) of the batch size with the best figure."""
    return max(((int(n), key(runs)) for n, runs in by_batch.items()), key=lambda x: x[1])


def _lat_runs(wh, slow):
    return [r for r in wh["latency"] if r["slow_neighbour"] == slow]


def values(res):
    wh = res.get("webhooks")
    if not wh:
        return {}
    tp = wh["throughput"]
    n_end = wh["config"]["wh_endpoints"]
    sizes = " / ".join(str(n) for n in tp["one"])
    one_batch, one = _best(tp["one"], _eps)
    many_batch, many = _best(tp["many"], _eps)
    lat, slow = {}, {}
    for key, runs in (("webhook_latency_p99", _lat_runs(wh, False)),
                      ("webhook_slow_neighbour_p99", _lat_runs(wh, True))):
        best = min(runs, key=lambda r: H.pct(r["from_commit_returned_ms"], 99))
        (lat if key == "webhook_latency_p99" else slow).update(
            value=H.pct(best["from_commit_returned_ms"], 99), batch=best["batch"],
            rate=f"{wh['config']['wh_lat_rate']:,}")
    runs = [r for by in tp.values() for rr in by.values() for r in rr] + wh["latency"]
    bad = [r for r in runs if r["missing"] or r["duplicates"] or r["out_of_order"]]
    return {
        "webhook_one_eps": dict(value=one, batch=one_batch, sizes=sizes),
        "webhook_many_eps": dict(value=many, batch=many_batch, sizes=sizes, endpoints=n_end),
        "webhook_latency_p99": lat,
        "webhook_slow_neighbour_p99": slow,
        "webhook_in_order": dict(value=not bad, shown="no: " + "; ".join(
            f"{r['missing']} missing, {r['duplicates']} twice, {r['out_of_order']} out of order" for r in bad)),
    }


def notes(res, short):
    wh = res.get("webhooks")
    if not wh or not short & {"webhook_one_eps", "webhook_many_eps", "webhook_latency_p99",
                              "webhook_slow_neighbour_p99"}:
        return []
    tp = wh["throughput"]

    def cpu(runs, k):
        v = [r["cpu"].get(k) for r in runs if r["cpu"].get(k) is not None]
        return H.med(v) if v else float("nan")

    parts = []
    for kind, label in (("one", "one endpoint"), ("many", f"{wh['config']['wh_endpoints']} endpoints")):
        for n, runs in tp[kind].items():
            parts.append(f"{label}, batch {n}: {_eps(runs):,.0f} events/s with the server at "
                         f"{cpu(runs, 'server'):.0f}% and the receiver at {cpu(runs, 'receiver'):.0f}% of a CPU")
    return ["**webhooks:** " + "; ".join(parts) + " (see section 7)."]


def section(res, w):
    wh = res.get("webhooks")
    if not wh:
        return
    cfg, tp = wh["config"], wh["throughput"]
    f0, fms, pct, med = H.f0, H.fms, H.pct, H.med
    w("## 7. Webhooks")
    w("")
    w(f"Measured {wh['measured_at']}, in a fresh database. The endpoint is `tests/webhook_receiver.py --fast` "
      "(Python's ThreadingHTTPServer, the integration tests' receiver in its benchmark mode: it answers 200 at "
      "once and logs each request's arrival), one process per run on 127.0.0.1, sharing the machine's "
      f"CPUs with the server. `webhook_timeout` = {cfg['wh_timeout_ms']} ms, `webhook_retry_min` / `max` = "
      f"{cfg['wh_retry_min_ms']} / {cfg['wh_retry_max_ms']} ms.")
    w("")
    sizes = list(tp["one"])
    w(f"**Throughput.** {cfg['wh_events']:,} events preloaded into one stream, then a webhook created from "
      f"before the first (`after =>`), delivered to one endpoint; and {cfg['wh_multi_events']:,} events "
      f"delivered to each of {cfg['wh_endpoints']} webhooks at once (created in one transaction, one path "
      "each on one receiver process). Events/s from the first request's arrival to the last's; "
      + (f"{cfg['wh_reps']} rounds, batch sizes in rotating order, median (runs in brackets)"
         if cfg["wh_reps"] > 1 else "one round") + ". *Server CPU*: every process of the cluster, per event; "
      "*receiver*: the endpoint process, % of one CPU.")
    w("")
    w("| endpoints | events per request (batch) | events/s | requests/s | server CPU / event | receiver CPU "
      "| first request after create |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    for kind in ("one", "many"):
        for n in sizes:
            runs = tp[kind][n]
            v = [r["events_per_s"] for r in runs]
            rps = [r["requests"] / r["seconds"] for r in runs if r["seconds"] > 0]
            us = [r["server_cpu_us"] for r in runs if r["server_cpu_us"] is not None]
            w(f"| {1 if kind == 'one' else cfg['wh_endpoints']} | up to {n} | {f0(med(v))}"
              + (f" ({H.reps_str(v)})" if len(v) > 1 else "") + f" | {f0(med(rps)) if rps else 'n/a'} | "
              + (f"{med(us):.1f} µs" if us else "n/a") + f" | {med([r['cpu'].get('receiver', 0) for r in runs]):.0f}% | "
              f"{fms(med([r['first_request_ms'] for r in runs]))} |")
    w("")
    w(f"**Latency.** {cfg['wh_lat_publishers']} publisher processes commit one `streams.publish` per "
      f"transaction on a fixed schedule ({cfg['wh_lat_rate']:,} events/s in total) for {cfg['wh_lat_secs']} s, "
      f"the first {cfg['wh_lat_warmup']} s discarded (section 2's method); a webhook on their stream posts to "
      "an endpoint that answers at once. Measured from the publisher's COMMIT returning to the request that "
      "carries the event arriving (CLOCK_MONOTONIC in both processes). *Slow neighbour*: the same while a "
      f"second webhook on the same stream posts to a path that sleeps {cfg['wh_slow_sleep']} s, past "
      "`webhook_timeout`, so each of its requests times out and is retried.")
    w("")
    w("| webhook | batch | events | events per request | p50 | p90 | p99 | max | publishers behind schedule p99 |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in wh["latency"]:
        a = r["from_commit_returned_ms"]
        label = "with a slow neighbour" if r["slow_neighbour"] else "alone"
        w(f"| {label} | {r['batch']} | {f0(r['events'])} ({f0(r['achieved_rate'])}/s) | "
          f"{r['events_per_request']:.1f} | {fms(pct(a, 50))} | {fms(pct(a, 90))} | {fms(pct(a, 99))} | "
          f"{fms(max(a, default=float('nan')))} | {fms(pct(r['publisher_behind_schedule_ms'], 99))} |")
    w("")
    lat_batches = {r["batch"] for r in wh["latency"]}
    for n in sizes:
        eps = _eps(tp["one"][n])
        if int(n) not in lat_batches and eps < cfg["wh_lat_rate"]:
            w(f"Batch {n} is not measured here: it delivered {f0(eps)} events/s to one endpoint above, less than "
              f"the {cfg['wh_lat_rate']:,} events/s offered, so its latency would only grow with the run.")
            w("")
    for r in _lat_runs(wh, True):
        st = r["sleeper_state"]
        w(f"The slow neighbour (batch {r['batch']}) got {r['sleeper_requests']} request(s) during that run and "
          f"ended in state `{st[0]}` at position {st[1]} with {st[2]} failed attempt(s) (last error: {st[3]}).")
        w("")
    runs = [x for by in tp.values() for rr in by.values() for x in rr] + wh["latency"]
    bad = sum(1 for r in runs if r["missing"] or r["duplicates"] or r["out_of_order"])
    w("Every run's fast endpoints got every event once, in position order." if not bad else
      f"**{bad} run(s) delivered events twice, out of order or not at all** (see results.json).")
    w("")
