/**
 * Publishing: {@link publish}, {@link publishOnce}, {@link publishBatch}.
 *
 * Each takes a client the caller owns and runs in its current transaction:
 * the events commit (and become visible) with the caller's own writes, or
 * not at all. Nothing here begins, commits or rolls back, nor changes the
 * session's settings. Errors arrive as {@link StreamsError} subclasses
 * (`InvalidArgumentError`, `IdempotencyConflictError`,
 * `ExpectedVersionMismatchError`, `PermissionDeniedError`, ...).
 *
 * @module
 */
import { translated } from "./errors.js";
function envelope(options) {
    return [
        options.type ?? null,
        options.key ?? null,
        options.headers === undefined ? null : JSON.stringify(options.headers),
        options.expectedPrev === undefined ? null : String(options.expectedPrev),
    ];
}
/**
 * Append one event to `stream` in `client`'s transaction; its position.
 * `data` is anything `JSON.stringify` takes. The caller commits.
 *
 * @throws {@link StreamsError} by SQLSTATE (22023, 23505, 40001, 42501, 54000, ...)
 */
export async function publish(client, stream, data, options = {}) {
    const { rows } = await translated(() => client.query("SELECT streams.publish($1, $2::jsonb, type => $3, key => $4, headers => $5::jsonb, " +
        "expected_prev => $6::bigint, idempotency_key => $7)::text AS position", [stream, JSON.stringify(data), ...envelope(options), options.idempotencyKey ?? null]));
    return Number(rows[0].position);
}
/**
 * {@link publish} with a required idempotency key, telling whether the key
 * was remembered. The caller commits.
 *
 * @throws {@link StreamsError} by SQLSTATE
 */
export async function publishOnce(client, stream, data, idempotencyKey, options = {}) {
    const { rows } = await translated(() => client.query("SELECT p.position::text AS position, p.duplicate FROM streams.publish_once($1, $2::jsonb, $7, " +
        "type => $3, key => $4, headers => $5::jsonb, expected_prev => $6::bigint) p", [stream, JSON.stringify(data), ...envelope(options), idempotencyKey]));
    return { position: Number(rows[0].position), duplicate: Boolean(rows[0].duplicate) };
}
/**
 * Append one event per item of `data`, in one call; their positions, in
 * order. The envelope, idempotency key and expected version are the
 * batch's (see `streams.publish_batch`). The caller commits.
 *
 * @throws {@link StreamsError} by SQLSTATE
 */
export async function publishBatch(client, stream, data, options = {}) {
    const { rows } = await translated(() => client.query("SELECT p::text AS position FROM streams.publish_batch($1, $2::jsonb[], type => $3, key => $4, " +
        "headers => $5::jsonb, expected_prev => $6::bigint, idempotency_key => $7) p", [stream, data.map((d) => JSON.stringify(d)), ...envelope(options), options.idempotencyKey ?? null]));
    return rows.map((r) => Number(r.position));
}
