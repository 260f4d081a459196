"""The errors this library raises.

Every error the extension raises carries a SQLSTATE (README, "Errors"). The
library turns a psycopg error into the `StreamsError` subclass its SQLSTATE
names, keeping the psycopg error as ``__cause__`` (and in `StreamsError.pgerror`),
so a caller can catch ``ExpectedVersionMismatch`` instead of comparing codes.
A SQLSTATE without a class of its own becomes a plain `StreamsError`. Lost
connections are not translated (see `connection_lost`): they stay
``psycopg.OperationalError``, which `subscribe` and `consume` handle by
reconnecting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg

__all__ = [
    "StreamsError",
    "NullArgument",
    "InvalidArgument",
    "IdempotencyConflict",
    "ExpectedVersionMismatch",
    "PermissionDenied",
    "NotFound",
    "EventTooLarge",
    "InvalidState",
    "NotSupported",
    "ReadOnly",
    "LogChanged",
    "connection_lost",
]


class StreamsError(Exception):
    """An error the database reported for a litebase_streams call.

    `sqlstate` is the five-character SQLSTATE, `detail` and `hint` the
    server's errdetail and errhint (or None), `pgerror` the psycopg error
    (also the exception's ``__cause__``).
    """

    sqlstate: str | None = None

    def __init__(self, message: str, *, sqlstate: str | None = None,
                 detail: str | None = None, hint: str | None = None,
                 pgerror: psycopg.Error | None = None) -> None:
        super().__init__(message)
        if sqlstate is not None:
            self.sqlstate = sqlstate
        self.detail = detail
        self.hint = hint
        self.pgerror = pgerror


class NullArgument(StreamsError):
    """22004: a required argument is NULL (None)."""
    sqlstate = "22004"


class InvalidArgument(StreamsError):
    """22023: a bad stream name or pattern, envelope, idempotency key, or an
    argument out of range; nothing was written."""
    sqlstate = "22023"


class IdempotencyConflict(StreamsError):
    """23505: the idempotency key is remembered for other data or envelope.
    A retry must repeat the original exactly; a new event needs a new key."""
    sqlstate = "23505"


class ExpectedVersionMismatch(StreamsError):
    """40001: ``expected_prev`` is not the stream's newest event (`detail`
    names the actual one). Read the stream head again and retry the
    transaction. (40001 is also PostgreSQL's serialization failure, which
    calls for the same retry.)"""
    sqlstate = "40001"


class PermissionDenied(StreamsError):
    """42501: the role lacks the ``read`` or ``publish`` privilege on the
    stream (``streams.grant``), or is not a member of a subscription's owner."""
    sqlstate = "42501"


class NotFound(StreamsError):
    """42704: an unknown subscription or webhook (or a ``redact`` of a
    position without a final event the caller may redact)."""
    sqlstate = "42704"


class EventTooLarge(StreamsError):
    """54000: ``data`` larger than ``litebase_streams.max_event_size`` (also a
    transaction holding claims on too many chunks or keys)."""
    sqlstate = "54000"


class InvalidState(StreamsError):
    """55000: an object not in the state the call needs: a nack of an event
    that is not the caller's, a lease that expired, no worker running."""
    sqlstate = "55000"


class NotSupported(StreamsError):
    """0A000: not supported (``PREPARE TRANSACTION`` after publish or poll, a
    lease of an unordered subscription, a long poll under REPEATABLE READ)."""
    sqlstate = "0A000"


class ReadOnly(StreamsError):
    """25006: publishing on a standby; publish on the primary."""
    sqlstate = "25006"


class LogChanged(StreamsError):
    """The database's log is not the one the cursor belongs to.

    ``streams.log_id()`` is new after every ``CREATE EXTENSION`` (a re-created
    or restored log), and positions start over in it, so a saved position
    means nothing there. `old` is the cursor's log id, `new` the database's.
    Raised by `subscribe` unless it was given ``on_log_change="restart"``.
    """

    def __init__(self, old: str | None, new: str | None) -> None:
        super().__init__(f"the log changed from {old} to {new}: positions start over "
                         "(the extension was re-created or the database restored)")
        self.old = old
        self.new = new


_BY_SQLSTATE: dict[str, type[StreamsError]] = {
    cls.sqlstate: cls
    for cls in (NullArgument, InvalidArgument, IdempotencyConflict, ExpectedVersionMismatch,
                PermissionDenied, NotFound, EventTooLarge, InvalidState, NotSupported, ReadOnly)
    if cls.sqlstate
}


def from_psycopg(error: psycopg.Error) -> StreamsError:
    """The `StreamsError` for a psycopg error, by its SQLSTATE."""
    diag = error.diag
    sqlstate = error.sqlstate
    cls = _BY_SQLSTATE.get(sqlstate or "", StreamsError)
    message = diag.message_primary or str(error).strip()
    return cls(message, sqlstate=sqlstate, detail=diag.message_detail,
               hint=diag.message_hint, pgerror=error)


#: SQLSTATEs of a session that ended: the server shut down or terminated it.
_SESSION_ENDED = ("57P01", "57P02", "57P03")


def connection_lost(error: BaseException) -> bool:
    """Whether `error` means the connection is gone (reconnect and go on):
    a psycopg ``OperationalError`` without a SQLSTATE, of class 08
    (connection exception), or a terminated session (57P01 to 57P03)."""
    if not isinstance(error, psycopg.OperationalError):
        return False
    state = error.sqlstate
    return state is None or state.startswith("08") or state in _SESSION_ENDED


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise a psycopg error with a SQLSTATE as its `StreamsError`.

    Lost connections (`connection_lost`) pass unchanged.
    """
    try:
        yield
    except psycopg.Error as e:
        if connection_lost(e) or e.sqlstate is None:
            raise
        raise from_psycopg(e) from e
