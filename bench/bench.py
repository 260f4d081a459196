#!/usr/bin/env python3
"""Benchmarks of litebase_streams against the plain-PostgreSQL anchors.

    make bench            full run (about 22 minutes): docs/benchmarks.md, docs/bench-*.png
    make bench QUICK=1    smoke run (under a minute): target/bench-quick/benchmarks.md

The Makefile runs `setup install start` first (a release build of the extension
in the local cluster) and exports PGHOST (the cluster's socket directory),
PGPORT and PG_BINDIR. Run directly, this script assumes the same defaults as
scripts/common.sh. Python packages (psycopg, matplotlib) are installed into
target/bench-venv on first use (bench/requirements.txt).

Every comparison runs side by side in one run, repetitions interleaved with a
rotating order (A B C, B C A, C A B), and reports medians:

  1. publish throughput (pgbench, 1/8/32 clients): streams.publish vs a plain
     INSERT of the same row vs INSERT + pg_notify in the same transaction, with
     the delivery worker running and a LISTEN client draining "payment.success";
     publish_batch of 100 events vs a 100-row INSERT; publish vs plain INSERT
     at 32 clients with synchronous_commit = off; PgQ's pgq.insert_event at
     the same client counts (not in a smoke run). The delivery worker's CPU per
     delivered event.
 1b. TPC-B with a publish (pgbench -i -s 10; 8/32 clients, 8 in a smoke run):
     pgbench's TPC-B-like transaction alone, with one streams.publish before
     END, and with the same row INSERTed into a plain table instead.
  2. delivery latency: commit -> notification received at a paced 1,000 events/s;
     the same with the publishers at synchronous_commit = off, streams.publish
     vs INSERT + pg_notify in the same transaction (an event is final only once
     its commit record is flushed; the anchor notifies before); the worker's lag
     while pgbench publishes at the maximum rate, with synchronous commit and
     with synchronous_commit = off (32 clients); a hot standby's lag.
 2e. a long-open snapshot: horizon(), a 100-event page, the worker's rounds/s
     and horizon_state's size under a paced load (pgbench -R 500), without and
     with a REPEATABLE READ transaction held open for 5 minutes (20 s in a
     smoke run), then after its COMMIT.
  3. replay throughput over N events (1M): streams.replay(), the streams.events
     view and a raw ordered scan of a plain copy of the same rows.
  4. storage: bytes per event, streams tables vs bench_plain with the same rows.
  5. growth (LARGE=1): one log grown to 50M events, measured as it grows.
  6. subscriptions: consume throughput of an ordered subscription (also
     under leases) vs replay() pages with an own cursor table vs PgQ 3,
     competing consumers on an unordered subscription, long-poll wake-up
     latency, competing consumers of a subscription ordered per key, the
     time polls wait for their deliveries to be written (attempt tracking).
  7. webhooks: events/s delivered to one local endpoint and to 10 at once
     (one event per request and up to 100), commit-to-request latency at
     1,000 events/s, alone and beside a webhook whose endpoint times out.

The code follows the run: measure -> results.json -> report.
  bench/bench.py        this driver: options, the order of the phases, results.json
  bench/common.py       what the phases share (connections, pgbench, CPU meters, clients)
  bench/phases/*.py     one module per phase: what it measures and its part of the report
  bench/report.py       the report writer (header, targets table, sections in order)
  bench/targets.toml    every target, the one place that holds a threshold

Exit status: non-zero when the harness breaks (a command or query fails, the
worker does not deliver in time); a missed target is reported, not an error.
"""


import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DB, PGHOST, PGPORT, REPO, HERE, Bench, BenchError, connect, say  # noqa: E402
from phases import all_phases  # noqa: E402
from report import load_results, report  # noqa: E402

VENV = REPO / "target" / "bench-venv"


# --------------------------------------------------------------------------
# Python environment: re-exec inside target/bench-venv with the packages.
# --------------------------------------------------------------------------

def _have_packages():
    try:
        import matplotlib  # noqa: F401
        import psycopg  # noqa: F401
        return True
    except ImportError:
        return False


def bootstrap():
    if _have_packages():
        return
    if os.environ.get("LITEBASE_BENCH_BOOTSTRAPPED"):
        raise BenchError(f"psycopg/matplotlib still missing in {sys.executable}")
    py = VENV / "bin" / "python"
    if not py.exists():
        say(f"creating {VENV.relative_to(REPO)} (Python packages for the benchmark)")
        r = subprocess.run([sys.executable, "-m", "venv", str(VENV)])
        if r.returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            # Debian's own python3 needs python3-venv for ensurepip.
            if os.geteuid() == 0 and shutil.which("apt-get"):
                say("installing python3-venv")
                subprocess.run(["apt-get", "install", "-y", "-q", "python3-venv"], check=True)
                subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            else:
                raise BenchError("python3 -m venv failed (install python3-venv)")
    if subprocess.run([str(py), "-c", "import psycopg, matplotlib"],
                      capture_output=True).returncode != 0:
        say("pip install -r bench/requirements.txt")
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-r", str(HERE / "requirements.txt")], check=True)
    os.environ["LITEBASE_BENCH_BOOTSTRAPPED"] = "1"
    sys.stdout.flush()
    os.execv(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]])


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

def config(phases, quick):
    cfg = {}
    for ph in phases:
        cfg.update(getattr(ph, "QUICK" if quick else "FULL", {}))
    return cfg


def run_only(b, ph, work_dir, out_dir, quick):
    """--only <phase>: that phase alone, its figures merged into the last
    run's results.json (the other sections keep theirs)."""
    if not getattr(ph, "OWN_DB", False):
        b.recreate_db()
    before = set(b.res)
    ph.run(b)
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    path = work_dir / "results.json"
    res = load_results(path) if path.exists() else None
    if res is not None:
        for k in set(b.res) - before:
            res[k] = b.res[k]
        # The report says which sections come from this later run.
        name = ph.__name__.rsplit(".", 1)[-1]
        res.setdefault("remeasured", {})[name] = dict(
            at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), git=b.res["machine"]["git"],
            load=b.res["machine"]["load_at_start"])
        res["config"].update({k: b.cfg[k] for k in getattr(ph, "FULL", {})})
        if hasattr(ph, "finish"):  # growth keeps its figures in docs/bench-growth.json
            ph.finish(res, out_dir, quick)
        path.write_text(json.dumps(res, indent=1, default=str))
        try:
            return report(res, out_dir)
        except KeyError as e:  # results.json of an older bench.py
            say(f"{path.relative_to(REPO)} lacks {e} (an older run): report not redrawn")
    else:
        path.write_text(json.dumps(b.res, indent=1, default=str))
        say(f"no earlier run in {work_dir.relative_to(REPO)}: figures in results.json, report not redrawn")


def main():
    phases = all_phases()
    runnable = {ph.NAME: ph for ph in phases if hasattr(ph, "run")}
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: short, one repetition, small data")
    ap.add_argument("--out", help="report directory (default docs/, or target/bench-quick/ with --quick)")
    ap.add_argument("--large", action="store_true",
                    help="also grow one log to 1M, 10M and 50M events and measure at each (about 25 more "
                         "minutes; the figures are kept in docs/bench-growth.json for later reports)")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: redraw the report and plots from the last run's results.json")
    ap.add_argument("--only", choices=list(runnable),
                    help="run only this phase (bench/phases/<name>.py; consume: section 6) and merge its "
                         "figures into the last run's results.json; the report is redrawn when that file "
                         "has a whole run")
    args = ap.parse_args()
    bootstrap()
    t_start = time.monotonic()
    cfg = config(phases, args.quick)
    out_dir = Path(args.out) if args.out else (REPO / "target" / "bench-quick" if args.quick
                                               else REPO / "docs")
    work_dir = REPO / "target" / ("bench-quick" if args.quick else "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report(load_results(work_dir / "results.json"), out_dir)
        return
    log_dir = work_dir / "logs"
    if not args.only:  # --only keeps the last run's logs, which its report points to
        shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    say(f"{'quick smoke run' if args.quick else 'full run'}{f' of {args.only} only' if args.only else ''}: "
        f"server {PGHOST}:{PGPORT}, database {DB}, report {out_dir}")
    b = Bench(cfg, args.quick, out_dir, log_dir)
    b.res["log_dir"] = str(log_dir.relative_to(REPO))
    b.res["work_dir"] = str(work_dir.relative_to(REPO))
    b.machine()
    b.find_postmaster()
    if args.only:
        return run_only(b, runnable[args.only], work_dir, out_dir, args.quick)
    # Every phase in ORDER; the optional ones (growth) last, with --large or --quick.
    order = [ph for ph in runnable.values() if not getattr(ph, "OPTIONAL", False)]
    if args.large or args.quick:
        order += [ph for ph in runnable.values() if getattr(ph, "OPTIONAL", False)]
    if not getattr(order[0], "OWN_DB", False):
        b.recreate_db()
    for ph in order:
        ph.run(b)
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    b.res["elapsed_s"] = time.monotonic() - t_start
    b.res["generated_at"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    for ph in phases:
        if hasattr(ph, "finish"):
            ph.finish(b.res, out_dir, args.quick)
    (work_dir / "results.json").write_text(json.dumps(b.res, indent=1, default=str))
    report(b.res, out_dir)


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"ERROR: bench: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # a failed query or connection: the harness broke
        if type(e).__module__.startswith("psycopg"):
            print(f"ERROR: bench: {type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(1)
        raise
    except KeyboardInterrupt:
        sys.exit(130)
