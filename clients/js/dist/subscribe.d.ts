/**
 * `subscribe`: every event of a stream pattern, exactly once, in order, live.
 *
 * The rule (docs/protocol.md, "Reconnecting without gaps or duplicates";
 * docs/security.md, "the client rule"): LISTEN first, then read
 * `streams.worker_pid()` and `streams.log_id()`, catch up with
 * `streams.replay(after => lastSeen)` in pages, then follow notifications.
 * The invariant a {@link Subscription} keeps: every event of the pattern at
 * or below `lastSeen` has been handed out, once, in position order, and
 * nothing above it has. It holds because `lastSeen` only moves to
 *
 * - the position of a replay row (replay returns only final events, in
 *   position order: none at or below it can appear later), or
 * - the position of a notification the worker sent (its sender pid is
 *   `streams.worker_pid()`: anyone can `pg_notify`), of the one stream an
 *   exact subscription names, whose `prev` is at or below `lastSeen`: no
 *   event of that stream was missed, and an exact subscription has no other.
 *
 * Everything else makes the subscription replay instead: a notification
 * from another pid (after reading the pid once more: the worker may have
 * restarted), a `prev` gap, a malformed payload, and any notification of a
 * pattern or of a filtered subscription. A pattern has no channel of its
 * own: the subscription LISTENs on the channels of the streams it matches
 * (found by name at the start, then met in replays), and replays every
 * `replayInterval` (doubling while nothing comes) to find the first events
 * of streams it had not met, as the gateway's topics do.
 *
 * Two connections: one LISTENs, the other runs replays and `streams.get`.
 *
 * @module
 */
import type pg from "pg";
import { type ConnectionConfig } from "./connection.js";
import { type Cursor, type Event } from "./events.js";
/** Options of {@link subscribe}. */
export interface SubscribeOptions {
    /**
     * Where to start: a {@link Cursor} saved earlier (`sub.cursor`), a
     * position (events after it), or nothing for the beginning of the log.
     */
    after?: Cursor | number | null;
    /** Only events whose `type` is one of these (as `streams.replay`'s `types`). */
    types?: string[];
    /** Only events whose data contains this JSON object (`data @> filter`). */
    filter?: Record<string, unknown>;
    /**
     * What a log other than the cursor's does (`streams.log_id()` changed:
     * the extension was re-created or the database restored, and positions
     * start over): `"throw"` (the default) ends the iteration with a
     * {@link LogChangedError} after the events of the old log already read;
     * `"restart"` starts again from position 0 of the new log
     * (`sub.cursor.logId` tells which).
     */
    onLogChange?: "throw" | "restart";
    /** Milliseconds between safety-net replays while events come (default 1000); doubles while none do. */
    replayInterval?: number;
    /** The longest interval between safety-net replays, ms (default 10000). */
    maxReplayInterval?: number;
    /** Events per replay page (default 1000). */
    pageSize?: number;
    /** The longest wait between reconnect attempts, ms (default 5000). */
    maxBackoff?: number;
    /** Ends the iteration (as {@link Subscription.close}). */
    signal?: AbortSignal;
    /** Called with each lost connection before the reconnect (default: nothing). */
    onReconnect?: (error: unknown, delayMs: number) => void;
    /**
     * Test hook: a notification for which this returns true is ignored, as if
     * it never arrived (tests make the subscription miss one).
     * @internal
     */
    dropNotification?: (message: pg.Notification) => boolean;
}
/**
 * Follow the events of `pattern`: an async iterable of {@link Event}, each
 * once, in position order, across worker restarts, lost connections
 * (reconnected with backoff) and forged notifications.
 *
 * `pattern` is a stream name, `'order.*'`, `'order.*.failed'` or `'*'`.
 * Persist `sub.cursor` with the work each event caused and pass it back as
 * `after` to go on after a restart.
 *
 * ```ts
 * const sub = subscribe(process.env.DATABASE_URL!, "order.*", { after: saved });
 * for await (const event of sub) {
 *   await handle(event);
 *   await save(sub.cursor);
 * }
 * ```
 *
 * Errors other than a lost connection end the iteration (thrown from the
 * `for await`): a {@link StreamsError} such as `PermissionDeniedError`, or
 * a {@link LogChangedError}.
 */
export declare function subscribe(config: ConnectionConfig, pattern: string, options?: SubscribeOptions): Subscription;
/** What {@link subscribe} returns. Iterate it once. */
export declare class Subscription implements AsyncIterable<Event> {
    /** The pattern followed. */
    readonly pattern: string;
    private readonly config;
    private readonly types;
    private readonly filter;
    private readonly onLogChange;
    private readonly pageSize;
    private readonly baseInterval;
    private readonly maxInterval;
    private readonly maxBackoff;
    private readonly options;
    /** Exact and unfiltered: notifications may be handed out without a replay. */
    private readonly direct;
    private logId;
    private lastSeen;
    private current;
    private workerPid;
    private channels;
    private pending;
    private inbox;
    private listen;
    private query;
    private lost;
    private wake;
    private interval;
    private nextReplay;
    private started;
    private closed;
    private iterating;
    private readonly abort;
    /** Use {@link subscribe}. @internal */
    constructor(config: ConnectionConfig, pattern: string, options: SubscribeOptions);
    /** The log and position of the last event handed out: persist it with the work that event caused. */
    get cursor(): Cursor;
    /** Stop: the iteration ends (at once, also while it waits) and the connections close. */
    close(): void;
    /** The events, each once, in position order (`for await`); iterate once. */
    [Symbol.asyncIterator](): AsyncIterator<Event>;
    private events;
    private retryable;
    private disconnect;
    private watch;
    /** Connect, LISTEN first, read the worker and the log, catch up. */
    private start;
    /**
     * Note the worker's pid and the log id; true when the log changed and the
     * subscription restarts from 0 (`onLogChange: "restart"`). Throws
     * {@link LogChangedError} otherwise.
     */
    private sawWorker;
    /** LISTEN on the channels of the streams of a pattern not listened to yet. */
    private listenOn;
    /** Hand out `event` if it is new, moving lastSeen. */
    private accept;
    /** Replay from lastSeen until a short page. */
    private catchUp;
    /** Wait for notifications (at most until the next periodic replay), then act on them. */
    private step;
    private onNotes;
    /** The verdict on a notification of the worker: drop, replay, fetch (a position), or the event. */
    private judge;
}
