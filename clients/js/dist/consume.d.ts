/**
 * `consume`: the durable-subscription loop (docs/subscriptions.md).
 *
 * One transaction per poll: `streams.poll` (a long poll), the handler for
 * each event inside that transaction (each in a savepoint), `streams.ack`,
 * COMMIT. The handler's writes commit together with the ack, or not at all:
 * exactly once inside the database. A handler that throws has its savepoint
 * rolled back and its event nacked (`streams.nack`, the error's message as
 * the reason) in the same transaction, which commits: the event comes again
 * after the subscription's backoff and is parked as a dead letter after
 * `max_attempts`. Which later events of the batch still run follows the
 * subscription's order: none in an ordered one (the ack stops before the
 * nacked event), those of other keys in one ordered per key, all of them in
 * an unordered one.
 *
 * With `lease`, each poll leases its events instead (for long jobs): the
 * poll commits at once and each event runs in a transaction of its own that
 * acks it with the lease id; the lease is extended while the batch runs; a
 * failure nacks with the lease id, which ends the lease (its other events
 * come again).
 *
 * Pooler-safe: only unnamed statements (node-postgres prepares a named one
 * only when asked), no session state; a poll, the handler's writes and the
 * ack share one transaction, hence one server connection under PgBouncer's
 * transaction pooling.
 *
 * @module
 */
import type pg from "pg";
import { type ConnectionConfig } from "./connection.js";
import { type Event } from "./events.js";
/** What the handler gets with each event besides the event itself. */
export interface Delivery {
    /**
     * The client whose transaction the ack commits in: write through it and
     * the writes commit with the ack (or roll back with a failed handler).
     */
    client: pg.Client;
    /** The subscription's name. */
    subscription: string;
    /** This subscription's delivery attempt of the event (1 the first time). */
    attempt: number;
    /** The lease id, or null without `lease`. */
    leaseId: string | null;
}
/** A handler: resolve to ack the event, throw (reject) to nack it. */
export type Handler = (event: Event, delivery: Delivery) => unknown;
/** Options of {@link consume}. */
export interface ConsumeOptions {
    /** Events per poll, 1 to 10,000 (default 100). */
    maxEvents?: number;
    /** How long a poll waits for events, ms (default 5000): a long poll, one statement. */
    wait?: number;
    /**
     * Lease each poll's events for this many ms (ordered subscriptions only):
     * each event then commits in its own transaction, for jobs longer than a
     * transaction should stay open. The lease is extended while the batch runs.
     */
    lease?: number;
    /** Stops the loop after the current transaction. */
    signal?: AbortSignal;
    /** Stop on SIGINT and SIGTERM too (default true). */
    handleSignals?: boolean;
    /** The longest wait between reconnect attempts, ms (default 5000). */
    maxBackoff?: number;
    /** Called with each handler failure (after its nack is written); default: nothing. */
    onHandlerError?: (error: unknown, event: Event, delivery: Delivery) => void;
    /** Called with each lost connection before the reconnect. */
    onReconnect?: (error: unknown, delayMs: number) => void;
}
/**
 * Run `handler(event, delivery)` for the events of `subscription` until
 * stopped; resolves to how many events it handled (and acked).
 *
 * ```ts
 * await consume(process.env.DATABASE_URL!, "billing", async (event, { client }) => {
 *   await client.query("INSERT INTO invoices (position, body) VALUES ($1, $2)", [event.position, event.data]);
 * });
 * ```
 *
 * A handler error nacks its event with the error's message as the reason
 * (it comes again after the subscription's backoff) and the loop goes on;
 * `onHandlerError` hears of it. Errors of the database calls themselves
 * reject the promise (as {@link StreamsError}), except a lost connection,
 * after which it reconnects with backoff: that transaction rolled back and
 * its events come again. SIGINT and SIGTERM (unless `handleSignals` is
 * false) or `signal` end the loop after the current transaction commits.
 */
export declare function consume(config: ConnectionConfig, subscription: string, handler: Handler, options?: ConsumeOptions): Promise<number>;
