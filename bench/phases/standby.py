"""2d. A hot standby of the local cluster (pg_basebackup -R, streaming) while
pgbench publishes at the maximum rate: how far behind the primary it shows
events. Its report closes section 2 (with the latency plot)."""

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from common import DB, PGHOST, PGPORT, PGUSER, connect, f0, fms, info, pct, pg_bindir, say

ORDER = 22


def run(b):
    """A hot standby of the local cluster (pg_basebackup -R, streaming) while
    pgbench publishes at the maximum rate: the age of the newest event each
    server shows, sampled every 50 ms on both."""
    cfg = b.cfg
    say(f"2d. hot standby: how far behind the primary it shows events, pgbench publish.sql, "
        f"{cfg['lag_clients']} clients, {cfg['lag_secs']} s")
    bindir = pg_bindir()
    as_server = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    data = Path(f"/tmp/lbs-bench-standby-{os.getpid()}")
    shutil.rmtree(data, ignore_errors=True)
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    subprocess.run(as_server + [f"{bindir}/pg_basebackup", "-D", str(data), "-R", "-c", "fast", "-X", "stream",
                                "-h", PGHOST, "-p", str(PGPORT), "-U", PGUSER], check=True, capture_output=True)
    opts = f"-p {port} -c listen_addresses='' -c unix_socket_directories={data}"
    subprocess.run(as_server + [f"{bindir}/pg_ctl", "-D", str(data), "-l", str(data / "standby.log"), "-w",
                                "-o", opts, "start"], check=True, capture_output=True)
    newest_age = ("SELECT extract(epoch FROM clock_timestamp() - e.time) * 1000 FROM streams.events e "
                  "WHERE e.position = (SELECT max(position) FROM streams.events)")
    samples, stop = [], threading.Event()

    def sampler():
        import psycopg
        with connect(DB) as pc, psycopg.connect(
                f"host={data} port={port} user={PGUSER} dbname={DB}", autocommit=True) as sc:
            t_next = time.monotonic()
            while not stop.is_set():
                ages = [conn.execute(newest_age).fetchone() for conn in (pc, sc)]
                if all(a and a[0] is not None for a in ages):
                    samples.append((float(ages[0][0]), float(ages[1][0])))
                t_next += 0.05
                time.sleep(max(0.0, t_next - time.monotonic()))

    th = threading.Thread(target=sampler, daemon=True)
    try:
        th.start()
        time.sleep(0.5)
        before = len(samples)
        r = b.run_pgbench("publish.sql", cfg["lag_clients"], cfg["lag_secs"], "standby-publish")
        after = len(samples)
    finally:
        stop.set()
        th.join(5)
        subprocess.run(as_server + [f"{bindir}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
    # Samples taken while events flowed (the primary's newest event younger
    # than a second); the standby's lag is how much older its newest event
    # was than the primary's at the same moment.
    flowing = [a for a in samples[before:after] if a[0] < 1000]
    during = dict(primary=[a[0] for a in flowing], standby=[a[1] for a in flowing],
                  behind=[a[1] - a[0] for a in flowing])
    b.res["standby"] = dict(pgbench=r, newest_age_ms=during)
    info(f"{r['tps']:,.0f} events/s; {len(flowing)} samples; the standby's newest event was older than the "
         f"primary's by p50 {pct(during['behind'], 50):.1f} / p99 {pct(during['behind'], 99):.1f} ms")


# --------------------------------------------------------------------------
# Report (reads res["standby"])
# --------------------------------------------------------------------------

def section(res, w):
    cfg = res["config"]
    sb_ = res.get("standby")
    if sb_:
        w(f"**Hot standby.** A streaming standby of the same cluster (`pg_basebackup -R`) while "
          f"`pgbench -f bench/publish.sql -c {cfg['lag_clients']}` publishes at {f0(sb_['pgbench']['tps'])} "
          "events/s: the age of the newest event each server shows in `streams.events` "
          "(wall clock minus its commit time), sampled on both every 50 ms while events flowed; "
          "\"standby behind\" is how much older the standby's newest event was at the same moment.")
        w("")
        w("| age of the newest visible event | p50 | p99 | max |")
        w("| --- | --- | --- | --- |")
        for name, label in (("primary", "primary"), ("standby", "standby"), ("behind", "standby behind")):
            v = sb_["newest_age_ms"][name]
            w(f"| {label} | {fms(pct(v, 50))} | {fms(pct(v, 99))} | {fms(max(v, default=float('nan')))} |")
        w("")
    # The end of section 2 (latency.py opens it), with or without a standby run.
    w("")
    w("![latency](bench-latency.png)")
    w("")

