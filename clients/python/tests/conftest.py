"""Test fixtures: a database of its own per test on the dev cluster, a
publisher connection, wait_until, and collectors that run a subscription
(sync in a thread, asyncio in a thread's event loop) while a test acts."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import litebase_streams as lbs

BASE_DSN = os.environ.get("LITEBASE_STREAMS_DSN", "host=127.0.0.1 port=54329 user=postgres dbname=postgres")


def dsn_for(dbname: str, **extra: str) -> str:
    """BASE_DSN with another database (and other keywords)."""
    params = psycopg.conninfo.conninfo_to_dict(BASE_DSN)
    params.update(dbname=dbname, **extra)
    return psycopg.conninfo.make_conninfo(**params)


def wait_until(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `cond` until it is truthy (its value) or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Db:
    """A database of the test's own, with the extension."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dsn = dsn_for(name)
        self.conn = psycopg.connect(self.dsn, autocommit=True)

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    def one(self, query: str, params: Any = None) -> Any:
        return self.sql(query, params)[0][0]

    def publish(self, stream: str, data: Any, **kw: Any) -> int:
        """Publish in autocommit and wait until the event is final."""
        position = lbs.publish(self.conn, stream, data, **kw)
        assert self.one("SELECT streams.wait(%s, '10s')", (position,))
        return position

    def worker_pid(self) -> int:
        return wait_until(lambda: self.one("SELECT streams.worker_pid()"), what="a worker")

    def restart_worker(self) -> None:
        old = self.worker_pid()
        self.sql("SELECT pg_terminate_backend(%s)", (old,))
        wait_until(lambda: self.one("SELECT streams.worker_pid()") not in (None, old), what="a new worker")

    def recreate_log(self) -> None:
        """DROP and CREATE the extension: a new log (new log_id, positions from 1).

        Right after it, a publish can fail for a moment with 55000
        ("position_seq handed out position 1, at or below the horizon N"):
        the database's shared state still holds the old log's horizon until
        the worker notices (an extension race, seen with 0.3.0). So wait
        until a publish (rolled back) goes through."""
        self.sql("DROP EXTENSION litebase_streams CASCADE")
        self.sql("CREATE EXTENSION litebase_streams")
        self.worker_pid()

        def publishes() -> bool:
            try:
                with self.conn.transaction(force_rollback=True):
                    lbs.publish(self.conn, "probe", {})
                return True
            except lbs.InvalidState:
                return False
        wait_until(publishes, what="the new log to accept a publish")

    def terminate(self, application_name: str) -> int:
        """Cut the connections of a client: how many."""
        return self.one("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = %s", (application_name,))


@pytest.fixture
def db() -> Iterator[Db]:
    name = f"lbs_py_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(BASE_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    d = Db(name)
    d.sql("CREATE EXTENSION litebase_streams")
    d.worker_pid()
    try:
        yield d
    finally:
        d.conn.close()
        with psycopg.connect(BASE_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Collector:
    """Runs a subscription in a thread, keeping what it hands out."""

    def __init__(self) -> None:
        self.events: list[lbs.Event] = []
        self.cursors: list[lbs.Cursor] = []
        self.error: BaseException | None = None
        self.sub: Any = None
        self.thread: threading.Thread | None = None

    def positions(self) -> list[int]:
        return [e.position for e in self.events]

    def wait_for(self, count: int, timeout: float = 20.0) -> list[lbs.Event]:
        try:
            wait_until(lambda: len(self.events) >= count or self.error, timeout, f"{count} events")
        except AssertionError as e:
            raise AssertionError(f"{e}: have {self.positions()}") from None
        if self.error is not None and len(self.events) < count:
            raise AssertionError(f"the subscription failed: {self.error!r}")
        return self.events

    def wait_error(self, timeout: float = 20.0) -> BaseException:
        return wait_until(lambda: self.error, timeout, "the subscription to fail")

    def stop(self) -> None:
        if self.sub is not None:
            self.sub._closed = True
        if self.thread is not None:
            self.thread.join(15)
            assert not self.thread.is_alive(), "the subscription did not stop"


def start_sync(dsn: str, pattern: str, **kw: Any) -> Collector:
    c = Collector()
    c.sub = lbs.subscribe(dsn, pattern, replay_interval=0.2, max_replay_interval=0.5, **kw)

    def run() -> None:
        try:
            for event in c.sub:
                c.events.append(event)
                c.cursors.append(c.sub.cursor)
        except BaseException as e:  # reported to the test
            c.error = e

    c.thread = threading.Thread(target=run, daemon=True)
    c.thread.start()
    return c


def start_async(dsn: str, pattern: str, **kw: Any) -> Collector:
    c = Collector()
    c.sub = lbs.subscribe_async(dsn, pattern, replay_interval=0.2, max_replay_interval=0.5, **kw)

    async def collect() -> None:
        async with c.sub:
            async for event in c.sub:
                c.events.append(event)
                c.cursors.append(c.sub.cursor)

    def run() -> None:
        try:
            asyncio.run(collect())
        except BaseException as e:
            c.error = e

    c.thread = threading.Thread(target=run, daemon=True)
    c.thread.start()
    return c


@pytest.fixture(params=["sync", "asyncio"])
def start(request: pytest.FixtureRequest) -> Callable[..., Collector]:
    """Start a subscription collector: sync or asyncio (each test runs with both)."""
    started: list[Collector] = []

    def starter(dsn: str, pattern: str, **kw: Any) -> Collector:
        c = (start_sync if request.param == "sync" else start_async)(dsn, pattern, **kw)
        started.append(c)
        return c

    yield starter
    for c in started:
        c.stop()
