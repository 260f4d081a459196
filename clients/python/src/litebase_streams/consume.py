"""`consume`: the durable-subscription loop (README, "Subscriptions").

One transaction per poll: ``streams.poll`` (a long poll), the handler for
each event inside that transaction (each in a savepoint), ``streams.ack``,
COMMIT. The handler's writes commit together with the ack, or not at all:
exactly once inside the database. A handler that raises has its savepoint
rolled back and its event nacked (``streams.nack``, the exception text as
the reason) in the same transaction, so the event comes again after the
subscription's backoff and is parked as a dead letter after
``max_attempts``. Which later events of the batch still run follows the
subscription's order: none in an ordered one (the ack stops before the
nacked event), those of other keys in one ordered per key, all of them in a
competing (unordered) one.

With `lease`, each poll leases the events instead (for long jobs): the poll
commits at once and each event runs in a transaction of its own that acks
it with the lease id; a failure nacks it with the lease id, which ends the
lease (its other events come again).

Pooler-safe: the connection disables psycopg's automatic prepared
statements (``prepare_threshold=None``): PgBouncer 1.18 in transaction
pooling and psycopg's auto-prepare give DuplicatePreparedStatement.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from .errors import NotFound, StreamsError, connection_lost, translated
from .events import EVENT_COLUMNS, Event, configure, event_of_row

__all__ = ["consume", "Delivery"]

log = logging.getLogger("litebase_streams")

POLL_SQL = (f"SELECT {EVENT_COLUMNS}, e.attempt, e.lease_id FROM streams.poll(%(sub)s, "
            "max_events => %(max)s, wait => %(wait)s::interval, lease => %(lease)s::interval) e")
MODE_SQL = "SELECT ordered, key FROM streams.subscriptions WHERE name = %s LIMIT 1"


@dataclass(frozen=True)
class Delivery:
    """What the handler gets with each event besides the event itself.

    `conn` is the connection whose transaction the ack commits in: write
    through it and the writes commit with the ack (or are rolled back with a
    failed handler). `attempt` counts this subscription's deliveries of the
    event (1 the first time); `lease_id` is the lease, or None.
    """

    conn: psycopg.Connection[Any]
    subscription: str
    attempt: int
    lease_id: int | None


Handler = Callable[[Event, Delivery], object]


def _interval(value: str | float | timedelta | None) -> str | timedelta | None:
    if value is None or isinstance(value, (str, timedelta)):
        return value
    return timedelta(seconds=float(value))


def _seconds(value: str | float | timedelta) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        raise TypeError("give lease as seconds or a timedelta (it is extended as it runs out)")
    return float(value)


def key_of(event: Event, key: str | None) -> str:
    """The event's key for a subscription ordered per `key` (``'$key'``,
    ``'$stream'`` or a path into data); only compared for equality."""
    if key == "$key":
        return event.key or ""
    if key == "$stream":
        return event.stream
    value: Any = event.data
    for part in (key or "").removeprefix("$.").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


class _Stop:
    """The shutdown flag: SIGINT, SIGTERM or the caller's event."""

    def __init__(self, stop: threading.Event | None, handle_signals: bool) -> None:
        self.event = stop or threading.Event()
        self.previous: dict[int, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        log.info("litebase_streams: signal %d: finishing the current transaction, then stopping", signum)
        self.event.set()

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def __bool__(self) -> bool:
        return self.event.is_set()


def consume(conninfo: str, subscription: str, handler: Handler, *, max_events: int = 100,
            wait: str | float | timedelta = "5s", lease: float | timedelta | None = None,
            stop: threading.Event | None = None, handle_signals: bool = True,
            max_backoff: float = 5.0, **connect_kwargs: Any) -> int:
    """Run `handler(event, delivery)` for the events of `subscription`
    until stopped; how many events it handled (and acked).

    Each poll (at most `max_events`, waiting up to `wait` for events) runs
    in one transaction with the handler calls and the ack; write through
    ``delivery.conn`` to commit with the ack. A handler exception nacks its
    event with the exception's text as the reason (the event comes again
    after the subscription's backoff) and is logged, not raised: the loop
    goes on. Errors of the database calls themselves are raised (as
    `StreamsError`), except a lost connection, after which it reconnects
    with backoff (up to `max_backoff` s): the transaction rolled back, and
    its events come again.

    `lease` (seconds or a timedelta) leases each poll's events for long
    jobs (ordered subscriptions only): each event then commits in its own
    transaction, and the lease is extended while the batch runs.

    SIGINT and SIGTERM (when called from the main thread and
    `handle_signals`), or `stop` being set, end the loop after the current
    transaction commits. `connect_kwargs` go to ``psycopg.connect``
    (``prepare_threshold`` defaults to None: safe behind PgBouncer).
    """
    connect_kwargs.setdefault("prepare_threshold", None)
    stopping = _Stop(stop, handle_signals)
    handled = 0
    failures = 0
    conn: psycopg.Connection[Any] | None = None
    try:
        while not stopping:
            try:
                if conn is None:
                    conn = configure(psycopg.connect(conninfo, autocommit=True, **connect_kwargs))
                    with translated():
                        mode = conn.execute(MODE_SQL, (subscription,)).fetchone()
                    if mode is None:
                        raise NotFound(f"subscription {subscription!r} does not exist", sqlstate="42704")
                    ordered, key = bool(mode[0]), mode[1]
                with translated():
                    if lease is None:
                        handled += _one_transaction(conn, subscription, handler, max_events, wait,
                                                    ordered, key)
                    else:
                        handled += _one_lease(conn, subscription, handler, max_events, wait, lease,
                                              stopping)
                failures = 0
            except psycopg.Error as e:
                if not connection_lost(e):
                    raise
                failures += 1
                delay = min(max_backoff, 0.1 * 2 ** (failures - 1)) * random.uniform(0.5, 1)
                log.warning("litebase_streams: consumer of %r lost its connection (%s); "
                            "reconnecting in %.1f s", subscription, e, delay)
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(delay)
    finally:
        stopping.restore()
        if conn is not None:
            conn.close()
    return handled


def _run_handler(handler: Handler, event: Event, delivery: Delivery) -> str | None:
    """Run the handler in a savepoint; the failure's reason, or None."""
    try:
        with delivery.conn.transaction():
            handler(event, delivery)
        return None
    except Exception as e:  # the handler's failure becomes a nack, never lost
        if isinstance(e, psycopg.Error) and connection_lost(e):
            raise
        log.warning("litebase_streams: handler failed on position %d of %r (attempt %d): %r",
                    event.position, delivery.subscription, delivery.attempt, e)
        return (str(e) or type(e).__name__)[:1000]


def _one_transaction(conn: psycopg.Connection[Any], subscription: str, handler: Handler,
                     max_events: int, wait: str | float | timedelta, ordered: bool,
                     key: str | None) -> int:
    handled = 0
    with conn.transaction():
        rows = conn.execute(POLL_SQL, {"sub": subscription, "max": max_events,
                                       "wait": _interval(wait), "lease": None}).fetchall()
        if not rows:
            return 0
        failed_keys: set[str] = set()
        stopped = False
        for row in rows:
            event = event_of_row(row)
            this_key = key_of(event, key) if key is not None else ""
            if stopped or this_key in failed_keys:
                continue  # after a failure in its sequence: it comes again, untried
            delivery = Delivery(conn, subscription, row[8], None)
            reason = _run_handler(handler, event, delivery)
            if reason is None:
                handled += 1
                continue
            conn.execute("SELECT streams.nack(%s, %s, reason => %s)",
                         (subscription, event.position, reason))
            if key is not None:
                failed_keys.add(this_key)
            elif ordered:
                stopped = True
        # The ack stops before a nacked event where order requires it.
        conn.execute("SELECT streams.ack(%s, %s)", (subscription, rows[-1][0]))
    return handled


def _one_lease(conn: psycopg.Connection[Any], subscription: str, handler: Handler,
               max_events: int, wait: str | float | timedelta, lease: float | timedelta,
               stopping: _Stop) -> int:
    duration = timedelta(seconds=_seconds(lease))
    rows = conn.execute(POLL_SQL, {"sub": subscription, "max": max_events,
                                   "wait": _interval(wait), "lease": duration}).fetchall()
    renewed = time.monotonic()
    handled = 0
    for row in rows:
        event, lease_id = event_of_row(row), row[9]
        if time.monotonic() - renewed > duration.total_seconds() / 2:
            conn.execute("SELECT streams.extend_lease(%s, %s, %s)", (subscription, lease_id, duration))
            renewed = time.monotonic()
        delivery = Delivery(conn, subscription, row[8], lease_id)
        try:
            with conn.transaction():
                handler(event, delivery)
                conn.execute("SELECT streams.ack(%s, %s, %s)", (subscription, event.position, lease_id))
            handled += 1
        except StreamsError:
            raise
        except Exception as e:
            if isinstance(e, psycopg.Error) and connection_lost(e):
                raise
            if isinstance(e, psycopg.Error) and e.sqlstate == "55000":
                # The lease expired (or was taken over): its events come again.
                log.warning("litebase_streams: lease %s of %r is over: %s", lease_id, subscription, e)
                break
            reason = (str(e) or type(e).__name__)[:1000]
            log.warning("litebase_streams: handler failed on position %d of %r (attempt %d): %r",
                        event.position, subscription, row[8], e)
            # Ends the lease: its events not acked yet come again.
            conn.execute("SELECT streams.nack(%s, %s, reason => %s, lease => %s)",
                         (subscription, event.position, reason, lease_id))
            break
    return handled
