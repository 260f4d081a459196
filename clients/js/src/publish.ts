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

/**
 * Anything with node-postgres's `query(text, values)`: a `pg.Client`, a
 * `pg.PoolClient` inside the caller's transaction, or a `pg.Pool` (then each
 * call is a transaction of its own).
 */
export interface Queryable {
  /** Runs one statement with parameters (node-postgres's signature). */
  query(text: string, values?: unknown[]): Promise<QueryRows>;
}

/** What {@link Queryable.query} resolves to (the part this library reads). */
export interface QueryRows {
  /** The result rows. */
  rows: any[];
}

/** The optional envelope and publishing conditions of {@link publish}. */
export interface PublishOptions {
  /** The event's type (1 to 255 bytes). */
  type?: string;
  /** The event's key (1 to 1,024 bytes): order per key, compaction, partitioning. */
  key?: string;
  /** String headers (at most 64). */
  headers?: Record<string, string>;
  /**
   * A key the stream remembers (for `litebase_streams.idempotency_window`):
   * a repeat writes nothing and returns the original position; the same key
   * with other data or envelope throws `IdempotencyConflictError`.
   */
  idempotencyKey?: string;
  /**
   * The position the stream's newest event must be at (0: the stream has
   * none), else `ExpectedVersionMismatchError` and nothing is written.
   */
  expectedPrev?: number;
}

/** What {@link publishOnce} did. */
export interface Published {
  /** The event's position (the original one for a duplicate). */
  position: number;
  /** True when the key was remembered: nothing was written. */
  duplicate: boolean;
}

function envelope(options: PublishOptions): unknown[] {
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
export async function publish(client: Queryable, stream: string, data: unknown, options: PublishOptions = {}): Promise<number> {
  const { rows } = await translated(() =>
    client.query(
      "SELECT streams.publish($1, $2::jsonb, type => $3, key => $4, headers => $5::jsonb, " +
        "expected_prev => $6::bigint, idempotency_key => $7)::text AS position",
      [stream, JSON.stringify(data), ...envelope(options), options.idempotencyKey ?? null],
    ),
  );
  return Number(rows[0].position);
}

/**
 * {@link publish} with a required idempotency key, telling whether the key
 * was remembered. The caller commits.
 *
 * @throws {@link StreamsError} by SQLSTATE
 */
export async function publishOnce(
  client: Queryable,
  stream: string,
  data: unknown,
  idempotencyKey: string,
  options: Omit<PublishOptions, "idempotencyKey"> = {},
): Promise<Published> {
  const { rows } = await translated(() =>
    client.query(
      "SELECT p.position::text AS position, p.duplicate FROM streams.publish_once($1, $2::jsonb, $7, " +
        "type => $3, key => $4, headers => $5::jsonb, expected_prev => $6::bigint) p",
      [stream, JSON.stringify(data), ...envelope(options), idempotencyKey],
    ),
  );
  return { position: Number(rows[0].position), duplicate: Boolean(rows[0].duplicate) };
}

/**
 * Append one event per item of `data`, in one call; their positions, in
 * order. The envelope, idempotency key and expected version are the
 * batch's (see `streams.publish_batch`). The caller commits.
 *
 * @throws {@link StreamsError} by SQLSTATE
 */
export async function publishBatch(
  client: Queryable,
  stream: string,
  data: unknown[],
  options: PublishOptions = {},
): Promise<number[]> {
  const { rows } = await translated(() =>
    client.query(
      "SELECT p::text AS position FROM streams.publish_batch($1, $2::jsonb[], type => $3, key => $4, " +
        "headers => $5::jsonb, expected_prev => $6::bigint, idempotency_key => $7) p",
      [stream, data.map((d) => JSON.stringify(d)), ...envelope(options), options.idempotencyKey ?? null],
    ),
  );
  return rows.map((r) => Number(r.position));
}

