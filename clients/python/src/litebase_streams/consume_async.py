"""`consume_async`: `consume` for asyncio (psycopg ``AsyncConnection``).

The same loop and guarantees as `litebase_streams.consume` (one transaction
per poll with the handler's writes and the ack; a handler exception nacks
its event; reconnect after a lost connection), with an async handler.
Leases are not offered here (use `consume`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from .consume import MODE_SQL, POLL_SQL, _interval, key_of
from .errors import NotFound, connection_lost, translated
from .events import Event, configure, event_of_row

__all__ = ["consume_async", "AsyncDelivery"]

log = logging.getLogger("litebase_streams")


@dataclass(frozen=True)
class AsyncDelivery:
    """`Delivery` for `consume_async`: `conn` is the AsyncConnection whose
    transaction commits the handler's writes with the ack."""

    conn: psycopg.AsyncConnection[Any]
    subscription: str
    attempt: int
    lease_id: int | None


AsyncHandler = Callable[[Event, AsyncDelivery], Awaitable[object]]


async def consume_async(conninfo: str, subscription: str, handler: AsyncHandler, *,
                        max_events: int = 100, wait: str | float | timedelta = "5s",
                        stop: asyncio.Event | None = None, handle_signals: bool = True,
                        max_backoff: float = 5.0, **connect_kwargs: Any) -> int:
    """`consume` for asyncio: await `handler(event, delivery)` for the events
    of `subscription` until `stop` is set (or SIGINT/SIGTERM, with
    `handle_signals`, on loops that support signal handlers); how many
    events it handled. The current transaction commits before it returns.
    """
    connect_kwargs.setdefault("prepare_threshold", None)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if handle_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signal support: `stop` only
    handled = failures = 0
    conn: psycopg.AsyncConnection[Any] | None = None
    ordered, key = True, None
    try:
        while not stop.is_set():
            try:
                if conn is None:
                    conn = configure(await psycopg.AsyncConnection.connect(conninfo, autocommit=True,
                                                                           **connect_kwargs))
                    with translated():
                        mode = await (await conn.execute(MODE_SQL, (subscription,))).fetchone()
                    if mode is None:
                        raise NotFound(f"subscription {subscription!r} does not exist", sqlstate="42704")
                    ordered, key = bool(mode[0]), mode[1]
                with translated():
                    handled += await _one_transaction(conn, subscription, handler, max_events, wait,
                                                      ordered, key)
                failures = 0
            except psycopg.Error as e:
                if not connection_lost(e):
                    raise
                failures += 1
                delay = min(max_backoff, 0.1 * 2 ** (failures - 1)) * random.uniform(0.5, 1)
                log.warning("litebase_streams: consumer of %r lost its connection (%s); "
                            "reconnecting in %.1f s", subscription, e, delay)
                if conn is not None:
                    await conn.close()
                conn = None
                await asyncio.sleep(delay)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if conn is not None:
            await conn.close()
    return handled


async def _one_transaction(conn: psycopg.AsyncConnection[Any], subscription: str,
                           handler: AsyncHandler, max_events: int,
                           wait: str | float | timedelta, ordered: bool, key: str | None) -> int:
    handled = 0
    async with conn.transaction():
        cur = await conn.execute(POLL_SQL, {"sub": subscription, "max": max_events,
                                            "wait": _interval(wait), "lease": None})
        rows = await cur.fetchall()
        if not rows:
            return 0
        failed_keys: set[str] = set()
        stopped = False
        for row in rows:
            event = event_of_row(row)
            this_key = key_of(event, key) if key is not None else ""
            if stopped or this_key in failed_keys:
                continue  # after a failure in its sequence: it comes again, untried
            delivery = AsyncDelivery(conn, subscription, row[8], None)
            try:
                async with conn.transaction():
                    await handler(event, delivery)
                handled += 1
                continue
            except Exception as e:  # the handler's failure becomes a nack, never lost
                if isinstance(e, psycopg.Error) and connection_lost(e):
                    raise
                log.warning("litebase_streams: handler failed on position %d of %r (attempt %d): %r",
                            event.position, subscription, delivery.attempt, e)
                reason = (str(e) or type(e).__name__)[:1000]
            await conn.execute("SELECT streams.nack(%s, %s, reason => %s)",
                               (subscription, event.position, reason))
            if key is not None:
                failed_keys.add(this_key)
            elif ordered:
                stopped = True
        await conn.execute("SELECT streams.ack(%s, %s)", (subscription, rows[-1][0]))
    return handled
