"""The listener protocol without I/O, shared by the sync and asyncio subscriptions.

The rule (README, "Reconnecting without gaps or duplicates"; docs/security.md,
"the client rule"): LISTEN first, then read ``streams.worker_pid()`` and
``streams.log_id()``, catch up with ``streams.replay(after => last_seen)``,
then follow notifications. The invariant `Follower` keeps: every event of the
pattern at or below `last_seen` has been handed out, once, in position order,
and nothing above it has. It holds because `last_seen` only moves to

- the position of a replay row (replay returns only final events, in
  position order: none at or below it can appear later), or
- the position of a notification that the worker sent (its pid is
  ``streams.worker_pid()``: anyone can ``pg_notify``), of the one stream an
  exact subscription names, whose ``prev`` (the stream's previous event) is
  at or below `last_seen`: so no event of that stream was missed, and an
  exact subscription has no other stream.

A re-created log (``DROP``/``CREATE EXTENSION``) keeps the worker's pid;
positions start over in it. A notification whose position went back, or
whose ``prev`` is older than an event handed out, cannot be of the same log:
it makes the subscription replay, and every replay reads ``log_id()``. (A
new log noticed by no such sign waits for the next periodic replay.)

Everything else makes the subscription replay instead: a notification from
another pid (after reading the pid once more: the worker may have
restarted), a ``prev`` gap, a malformed payload, and any notification of a
pattern or of a ``filter`` subscription: a pattern may match a stream whose
channel it does not LISTEN on yet, so only a replay may move its cursor
(the notification merely wakes it; a periodic replay finds new streams,
as the gateway's topics do).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from .errors import LogChanged
from .events import EVENT_COLUMNS, Cursor, Event, decode_payload
from .patterns import is_exact, matches, name_range

#: Read together: the worker to trust and the log the positions belong to.
WORKER_SQL = "SELECT streams.worker_pid(), streams.log_id()::text"

#: One replay page, with the worker's pid and the log id read in the same statement.
REPLAY_SQL = f"""SELECT l.pid, l.log_id, {EVENT_COLUMNS}
FROM (SELECT streams.worker_pid() AS pid, streams.log_id()::text AS log_id) l
LEFT JOIN LATERAL streams.replay(stream => %(pattern)s, after => %(after)s, max_events => %(page)s,
                                 types => %(types)s, filter => %(filter)s) e ON true
ORDER BY e.position"""

#: The data of a truncated or private notification.
GET_SQL = f"SELECT {EVENT_COLUMNS} FROM streams.get(%s) e WHERE e.position IS NOT NULL"

#: The names of the streams in a range, one index probe each (a loose scan).
STREAM_NAMES_SQL = """WITH RECURSIVE s(stream) AS (
    SELECT (SELECT min(e.stream) FROM streams.event_log e WHERE e.stream >= %(low)s AND e.stream < %(high)s)
    UNION ALL
    SELECT (SELECT min(e.stream) FROM streams.event_log e WHERE e.stream > s.stream AND e.stream < %(high)s)
    FROM s WHERE s.stream IS NOT NULL
) SELECT s.stream::text FROM s WHERE s.stream IS NOT NULL LIMIT 10000"""

#: SQLSTATEs that mean the extension is being re-created under a running
#: subscription (undefined function, invalid schema name): reconnect and
#: see which log is there then.
REINSTALLING = ("42883", "3F000")


class Verdict(enum.Enum):
    """What to do with one notification."""

    DROP = "drop"          # seen already, or not for this subscription
    DELIVER = "deliver"    # hand out the payload's event
    FETCH = "fetch"        # the worker's, but without data: streams.get
    RECHECK = "recheck"    # another pid: read streams.worker_pid() again
    REPLAY = "replay"      # in doubt: replay from last_seen


@dataclass
class Judgement:
    verdict: Verdict
    event: Event | None = None
    position: int = 0


class Follower:
    """The state of one subscription: the log, the trusted pid, `last_seen`."""

    def __init__(self, pattern: str, after: Cursor | int | None, *, types: list[str] | None,
                 filter: dict[str, Any] | None, on_log_change: str, page: int) -> None:
        if on_log_change not in ("raise", "restart"):
            raise ValueError("on_log_change is 'raise' or 'restart'")
        self.pattern = pattern
        self.types = list(types) if types is not None else None
        self.filter = filter
        self.on_log_change = on_log_change
        self.page = page
        if isinstance(after, Cursor):
            self.log_id, self.last_seen = after.log_id, after.position
        else:
            self.log_id, self.last_seen = None, int(after or 0)
        self.worker_pid: int | None = None
        #: The position of the last event handed out by this subscription,
        #: and of the worker's last notification (of a direct subscription).
        self.last_delivered = 0
        self.last_note = 0
        #: Streams whose channel is LISTENed on (patterns only).
        self.channels: set[str] = set()
        #: Exact, unfiltered: notifications may be delivered without a replay.
        self.direct = is_exact(pattern) and filter is None

    def cursor(self) -> Cursor:
        return Cursor(self.log_id, self.last_seen)

    def saw_worker(self, pid: int | None, log_id: str | None) -> bool:
        """Note the worker's pid and the log id; True when the log changed
        and the subscription restarts from 0 (``on_log_change="restart"``).
        Raises `LogChanged` otherwise."""
        self.worker_pid = pid
        if log_id is None or log_id == self.log_id:
            return False
        if self.log_id is None:  # a fresh cursor: this log is its log
            self.log_id = log_id
            return False
        if self.on_log_change == "raise":
            raise LogChanged(self.log_id, log_id)
        self.log_id, self.last_seen = log_id, 0
        self.last_delivered = self.last_note = 0
        return True

    def replay_params(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "after": self.last_seen, "page": self.page,
                "types": self.types,
                "filter": Jsonb(self.filter) if self.filter is not None else None}

    def accept(self, event: Event) -> bool:
        """Whether a replayed or fetched event is new; moves `last_seen` if so."""
        if event.position <= self.last_seen:
            return False
        self.last_seen = self.last_delivered = event.position
        return True

    def new_channels(self, events: list[Event]) -> list[str]:
        """Streams of a pattern met for the first time (to LISTEN on)."""
        if is_exact(self.pattern):
            return []
        found = sorted({e.stream for e in events} - self.channels)
        self.channels.update(found)
        return found

    def wanted_names(self, names: list[str]) -> list[str]:
        found = [n for n in names if matches(self.pattern, n) and n not in self.channels]
        self.channels.update(found)
        return found

    def names_range(self) -> dict[str, str]:
        low, high = name_range(self.pattern)
        return {"low": low, "high": high}

    def judge(self, pid: int, payload_text: str) -> Judgement:
        """The verdict on one notification (sent by `pid`)."""
        if self.worker_pid is None or pid != self.worker_pid:
            return Judgement(Verdict.RECHECK)
        if not self.direct:
            return Judgement(Verdict.REPLAY)
        payload = decode_payload(payload_text)
        if payload is None or payload.stream != self.pattern:
            return Judgement(Verdict.REPLAY)
        went_back = payload.position <= self.last_note
        self.last_note = payload.position
        if went_back or payload.prev < self.last_delivered:
            # The worker's positions went back, or the stream's previous event
            # is older than one handed out: not this log any more (it was
            # re-created), unless proven otherwise: a replay reads log_id.
            return Judgement(Verdict.REPLAY)
        if payload.position <= self.last_seen:
            return Judgement(Verdict.DROP)
        if payload.prev > self.last_seen:
            return Judgement(Verdict.REPLAY)  # missed an event of the stream
        if self.types is not None and payload.type not in self.types:
            return Judgement(Verdict.DROP)
        if payload.event is None:
            return Judgement(Verdict.FETCH, position=payload.position)
        return Judgement(Verdict.DELIVER, event=payload.event)


class Throttle:
    """At most one forced replay (or re-read of the worker's pid) per
    `interval` seconds for notifications the worker did not send: anyone can
    ``pg_notify``, and a flood of forged notifications must not become a
    flood of queries (the gateway coalesces them the same way). What it
    defers, the next periodic replay (due no later than `due`) finds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last = float("-inf")

    def allow(self, now: float) -> bool:
        if now - self.last < self.interval:
            return False
        self.last = now
        return True

    def due(self) -> float:
        return self.last + self.interval
