/** An event of the gateway's JSON (SSE `data:`, or a WebSocket `event` message, whose type is `event_type`). */
function eventOf(body, typeField) {
    const { position, stream, time, tx } = body;
    if (typeof position !== "number" || typeof stream !== "string" || typeof time !== "string")
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
export function subscribeGateway(baseUrl, pattern, options) {
    const transport = options.transport ?? "sse";
    if (transport !== "sse" && transport !== "websocket")
        throw new TypeError('transport is "sse" or "websocket"');
    const base = baseUrl.replace(/\/+$/, "");
    const maxBackoff = options.maxBackoff ?? 5000;
    let last = options.after ?? 0;
    let started = options.after !== undefined;
    let closed = false;
    let failures = 0;
    let connections = 0;
    let timer;
    let stopCurrent;
    const report = (error) => {
        if (closed)
            return;
        try {
            options.onError?.(error instanceof Error ? error : new Error(String(error)));
        }
        catch {
            // The caller's handler failing must not stop delivery.
        }
    };
    const deliver = (event) => {
        if (closed || event === undefined || (started && event.position <= last))
            return;
        last = event.position;
        started = true;
        failures = 0;
        options.onEvent(event);
    };
    // Reconnect once per connection, whatever ended it (error, close, end).
    const scheduleReconnect = (current) => {
        if (current.ended || closed)
            return;
        current.ended = true;
        stopCurrent?.();
        stopCurrent = undefined;
        failures += 1;
        const delay = Math.min(maxBackoff, 100 * 2 ** (failures - 1)) * (0.5 + Math.random() / 2);
        timer = setTimeout(open, delay);
    };
    async function open() {
        timer = undefined;
        if (closed)
            return;
        const current = { ended: false };
        let token;
        try {
            token = typeof options.token === "function" ? await options.token() : options.token;
        }
        catch (error) {
            report(new Error(`the token provider failed: ${error instanceof Error ? error.message : String(error)}`));
            scheduleReconnect(current);
            return;
        }
        if (closed)
            return;
        connections += 1;
        if (transport === "sse")
            openSse(token, current);
        else
            openWebSocket(token, current);
    }
    function openSse(token, current) {
        const params = new URLSearchParams({ frames: "message" });
        if (started)
            params.set("after", String(last));
        if (options.types)
            params.set("types", options.types.join(","));
        if (options.filter)
            params.set("filter", JSON.stringify(options.filter));
        if (token !== undefined)
            params.set("access_token", token);
        const url = `${base}/v1/streams/${encodeURIComponent(pattern)}/events?${params}`;
        const source = new EventSource(url);
        stopCurrent = () => source.close();
        source.onopen = () => {
            failures = 0;
        };
        source.onmessage = (message) => {
            if (current.ended)
                return;
            let body;
            try {
                body = JSON.parse(message.data);
            }
            catch {
                return report(new Error("the gateway sent a frame that is not JSON"));
            }
            deliver(eventOf(body, "type"));
        };
        source.onerror = () => {
            // An end (the token's exp, a restart), a refused request (401, 403, 503):
            // the browser would retry with the same URL; reconnect with a fresh token.
            if (source.readyState === EventSource.CLOSED)
                report(new Error("the gateway refused the event stream"));
            scheduleReconnect(current);
        };
    }
    function openWebSocket(token, current) {
        const url = new URL(`${base}/v1/ws`, globalThis.location?.href);
        url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
        if (token !== undefined)
            url.searchParams.set("access_token", token);
        const socket = new WebSocket(url);
        stopCurrent = () => socket.close(1000);
        socket.onopen = () => {
            const subscribe = { type: "subscribe", stream: pattern };
            if (started)
                subscribe.after = last;
            if (options.types)
                subscribe.types = options.types;
            if (options.filter)
                subscribe.filter = options.filter;
            socket.send(JSON.stringify(subscribe));
        };
        socket.onmessage = (message) => {
            if (current.ended || typeof message.data !== "string")
                return;
            let body;
            try {
                body = JSON.parse(message.data);
            }
            catch {
                return report(new Error("the gateway sent a message that is not JSON"));
            }
            if (body.type === "subscribed")
                failures = 0;
            else if (body.type === "event")
                deliver(eventOf(body, "event_type"));
            else if (body.type === "error") {
                report(new Error(`the gateway refused the subscription: ${body.status} ${body.error} (SQLSTATE ${body.sqlstate})`));
                scheduleReconnect(current);
            }
            else if (body.type === "unsubscribed")
                scheduleReconnect(current);
        };
        socket.onclose = (close) => {
            // 4001: the token expired; 4008: too slow; anything else: the gateway went away.
            if (close.code !== 4001 && close.code !== 1000)
                report(new Error(`the WebSocket closed (${close.code} ${close.reason})`));
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
            if (timer !== undefined)
                clearTimeout(timer);
            stopCurrent?.();
            stopCurrent = undefined;
        },
    };
}
