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
/**
 * The columns of an event row, for queries over `streams.replay`, `get` and
 * `poll` aliased `e`: int8 and xid8 as text (no precision lost on the way),
 * the time in the canonical form.
 * @internal
 */
export const EVENT_COLUMNS = "e.position::text AS position, e.stream, " +
    `to_char(e.time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS time, ` +
    "e.tx::text AS tx, e.data, e.type, e.key, e.headers";
/** An {@link Event} of a row of {@link EVENT_COLUMNS}. @internal */
export function eventOfRow(row) {
    return {
        position: Number(row.position),
        stream: row.stream,
        time: row.time,
        tx: Number(row.tx),
        data: row.data,
        type: row.type ?? null,
        key: row.key ?? null,
        headers: row.headers ?? null,
    };
}
/** An {@link Event} of the canonical JSON form (a payload or a gateway frame), or undefined when malformed. @internal */
export function eventOfJson(body, typeField = "type") {
    const { position, stream, time, tx } = body;
    if (typeof position !== "number" || typeof stream !== "string" || typeof time !== "string")
        return undefined;
    if (!("data" in body))
        return undefined;
    const type = body[typeField];
    return {
        position,
        stream,
        time,
        tx: Number(tx),
        data: body.data,
        type: typeof type === "string" ? type : null,
        key: typeof body.key === "string" ? body.key : null,
        headers: body.headers ?? null,
    };
}
/** The payload of a notification, or undefined when it is not one the worker sends. @internal */
export function decodePayload(text) {
    let body;
    try {
        body = JSON.parse(text);
    }
    catch {
        return undefined;
    }
    if (typeof body !== "object" || body === null)
        return undefined;
    const b = body;
    if (typeof b.position !== "number" || typeof b.prev !== "number" || typeof b.stream !== "string")
        return undefined;
    const withData = "data" in b && !b.truncated && !b.private;
    return {
        position: b.position,
        stream: b.stream,
        prev: b.prev,
        type: typeof b.type === "string" ? b.type : null,
        event: withData ? eventOfJson(b) : undefined,
    };
}
