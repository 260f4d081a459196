"""subscribe / subscribe_async: exactly once, in order, whatever happens.

Each test runs twice, with the sync and the asyncio subscription (the
`start` fixture)."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

import litebase_streams as lbs
from conftest import Db, dsn_for

STREAM = "payment.success"


def forge(dsn: str, channel: str, position: int, prev: int) -> None:
    """pg_notify a plausible payload on `channel` from the connection `dsn`."""
    payload = json.dumps({"position": position, "stream": channel, "time": "2026-12-03T18:50:10.123456Z",
                          "tx": 1, "prev": prev, "data": {"forged": True}})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def test_every_event_once_in_order_through_every_fault(db: Db, start) -> None:
    app = f"lbs_py_sub_{uuid.uuid4().hex[:8]}"
    forger = f"lbs_py_forger_{uuid.uuid4().hex[:8]}"
    db.sql(f'CREATE ROLE "{forger}" LOGIN')
    try:
        sub = start(dsn_for(db.name, application_name=app), STREAM)
        expected = [db.publish(STREAM, {"n": 1})]
        sub.wait_for(1)

        # Forged notifications, by a superuser and by a role with no grant at all:
        # the next position, a plausible prev. Never delivered.
        head = expected[-1]
        forge(db.dsn, STREAM, head + 1, head)
        forge(dsn_for(db.name, user=forger), STREAM, head + 2, head)
        expected.append(db.publish(STREAM, {"n": 2}))
        sub.wait_for(2)

        # A worker restart: the new worker's pid is trusted after one re-read.
        db.restart_worker()
        expected.append(db.publish(STREAM, {"n": 3}))
        sub.wait_for(3)

        # A cut connection: an event published while it is down, one after.
        assert db.terminate(app) >= 1
        expected.append(db.publish(STREAM, {"n": 4}))
        expected.append(db.publish(STREAM, {"n": 5}))
        sub.wait_for(5)

        # Truncated (over 8000 bytes) and private events arrive with their data.
        big = "x" * 9000
        expected.append(db.publish(STREAM, {"n": 6, "big": big}))
        db.sql("SELECT streams.set_private(%s)", (STREAM,))
        expected.append(db.publish(STREAM, {"n": 7}, type="secret", key="k7"))
        db.sql("SELECT streams.set_private(%s, false)", (STREAM,))
        sub.wait_for(7)

        # A missed notification (the hook drops it): the next one's prev says so.
        sub.sub._drop_notification = lambda note: '"dropped"' in note.payload
        with db.conn.transaction():
            expected.append(lbs.publish(db.conn, STREAM, {"n": 8, "dropped": True}))
            expected.append(lbs.publish(db.conn, STREAM, {"n": 9}))
        sub.wait_for(9)

        assert sub.positions() == expected
        assert [e.data["n"] for e in sub.events] == list(range(1, 10))
        assert sub.events[5].data["big"] == big
        assert (sub.events[6].type, sub.events[6].key) == ("secret", "k7")
        assert all(not (e.data or {}).get("forged") for e in sub.events)
        assert sub.events[0].time.tzinfo is not None and isinstance(sub.events[0].tx, int)
        log_id = db.one("SELECT streams.log_id()::text")
        assert sub.cursors[-1] == lbs.Cursor(log_id, expected[-1])

        # A re-created log: the subscription says so instead of dropping positions.
        db.recreate_log()
        db.publish(STREAM, {"n": "new log"})
        err = sub.wait_error()
        assert isinstance(err, lbs.LogChanged), repr(err)
        assert err.old == log_id and err.new == db.one("SELECT streams.log_id()::text")
        assert sub.positions() == expected
    finally:
        db.sql(f'DROP ROLE "{forger}"')


def test_restart_on_log_change_starts_the_new_log_from_zero(db: Db, start) -> None:
    sub = start(db.dsn, STREAM, on_log_change="restart")
    with db.conn.transaction():
        lbs.publish_batch(db.conn, "other", [{}] * 20)
    first = db.publish(STREAM, {"log": 1})
    sub.wait_for(1)
    db.recreate_log()
    again = db.publish(STREAM, {"log": 2})
    sub.wait_for(2)
    new_log = db.one("SELECT streams.log_id()::text")
    assert [e.data["log"] for e in sub.events] == [1, 2]
    assert sub.cursors[-1] == lbs.Cursor(new_log, again) and again < first  # positions start over


def test_a_saved_cursor_resumes_after_it_and_refuses_another_log(db: Db, start) -> None:
    positions = [db.publish(STREAM, {"n": n}) for n in range(3)]
    log_id = db.one("SELECT streams.log_id()::text")
    sub = start(db.dsn, STREAM, after=lbs.Cursor(log_id, positions[0]))
    sub.wait_for(2)
    assert sub.positions() == positions[1:]
    stale = start(db.dsn, STREAM, after=lbs.Cursor(str(uuid.uuid4()), positions[0]))
    assert isinstance(stale.wait_error(), lbs.LogChanged)


def test_a_pattern_finds_new_streams_and_ignores_others(db: Db, start) -> None:
    db.publish("order.eu.failed", {"n": 1})
    db.publish("order.eu.paid", {"n": "not this"})
    sub = start(db.dsn, "order.*.failed")
    sub.wait_for(1)
    # A stream the pattern had not met, and a forged notification on a known channel.
    db.publish("order.us.failed", {"n": 2})
    forge(db.dsn, "order.eu.failed", 1000, 0)
    db.publish("order.eu.paid", {"n": "not this either"})
    db.publish("order.eu.failed", {"n": 3})
    db.publish("order.us.failed", {"n": 4})
    sub.wait_for(4)
    assert [e.data["n"] for e in sub.events] == [1, 2, 3, 4]
    assert [e.stream for e in sub.events] == ["order.eu.failed", "order.us.failed",
                                              "order.eu.failed", "order.us.failed"]


def test_types_and_filter_narrow_the_events(db: Db, start) -> None:
    by_type = start(db.dsn, "shop.*", types=["paid"])
    by_data = start(db.dsn, "shop.orders", filter={"currency": "EUR"})
    db.publish("shop.orders", {"currency": "USD"}, type="paid")
    db.publish("shop.orders", {"currency": "EUR"}, type="placed")
    last = db.publish("shop.orders", {"currency": "EUR"}, type="paid")
    by_type.wait_for(2)
    by_data.wait_for(2)
    assert [e.type for e in by_type.events] == ["paid", "paid"]
    assert [e.data["currency"] for e in by_data.events] == ["EUR", "EUR"]
    assert by_type.positions()[-1] == by_data.positions()[-1] == last


def test_a_missing_extension_is_an_error_not_a_wait(db: Db) -> None:
    db.sql("DROP EXTENSION litebase_streams CASCADE")
    with pytest.raises(lbs.StreamsError) as raised:
        next(iter(lbs.subscribe(db.dsn, STREAM)))
    assert raised.value.sqlstate in ("3F000", "42883")


def test_a_reader_role_gets_only_what_it_may_read(db: Db, start) -> None:
    role = f"lbs_py_reader_{uuid.uuid4().hex[:8]}"
    db.sql(f'CREATE ROLE "{role}" LOGIN')
    try:
        db.sql("SELECT streams.grant('read', 'pay.*', %s)", (role,))
        db.publish("pay.a", {"n": 1})
        db.publish("secret.a", {"n": "no"})
        sub = start(dsn_for(db.name, user=role), "*")
        sub.wait_for(1)
        db.publish("secret.b", {"n": "no"})
        db.publish("pay.b", {"n": 2})
        sub.wait_for(2)
        assert [(e.stream, e.data["n"]) for e in sub.events] == [("pay.a", 1), ("pay.b", 2)]
        sub.stop()
    finally:
        db.sql("SELECT streams.revoke('read', 'pay.*', %s)", (role,))
        db.sql(f'DROP ROLE "{role}"')
