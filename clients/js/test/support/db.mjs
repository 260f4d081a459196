// Test support: a database of its own per test (CREATE DATABASE, CREATE
// EXTENSION; dropped at the end), connection settings from the harness's
// environment, and the one wait helper.
import { randomBytes, createHmac } from "node:crypto";
import pg from "pg";

import { parseKeywordValue } from "../../dist/index.js";

export const DSN = process.env.LITEBASE_STREAMS_DSN ?? "host=127.0.0.1 port=54329 user=postgres dbname=postgres";
export const BASE = parseKeywordValue(DSN);
export const SCRATCH = process.env.LITEBASE_STREAMS_SCRATCH_DIR ?? "/tmp/litebase_streams-scratch-54329";
if (process.env.LITEBASE_STREAMS_PGHOST) BASE.host = process.env.LITEBASE_STREAMS_PGHOST;
if (process.env.LITEBASE_STREAMS_PGPORT) BASE.port = Number(process.env.LITEBASE_STREAMS_PGPORT);

/** Waits until `check()` returns a truthy value (returned), or fails after `timeout` ms. */
export async function waitUntil(check, { timeout = 20000, what = "the condition" } = {}) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** A fresh database with the extension; `await db.drop()` at the end. */
export async function createDb(t) {
  const name = `lbs_js_${randomBytes(5).toString("hex")}`;
  const admin = new pg.Client({ ...BASE, database: BASE.database ?? "postgres" });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const config = { ...BASE, database: name };
  const client = new pg.Client(config);
  client.on("error", () => {});
  await client.connect();
  await client.query("CREATE EXTENSION litebase_streams");
  const db = {
    name,
    config,
    client,
    /** A connection string for this database. */
    dsn: `host=${config.host} port=${config.port} user=${config.user ?? "postgres"} dbname=${name}`,
    query: (text, values) => client.query(text, values),
    /** Publish one event per transaction; its position. */
    async publish(stream, data, extra = "") {
      const { rows } = await client.query(`SELECT streams.publish($1, $2::jsonb${extra})::int AS p`, [stream, JSON.stringify(data)]);
      return rows[0].p;
    },
    async workerPid() {
      return waitUntil(async () => (await client.query("SELECT streams.worker_pid() AS p")).rows[0].p, { what: "a worker" });
    },
    /** Terminate the worker and wait for its successor. */
    async restartWorker() {
      const old = await db.workerPid();
      await client.query("SELECT pg_terminate_backend($1)", [old]);
      await waitUntil(async () => {
        const p = (await client.query("SELECT streams.worker_pid() AS p")).rows[0].p;
        return p !== null && p !== old;
      }, { what: "the worker to restart" });
    },
    /** Terminate every backend of this database with this application_name. */
    async cut(applicationName) {
      const { rows } = await client.query(
        "SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
        [name, applicationName],
      );
      return rows[0].n;
    },
    async drop() {
      await client.end().catch(() => {});
      const a = new pg.Client({ ...BASE, database: BASE.database ?? "postgres" });
      await a.connect();
      await a.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await a.end();
    },
  };
  if (t) t.after(() => db.drop());
  return db;
}

/** Iterate `sub` in the background into `events`; `done` settles when the iteration ends. */
export function collect(sub) {
  const events = [];
  const done = (async () => {
    for await (const event of sub) events.push(event);
  })();
  done.catch(() => {});
  return { events, done };
}

/** An HS256 JWT. */
export function jwt(claims, secret) {
  const b64 = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");
  const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64(claims)}`;
  return `${body}.${createHmac("sha256", secret).update(body).digest("base64url")}`;
}

/** Positions strictly increasing and without repeats. */
export function positions(events) {
  return events.map((e) => e.position);
}
