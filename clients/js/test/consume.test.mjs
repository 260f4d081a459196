// consume(): every event's effect exactly once, with concurrent consumers
// behind PgBouncer's transaction pooling, injected handler failures and a
// consumer killed with SIGKILL; nack reasons; errors of the calls themselves.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

import { consume, NotFoundError, publishBatch } from "../dist/index.js";
import { createDb, waitUntil } from "./support/db.mjs";
import { startPgbouncer } from "./support/pgbouncer.mjs";

const CHILD = fileURLToPath(new URL("./support/consumer.mjs", import.meta.url));
const N = 400;

test("three consumers through PgBouncer, 10% failures, one SIGKILLed: each effect exactly once", async (t) => {
  const db = await createDb(t);
  const bouncer = await startPgbouncer(t);
  await db.query("CREATE TABLE effects (position bigint NOT NULL, consumer text, attempt int)");
  await db.query("SELECT streams.create_subscription('jobs', 'job.*', after => 0, ordered => false, backoff_min => '10 ms', backoff_max => '50 ms')");
  for (let i = 0; i < N; i += 100) {
    await publishBatch(db.client, `job.q${i % 3}`, Array.from({ length: 100 }, (_, k) => ({ n: i + k })));
  }
  const children = ["a", "b", "c"].map((name) => {
    const child = spawn(process.execPath, [CHILD, bouncer.dsn(db.name), "jobs", name], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal, out })));
    t.after(() => child.kill("SIGKILL"));
    return { name, child, exited };
  });
  const count = async () => (await db.query("SELECT count(DISTINCT position)::int AS n FROM effects")).rows[0].n;
  await waitUntil(async () => (await count()) >= N / 4, { what: "a quarter of the events handled" });
  children[0].child.kill("SIGKILL");
  const killed = await children[0].exited;
  assert.equal(killed.signal, "SIGKILL");
  await waitUntil(async () => (await count()) === N, { timeout: 60000, what: "every event handled" });
  await waitUntil(
    async () => (await db.query("SELECT pending, claimed FROM streams.subscriptions WHERE name = 'jobs'")).rows[0].pending == 0,
    { what: "the subscription to be drained" },
  );
  for (const c of children.slice(1)) c.child.kill("SIGTERM");
  const results = await Promise.all(children.slice(1).map((c) => c.exited));
  for (const r of results) assert.equal(r.code, 0, `a consumer stopped on SIGTERM: ${JSON.stringify(r)}`);
  const stats = results.map((r) => JSON.parse(r.out));
  assert.ok(stats.every((s) => s.handled > 0), `both survivors worked: ${JSON.stringify(stats)}`);
  assert.ok(stats.some((s) => s.failed > 0), "failures were injected");

  const { rows } = await db.query("SELECT position, count(*)::int AS n FROM effects GROUP BY position HAVING count(*) <> 1");
  assert.deepEqual(rows, [], "no effect twice");
  const { rows: all } = await db.query(
    "SELECT count(*)::int AS n FROM effects f JOIN streams.events e USING (position) WHERE e.stream LIKE 'job.%'",
  );
  assert.equal(all[0].n, N);
  // A failed attempt left no effect, but its nack reason is on record.
  const retried = await db.query("SELECT count(*)::int AS n FROM effects WHERE attempt > 1");
  assert.ok(retried.rows[0].n > 0, "some events were handled on a later attempt");
});

test("a handler error nacks with its message; the event comes again; stop by AbortSignal", async (t) => {
  const db = await createDb(t);
  await db.query("CREATE TABLE done (position bigint, attempt int)");
  await db.query("SELECT streams.create_subscription('once', 'w', after => 0, max_attempts => 2, backoff_min => '10 ms', backoff_max => '10 ms')");
  await db.publish("w", { fail: true });
  await db.publish("w", { fail: false });
  await db.publish("w", { fail: "always" });
  const stop = new AbortController();
  const errors = [];
  const handled = consume(
    db.dsn,
    "once",
    async (event, { client, attempt }) => {
      await client.query("INSERT INTO done VALUES ($1, $2)", [event.position, attempt]);
      if (event.data.fail === "always") throw new Error(`boom: always (${attempt})`);
      if (event.data.fail && attempt === 1) throw new Error("boom: first attempt");
    },
    { wait: 200, signal: stop.signal, handleSignals: false, onHandlerError: (e) => errors.push(e.message) },
  );
  await waitUntil(async () => (await db.query("SELECT count(*)::int AS n FROM streams.dead_letters")).rows[0].n === 1, {
    what: "the always failing event parked",
  });
  stop.abort();
  assert.equal(await handled, 2);
  assert.deepEqual(errors, ["boom: first attempt", "boom: always (1)", "boom: always (2)"]);
  const parked = await db.query("SELECT first_error, last_error FROM streams.dead_letters");
  assert.deepEqual(parked.rows, [{ first_error: "boom: always (1)", last_error: "boom: always (2)" }]);
  const { rows } = await db.query("SELECT attempt FROM done ORDER BY position");
  assert.deepEqual(rows.map((r) => r.attempt), [2, 1], "the failed attempt's insert rolled back; ordered: the second waited");

  await assert.rejects(consume(db.dsn, "nope", () => {}, { handleSignals: false }), NotFoundError);
});

test("a lease: each event commits on its own; a failure nacks with the lease", async (t) => {
  const db = await createDb(t);
  await db.query("CREATE TABLE done (position bigint, attempt int)");
  await db.query("SELECT streams.create_subscription('long', 'l', after => 0, backoff_min => '10 ms', backoff_max => '10 ms')");
  for (let i = 0; i < 5; i++) await db.publish("l", { i });
  const stop = new AbortController();
  let failedOnce = false;
  const handled = consume(
    db.dsn,
    "long",
    async (event, { client, attempt, leaseId }) => {
      assert.ok(leaseId !== null);
      await client.query("INSERT INTO done VALUES ($1, $2)", [event.position, attempt]);
      if (event.data.i === 2 && !failedOnce) {
        failedOnce = true;
        throw new Error("lease failure");
      }
    },
    { wait: 200, lease: 10000, signal: stop.signal, handleSignals: false },
  );
  await waitUntil(async () => (await db.query("SELECT count(*)::int AS n FROM done")).rows[0].n === 5, { what: "five handled" });
  stop.abort();
  assert.equal(await handled, 5);
  const { rows } = await db.query("SELECT position, count(*)::int AS n FROM done GROUP BY 1 HAVING count(*) > 1");
  assert.deepEqual(rows, []);
});
