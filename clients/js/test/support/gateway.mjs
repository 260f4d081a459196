// The gateway as the browser tests use it: a process against the test's
// database, logged in as a role of its own that is only a member of the role
// it serves (as tests/common/gateway.rs sets it up), with the tests' JWT secret.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";

import { jwt, waitUntil } from "./db.mjs";
import { freePort } from "./pgbouncer.mjs";

export const SECRET = "gateway-test-secret";
const ROOT = new URL("../../../../", import.meta.url).pathname;
export const BINARY = process.env.LITEBASE_STREAMS_GATEWAY_BIN ?? `${ROOT}target/gateway/litebase-streams-gateway`;

/** Roles `<db>_gw` (the gateway's login) and `<db>_reader` (reads and publishes pay.*); dropped at the end. */
export async function gatewayRoles(t, db) {
  const gw = `${db.name}_gw`;
  const reader = `${db.name}_reader`;
  await db.query(`CREATE ROLE ${gw} LOGIN NOINHERIT; CREATE ROLE ${reader} NOLOGIN; GRANT ${reader} TO ${gw}`);
  await db.query(`SELECT streams.grant('read', 'pay.*', '${reader}'); SELECT streams.grant('publish', 'pay.*', '${reader}')`);
  t.after(async () => {
    await db.drop();
    const { default: pg } = await import("pg");
    const { BASE } = await import("./db.mjs");
    const admin = new pg.Client({ ...BASE });
    await admin.connect();
    await admin.query(`DROP ROLE IF EXISTS ${gw}; DROP ROLE IF EXISTS ${reader}`).catch(() => {});
    await admin.end();
  });
  return { gw, reader };
}

/** A token for `role` that expires in `seconds`. */
export function token(role, seconds = 3600) {
  return jwt({ role, exp: Math.floor(Date.now() / 1000) + seconds }, SECRET);
}

/** A running gateway; `restart()` stops it and starts it again on the same port. */
export async function startGateway(t, db, login) {
  if (!existsSync(BINARY)) throw new Error(`no gateway binary at ${BINARY} (cargo build --profile gateway -p litebase-streams-gateway --bins)`);
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  let child;
  let log = "";
  const start = async () => {
    child = spawn(
      BINARY,
      ["--listen", `127.0.0.1:${port}`, "--database-url", `host=${db.config.host} port=${db.config.port} user=${login} dbname=${db.name}`,
        "--allow-origin", "*", "--poll-interval-ms", "200"],
      { env: { ...process.env, LITEBASE_GATEWAY_JWT_SECRET: SECRET }, stdio: ["ignore", "ignore", "pipe"] },
    );
    child.stderr.on("data", (d) => (log = (log + d).slice(-20000)));
    const exited = new Promise((resolve) => child.on("exit", resolve));
    child.exited = exited;
    await waitUntil(async () => {
      try {
        const r = await fetch(`${url}/healthz`);
        return r.status === 200 || r.status === 503;
      } catch {
        return false;
      }
    }, { what: "the gateway to answer" });
  };
  const stop = async () => {
    child.kill("SIGKILL");
    await child.exited;
  };
  await start();
  t.after(stop);
  return { url, port, log: () => log, restart: async () => (await stop(), await start()) };
}
