// @litebase/streams/browser in headless Chromium: a page served by a tiny
// HTTP server imports dist/browser.js (no bundler) and follows a pattern
// through a real gateway, over SSE and WebSocket, across a gateway restart
// and expiring tokens: every event exactly once, in order.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { readFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

import { createDb, waitUntil } from "./support/db.mjs";
import { gatewayRoles, startGateway, token } from "./support/gateway.mjs";

const BROWSER_JS = new URL("../dist/browser.js", import.meta.url);
const PAGE = `<!doctype html><meta charset="utf-8"><title>litebase streams</title>
<script type="module">
import { subscribeGateway } from "/browser.js";
window.received = [];
window.errors = [];
window.start = (gateway, pattern, transport) => {
  window.sub = subscribeGateway(gateway, pattern, {
    transport,
    token: () => window.fetchToken(),
    onEvent: (event) => window.received.push(event),
    onError: (error) => window.errors.push(error.message),
    maxBackoff: 500,
  });
};
window.ready = true;
</script>`;

async function servePage(t) {
  const server = createServer((req, res) => {
    if (req.url === "/browser.js") {
      res.writeHead(200, { "content-type": "text/javascript" });
      res.end(readFileSync(BROWSER_JS));
    } else {
      res.writeHead(200, { "content-type": "text/html" });
      res.end(PAGE);
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => server.close());
  return `http://127.0.0.1:${server.address().port}/`;
}

async function openBrowser(t) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  t.after(() => browser.close());
  return browser;
}

/** A page subscribed to `pay.*` through the gateway; tokens from `tokenFor()`. */
async function subscribedPage(t, browser, pageUrl, gatewayUrl, transport, tokenFor) {
  const page = await browser.newPage();
  let issued = 0;
  await page.exposeFunction("fetchToken", () => (issued++, tokenFor()));
  await page.goto(pageUrl);
  await page.waitForFunction(() => window.ready === true);
  await page.evaluate(([g, tr]) => window.start(g, "pay.*", tr), [gatewayUrl, transport]);
  return {
    page,
    issued: () => issued,
    received: () => page.evaluate(() => window.received),
    async waitFor(n, what) {
      await waitUntil(async () => (await page.evaluate(() => window.received.length)) >= n, {
        timeout: 30000,
        what: `${n} events in the page (${what})`,
      });
    },
  };
}

async function publishSome(db, from, n) {
  const positions = [];
  for (let i = from; i < from + n; i++) positions.push(await db.publish(i % 2 ? "pay.eu" : "pay.us", { i }));
  return positions;
}

function assertExactlyOnceInOrder(received, published) {
  assert.deepEqual(received.map((e) => e.position), published);
  assert.deepEqual(received.map((e) => e.data.i), [...published.keys()]);
  for (const e of received) {
    assert.match(e.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
    assert.equal(typeof e.tx, "number");
  }
}

for (const transport of ["sse", "websocket"]) {
  test(`${transport}: every event once, in order, across a gateway restart`, async (t) => {
    const db = await createDb();
    const { gw, reader } = await gatewayRoles(t, db);
    const gateway = await startGateway(t, db, gw);
    const browser = await openBrowser(t);
    const pageUrl = await servePage(t);
    const published = await publishSome(db, 0, 5);
    const sub = await subscribedPage(t, browser, pageUrl, gateway.url, transport, () => token(reader));
    await sub.waitFor(5, "catch-up");
    published.push(...(await publishSome(db, 5, 5)));
    await sub.waitFor(10, "live");
    await gateway.restart();
    published.push(...(await publishSome(db, 10, 5)));
    await sub.waitFor(15, "after the gateway restart");
    assert.ok(sub.issued() >= 2, "it reconnected with a token from the provider");
    published.push(...(await publishSome(db, 15, 2)));
    await sub.waitFor(17, "live again");
    assertExactlyOnceInOrder(await sub.received(), published);
  });

  test(`${transport}: a token that expires is replaced by a fresh one and delivery continues`, async (t) => {
    const db = await createDb();
    const { gw, reader } = await gatewayRoles(t, db);
    const gateway = await startGateway(t, db, gw);
    const browser = await openBrowser(t);
    const pageUrl = await servePage(t);
    const published = await publishSome(db, 0, 3);
    // Each token lives 1 s (the gateway adds 5 s of leeway before it ends the stream).
    const sub = await subscribedPage(t, browser, pageUrl, gateway.url, transport, () => token(reader, 1));
    await sub.waitFor(3, "catch-up");
    // Past the first token's exp and the gateway's 5 s of leeway: that token opens nothing now.
    const firstExpired = Date.now() + 1000 + 6000;
    await waitUntil(() => Date.now() > firstExpired, { timeout: 10000, what: "the first token to be past its leeway" });
    assert.ok((await sub.page.evaluate(() => window.sub.connections)) >= 2, "the expired connection was replaced");
    published.push(...(await publishSome(db, 3, 3)));
    await sub.waitFor(6, "after the token was renewed");
    assert.ok(sub.issued() >= 2, "each connection asked the provider for a token");
    assertExactlyOnceInOrder(await sub.received(), published);
  });
}
