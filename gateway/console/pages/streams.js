// #/streams: the charts, the streams the role may read (events, rate,
// positions, newest event) and a form to tail any pattern.

import * as api from "../api.js";
import { sampledCharts } from "../chart.js";
import { errorNotice, h, heading, replace, table, when } from "../dom.js";
import { count, position, rate } from "../format.js";
import { eventHref, streamHref } from "../router.js";
import * as sampler from "../sampler.js";

const REFRESH_MS = 2000;

export function render(main) {
  const charts = h("div", { class: "charts", id: "charts" });
  const list = h("div", { id: "streams-list", "aria-live": "polite" });
  const pattern = h("input", { id: "tail-pattern", name: "pattern", required: true, placeholder: "orders.*", autocomplete: "off" });
  const tailForm = h(
    "form",
    { class: "inline-form", id: "tail-form" },
    h("label", { for: "tail-pattern" }, "Tail a pattern"),
    pattern,
    h("button", { type: "submit", class: "button" }, "Open"),
  );
  tailForm.addEventListener("submit", (e) => {
    e.preventDefault();
    if (pattern.value.trim()) location.hash = streamHref(pattern.value.trim());
  });
  main.append(
    h("div", { class: "page-head" }, heading("Streams"), tailForm),
    charts,
    h("section", { "aria-labelledby": "streams-table-title" }, h("h2", { id: "streams-table-title" }, "Streams this role may read"), list),
  );

  const stopCharts = sampledCharts(charts, ["events", "lag", "subscriptionLag"]);

  // Pages of streams by name: `pages` holds the `after` of each page shown.
  const pages = [null];
  let stopped = false;
  let timer = null;
  async function load() {
    clearTimeout(timer);
    const after = pages[pages.length - 1];
    try {
      const answer = await api.streams(after, 100);
      if (stopped) return;
      replace(list, streamsTable(answer.streams), pager(answer.next));
    } catch (error) {
      if (stopped) return;
      replace(list, errorNotice(error));
    }
    if (!stopped) timer = setTimeout(load, REFRESH_MS);
  }
  function pager(next) {
    if (pages.length === 1 && !next) return null;
    return h(
      "div",
      { class: "pager" },
      pages.length > 1
        ? h("button", { type: "button", class: "button button-quiet", onclick: () => (pages.pop(), load()) }, "Previous page")
        : null,
      next ? h("button", { type: "button", class: "button button-quiet", id: "streams-next", onclick: () => (pages.push(next), load()) }, "Next page") : null,
    );
  }
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
    stopCharts();
  };
}

function streamsTable(streams) {
  return table(
    [
      { title: "Stream" },
      { title: "Events", class: "num" },
      { title: "Rate", class: "num" },
      { title: "First", class: "num mono" },
      { title: "Newest", class: "num mono" },
      { title: "Newest event" },
    ],
    streams.map((s) => [
      h("a", { href: streamHref(s.stream), class: "stream-name" }, s.stream),
      count(s.events),
      rate(sampler.rateOf(s.stream)),
      position(s.first_position),
      h("a", { href: eventHref(s.last_position) }, position(s.last_position)),
      when(s.last_time),
    ]),
    { caption: "Streams", empty: "No streams this role may read (or nothing published yet)." },
  );
}
