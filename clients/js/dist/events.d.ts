/**
 * The one event type, the cursor, and how both are read from the database.
 *
 * An {@link Event} is the same whatever path it came by: a replay row, a
 * notification payload (the canonical JSON form), a `streams.get` row, a
 * subscription's poll, or (in the browser entry) a gateway frame. Its shape
 * is the canonical JSON form of the extension:
 *
 * - `position` and `tx` are JavaScript numbers (exact up to 2^53, nine
 *   quadrillion events or transactions);
 * - `time` is the RFC 3339 UTC string with microseconds and `Z`, exactly as
 *   the database writes it (`"2026-12-03T18:50:10.123456Z"`); `new
 *   Date(event.time)` when a Date is wanted (it keeps milliseconds only);
 * - `type`, `key` and `headers` are `null` when the event has none.
 *
 * @module
 */
/** One committed event of the log. */
export interface Event {
    /** Unique across the log, increasing in commit order: a good idempotency key for work done outside the database. */
    position: number;
    /** The stream's name. */
    stream: string;
    /** The commit time: RFC 3339, UTC, microseconds, `Z`. */
    time: string;
    /** The publishing transaction's id (xid8). */
    tx: number;
    /** The event's JSON data. */
    data: unknown;
    /** The envelope's type, or null. */
    type: string | null;
    /** The envelope's key, or null. */
    key: string | null;
    /** The envelope's headers, or null. */
    headers: Record<string, string> | null;
}
/**
 * Where a subscriber is: the log (`streams.log_id()`) and the last position
 * handled in it. Persist it with the work each event caused and pass it back
 * as `subscribe(..., { after: cursor })`: every later event arrives exactly
 * once. A cursor of another log is refused with `LogChangedError`.
 */
export interface Cursor {
    /** The log the position belongs to; null: whichever log the database has. */
    logId: string | null;
    /** The last position handled. */
    position: number;
}
/**
 * The columns of an event row, for queries over `streams.replay`, `get` and
 * `poll` aliased `e`: int8 and xid8 as text (no precision lost on the way),
 * the time in the canonical form.
 * @internal
 */
export declare const EVENT_COLUMNS: string;
/** A row of {@link EVENT_COLUMNS}. @internal */
export interface EventRow {
    position: string;
    stream: string;
    time: string;
    tx: string;
    data: unknown;
    type: string | null;
    key: string | null;
    headers: Record<string, string> | null;
}
/** An {@link Event} of a row of {@link EVENT_COLUMNS}. @internal */
export declare function eventOfRow(row: EventRow): Event;
/** An {@link Event} of the canonical JSON form (a payload or a gateway frame), or undefined when malformed. @internal */
export declare function eventOfJson(body: Record<string, unknown>, typeField?: string): Event | undefined;
/**
 * A decoded notification payload: the event, or only what the notification
 * said about it (`event` undefined when it came without data: truncated or
 * private). @internal
 */
export interface Payload {
    position: number;
    stream: string;
    prev: number;
    type: string | null;
    event: Event | undefined;
}
/** The payload of a notification, or undefined when it is not one the worker sends. @internal */
export declare function decodePayload(text: string): Payload | undefined;
