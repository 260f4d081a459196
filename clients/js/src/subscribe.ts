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

import { backoff, connect, release, sleep, type ConnectionConfig } from "./connection.js";
import { LogChangedError, StreamsError, isConnectionLost, translate } from "./errors.js";
import { EVENT_COLUMNS, decodePayload, eventOfRow, type Cursor, type Event, type EventRow } from "./events.js";
import { isExact, matches, nameRange, quoteIdent } from "./patterns.js";

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

/** One replay page with the worker's pid and the log id, read in one statement. */
const REPLAY_SQL = `SELECT l.pid, l.log_id, ${EVENT_COLUMNS}
FROM (SELECT streams.worker_pid() AS pid, streams.log_id()::text AS log_id) l
LEFT JOIN LATERAL streams.replay(stream => $1, after => $2::bigint, max_events => $3,
                                 types => $4::text[], filter => $5::jsonb) e ON true
ORDER BY e.position`;

const WORKER_SQL = "SELECT streams.worker_pid() AS pid, streams.log_id()::text AS log_id";

const GET_SQL = `SELECT ${EVENT_COLUMNS} FROM streams.get($1::bigint) e WHERE e.position IS NOT NULL`;

/** The names of the streams in a range, one index probe each (a loose scan). */
const STREAM_NAMES_SQL = `WITH RECURSIVE s(stream) AS (
    SELECT (SELECT min(e.stream) FROM streams.event_log e WHERE e.stream >= $1 AND e.stream < $2)
    UNION ALL
    SELECT (SELECT min(e.stream) FROM streams.event_log e WHERE e.stream > s.stream AND e.stream < $2)
    FROM s WHERE s.stream IS NOT NULL
) SELECT s.stream::text AS stream FROM s WHERE s.stream IS NOT NULL LIMIT 10000`;

/**
 * SQLSTATEs that mean the extension is being re-created under a running
 * subscription (undefined function, invalid schema name): reconnect and see
 * which log is there then.
 */
const REINSTALLING = new Set(["42883", "3F000"]);

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
export function subscribe(config: ConnectionConfig, pattern: string, options: SubscribeOptions = {}): Subscription {
  return new Subscription(config, pattern, options);
}

/** What {@link subscribe} returns. Iterate it once. */
export class Subscription implements AsyncIterable<Event> {
  /** The pattern followed. */
  readonly pattern: string;
  private readonly config: ConnectionConfig;
  private readonly types: string[] | null;
  private readonly filter: string | null;
  private readonly onLogChange: "throw" | "restart";
  private readonly pageSize: number;
  private readonly baseInterval: number;
  private readonly maxInterval: number;
  private readonly maxBackoff: number;
  private readonly options: SubscribeOptions;
  /** Exact and unfiltered: notifications may be handed out without a replay. */
  private readonly direct: boolean;

  private logId: string | null;
  private lastSeen: number;
  private current: Cursor;
  private workerPid: number | null = null;
  private channels = new Set<string>();
  private pending: Array<[Event, string | null]> = [];
  private inbox: pg.Notification[] = [];
  private listen: pg.Client | undefined;
  private query: pg.Client | undefined;
  private lost: unknown;
  private wake: (() => void) | undefined;
  private interval: number;
  private nextReplay = 0;
  private started = false;
  private closed = false;
  private iterating = false;
  private readonly abort = new AbortController();

  /** Use {@link subscribe}. @internal */
  constructor(config: ConnectionConfig, pattern: string, options: SubscribeOptions) {
    this.config = config;
    this.pattern = pattern;
    this.options = options;
    this.types = options.types ? [...options.types] : null;
    this.filter = options.filter === undefined ? null : JSON.stringify(options.filter);
    this.onLogChange = options.onLogChange ?? "throw";
    if (this.onLogChange !== "throw" && this.onLogChange !== "restart")
      throw new TypeError('onLogChange is "throw" or "restart"');
    this.pageSize = options.pageSize ?? 1000;
    this.baseInterval = options.replayInterval ?? 1000;
    this.maxInterval = Math.max(this.baseInterval, options.maxReplayInterval ?? 10000);
    this.interval = this.baseInterval;
    this.maxBackoff = options.maxBackoff ?? 5000;
    this.direct = isExact(pattern) && options.filter === undefined;
    const after = options.after;
    if (after !== null && typeof after === "object") [this.logId, this.lastSeen] = [after.logId, after.position];
    else [this.logId, this.lastSeen] = [null, Number(after ?? 0)];
    this.current = { logId: this.logId, position: this.lastSeen };
    options.signal?.addEventListener("abort", () => this.close(), { once: true });
    if (options.signal?.aborted) this.closed = true;
  }

  /** The log and position of the last event handed out: persist it with the work that event caused. */
  get cursor(): Cursor {
    return { ...this.current };
  }

  /** Stop: the iteration ends (at once, also while it waits) and the connections close. */
  close(): void {
    this.closed = true;
    this.abort.abort();
    this.wake?.();
  }

  /** The events, each once, in position order (`for await`); iterate once. */
  [Symbol.asyncIterator](): AsyncIterator<Event> {
    if (this.iterating) throw new Error("a subscription is iterated once");
    this.iterating = true;
    return this.events();
  }

  private async *events(): AsyncGenerator<Event> {
    let failures = 0;
    let changed: LogChangedError | undefined;
    try {
      while (!this.closed) {
        const next = this.pending.shift();
        if (next !== undefined) {
          const [event, logId] = next;
          this.current = { logId, position: event.position };
          yield event;
          continue;
        }
        if (changed !== undefined) throw changed;
        try {
          if (this.listen === undefined) await this.start();
          else await this.step();
          failures = 0;
        } catch (raw) {
          const error = translate(raw);
          if (this.closed) return;
          if (error instanceof LogChangedError) {
            changed = error; // after the events of the old log already taken
            this.disconnect();
            continue;
          }
          if (!this.retryable(error)) throw error;
          failures += 1;
          const delay = backoff(failures, this.maxBackoff);
          this.options.onReconnect?.(error, delay);
          this.disconnect();
          await sleep(delay, this.abort.signal);
        }
      }
    } finally {
      this.closed = true;
      this.disconnect();
    }
  }

  private retryable(error: unknown): boolean {
    if (isConnectionLost(error)) return true;
    return this.started && error instanceof StreamsError && REINSTALLING.has(error.sqlstate ?? "");
  }

  private disconnect(): void {
    release(this.listen);
    release(this.query);
    this.listen = this.query = undefined;
    this.inbox = [];
    this.lost = undefined;
  }

  private watch(client: pg.Client): void {
    const lose = (error: unknown) => {
      // A client already let go of still ends (and may fail) later: not the current session's loss.
      if (client !== this.listen && client !== this.query) return;
      this.lost ??= error;
      this.wake?.();
    };
    client.on("error", lose);
    client.on("end", () => lose(new Error("connection closed")));
  }

  /** Connect, LISTEN first, read the worker and the log, catch up. */
  private async start(): Promise<void> {
    const listen = await connect(this.config);
    this.listen = listen;
    this.watch(listen);
    listen.on("notification", (message) => {
      this.inbox.push(message);
      this.wake?.();
    });
    this.query = await connect(this.config);
    this.watch(this.query);
    this.channels = new Set();
    if (isExact(this.pattern)) {
      await listen.query(`LISTEN ${quoteIdent(this.pattern)}`);
    } else {
      const { rows } = await this.query.query<{ stream: string }>(STREAM_NAMES_SQL, nameRange(this.pattern));
      await this.listenOn(rows.map((r) => r.stream));
    }
    const { rows } = await this.query.query<{ pid: number | null; log_id: string | null }>(WORKER_SQL);
    this.sawWorker(rows[0]?.pid ?? null, rows[0]?.log_id ?? null);
    this.started = true;
    await this.catchUp();
  }

  /**
   * Note the worker's pid and the log id; true when the log changed and the
   * subscription restarts from 0 (`onLogChange: "restart"`). Throws
   * {@link LogChangedError} otherwise.
   */
  private sawWorker(pid: number | null, logId: string | null): boolean {
    this.workerPid = pid;
    if (logId === null || logId === this.logId) return false;
    if (this.logId === null) {
      this.logId = logId; // a fresh cursor: this log is its log
      if (this.current.logId === null) this.current = { logId, position: this.current.position };
      return false;
    }
    if (this.onLogChange === "throw") throw new LogChangedError(this.logId, logId);
    [this.logId, this.lastSeen] = [logId, 0];
    return true;
  }

  /** LISTEN on the channels of the streams of a pattern not listened to yet. */
  private async listenOn(names: Iterable<string>): Promise<void> {
    const fresh = [...new Set(names)].filter((n) => matches(this.pattern, n) && !this.channels.has(n));
    for (let i = 0; i < fresh.length; i += 100) {
      const chunk = fresh.slice(i, i + 100);
      await this.listen!.query(chunk.map((n) => `LISTEN ${quoteIdent(n)}`).join("; "));
      chunk.forEach((n) => this.channels.add(n));
    }
  }

  /** Hand out `event` if it is new, moving lastSeen. */
  private accept(event: Event): void {
    if (event.position <= this.lastSeen) return;
    this.lastSeen = event.position;
    this.pending.push([event, this.logId]);
  }

  /** Replay from lastSeen until a short page. */
  private async catchUp(): Promise<void> {
    let got = 0;
    for (;;) {
      const { rows } = await this.query!.query<{ pid: number | null; log_id: string | null } & EventRow>(REPLAY_SQL, [
        this.pattern,
        String(this.lastSeen),
        this.pageSize,
        this.types,
        this.filter,
      ]);
      if (rows.length > 0 && this.sawWorker(rows[0]!.pid, rows[0]!.log_id)) continue; // a new log: from 0
      const events = rows.filter((r) => r.position !== null).map(eventOfRow);
      if (!isExact(this.pattern)) await this.listenOn(events.map((e) => e.stream));
      for (const event of events) {
        const before = this.lastSeen;
        this.accept(event);
        if (this.lastSeen !== before) got += 1;
      }
      if (events.length < this.pageSize) break;
    }
    this.interval = got > 0 ? this.baseInterval : Math.min(this.interval * 2, this.maxInterval);
    this.nextReplay = Date.now() + this.interval;
  }

  /** Wait for notifications (at most until the next periodic replay), then act on them. */
  private async step(): Promise<void> {
    if (this.inbox.length === 0 && this.lost === undefined && !this.closed) {
      const timeout = Math.max(0, this.nextReplay - Date.now());
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, timeout);
        this.wake = done;
        function done() {
          clearTimeout(timer);
          resolve();
        }
      });
      this.wake = undefined;
    }
    if (this.lost !== undefined) throw this.lost;
    if (this.closed) return;
    const notes = this.inbox;
    this.inbox = [];
    if (notes.length > 0) await this.onNotes(notes);
    else if (Date.now() >= this.nextReplay) await this.catchUp();
  }

  private async onNotes(notes: pg.Notification[]): Promise<void> {
    let rechecked = false;
    let replayed = false;
    for (const note of notes) {
      if (this.options.dropNotification?.(note)) continue;
      if (this.workerPid === null || note.processId !== this.workerPid) {
        if (!rechecked) {
          // Not sent by the worker we know, or the worker restarted: ask again, once.
          rechecked = true;
          const { rows } = await this.query!.query<{ pid: number | null; log_id: string | null }>(WORKER_SQL);
          if (this.sawWorker(rows[0]?.pid ?? null, rows[0]?.log_id ?? null)) {
            replayed = true;
            await this.catchUp();
            continue;
          }
        }
        if (note.processId !== this.workerPid) {
          // Anyone can pg_notify: never trust it, replay instead (once for the whole batch).
          if (!replayed) {
            replayed = true;
            await this.catchUp();
          }
          continue;
        }
      }
      const verdict = this.judge(note.payload ?? "");
      if (verdict === "replay") {
        // One replay covers every notification received before it.
        if (!replayed) {
          replayed = true;
          await this.catchUp();
        }
      } else if (typeof verdict === "number") {
        const { rows } = await this.query!.query<EventRow>(GET_SQL, [String(verdict)]);
        if (rows[0] !== undefined) this.accept(eventOfRow(rows[0]));
      } else if (verdict !== "drop") {
        this.accept(verdict);
      }
    }
  }

  /** The verdict on a notification of the worker: drop, replay, fetch (a position), or the event. */
  private judge(text: string): "drop" | "replay" | number | Event {
    if (!this.direct) return "replay";
    const payload = decodePayload(text);
    if (payload === undefined || payload.stream !== this.pattern) return "replay";
    if (payload.position <= this.lastSeen) return "drop";
    if (payload.prev > this.lastSeen) return "replay"; // missed an event of the stream
    if (this.types !== null && (payload.type === null || !this.types.includes(payload.type))) {
      // Not for this subscription; no later event of the stream can come at or below it.
      this.lastSeen = payload.position;
      return "drop";
    }
    return payload.event ?? payload.position;
  }
}
