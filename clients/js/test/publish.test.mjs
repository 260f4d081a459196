// publish(), publishOnce(), publishBatch() in the caller's transaction, and
// errors by SQLSTATE.
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  publish,
  publishOnce,
  publishBatch,
  StreamsError,
  InvalidArgumentError,
  IdempotencyConflictError,
  ExpectedVersionMismatchError,
  PermissionDeniedError,
  EventTooLargeError,
  NotFoundError,
  parseKeywordValue,
} from "../dist/index.js";
import { createDb } from "./support/db.mjs";

test("publish runs in the caller's transaction and never commits it", async (t) => {
  const db = await createDb(t);
  const c = db.client;
  await c.query("BEGIN");
  const p1 = await publish(c, "acct.1", { a: 1 }, { type: "opened", key: "k", headers: { src: "test" } });
  const [p2, p3] = await publishBatch(c, "acct.1", [{ a: 2 }, { a: 3 }]);
  assert.ok(p1 < p2 && p2 < p3);
  await c.query("ROLLBACK");
  assert.equal((await c.query("SELECT count(*)::int AS n FROM streams.event_log")).rows[0].n, 0, "rolled back with the caller");

  await c.query("BEGIN");
  const p = await publish(c, "acct.1", { a: 1 }, { type: "opened", key: "k", headers: { src: "test" } });
  assert.equal((await c.query("SELECT txid_status(txid_current()) AS s")).rows[0].s, "in progress", "still the caller's transaction");
  await c.query("COMMIT");
  await c.query("SELECT streams.wait($1)", [p]);
  const { rows } = await c.query("SELECT type, key, headers FROM streams.get($1)", [p]);
  assert.deepEqual(rows[0], { type: "opened", key: "k", headers: { src: "test" } });
});

test("idempotency keys and expected versions", async (t) => {
  const db = await createDb(t);
  const c = db.client;
  const first = await publishOnce(c, "acct.2", { n: 1 }, "key-1");
  assert.deepEqual(await publishOnce(c, "acct.2", { n: 1 }, "key-1"), { position: first.position, duplicate: true });
  assert.equal(first.duplicate, false);
  assert.equal(await publish(c, "acct.2", { n: 1 }, { idempotencyKey: "key-1" }), first.position);
  await assert.rejects(publishOnce(c, "acct.2", { n: 2 }, "key-1"), (e) => e instanceof IdempotencyConflictError && e.sqlstate === "23505");

  const head = first.position;
  const next = await publish(c, "acct.2", { n: 3 }, { expectedPrev: head });
  await assert.rejects(publish(c, "acct.2", { n: 4 }, { expectedPrev: head }), (e) => {
    assert.ok(e instanceof ExpectedVersionMismatchError && e instanceof StreamsError);
    assert.equal(e.sqlstate, "40001");
    assert.match(e.detail ?? "", new RegExp(String(next)));
    return true;
  });
  const batch = await publishBatch(c, "acct.3", [1, 2, 3], { expectedPrev: 0, idempotencyKey: "b" });
  assert.deepEqual(await publishBatch(c, "acct.3", [1, 2, 3], { expectedPrev: 0, idempotencyKey: "b" }), batch);
});

test("errors carry their SQLSTATE and class", async (t) => {
  const db = await createDb(t);
  const c = db.client;
  await assert.rejects(publish(c, "bad name!", {}), (e) => e instanceof InvalidArgumentError && e.sqlstate === "22023" && e.cause !== undefined);
  await assert.rejects(publish(c, "x", {}, { type: "" }), InvalidArgumentError);
  await c.query("CREATE ROLE lbs_js_nobody_" + db.name);
  await c.query("BEGIN");
  await c.query(`SET LOCAL ROLE lbs_js_nobody_${db.name}`);
  await assert.rejects(publish(c, "acct.9", {}), (e) => e instanceof PermissionDeniedError && e.sqlstate === "42501");
  await c.query("ROLLBACK");
  await c.query(`DROP ROLE lbs_js_nobody_${db.name}`);
  await c.query("SET litebase_streams.max_event_size = 100");
  await assert.rejects(publish(c, "acct.9", { big: "y".repeat(500) }), (e) => e instanceof EventTooLargeError && e.sqlstate === "54000");
  await c.query("RESET litebase_streams.max_event_size");
  const other = await c.query("SELECT streams.ack('nope', 1)").catch((e) => e);
  assert.equal(other.code, "42704");
  assert.ok(new NotFoundError("x") instanceof StreamsError);
  assert.equal(new NotFoundError("x").sqlstate, "42704");
});

test("libpq keyword/value connection strings", () => {
  assert.deepEqual(parseKeywordValue("host=127.0.0.1 port=5432 user=app dbname='my db' password='it\\'s'"), {
    host: "127.0.0.1",
    port: 5432,
    user: "app",
    database: "my db",
    password: "it's",
  });
  assert.throws(() => parseKeywordValue("host"), TypeError);
});
