// #/subscriptions: lag, pending, claims and dead letters of the
// subscriptions the role sees (streams.subscriptions), with retry and
// discard of a dead letter for those the database lets do it.

import * as api from "../api.js";
import { errorNotice, h, heading, notice, replace, table, when, whenRelative } from "../dom.js";
import { count, duration, position } from "../format.js";
import { eventHref, streamHref } from "../router.js";

const REFRESH_MS = 5000;

export function render(main) {
  const list = h("div", { id: "subscriptions-list" });
  const message = h("div", { id: "subscriptions-message", "aria-live": "polite" });
  const refresh = h("button", { type: "button", class: "button button-quiet", id: "subscriptions-refresh" }, "Refresh");
  main.append(h("div", { class: "page-head" }, heading("Subscriptions"), refresh), message, list);
  /// The dead-letter panels open, by "owner/name".
  const open = new Set();
  let stopped = false;
  let timer = null;

  async function load() {
    clearTimeout(timer);
    let answer;
    try {
      answer = await api.subscriptions();
    } catch (error) {
      if (!stopped) replace(list, errorNotice(error));
      return;
    }
    if (stopped) return;
    const subscriptions = answer.subscriptions;
    replace(list, subscriptionsTable(subscriptions));
    for (const s of subscriptions) {
      if (open.has(`${s.owner}/${s.name}`)) await showDeadLetters(s);
    }
    // Refreshing while a dead-letter panel is open would move the buttons
    // under the pointer: only the closed view refreshes itself.
    if (!stopped && open.size === 0) timer = setTimeout(load, REFRESH_MS);
  }

  function subscriptionsTable(subscriptions) {
    return table(
      [
        { title: "Subscription" },
        { title: "Owner" },
        { title: "Stream" },
        { title: "Position", class: "num mono" },
        { title: "Pending", class: "num" },
        { title: "Lag", class: "num" },
        { title: "Claimed", class: "num" },
        { title: "Claimed by" },
        { title: "Retrying", class: "num" },
        { title: "Last ack" },
        { title: "Dead letters" },
      ],
      subscriptions.map((s) => {
        const key = `${s.owner}/${s.name}`;
        return [
          h("span", { class: "mono" }, s.name),
          s.owner,
          h("a", { href: streamHref(s.stream), class: "mono" }, s.stream),
          position(s.position),
          count(s.pending),
          s.lag_seconds ? duration(s.lag_seconds) : "–",
          count(s.claimed),
          (s.claimed_by ?? []).length ? h("span", { class: "mono" }, s.claimed_by.map((pid) => `pid ${pid}`).join(", ")) : "–",
          count(s.retrying ?? 0),
          whenRelative(s.last_ack_at),
          h(
            "button",
            {
              type: "button",
              class: "button button-quiet button-small",
              "data-action": "dead-letters",
              "data-subscription": s.name,
              "aria-expanded": String(open.has(key)),
              "aria-controls": panelId(s),
              onclick: () => {
                if (open.has(key)) open.delete(key);
                else open.add(key);
                load();
              },
            },
            `${open.has(key) ? "Hide" : "Show"} (${count(s.parked ?? 0)})`,
          ),
        ];
      }),
      {
        caption: "Subscriptions",
        empty: "No subscriptions this role sees.",
        rowAttributes: (i) => ({ "data-subscription": subscriptions[i].name }),
      },
    );
  }

  async function showDeadLetters(s) {
    const panel = h("section", { class: "card dead-letters", id: panelId(s), "aria-label": `Dead letters of ${s.name}` }, h("h2", {}, "Dead letters of ", h("span", { class: "mono" }, s.name)));
    list.append(panel);
    let answer;
    try {
      answer = await api.deadLetters(s.owner, s.name);
    } catch (error) {
      panel.append(errorNotice(error));
      return;
    }
    panel.append(
      table(
        [
          { title: "Position", class: "num mono" },
          { title: "Stream" },
          { title: "Attempts", class: "num" },
          { title: "Last error" },
          { title: "Parked" },
          { title: "" },
        ],
        answer.dead_letters.map((d) => [
          h("a", { href: eventHref(d.position) }, position(d.position)),
          h("span", { class: "mono" }, d.stream ?? "–"),
          count(d.attempts),
          h("span", { class: "error-text" }, d.last_error ?? "–"),
          when(d.parked_at),
          h("span", { class: "actions" }, settleButton(s, d, "retry", "Retry"), settleButton(s, d, "discard", "Discard")),
        ]),
        { caption: `Dead letters of ${s.name}`, empty: "No dead letters.", rowAttributes: (i) => ({ class: "dead-letter", "data-position": String(answer.dead_letters[i].position) }) },
      ),
    );
  }

  function settleButton(s, d, action, label) {
    let armed = action === "retry"; // discard asks once more, in place
    const button = h("button", { type: "button", class: `button button-small${action === "discard" ? " button-danger" : ""}`, "data-action": action, "data-position": String(d.position) }, label);
    button.addEventListener("click", async () => {
      if (!armed) {
        armed = true;
        button.textContent = "Confirm discard";
        return;
      }
      button.disabled = true;
      try {
        const answer = await api.settleDeadLetter(s.owner, s.name, d.position, action);
        replace(message, notice(`${action === "retry" ? "Retried" : "Discarded"} position ${d.position} of ${s.name} (${answer.changed} changed).`, "ok"));
      } catch (error) {
        replace(message, errorNotice(error));
      }
      load();
    });
    return button;
  }

  refresh.addEventListener("click", load);
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

const panelId = (s) => `dead-letters-${encodeURIComponent(`${s.owner}/${s.name}`).replace(/[^A-Za-z0-9_-]/g, "_")}`;
