import { backoff, connect, release, sleep } from "./connection.js";
import { InvalidStateError, NotFoundError, StreamsError, isConnectionLost, translate } from "./errors.js";
import { EVENT_COLUMNS, eventOfRow } from "./events.js";
const POLL_SQL = `SELECT ${EVENT_COLUMNS}, e.attempt, e.lease_id::text AS lease_id
FROM streams.poll($1, max_events => $2, wait => $3::interval, lease => $4::interval) e`;
const MODE_SQL = "SELECT ordered, key FROM streams.subscriptions WHERE name = $1 LIMIT 1";
/** A duration in ms as a PostgreSQL interval. */
const interval = (ms) => `${Math.max(0, Math.round(ms))} milliseconds`;
/** The error's text as a nack reason (at most 1,000 bytes). */
function reasonOf(error) {
    const text = error instanceof Error ? error.message || error.name : String(error);
    let reason = text.slice(0, 1000);
    while (Buffer.byteLength(reason) > 1000)
        reason = reason.slice(0, -1);
    return reason;
}
/**
 * The event's key for a subscription ordered per `key` (`'$key'`,
 * `'$stream'` or a path into data); only compared for equality.
 */
function keyOf(event, key) {
    if (key === null)
        return "";
    if (key === "$key")
        return event.key ?? "";
    if (key === "$stream")
        return event.stream;
    let value = event.data;
    for (const part of key.replace(/^\$\./, "").split(".")) {
        value = typeof value === "object" && value !== null ? value[part] : undefined;
    }
    if (value === undefined || value === null)
        return "";
    return typeof value === "string" ? value : JSON.stringify(value);
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
export async function consume(config, subscription, handler, options = {}) {
    const stop = new AbortController();
    const onStop = () => stop.abort();
    options.signal?.addEventListener("abort", onStop, { once: true });
    if (options.signal?.aborted)
        stop.abort();
    const signals = options.handleSignals === false ? [] : ["SIGINT", "SIGTERM"];
    for (const s of signals)
        process.on(s, onStop);
    const maxEvents = options.maxEvents ?? 100;
    const wait = options.wait ?? 5000;
    let handled = 0;
    let failures = 0;
    let client;
    let mode;
    let lostError;
    try {
        while (!stop.signal.aborted) {
            try {
                if (client === undefined) {
                    lostError = undefined;
                    client = await connect(config);
                    const current = client;
                    // A client let go of after a loss may still fail later: not this session's loss.
                    current.on("error", (e) => {
                        if (current === client)
                            lostError ??= e;
                    });
                    const { rows } = await client.query(MODE_SQL, [subscription]);
                    if (rows[0] === undefined)
                        throw new NotFoundError(`subscription ${JSON.stringify(subscription)} does not exist`, { sqlstate: "42704" });
                    mode = { ordered: Boolean(rows[0].ordered), key: rows[0].key ?? null };
                }
                const c = client;
                handled +=
                    options.lease === undefined
                        ? await oneTransaction(c, subscription, handler, maxEvents, wait, mode, options)
                        : await oneLease(c, subscription, handler, maxEvents, wait, options.lease, options);
                failures = 0;
            }
            catch (raw) {
                const error = translate(raw);
                if (!isConnectionLost(error) && !(lostError !== undefined && !(error instanceof StreamsError)))
                    throw error;
                if (stop.signal.aborted)
                    break;
                failures += 1;
                const delay = backoff(failures, options.maxBackoff ?? 5000);
                options.onReconnect?.(error, delay);
                release(client);
                client = undefined;
                await sleep(delay, stop.signal);
            }
        }
    }
    finally {
        for (const s of signals)
            process.off(s, onStop);
        options.signal?.removeEventListener("abort", onStop);
        if (client !== undefined)
            await client.end().catch(() => { });
    }
    return handled;
}
/** Run the handler in a savepoint; the error it threw, or undefined. */
async function runHandler(handler, event, delivery) {
    const client = delivery.client;
    await client.query("SAVEPOINT litebase_streams_handler");
    try {
        await handler(event, delivery);
        await client.query("RELEASE SAVEPOINT litebase_streams_handler");
        return undefined;
    }
    catch (error) {
        if (isConnectionLost(error))
            throw error;
        await client.query("ROLLBACK TO SAVEPOINT litebase_streams_handler");
        return { error };
    }
}
async function oneTransaction(client, subscription, handler, maxEvents, wait, mode, options) {
    let handled = 0;
    await client.query("BEGIN");
    try {
        const { rows } = await client.query(POLL_SQL, [subscription, maxEvents, interval(wait), null]);
        if (rows.length === 0) {
            await client.query("COMMIT");
            return 0;
        }
        const failedKeys = new Set();
        let stopped = false;
        for (const row of rows) {
            const event = eventOfRow(row);
            const key = keyOf(event, mode.key);
            if (stopped || failedKeys.has(key))
                continue; // after a failure in its sequence: it comes again, untried
            const delivery = { client, subscription, attempt: row.attempt, leaseId: null };
            const failed = await runHandler(handler, event, delivery);
            if (failed === undefined) {
                handled += 1;
                continue;
            }
            await client.query("SELECT streams.nack($1, $2::bigint, reason => $3)", [
                subscription,
                String(event.position),
                reasonOf(failed.error),
            ]);
            options.onHandlerError?.(failed.error, event, delivery);
            if (mode.key !== null)
                failedKeys.add(key);
            else if (mode.ordered)
                stopped = true;
        }
        // The ack stops before a nacked event where order requires it.
        await client.query("SELECT streams.ack($1, $2::bigint)", [subscription, rows[rows.length - 1].position]);
        await client.query("COMMIT");
    }
    catch (error) {
        if (!isConnectionLost(error))
            await client.query("ROLLBACK").catch(() => { });
        throw error;
    }
    return handled;
}
async function oneLease(client, subscription, handler, maxEvents, wait, lease, options) {
    const { rows } = await client.query(POLL_SQL, [subscription, maxEvents, interval(wait), interval(lease)]);
    let renewed = Date.now();
    let handled = 0;
    for (const row of rows) {
        const event = eventOfRow(row);
        const leaseId = row.lease_id;
        if (Date.now() - renewed > lease / 2) {
            await client.query("SELECT streams.extend_lease($1, $2::bigint, $3::interval)", [subscription, leaseId, interval(lease)]);
            renewed = Date.now();
        }
        const delivery = { client, subscription, attempt: row.attempt, leaseId };
        await client.query("BEGIN");
        let failure;
        try {
            await handler(event, delivery);
        }
        catch (error) {
            if (isConnectionLost(error))
                throw error;
            failure = { error };
        }
        if (failure === undefined) {
            try {
                await client.query("SELECT streams.ack($1, $2::bigint, $3::bigint)", [subscription, String(event.position), leaseId]);
                await client.query("COMMIT");
                handled += 1;
                continue;
            }
            catch (raw) {
                const error = translate(raw);
                if (isConnectionLost(error))
                    throw error;
                await client.query("ROLLBACK");
                if (error instanceof InvalidStateError)
                    break; // the lease is over: its events come again
                throw error;
            }
        }
        await client.query("ROLLBACK");
        // Ends the lease: its events not acked yet come again.
        await client.query("SELECT streams.nack($1, $2::bigint, reason => $3, lease => $4::bigint)", [
            subscription,
            String(event.position),
            reasonOf(failure.error),
            leaseId,
        ]);
        options.onHandlerError?.(failure.error, event, delivery);
        break;
    }
    return handled;
}
