// #/worker: the database's worker (state, positions, notifications) and
// what holds the horizon back, from streams.status; the lag chart.

import * as api from "../api.js";
import { sampledCharts } from "../chart.js";
import { badge, errorNotice, h, heading, notice, replace } from "../dom.js";
import { absolute, count, duration, intervalSeconds, position } from "../format.js";

const REFRESH_MS = 2000;

export function render(main) {
  const body = h("div", { id: "worker-body" }, h("p", { class: "muted" }, "Loading…"));
  const charts = h("div", { class: "charts charts-two" });
  main.append(h("div", { class: "page-head" }, heading("Worker")), body, charts);
  const stopCharts = sampledCharts(charts, ["lag", "subscriptionLag"]);
  let stopped = false;
  let timer = null;
  async function load() {
    try {
      const answer = await api.overview();
      if (stopped) return;
      replace(body, ...overview(answer));
    } catch (error) {
      if (stopped) return;
      replace(body, errorNotice(error));
    }
    if (!stopped) timer = setTimeout(load, REFRESH_MS);
  }
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
    stopCharts();
  };
}

function overview(answer) {
  const horizon = [h("dt", {}, "Horizon"), h("dd", { class: "mono", id: "worker-horizon" }, position(answer.horizon))];
  if (!answer.status) {
    return [
      h("section", { class: "card" }, h("h2", {}, "Log"), h("dl", { class: "facts" }, horizon)),
      notice(answer.status_error ?? "streams.status is not readable by this role.", "warn"),
    ];
  }
  const s = answer.status;
  const running = s.worker_pid !== null && s.worker_pid !== undefined;
  const worker = h(
    "dl",
    { class: "facts" },
    h("dt", {}, "Worker"),
    h("dd", { id: "worker-running" }, running ? badge("running", "ok") : badge("not running", "error"), running ? h("span", { class: "muted" }, ` pid ${s.worker_pid}`) : null),
    h("dt", {}, "State"),
    h("dd", { id: "worker-state" }, s.worker_state ?? "–"),
    h("dt", {}, "Notifications"),
    h("dd", {}, s.notify_state === "ok" || !s.notify_state ? (s.notify_state ?? "–") : badge(s.notify_state, "warn")),
    h("dt", {}, "Rounds"),
    h("dd", { class: "mono" }, count(s.rounds)),
    h("dt", {}, "Log id"),
    h("dd", { class: "mono" }, s.log_id ?? "–"),
  );
  const positions = h(
    "dl",
    { class: "facts" },
    horizon,
    h("dt", {}, "Newest position"),
    h("dd", { class: "mono" }, position(s.newest_position)),
    h("dt", {}, "Horizon lag"),
    h("dd", { class: "mono" }, count(Math.max(0, Number(s.newest_position) - Number(s.horizon ?? answer.horizon)))),
    h("dt", {}, "Delivered position"),
    h("dd", { class: "mono" }, position(s.delivered_position)),
    h("dt", {}, "Delivery lag"),
    h("dd", { class: "mono" }, count(s.lag_positions)),
  );
  const age = s.holder_age_seconds ?? intervalSeconds(s.holder_age);
  const holder = s.holder_pid
    ? h(
        "dl",
        { class: "facts", id: "worker-holder" },
        h("dt", {}, "Backend pid"),
        h("dd", { class: "mono" }, String(s.holder_pid)),
        h("dt", {}, "Transaction"),
        h("dd", { class: "mono" }, String(s.holder_xid ?? "–")),
        h("dt", {}, "Its position"),
        h("dd", { class: "mono" }, position(s.holder_position)),
        h("dt", {}, "Open for"),
        h("dd", {}, duration(age)),
        s.holder_waits_for ? [h("dt", {}, "Waits for"), h("dd", {}, String(s.holder_waits_for))] : null,
      )
    : h("p", { class: "muted", id: "worker-holder" }, "Nothing: no open transaction holds the horizon back.");
  return [
    h(
      "div",
      { class: "cards" },
      h("section", { class: "card" }, h("h2", {}, "Worker"), worker),
      h("section", { class: "card" }, h("h2", {}, "Positions"), positions),
      h("section", { class: "card" }, h("h2", {}, "What holds the horizon"), holder),
    ),
    h("p", { class: "muted small" }, `As of ${absolute(answer.time)}`),
  ];
}
