// A PgBouncer of the test's own (transaction pooling), from the project's
// scripts/pgbouncer.sh ini, run as the cluster's OS user when we are root.
import { spawn, execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync, chmodSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import pg from "pg";

import { BASE, SCRATCH, waitUntil } from "./db.mjs";

const ROOT = new URL("../../../../", import.meta.url).pathname;

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on("error", reject);
  });
}

export async function startPgbouncer(t) {
  const port = await freePort();
  const dir = join(SCRATCH, `pgbouncer-js-${port}`);
  mkdirSync(dir, { recursive: true });
  chmodSync(dir, 0o777);
  const ini = execFileSync("bash", [join(ROOT, "scripts/pgbouncer.sh"), "ini"], {
    env: { ...process.env, PGBOUNCER_DIR: dir, PGBOUNCER_PORT: String(port), PGBOUNCER_TARGET_HOST: BASE.host, PGPORT: String(BASE.port) },
  });
  const iniPath = join(dir, "pgbouncer.ini");
  writeFileSync(iniPath, ini);
  chmodSync(iniPath, 0o644);
  const runas = process.env.LITEBASE_STREAMS_RUNAS ?? (process.getuid?.() === 0 ? "postgres" : "");
  const [cmd, args] = runas ? ["runuser", ["-u", runas, "--", "pgbouncer", iniPath]] : ["pgbouncer", [iniPath]];
  const child = spawn(cmd, args, { stdio: "ignore" });
  t.after(() => child.kill("SIGTERM"));
  await waitUntil(async () => {
    const c = new pg.Client({ host: "127.0.0.1", port, user: "postgres", database: "postgres" });
    c.on("error", () => {});
    try {
      await c.connect();
      await c.query("SELECT 1");
      return true;
    } catch {
      return false;
    } finally {
      c.end().catch(() => {});
    }
  }, { what: "pgbouncer to accept connections" });
  return { port, dsn: (db) => `host=127.0.0.1 port=${port} user=postgres dbname=${db}` };
}
