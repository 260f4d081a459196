"""litebase_streams: the Python client for litebase_streams event streams.

- `subscribe` / `subscribe_async`: follow a stream pattern live, every event
  exactly once and in order (LISTEN/NOTIFY plus replay), resumable from a
  `Cursor`.
- `consume` / `consume_async`: the durable-subscription loop (``streams.poll``, the handler in
  the same transaction, ``streams.ack``; nack on failure), safe behind
  PgBouncer.
- `publish`, `publish_once`, `publish_batch`: append events in the caller's
  transaction.
- Errors: `StreamsError` and one subclass per SQLSTATE the extension raises.
"""

from .consume import Delivery, consume
from .consume_async import AsyncDelivery, consume_async
from .errors import (EventTooLarge, ExpectedVersionMismatch, IdempotencyConflict, InvalidArgument,
                     InvalidState, LogChanged, NotFound, NotSupported, NullArgument,
                     PermissionDenied, ReadOnly, StreamsError)
from .events import Cursor, Event, UndecodedJSON
from .publish import Published, publish, publish_batch, publish_once
from .subscribe import Subscription, subscribe
from .subscribe_async import AsyncSubscription, subscribe_async

__all__ = [
    "subscribe", "Subscription", "subscribe_async", "AsyncSubscription",
    "consume", "Delivery", "consume_async", "AsyncDelivery",
    "publish", "publish_once", "publish_batch", "Published",
    "Event", "Cursor", "UndecodedJSON",
    "StreamsError", "NullArgument", "InvalidArgument", "IdempotencyConflict",
    "ExpectedVersionMismatch", "PermissionDenied", "NotFound", "EventTooLarge",
    "InvalidState", "NotSupported", "ReadOnly", "LogChanged",
]
