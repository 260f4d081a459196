"""Publishing: `publish`, `publish_once`, `publish_batch`.

Each takes a connection the caller owns and runs in its current transaction:
the events commit (and become visible) with the caller's own writes, or not
at all. Nothing here commits, rolls back or changes the connection's
settings. Errors arrive as `StreamsError` subclasses (`InvalidArgument`,
`IdempotencyConflict`, `ExpectedVersionMismatch`, `PermissionDenied`, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from .errors import translated

__all__ = ["publish", "publish_once", "publish_batch", "Published"]


class Published(NamedTuple):
    """What `publish_once` did: the event's `position`, and whether the key
    was remembered (`duplicate`: nothing was written, the position is the
    original event's)."""

    position: int
    duplicate: bool


def _envelope(type: str | None, key: str | None, headers: Mapping[str, str] | None,
              expected_prev: int | None) -> dict[str, Any]:
    return {"type": type, "key": key,
            "headers": Jsonb(dict(headers)) if headers is not None else None,
            "expected_prev": expected_prev}


def publish(conn: psycopg.Connection[Any], stream: str, data: Any, *, type: str | None = None,
            key: str | None = None, headers: Mapping[str, str] | None = None,
            idempotency_key: str | None = None, expected_prev: int | None = None) -> int:
    """Append one event to `stream` in `conn`'s transaction; its position.

    `data` is anything JSON-serialisable. `type`, `key` and `headers` are
    the optional envelope. With `idempotency_key`, a key the stream
    remembers writes nothing and returns the original position (the same
    key with other data: `IdempotencyConflict`). With `expected_prev`, the
    stream's newest event must be at that position (0: none yet), else
    `ExpectedVersionMismatch` and nothing is written. The caller commits.
    """
    params = {"stream": stream, "data": Jsonb(data), "idem": idempotency_key,
              **_envelope(type, key, headers, expected_prev)}
    with translated():
        row = conn.execute(
            "SELECT streams.publish(%(stream)s, %(data)s, type => %(type)s, key => %(key)s, "
            "headers => %(headers)s, idempotency_key => %(idem)s, "
            "expected_prev => %(expected_prev)s)", params).fetchone()
    assert row is not None
    return int(row[0])


def publish_once(conn: psycopg.Connection[Any], stream: str, data: Any, idempotency_key: str, *,
                 type: str | None = None, key: str | None = None,
                 headers: Mapping[str, str] | None = None,
                 expected_prev: int | None = None) -> Published:
    """`publish` with a required idempotency key, telling whether the key
    was remembered: ``Published(position, duplicate)``. The caller commits."""
    params = {"stream": stream, "data": Jsonb(data), "idem": idempotency_key,
              **_envelope(type, key, headers, expected_prev)}
    with translated():
        row = conn.execute(
            "SELECT p.position, p.duplicate FROM streams.publish_once(%(stream)s, %(data)s, "
            "%(idem)s, type => %(type)s, key => %(key)s, headers => %(headers)s, "
            "expected_prev => %(expected_prev)s) p", params).fetchone()
    assert row is not None
    return Published(int(row[0]), bool(row[1]))


def publish_batch(conn: psycopg.Connection[Any], stream: str, data: Iterable[Any], *,
                  type: str | None = None, key: str | None = None,
                  headers: Mapping[str, str] | None = None, idempotency_key: str | None = None,
                  expected_prev: int | None = None) -> list[int]:
    """Append one event per item of `data`, in one call; their positions, in
    order. The envelope, idempotency key and expected version are the
    batch's (see ``streams.publish_batch``). The caller commits."""
    params = {"stream": stream, "data": [Jsonb(d) for d in data], "idem": idempotency_key,
              **_envelope(type, key, headers, expected_prev)}
    with translated():
        rows = conn.execute(
            "SELECT p FROM streams.publish_batch(%(stream)s, %(data)s::jsonb[], type => %(type)s, "
            "key => %(key)s, headers => %(headers)s, idempotency_key => %(idem)s, "
            "expected_prev => %(expected_prev)s) p", params).fetchall()
    return [int(r[0]) for r in rows]
