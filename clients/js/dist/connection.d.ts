/**
 * How the library makes its own connections (subscribe and consume own
 * theirs: they reconnect after a loss, which a caller's `pg.Client` cannot).
 *
 * @module
 */
import pg from "pg";
/**
 * Where to connect: a `postgres://` URL, a libpq keyword/value string
 * (`"host=127.0.0.1 port=5432 user=app dbname=app"`), a node-postgres
 * `ClientConfig`, or a function returning a new, not yet connected
 * `pg.Client` (called again for every reconnect).
 */
export type ConnectionConfig = string | pg.ClientConfig | (() => pg.Client | Promise<pg.Client>);
/**
 * A node-postgres config of a libpq keyword/value string (values may be
 * single-quoted, with `\'` and `\\` escapes). Unknown keywords are ignored
 * but `sslmode`, which sets `ssl` for `require`, `verify-ca` and `verify-full`.
 */
export declare function parseKeywordValue(text: string): pg.ClientConfig;
/** A new, connected client for `config`. @internal */
export declare function connect(config: ConnectionConfig): Promise<pg.Client>;
/** Close a client, whatever state it is in. @internal */
export declare function release(client: pg.Client | undefined): void;
/** A promise that resolves after `ms` milliseconds, or at once when `signal` aborts. @internal */
export declare function sleep(ms: number, signal?: AbortSignal): Promise<void>;
/** The delay before reconnect attempt `failures` (1, 2, ...): exponential with jitter, at most `max` ms. @internal */
export declare function backoff(failures: number, max: number): number;
