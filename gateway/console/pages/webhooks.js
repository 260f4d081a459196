// #/webhooks: the role's webhooks (streams.webhooks): state, last error,
// next retry, and pause/resume for their owners. Only the endpoint's host is
// shown: a webhook URL may carry a secret in its path or query.

import * as api from "../api.js";
import { badge, errorNotice, h, heading, notice, replace, table, whenRelative } from "../dom.js";
import { count, duration, position } from "../format.js";
import { streamHref } from "../router.js";

const REFRESH_MS = 5000;
const KINDS = { active: "ok", retrying: "warn", paused: "neutral", disabled: "error" };

export function render(main) {
  const list = h("div", { id: "webhooks-list" });
  const message = h("div", { id: "webhooks-message", "aria-live": "polite" });
  main.append(h("div", { class: "page-head" }, heading("Webhooks")), message, list);
  let stopped = false;
  let timer = null;

  async function load() {
    clearTimeout(timer);
    try {
      const answer = await api.webhooks();
      if (stopped) return;
      replace(list, webhooksTable(answer.webhooks));
    } catch (error) {
      if (stopped) return;
      replace(list, errorNotice(error));
    }
    if (!stopped) timer = setTimeout(load, REFRESH_MS);
  }

  function webhooksTable(webhooks) {
    return table(
      [
        { title: "Webhook" },
        { title: "Owner" },
        { title: "Stream" },
        { title: "Endpoint" },
        { title: "State" },
        { title: "" },
        { title: "Position", class: "num mono" },
        { title: "Pending", class: "num" },
        { title: "Failures", class: "num" },
        { title: "Next retry" },
        { title: "Last success" },
        { title: "Last error" },
      ],
      webhooks.map((w) => [
        h("span", { class: "mono" }, w.name),
        w.owner,
        h("a", { href: streamHref(w.stream), class: "mono" }, w.stream),
        h("span", { class: "mono" }, host(w.url)),
        badge(w.state, KINDS[w.state] ?? "neutral"),
        toggleButton(w),
        position(w.position),
        count(w.pending),
        count(w.attempts),
        w.next_retry_seconds !== null && w.next_retry_seconds !== undefined ? `in ${duration(w.next_retry_seconds)}` : "–",
        whenRelative(w.last_success_at),
        w.last_error ? h("span", { class: "error-text" }, `${w.last_status ? `${w.last_status}: ` : ""}${w.last_error}`) : "–",
      ]),
      { caption: "Webhooks", empty: "No webhooks this role sees.", rowAttributes: (i) => ({ "data-webhook": webhooks[i].name }) },
    );
  }

  function toggleButton(w) {
    const action = w.state === "paused" || w.state === "disabled" ? "resume" : "pause";
    const button = h("button", { type: "button", class: "button button-small", "data-action": action, "data-webhook": w.name }, action === "pause" ? "Pause" : "Resume");
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await api.setWebhook(w.owner, w.name, action);
        replace(message, notice(`${action === "pause" ? "Paused" : "Resumed"} ${w.name}.`, "ok"));
      } catch (error) {
        replace(message, errorNotice(error));
      }
      load();
    });
    return button;
  }

  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function host(url) {
  if (!url) return "–";
  try {
    return new URL(url).host;
  } catch {
    return "–";
  }
}
