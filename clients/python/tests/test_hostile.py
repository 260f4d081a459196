"""Hostile review: what publishers and any connected role can do to a subscriber.

Each test failed before the fix it names (see the report of helper "hostile")."""

from __future__ import annotations

import threading

import psycopg

import litebase_streams as lbs
from conftest import Db, start_sync

STREAM = "payment.success"
#: Deeper than Python's json module parses (about 1,000 levels), well within jsonb's limit.
DEEP = "[" * 3000 + "]" * 3000


def test_deeply_nested_data_does_not_kill_a_subscription(db: Db, start) -> None:
    """A publisher's event nested deeper than Python's json parses used to
    raise RecursionError out of every subscriber of the stream, at each
    restart again (a poison pill). Now its data arrives as the JSON text."""
    deep = db.one("SELECT streams.publish(%s, %s::jsonb)", (STREAM, DEEP))
    sub = start(db.dsn, STREAM)
    after = db.publish(STREAM, {"n": 2})
    events = sub.wait_for(2)
    assert [e.position for e in events] == [deep, after]
    assert isinstance(events[0].data, lbs.UndecodedJSON)
    assert events[0].data.replace(" ", "") == DEEP
    assert events[1].data == {"n": 2}
    # Live, by notification, too.
    live = db.one("SELECT streams.publish(%s, %s::jsonb)", (STREAM, DEEP))
    assert [e.position for e in sub.wait_for(3)][2] == live


def test_deeply_nested_data_is_consumed_not_fatal(db: Db) -> None:
    db.sql("SELECT streams.create_subscription('deep', %s)", (STREAM,))
    deep = db.one("SELECT streams.publish(%s, %s::jsonb)", (STREAM, DEEP))
    db.one("SELECT streams.wait(%s, '10s')", (deep,))
    seen: list[lbs.Event] = []
    stop = threading.Event()

    def handler(event: lbs.Event, delivery: lbs.Delivery) -> None:
        seen.append(event)
        stop.set()

    assert lbs.consume(db.dsn, "deep", handler, wait="1s", stop=stop, handle_signals=False) == 1
    assert seen[0].position == deep and isinstance(seen[0].data, lbs.UndecodedJSON)


def test_a_flood_of_forged_notifications_costs_a_bounded_number_of_queries(db: Db) -> None:
    """Each forged notification used to cost a worker-pid read and a replay:
    a role that can connect turned one pg_notify into two queries of every
    subscriber. Now forced replays (and re-reads of the worker's pid) are at
    most one per replay interval."""
    sub = start_sync(db.dsn, STREAM)
    queries = [0]
    follower = sub.sub._follower
    saw_worker = follower.saw_worker

    def counting(*args):  # every replay page and every pid re-read passes here
        queries[0] += 1
        return saw_worker(*args)

    follower.saw_worker = counting
    try:
        first = db.publish(STREAM, {"n": 1})
        sub.wait_for(1)
        before = queries[0]
        forger = psycopg.connect(db.dsn, autocommit=True)
        for i in range(300):  # one notification per transaction: one batch each
            forger.execute("SELECT pg_notify(%s, %s)",
                           (STREAM, f'{{"position":{first + 1 + i},"stream":"{STREAM}","prev":{first}}}'))
        forger.close()
        marker = db.publish(STREAM, {"n": 2})
        sub.wait_for(2)
        spent = queries[0] - before
        assert spent < 40, f"{spent} queries for 300 forged notifications"
        assert [e.position for e in sub.events] == [first, marker]
    finally:
        sub.stop()


def test_catch_up_holds_one_page_in_memory(db: Db) -> None:
    """A catch-up used to read every page of the backlog into memory before
    handing out the first event (a publisher of a million events grew every
    new subscriber by all of them). Now it holds at most a page."""
    last = lbs.publish_batch(db.conn, STREAM, [{"n": i} for i in range(5000)])[-1]
    db.one("SELECT streams.wait(%s, '10s')", (last,))
    sub = lbs.subscribe(db.dsn, STREAM, page_size=100)
    try:
        it = iter(sub)
        next(it)
        assert len(sub._pending) < 100
        got = 1 + sum(1 for _, e in zip(range(4999), it))
        assert got == 5000
    finally:
        sub.close()
