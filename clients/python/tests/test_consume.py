"""consume: exactly once inside the database, through PgBouncer, with
failures and a killed consumer; nack reasons; ordered retries; leases;
graceful shutdown."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

import litebase_streams as lbs
from conftest import Db, wait_until

HERE = Path(__file__).parent
SCRATCH = Path(os.environ.get("LITEBASE_STREAMS_SCRATCH_DIR", "/tmp/litebase_streams-scratch-54329"))
REPO = HERE.parents[2]


def _pgbouncer(pool_size: int | None = None):
    """A PgBouncer of the test's own (transaction pooling, scripts/pgbouncer.sh's
    config, `pool_size` server connections per database if given) in front of
    the dev cluster; yields its port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = psycopg.conninfo.conninfo_to_dict(os.environ.get(
        "LITEBASE_STREAMS_DSN", "host=127.0.0.1 port=54329 user=postgres dbname=postgres"))
    folder = SCRATCH / f"pgbouncer-py-{os.getpid()}-{port}"
    folder.mkdir(parents=True, exist_ok=True)
    ini = subprocess.run(
        ["bash", str(REPO / "scripts/pgbouncer.sh"), "ini"], check=True, capture_output=True, text=True,
        env={**os.environ, "PGBOUNCER_DIR": str(folder), "PGBOUNCER_PORT": str(port),
             "PGBOUNCER_TARGET_HOST": str(target.get("host", "127.0.0.1")),
             "PGPORT": str(target.get("port", "5432"))}).stdout
    if pool_size is not None:
        assert "default_pool_size = " in ini
        ini = "\n".join(f"default_pool_size = {pool_size}" if line.startswith("default_pool_size = ") else line
                        for line in ini.splitlines()) + "\n"
    (folder / "pgbouncer.ini").write_text(ini)
    os.chmod(folder, 0o777)
    command = ["pgbouncer", str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        command = ["runuser", "-u", "postgres", "--"] + command
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready() -> bool:
        try:
            psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres").close()
            return True
        except psycopg.OperationalError:
            return False
    try:
        wait_until(ready, what="pgbouncer")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pgbouncer() -> int:
    yield from _pgbouncer()


@pytest.fixture
def pgbouncer_one_server() -> int:
    """A PgBouncer whose clients share one server connection per database."""
    yield from _pgbouncer(pool_size=1)


def test_consumers_sharing_one_server_connection_need_no_prepared_statements(
        db: Db, pgbouncer_one_server: int) -> None:
    """The README's finding: psycopg prepares statements (by default after 5
    runs of one), and PgBouncer 1.18 in transaction pooling mode hands the
    same server connection to another client, whose prepared statement of
    the same name then fails. consume() turns preparing off, so consumers
    sharing one server connection work."""
    dsn = f"host=127.0.0.1 port={pgbouncer_one_server} user=postgres dbname={db.name}"
    # Raw psycopg preparing at once: the second client's "_pg3_0" meets the first's.
    with psycopg.connect(dsn, prepare_threshold=0, autocommit=True) as a, \
            psycopg.connect(dsn, prepare_threshold=0, autocommit=True) as b:
        a.execute("SELECT 1 + %s", (1,))
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            b.execute("SELECT 2 + %s", (1,))

    db.sql("CREATE TABLE effects (position bigint PRIMARY KEY)")
    db.sql("SELECT streams.create_subscription('shared', 'job', ordered => false)")
    for i in range(60):
        db.publish("job", {"n": i})
    stop = threading.Event()
    errors: list[BaseException] = []

    def handler(event: lbs.Event, delivery: lbs.Delivery) -> None:
        delivery.conn.execute("INSERT INTO effects VALUES (%s)", (event.position,))

    def run() -> None:
        try:
            lbs.consume(dsn, "shared", handler, max_events=5, wait="200ms", stop=stop, handle_signals=False)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            stop.set()
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: errors or db.one("SELECT count(*) FROM effects") == 60, timeout=60,
                   what="every event handled")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert db.one("SELECT count(*) FROM effects") == 60


def test_three_consumers_through_pgbouncer_exactly_once_with_failures_and_a_kill(db: Db, pgbouncer: int) -> None:
    events = 300
    db.sql("CREATE TABLE effects (position bigint NOT NULL, attempt int NOT NULL, pid int)")
    db.sql("SELECT streams.create_subscription('work', 'job.*', after => 0, ordered => false, "
           "max_attempts => 5, backoff_min => '10 milliseconds', backoff_max => '50 milliseconds')")
    with db.conn.transaction():
        positions = lbs.publish_batch(db.conn, "job.run", [{"n": n} for n in range(events)])
    db.one("SELECT streams.wait(%s, '10s')", (positions[-1],))

    dsn = f"host=127.0.0.1 port={pgbouncer} user=postgres dbname={db.name}"
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    consumers = [subprocess.Popen([sys.executable, str(HERE / "consumer_process.py"), dsn, "work"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
                 for _ in range(3)]
    try:
        done = lambda: db.one("SELECT count(DISTINCT position) FROM effects")
        wait_until(lambda: done() >= events // 4, 60, "a quarter of the events")
        consumers[0].send_signal(signal.SIGKILL)
        consumers[0].wait(10)
        wait_until(lambda: done() >= events, 90, f"every event's effect (have {done()})")
        for c in consumers[1:]:
            c.send_signal(signal.SIGTERM)
        outputs = [c.communicate(timeout=20) for c in consumers[1:]]
        assert [c.returncode for c in consumers[1:]] == [0, 0], outputs
    finally:
        for c in consumers:
            if c.poll() is None:
                c.kill()

    rows = db.sql("SELECT position, count(*) FROM effects GROUP BY position ORDER BY position")
    assert [p for p, _ in rows] == positions, "every event has an effect"
    assert [p for p, n in rows if n != 1] == [], "no effect twice"
    # The failing tenth were retried: their one committed effect is a later attempt.
    retried = db.sql("SELECT position FROM effects WHERE position % 10 = 0 AND attempt = 1")
    assert retried == []
    assert db.one("SELECT count(*) FROM streams.dead_letters") == 0
    assert db.one("SELECT pending FROM streams.subscriptions WHERE name = 'work'") == 0


def run_consumer(db: Db, handler, stop: threading.Event, **kw) -> threading.Thread:
    thread = threading.Thread(target=lbs.consume, args=(db.dsn, "s", handler),
                              kwargs={"stop": stop, "wait": 0.2, **kw}, daemon=True)
    thread.start()
    return thread


def test_a_failing_handler_is_nacked_with_its_reason_and_order_holds(db: Db) -> None:
    db.sql("CREATE TABLE done (position bigint PRIMARY KEY, attempt int)")
    db.sql("SELECT streams.create_subscription('s', 'q', after => 0, max_attempts => 2, "
           "backoff_min => '10 milliseconds', backoff_max => '20 milliseconds')")
    positions = [db.publish("q", {"n": n, "poison": n == 1}) for n in range(3)]

    def handler(event: lbs.Event, d: lbs.Delivery) -> None:
        if event.data["poison"]:
            raise ValueError("cannot ship to the moon")
        d.conn.execute("INSERT INTO done VALUES (%s, %s)", (event.position, d.attempt))

    stop = threading.Event()
    thread = run_consumer(db, handler, stop)
    try:
        wait_until(lambda: db.one("SELECT count(*) FROM streams.dead_letters"), what="a dead letter")
        wait_until(lambda: db.one("SELECT count(*) FROM done") == 2, what="the others")
    finally:
        stop.set()
        thread.join(10)
    assert db.sql("SELECT position, attempts, last_error FROM streams.dead_letters") == [
        (positions[1], 2, "cannot ship to the moon")]
    # Ordered: the event after the poison one waited for it (one attempt, after it).
    assert db.sql("SELECT position, attempt FROM done ORDER BY position") == [
        (positions[0], 1), (positions[2], 1)]


def test_leases_commit_each_job_with_its_ack(db: Db) -> None:
    db.sql("CREATE TABLE done (position bigint PRIMARY KEY, lease bigint)")
    db.sql("SELECT streams.create_subscription('s', 'video', after => 0, "
           "backoff_min => '10 milliseconds', backoff_max => '20 milliseconds')")
    positions = [db.publish("video", {"n": n}) for n in range(4)]

    def handler(event: lbs.Event, d: lbs.Delivery) -> None:
        d.conn.execute("INSERT INTO done VALUES (%s, %s)", (event.position, d.lease_id))
        if event.data["n"] == 1 and d.attempt == 1:
            raise RuntimeError("transcoder crashed")  # rolls the insert back, nacks, ends the lease

    stop = threading.Event()
    thread = run_consumer(db, handler, stop, lease=30, max_events=2)
    try:
        wait_until(lambda: db.one("SELECT count(*) FROM done") == 4, what="every job")
    finally:
        stop.set()
        thread.join(10)
    rows = db.sql("SELECT position, lease FROM done ORDER BY position")
    assert [p for p, _ in rows] == positions and all(lease is not None for _, lease in rows)
    assert db.one("SELECT pending FROM streams.subscriptions WHERE name = 's'") == 0


def test_sigterm_finishes_the_transaction_then_returns(db: Db, pgbouncer: int) -> None:
    db.sql("CREATE TABLE effects (position bigint NOT NULL, attempt int NOT NULL, pid int)")
    db.sql("SELECT streams.create_subscription('work', 'job.*', after => 0)")
    dsn = f"host=127.0.0.1 port={pgbouncer} user=postgres dbname={db.name}"
    proc = subprocess.Popen([sys.executable, str(HERE / "consumer_process.py"), dsn, "work"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(HERE)})
    try:
        position = db.publish("job.one", {"n": 1})
        wait_until(lambda: db.one("SELECT count(*) FROM effects"), what="the effect")
        wait_until(lambda: db.one("SELECT pending FROM streams.subscriptions") == 0, what="the ack")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == "1"
    assert db.sql("SELECT position FROM effects") == [(position,)]


def test_consume_async_commits_effects_with_acks_and_nacks_failures(db: Db) -> None:
    import asyncio

    db.sql("CREATE TABLE done (position bigint NOT NULL, attempt int)")
    db.sql("SELECT streams.create_subscription('s', 'a.*', after => 0, ordered => false, "
           "backoff_min => '10 milliseconds', backoff_max => '20 milliseconds')")
    with db.conn.transaction():
        positions = lbs.publish_batch(db.conn, "a.b", [{"n": n} for n in range(30)])
    db.one("SELECT streams.wait(%s)", (positions[-1],))

    async def handler(event: lbs.Event, d: lbs.AsyncDelivery) -> None:
        await d.conn.execute("INSERT INTO done VALUES (%s, %s)", (event.position, d.attempt))
        if event.data["n"] % 10 == 3 and d.attempt == 1:
            raise RuntimeError("try again")

    async def main() -> int:
        stop = asyncio.Event()
        task = asyncio.create_task(lbs.consume_async(db.dsn, "s", handler, stop=stop, wait=0.2,
                                                     max_events=7, handle_signals=False))
        while await asyncio.to_thread(db.one, "SELECT count(DISTINCT position) FROM done") < 30:
            await asyncio.sleep(0.05)
        stop.set()
        return await asyncio.wait_for(task, 10)

    assert asyncio.run(main()) == 30
    rows = db.sql("SELECT position, count(*), max(attempt) FROM done GROUP BY position ORDER BY position")
    assert [p for p, _, _ in rows] == positions
    assert all(n == 1 for _, n, _ in rows), "each effect once"
    assert sorted(p for p, _, a in rows if a == 2) == [positions[i] for i in (3, 13, 23)]
