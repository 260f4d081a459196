// Checks that the committed dist/ is exactly what `npm run build` makes of
// src/ now: users install the package without a build step, so a stale
// dist/ would ship code nobody tested. Exit 1 with the differing files.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const fresh = mkdtempSync(join(tmpdir(), "litebase-streams-dist-"));
try {
  execFileSync(process.execPath, [join(root, "node_modules/typescript/bin/tsc"), "-p", join(root, "tsconfig.json"), "--outDir", fresh], {
    stdio: "inherit",
  });
  const files = (dir) => (existsSync(dir) ? readdirSync(dir, { recursive: true }).filter((f) => /\.(js|d\.ts)$/.test(f)).sort() : []);
  const want = files(fresh);
  const have = files(join(root, "dist"));
  const differ = [...new Set([...want, ...have])].filter(
    (f) => !want.includes(f) || !have.includes(f) || readFileSync(join(fresh, f), "utf8") !== readFileSync(join(root, "dist", f), "utf8"),
  );
  if (differ.length > 0) {
    console.error(`dist/ does not match a fresh build of src/ (run npm run build): ${differ.join(", ")}`);
    process.exit(1);
  }
  console.log(`dist/ matches a fresh build (${want.length} files)`);
} finally {
  rmSync(fresh, { recursive: true, force: true });
}
