/**
 * `@litebase/streams`: the Node client of litebase_streams, on node-postgres.
 *
 * - {@link subscribe}: every event of a stream pattern, live, exactly once,
 *   in order, across worker restarts and lost connections (LISTEN + replay);
 * - {@link consume}: a durable subscription's loop (poll, handler in the
 *   transaction, ack; nack on failure), safe behind PgBouncer;
 * - {@link publish}, {@link publishOnce}, {@link publishBatch}: in the
 *   caller's transaction;
 * - errors by SQLSTATE ({@link StreamsError} and its subclasses).
 *
 * The browser client is `@litebase/streams/browser`.
 *
 * @module
 */
export { subscribe, Subscription, type SubscribeOptions } from "./subscribe.js";
export { consume, type ConsumeOptions, type Delivery, type Handler } from "./consume.js";
export { publish, publishOnce, publishBatch, type PublishOptions, type Published, type Queryable, type QueryRows } from "./publish.js";
export { parseKeywordValue, type ConnectionConfig } from "./connection.js";
export { isExact, matches, nameRange } from "./patterns.js";
export type { Event, Cursor } from "./events.js";
export { StreamsError, NullArgumentError, InvalidArgumentError, IdempotencyConflictError, ExpectedVersionMismatchError, PermissionDeniedError, NotFoundError, EventTooLargeError, InvalidStateError, NotSupportedError, ReadOnlyError, LogChangedError, isConnectionLost, type StreamsErrorOptions, } from "./errors.js";
