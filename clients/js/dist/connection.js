/**
 * How the library makes its own connections (subscribe and consume own
 * theirs: they reconnect after a loss, which a caller's `pg.Client` cannot).
 *
 * @module
 */
import pg from "pg";
const KEYWORDS = {
    host: "host",
    hostaddr: "host",
    port: "port",
    user: "user",
    dbname: "database",
    password: "password",
    application_name: "application_name",
    connect_timeout: "connectionTimeoutMillis",
};
/**
 * A node-postgres config of a libpq keyword/value string (values may be
 * single-quoted, with `\'` and `\\` escapes). Unknown keywords are ignored
 * but `sslmode`, which sets `ssl` for `require`, `verify-ca` and `verify-full`.
 */
export function parseKeywordValue(text) {
    const config = {};
    const re = /\s*([A-Za-z_]+)\s*=\s*('((?:[^'\\]|\\.)*)'|(\S+))/gy;
    let match;
    let end = 0;
    while ((match = re.exec(text)) !== null) {
        end = re.lastIndex;
        const keyword = match[1];
        const value = match[3] !== undefined ? match[3].replace(/\\(.)/g, "$1") : match[4];
        const field = KEYWORDS[keyword];
        if (field === "port")
            config.port = Number(value);
        else if (field === "connectionTimeoutMillis")
            config.connectionTimeoutMillis = Number(value) * 1000;
        else if (field !== undefined)
            config[field] = value;
        else if (keyword === "sslmode")
            config.ssl = ["require", "verify-ca", "verify-full"].includes(value) ? true : undefined;
    }
    if (text.slice(end).trim() !== "")
        throw new TypeError(`not a libpq connection string: ${JSON.stringify(text)}`);
    return config;
}
/** A new, connected client for `config`. @internal */
export async function connect(config) {
    let client;
    if (typeof config === "function")
        client = await config();
    else if (typeof config === "string")
        client = new pg.Client(config.includes("://") ? { connectionString: config } : parseKeywordValue(config));
    else
        client = new pg.Client(config);
    try {
        await client.connect();
    }
    catch (error) {
        client.end().catch(() => { });
        throw error;
    }
    return client;
}
/** Close a client, whatever state it is in. @internal */
export function release(client) {
    if (client === undefined)
        return;
    client.removeAllListeners("notification");
    // A broken connection may emit more errors while it closes: nothing to tell.
    client.on("error", () => { });
    client.end().catch(() => { });
}
/** A promise that resolves after `ms` milliseconds, or at once when `signal` aborts. @internal */
export function sleep(ms, signal) {
    return new Promise((resolve) => {
        if (signal?.aborted)
            return resolve();
        const timer = setTimeout(done, ms);
        function done() {
            clearTimeout(timer);
            signal?.removeEventListener("abort", done);
            resolve();
        }
        signal?.addEventListener("abort", done, { once: true });
    });
}
/** The delay before reconnect attempt `failures` (1, 2, ...): exponential with jitter, at most `max` ms. @internal */
export function backoff(failures, max) {
    return Math.min(max, 100 * 2 ** (failures - 1)) * (0.5 + Math.random() / 2);
}
