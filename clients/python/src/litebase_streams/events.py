"""The one event type, the cursor, and how both are read from the database.

An `Event` is the same whatever path it came by: a replay row, a
notification payload (the canonical JSON form), a ``streams.get`` row, or a
subscription's poll.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import set_json_loads

__all__ = ["Event", "Cursor", "UndecodedJSON"]


@dataclass(frozen=True)
class Event:
    """One committed event of the log.

    `position` is unique across the log (a good idempotency key for work
    done outside the database), `time` the commit time (timezone-aware,
    UTC), `tx` the publishing transaction's id (xid8). `type`, `key` and
    `headers` are the optional envelope: None when the event was published
    without them.
    """

    position: int
    stream: str
    time: datetime
    tx: int
    data: Any
    type: str | None = None
    key: str | None = None
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class Cursor:
    """Where a subscriber is: the log (``streams.log_id()``) and the last
    position handled in it.

    Persist it with the work each event caused and pass it back as
    ``subscribe(..., after=cursor)``: every later event arrives exactly once.
    A cursor of another log (the extension was re-created, or the database
    restored) is refused with `LogChanged`.
    """

    log_id: str | None
    position: int


class UndecodedJSON(str):
    """The `data` (or `headers`) of an event nested deeper than Python's
    ``json`` module parses (about 1,000 levels; jsonb allows thousands):
    its JSON text, as a `str` subclass, instead of an error that would stop
    every subscriber of the stream at that event again and again. Parse it
    with a parser of your own, or treat it as a bad event."""


def loads(text: str | bytes) -> Any:
    """``json.loads``, but `UndecodedJSON` where the nesting is too deep."""
    try:
        return json.loads(text)
    except RecursionError:
        return UndecodedJSON(text.decode() if isinstance(text, (bytes, bytearray, memoryview))
                             else text)


def configure(conn: Any) -> Any:
    """Make `conn` (a psycopg connection of the library's) read json and
    jsonb with `loads`; returns it."""
    set_json_loads(loads, conn)
    return conn


#: The typed columns of an event row, for queries over streams.replay/get/poll.
EVENT_COLUMNS = "e.position, e.stream, e.time, e.tx::text::bigint, e.data, e.type, e.key, e.headers"


def event_of_row(row: tuple[Any, ...] | Any) -> Event:
    """An `Event` of a row of `EVENT_COLUMNS`."""
    position, stream, time, tx, data, type_, key, headers = row[:8]
    return Event(position=position, stream=stream, time=time, tx=tx, data=data,
                 type=type_, key=key, headers=headers)


@dataclass(frozen=True)
class Payload:
    """A decoded notification payload: the event, or only what the
    notification said about it (`event` is None when it came without data:
    truncated or private)."""

    position: int
    stream: str
    prev: int
    type: str | None
    event: Event | None


def decode_payload(text: str) -> Payload | None:
    """The payload of a notification, or None when it is not one the
    worker sends (malformed: a replay decides instead)."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return None  # a replay decides (and hands a deep one out as UndecodedJSON)
    try:
        position = body["position"]
        stream = body["stream"]
        prev = body["prev"]
        if not (isinstance(position, int) and isinstance(prev, int) and isinstance(stream, str)):
            return None
        type_ = body.get("type")
        event = None
        if "data" in body and not body.get("truncated") and not body.get("private"):
            event = Event(position=position, stream=stream,
                          time=datetime.fromisoformat(body["time"]), tx=int(body["tx"]),
                          data=body["data"], type=type_, key=body.get("key"),
                          headers=body.get("headers"))
        return Payload(position=position, stream=stream, prev=prev, type=type_, event=event)
    except (ValueError, KeyError, TypeError):
        return None
