/**
 * `@litebase/streams/browser`: follow a stream pattern through the gateway
 * from a browser, each event once, in order, across reconnects.
 *
 * A plain ES module without dependencies (import it from
 * `<script type="module">`, no bundler needed). It speaks to the gateway's
 * Server-Sent Events route (`GET /v1/streams/{pattern}/events?frames=message`,
 * the token in `access_token`) or its WebSocket (`/v1/ws`), tracks the last
 * position it handed out and, on any end of the connection (an error, a 401,
 * a token that expired: SSE ends at the token's `exp`, WebSocket closes with
 * 4001; a client too slow, 4008; a gateway restart), reconnects with backoff,
 * a fresh token from the provider, and `after` = that position. A position
 * at or below the last one is never delivered again.
 *
 * The browser's own EventSource reconnection is not used: it would come back
 * with the old URL, hence the old token.
 *
 * @module
 */
import type { Event } from "./events.js";

export type { Event };

/** Options of {@link subscribeGateway}. */
export interface GatewayOptions {
  /** Events after this position (none: from the beginning of the log). */
  after?: number;
  /** Only events whose type is one of these. */
  types?: string[];
  /** Only events whose data contains this JSON object. */
  filter?: Record<string, unknown>;
  /**
   * The JWT, or a function giving one (called for every connection, so it
   * can hand out a fresh token); none: the gateway's anonymous role.
   */
  token?: string | (() => string | Promise<string>);
  /** `"sse"` (default) or `"websocket"`. */
  transport?: "sse" | "websocket";
  /** Called with each event, once, in position order. */
  onEvent: (event: Event) => void;
  /**
   * Called with each connection problem before the reconnect (a failed
   * token provider, a refused request, an error message of the gateway).
   * Delivery goes on; call `close()` to give up.
   */
  onError?: (error: Error) => void;
  /** The longest wait between reconnect attempts, ms (default 5000). */
  maxBackoff?: number;
}

/** What {@link subscribeGateway} returns. */
export interface GatewaySubscription {
  /** The last position handed to `onEvent` (or `after`, or 0). */
  readonly lastPosition: number;
  /** How many connections were opened so far (1 + reconnects). */
  readonly connections: number;
  /** Stop: close the connection, no reconnect, no more events. */
  close(): void;
}

/** An event of the gateway's JSON (SSE `data:`, or a WebSocket `event` message, whose type is `event_type`). */
function eventOf(body: Record<string, unknown>, typeField: string): Event | undefined {
  const { position, stream, time, tx } = body;
  if (typeof position !== "number" || typeof stream !== "string" || typeof time !== "string") return undefined;
  const type = body[typeField];
  return {
    position,
    stream,
    time,
    tx: Number(tx),
    data: body.data,
    type: typeof type === "string" ? type : null,
    key: typeof body.key === "string" ? body.key : null,
    headers: (body.headers as Record<string, string> | undefined) ?? null,
  };
}

/**
 * Follow `pattern` (`'order.*'`, `'*'`, `'order.*.failed'`, a name) through
 * the gateway at `baseUrl` (`"https://gateway.example.com"`).
 *
 * ```js
 * import { subscribeGateway } from "@litebase/streams/browser";
 * const sub = subscribeGateway("https://gw.example.com", "order.*", {
 *   token: () => fetch("/token").then((r) => r.text()),
 *   onEvent: (event) => console.log(event.position, event.data),
 * });
 * ```
 */
export function subscribeGateway(baseUrl: string, pattern: string, options: GatewayOptions): GatewaySubscription {
  const transport = options.transport ?? "sse";
  if (transport !== "sse" && transport !== "websocket") throw new TypeError('transport is "sse" or "websocket"');
  const base = baseUrl.replace(/\/+$/, "");
  const maxBackoff = options.maxBackoff ?? 5000;
  let last = options.after ?? 0;
  let started = options.after !== undefined;
  let closed = false;
  let failures = 0;
  let connections = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let stopCurrent: (() => void) | undefined;

  const report = (error: unknown) => {
    if (closed) return;
    try {
      options.onError?.(error instanceof Error ? error : new Error(String(error)));
    } catch {
      // The caller's handler failing must not stop delivery.
    }
  };

  const deliver = (event: Event | undefined) => {
    if (closed || event === undefined || (started && event.position <= last)) return;
    last = event.position;
    started = true;
    failures = 0;
    options.onEvent(event);
  };

  // Reconnect once per connection, whatever ended it (error, close, end).
  const scheduleReconnect = (current: { ended: boolean }) => {
    if (current.ended || closed) return;
    current.ended = true;
    stopCurrent?.();
    stopCurrent = undefined;
    failures += 1;
    const delay = Math.min(maxBackoff, 100 * 2 ** (failures - 1)) * (0.5 + Math.random() / 2);
    timer = setTimeout(open, delay);
  };

  async function open(): Promise<void> {
    timer = undefined;
    if (closed) return;
    const current = { ended: false };
    let token: string | undefined;
    try {
      token = typeof options.token === "function" ? await options.token() : options.token;
    } catch (error) {
      report(new Error(`the token provider failed: ${error instanceof Error ? error.message : String(error)}`));
      scheduleReconnect(current);
      return;
    }
    if (closed) return;
    connections += 1;
    if (transport === "sse") openSse(token, current);
    else openWebSocket(token, current);
  }

  function openSse(token: string | undefined, current: { ended: boolean }): void {
    const params = new URLSearchParams({ frames: "message" });
    if (started) params.set("after", String(last));
    if (options.types) params.set("types", options.types.join(","));
    if (options.filter) params.set("filter", JSON.stringify(options.filter));
    if (token !== undefined) params.set("access_token", token);
    const url = `${base}/v1/streams/${encodeURIComponent(pattern)}/events?${params}`;
    const source = new EventSource(url);
    stopCurrent = () => source.close();
    source.onopen = () => {
      failures = 0;
    };
    source.onmessage = (message: MessageEvent<string>) => {
      if (current.ended) return;
      let body: unknown;
      try {
        body = JSON.parse(message.data);
      } catch {
        return report(new Error("the gateway sent a frame that is not JSON"));
      }
      deliver(eventOf(body as Record<string, unknown>, "type"));
    };
    source.onerror = () => {
      // An end (the token's exp, a restart), a refused request (401, 403, 503):
      // the browser would retry with the same URL; reconnect with a fresh token.
      if (source.readyState === EventSource.CLOSED) report(new Error("the gateway refused the event stream"));
      scheduleReconnect(current);
    };
  }

  function openWebSocket(token: string | undefined, current: { ended: boolean }): void {
    const url = new URL(`${base}/v1/ws`, globalThis.location?.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (token !== undefined) url.searchParams.set("access_token", token);
    const socket = new WebSocket(url);
    stopCurrent = () => socket.close(1000);
    socket.onopen = () => {
      const subscribe: Record<string, unknown> = { type: "subscribe", stream: pattern };
      if (started) subscribe.after = last;
      if (options.types) subscribe.types = options.types;
      if (options.filter) subscribe.filter = options.filter;
      socket.send(JSON.stringify(subscribe));
    };
    socket.onmessage = (message: MessageEvent) => {
      if (current.ended || typeof message.data !== "string") return;
      let body: Record<string, unknown>;
      try {
        body = JSON.parse(message.data) as Record<string, unknown>;
      } catch {
        return report(new Error("the gateway sent a message that is not JSON"));
      }
      if (body.type === "subscribed") failures = 0;
      else if (body.type === "event") deliver(eventOf(body, "event_type"));
      else if (body.type === "error") {
        report(new Error(`the gateway refused the subscription: ${body.status} ${body.error} (SQLSTATE ${body.sqlstate})`));
        scheduleReconnect(current);
      } else if (body.type === "unsubscribed") scheduleReconnect(current);
    };
    socket.onclose = (close: CloseEvent) => {
      // 4001: the token expired; 4008: too slow; anything else: the gateway went away.
      if (close.code !== 4001 && close.code !== 1000) report(new Error(`the WebSocket closed (${close.code} ${close.reason})`));
      scheduleReconnect(current);
    };
    socket.onerror = () => scheduleReconnect(current);
  }

  void open();
  return {
    get lastPosition() {
      return last;
    },
    get connections() {
      return connections;
    },
    close() {
      closed = true;
      if (timer !== undefined) clearTimeout(timer);
      stopCurrent?.();
      stopCurrent = undefined;
    },
  };
}
