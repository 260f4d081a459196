"""publish, publish_once, publish_batch and the errors they raise."""

from __future__ import annotations

import psycopg
import pytest

import litebase_streams as lbs
from conftest import Db


def test_publish_runs_in_the_callers_transaction(db: Db) -> None:
    with psycopg.connect(db.dsn) as conn:  # not autocommit: the caller's transaction
        position = lbs.publish(conn, "pay.ok", {"a": 1}, type="paid", key="o1", headers={"h": "v"})
        assert db.one("SELECT count(*) FROM streams.event_log") == 0, "nothing before COMMIT"
        conn.rollback()
    assert db.one("SELECT count(*) FROM streams.events") == 0
    with psycopg.connect(db.dsn) as conn:
        position = lbs.publish(conn, "pay.ok", {"a": 1}, type="paid", key="o1", headers={"h": "v"})
        conn.commit()
    db.one("SELECT streams.wait(%s)", (position,))
    assert db.sql("SELECT stream, data, type, key, headers FROM streams.get(%s)", (position,)) == [
        ("pay.ok", {"a": 1}, "paid", "o1", {"h": "v"})]


def test_publish_once_and_batch(db: Db) -> None:
    first = lbs.publish_once(db.conn, "pay.ok", {"a": 1}, "key-1")
    again = lbs.publish_once(db.conn, "pay.ok", {"a": 1}, "key-1")
    assert (first.duplicate, again) == (False, lbs.Published(first.position, True))
    batch = lbs.publish_batch(db.conn, "pay.ok", [{"n": 1}, {"n": 2}], expected_prev=first.position)
    assert len(batch) == 2 and first.position < batch[0] < batch[1]


@pytest.mark.parametrize("call, error, sqlstate", [
    (lambda c: lbs.publish(c, "bad name", {}), lbs.InvalidArgument, "22023"),
    (lambda c: lbs.publish(c, "s", {}, expected_prev=99), lbs.ExpectedVersionMismatch, "40001"),
    (lambda c: lbs.publish_once(c, "s", {"other": 1}, "k"), lbs.IdempotencyConflict, "23505"),
    (lambda c: lbs.publish_once(c, "s", {}, None), lbs.NullArgument, "22004"),
])
def test_errors_are_typed_by_sqlstate(db: Db, call, error, sqlstate) -> None:
    lbs.publish_once(db.conn, "s", {}, "k")
    with pytest.raises(error) as raised:
        call(db.conn)
    assert raised.value.sqlstate == sqlstate
    assert isinstance(raised.value, lbs.StreamsError)
    assert isinstance(raised.value.__cause__, psycopg.Error)
    assert raised.value.__cause__.sqlstate == sqlstate


def test_permission_denied(db: Db) -> None:
    db.sql("CREATE ROLE lbs_py_reader_%s" % db.name[-8:])
    role = "lbs_py_reader_%s" % db.name[-8:]
    try:
        db.sql(f"SELECT streams.grant('read', 'pay.*', '{role}')")
        with db.conn.transaction(force_rollback=True):
            db.sql(f'SET LOCAL ROLE "{role}"')
            with pytest.raises(lbs.PermissionDenied):
                lbs.publish(db.conn, "pay.ok", {})
    finally:
        db.sql(f"SELECT streams.revoke('read', 'pay.*', '{role}')")
        db.sql(f'DROP ROLE "{role}"')


def test_consume_of_an_unknown_subscription_is_not_found(db: Db) -> None:
    with pytest.raises(lbs.NotFound):
        lbs.consume(db.dsn, "nope", lambda e, d: None, handle_signals=False)
