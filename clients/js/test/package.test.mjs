// The package as a user installs it: `npm pack`, then `npm install` of the
// tarball into a new project, with no build step there; both entry points
// import, and their type declarations check under strict TypeScript.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const npm = (args, cwd) => execFileSync("npm", args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });

test("npm install of the packed package works without a build step, types included", (t) => {
  const dir = mkdtempSync(join(tmpdir(), "litebase-streams-user-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  npm(["pack", "--pack-destination", dir], ROOT);
  const tarball = readdirSync(dir).find((f) => f.endsWith(".tgz"));
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "user", private: true, type: "module" }));
  npm(["install", "--prefer-offline", "--no-audit", "--no-fund", `./${tarball}`, "@types/pg"], dir);
  writeFileSync(
    join(dir, "use.mjs"),
    `import { subscribe, consume, publish, publishOnce, publishBatch, LogChangedError, StreamsError } from "@litebase/streams";
import { subscribeGateway } from "@litebase/streams/browser";
console.log([subscribe, consume, publish, publishOnce, publishBatch, subscribeGateway].map((f) => typeof f).join(), new LogChangedError("a", "b") instanceof StreamsError);`,
  );
  assert.equal(execFileSync(process.execPath, ["use.mjs"], { cwd: dir, encoding: "utf8" }).trim(), "function,function,function,function,function,function true");
  writeFileSync(
    join(dir, "use.ts"),
    `import pg from "pg";
import { subscribe, publish, type Event, type Cursor, ExpectedVersionMismatchError } from "@litebase/streams";
import { subscribeGateway, type GatewaySubscription } from "@litebase/streams/browser";
export async function run(client: pg.Client): Promise<Cursor> {
  const position: number = await publish(client, "a", { x: 1 }, { type: "t", expectedPrev: 0 });
  const sub = subscribe("postgres://localhost/app", "a.*", { after: { logId: null, position } });
  for await (const event of sub) { const e: Event = event; if (e.time.endsWith("Z")) break; }
  const g: GatewaySubscription = subscribeGateway("http://x", "a.*", { onEvent: (e: Event) => void e.data });
  g.close();
  try { await publish(client, "a", 1); } catch (e) { if (e instanceof ExpectedVersionMismatchError) return sub.cursor; }
  return sub.cursor;
}`,
  );
  execFileSync(
    process.execPath,
    [join(ROOT, "node_modules/typescript/bin/tsc"), "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext",
      "--target", "es2022", "--lib", "es2022,dom", "--types", "node", "--typeRoots", join(ROOT, "node_modules/@types"), "use.ts"],
    { cwd: dir, encoding: "utf8" },
  );
});
