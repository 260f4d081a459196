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
export declare function subscribeGateway(baseUrl: string, pattern: string, options: GatewayOptions): GatewaySubscription;
