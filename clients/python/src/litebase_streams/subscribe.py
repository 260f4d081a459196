"""`subscribe`: every event of a stream pattern, exactly once, in order, live.

A `Subscription` holds two connections: one LISTENs (psycopg's
``notifies()`` keeps it busy while it waits), the other runs the replays.
The decisions are `_protocol.Follower`'s; this module does the I/O: it
connects, LISTENs, catches up, waits for notifications (at most until the
next periodic replay), and after a lost connection reconnects with backoff
and does it all again from `last_seen`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import sql

from . import _protocol as p
from .errors import LogChanged, StreamsError, connection_lost, translated
from .events import Cursor, Event, configure, event_of_row
from .patterns import is_exact

__all__ = ["subscribe", "Subscription"]

log = logging.getLogger("litebase_streams")


def subscribe(conninfo: str, pattern: str, after: Cursor | int | None = None, *,
              types: list[str] | None = None, filter: dict[str, Any] | None = None,
              on_log_change: str = "raise", replay_interval: float = 1.0,
              max_replay_interval: float = 10.0, page_size: int = 1000,
              max_backoff: float = 5.0, **connect_kwargs: Any) -> Subscription:
    """Follow the events of `pattern`: an iterator of `Event`.

    `pattern` is a stream name, ``'order.*'``, ``'order.*.failed'`` or
    ``'*'``. `after` is where to start: a `Cursor` saved earlier
    (``sub.cursor``), a position, or None for the beginning of the log.
    `types` and `filter` narrow the events as in ``streams.replay`` (the
    event's type is one of `types`; its data contains `filter`).

    Each event arrives once, in position order, across worker restarts,
    lost connections (reconnected with backoff up to `max_backoff`
    seconds) and forged notifications. Persist ``sub.cursor`` with the work
    each event caused, and pass it back as `after` to go on after a restart.

    A log other than the cursor's (``streams.log_id()`` changed: the
    extension was re-created or the database restored, and positions start
    over) raises `LogChanged` by default: the caller decides what its saved
    state means now. ``on_log_change="restart"`` instead starts again from
    position 0 of the new log (``sub.cursor.log_id`` tells which).

    The subscription also replays every `replay_interval` seconds (doubling
    to `max_replay_interval` while nothing comes), which finds the first
    events of streams a pattern had not met. `connect_kwargs` go to
    ``psycopg.connect``. Use it as an iterator, ideally in a ``with`` block
    (or call `Subscription.close`)::

        with subscribe(dsn, "order.*", after=saved) as sub:
            for event in sub:
                handle(event)
                save(sub.cursor)
    """
    return Subscription(conninfo, pattern, after, types=types, filter=filter,
                        on_log_change=on_log_change, replay_interval=replay_interval,
                        max_replay_interval=max_replay_interval, page_size=page_size,
                        max_backoff=max_backoff, connect_kwargs=connect_kwargs)


class Subscription:
    """The iterator `subscribe` returns. Iterate it once."""

    def __init__(self, conninfo: str, pattern: str, after: Cursor | int | None, *,
                 types: list[str] | None, filter: dict[str, Any] | None, on_log_change: str,
                 replay_interval: float, max_replay_interval: float, page_size: int,
                 max_backoff: float, connect_kwargs: dict[str, Any]) -> None:
        self._conninfo = conninfo
        self._connect_kwargs = connect_kwargs
        self._follower = p.Follower(pattern, after, types=types, filter=filter,
                                    on_log_change=on_log_change, page=page_size)
        self._cursor = self._follower.cursor()
        self._pending: deque[tuple[Event, str | None]] = deque()
        self._listen: psycopg.Connection[Any] | None = None
        self._query: psycopg.Connection[Any] | None = None
        self._base_interval = replay_interval
        self._max_interval = max(replay_interval, max_replay_interval)
        self._interval = replay_interval
        self._next_replay = 0.0
        self._untrusted = p.Throttle(min(replay_interval, 1.0))
        self._max_backoff = max_backoff
        self._started_once = False
        self._closed = False
        self._thread: int | None = None
        #: Test hook: a notification for which this returns True is ignored,
        #: as if it never arrived (tests make the subscription miss one).
        self._drop_notification: Callable[[psycopg.Notify], bool] | None = None

    @property
    def cursor(self) -> Cursor:
        """The log and position of the last event handed out: persist it
        with the work that event caused."""
        return self._cursor

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop: iteration ends and the connections close. From another
        thread than the iterating one, it only asks: the iteration ends at
        its next wake-up (at most `max_replay_interval` seconds)."""
        self._closed = True
        if self._thread in (None, threading.get_ident()):
            self._disconnect()

    def __iter__(self) -> Iterator[Event]:
        return self._events()

    def _events(self) -> Iterator[Event]:
        self._thread = threading.get_ident()
        failures = 0
        changed: LogChanged | None = None
        try:
            while not self._closed:
                if self._pending:
                    event, log_id = self._pending.popleft()
                    self._cursor = Cursor(log_id, event.position)
                    yield event
                    continue
                if changed is not None:
                    raise changed
                try:
                    with translated():
                        if self._listen is None:
                            self._start()
                        else:
                            self._step()
                    failures = 0
                except LogChanged as e:
                    changed = e  # after the events of the old log already taken
                    self._disconnect()
                except (psycopg.Error, StreamsError) as e:
                    if self._closed:
                        return
                    if not self._retryable(e):
                        raise
                    failures += 1
                    delay = min(self._max_backoff, 0.1 * 2 ** (failures - 1)) * random.uniform(0.5, 1)
                    log.warning("litebase_streams: subscription to %r lost its connection (%s); "
                                "reconnecting in %.1f s", self._follower.pattern, e, delay)
                    self._disconnect()
                    time.sleep(delay)
        finally:
            self._disconnect()

    def _retryable(self, e: BaseException) -> bool:
        if connection_lost(e):
            return True
        # The extension being re-created under a running subscription.
        return self._started_once and isinstance(e, StreamsError) and e.sqlstate in p.REINSTALLING

    def _connect(self) -> psycopg.Connection[Any]:
        return configure(psycopg.connect(self._conninfo, autocommit=True, **self._connect_kwargs))

    def _disconnect(self) -> None:
        for conn in (self._listen, self._query):
            if conn is not None:
                try:
                    conn.close()
                except Exception:  # closing a broken connection: nothing to tell
                    pass
        self._listen = self._query = None

    def _start(self) -> None:
        """Connect, LISTEN first, read the worker and the log, catch up."""
        f = self._follower
        self._listen = self._connect()
        self._query = self._connect()
        f.channels = set()
        if is_exact(f.pattern):
            self._listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f.pattern)))
        else:
            names = [r[0] for r in self._query.execute(p.STREAM_NAMES_SQL, f.names_range())]
            self._listen_on(f.wanted_names(names))
        pid, log_id = self._query.execute(p.WORKER_SQL).fetchone() or (None, None)
        f.saw_worker(pid, log_id)
        self._started_once = True
        self._catch_up()

    def _listen_on(self, names: list[str]) -> None:
        assert self._listen is not None
        for i in range(0, len(names), 100):
            self._listen.execute(sql.SQL("; ").join(
                sql.SQL("LISTEN {}").format(sql.Identifier(n)) for n in names[i:i + 100]))

    def _catch_up(self) -> None:
        """Replay from last_seen until a short page."""
        assert self._query is not None
        f = self._follower
        got = 0
        while True:
            rows = self._query.execute(p.REPLAY_SQL, f.replay_params()).fetchall()
            if rows and f.saw_worker(rows[0][0], rows[0][1]):
                continue  # a new log, from 0 ("restart"): this page was of the old position
            events = [event_of_row(r[2:]) for r in rows if r[2] is not None]
            self._listen_on(f.new_channels(events))
            for event in events:
                if f.accept(event):
                    self._pending.append((event, f.log_id))
                    got += 1
            if len(events) < f.page:
                break
            if self._pending:
                # A full page: hand it out before reading the next one, so a
                # long backlog is held a page at a time, not all at once.
                self._next_replay = time.monotonic()
                return
        self._interval = self._base_interval if got else min(self._interval * 2, self._max_interval)
        self._next_replay = time.monotonic() + self._interval

    def _step(self) -> None:
        """Wait for notifications (until the next periodic replay), act on them."""
        assert self._listen is not None
        timeout = max(0.0, self._next_replay - time.monotonic())
        notes = list(self._listen.notifies(timeout=timeout, stop_after=1))
        if notes:
            notes += self._listen.notifies(timeout=0)
            self._on_notes(notes)
        # Also while notifications keep coming (a flood of forged ones, say).
        if time.monotonic() >= self._next_replay:
            self._catch_up()

    def _on_notes(self, notes: list[psycopg.Notify]) -> None:
        assert self._query is not None
        f = self._follower
        rechecked = replayed = False
        for note in notes:
            if self._drop_notification is not None and self._drop_notification(note):
                continue
            judged = f.judge(note.pid, note.payload)
            if judged.verdict is p.Verdict.RECHECK:
                if not rechecked and self._untrusted.allow(time.monotonic()):
                    # Not sent by the worker we know, or the worker restarted: ask again
                    # (once per batch, and at most once per replay interval).
                    rechecked = True
                    pid, log_id = self._query.execute(p.WORKER_SQL).fetchone() or (None, None)
                    f.saw_worker(pid, log_id)
                judged = f.judge(note.pid, note.payload)
                if judged.verdict is p.Verdict.RECHECK:
                    # Anyone can pg_notify: never trusted. A replay decides, soon but
                    # not at once: forged notifications cost one replay per interval.
                    self._next_replay = min(self._next_replay, self._untrusted.due())
                    continue
            if judged.verdict is p.Verdict.REPLAY:
                # One replay covers every notification received before it.
                if not replayed:
                    replayed = True
                    self._catch_up()
            elif judged.verdict is p.Verdict.DELIVER and judged.event is not None:
                if f.accept(judged.event):
                    self._pending.append((judged.event, f.log_id))
            elif judged.verdict is p.Verdict.FETCH:
                row = self._query.execute(p.GET_SQL, (judged.position,)).fetchone()
                if row is not None and f.accept(event := event_of_row(row)):
                    self._pending.append((event, f.log_id))
