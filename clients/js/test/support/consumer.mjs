// A consumer process for consume.test.mjs: consume(<dsn>, <subscription>)
// through PgBouncer; each event inserts its effect row in the handler's
// transaction, and about one handler call in ten fails (after the insert,
// which the failure must roll back). Stops on SIGTERM.
import { consume } from "../../dist/index.js";

const [dsn, subscription, name] = process.argv.slice(2);
let failed = 0;
const handled = await consume(
  dsn,
  subscription,
  async (event, { client, attempt }) => {
    await client.query("INSERT INTO effects (position, consumer, attempt) VALUES ($1, $2, $3)", [event.position, name, attempt]);
    if (Math.random() < 0.1) {
      failed += 1;
      throw new Error(`injected failure ${failed} at ${event.position}`);
    }
  },
  { maxEvents: 10, wait: 500, maxBackoff: 500 },
);
console.log(JSON.stringify({ name, handled, failed }));
