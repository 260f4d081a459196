// #/events/<position>: one event's envelope, its data pretty-printed, and
// the other events of its transaction that the role may read.

import * as api from "../api.js";
import { errorNotice, h, heading, table, when } from "../dom.js";
import { position, preview } from "../format.js";
import { eventHref, streamHref } from "../router.js";

export function render(main, route) {
  const body = h("div", { id: "event-body" }, h("p", { class: "muted" }, "Loading…"));
  main.append(
    h("p", { class: "breadcrumb" }, h("a", { href: "#/streams" }, "Streams"), " / event"),
    heading("Event ", h("span", { class: "mono" }, route.position)),
    body,
  );
  let stopped = false;
  api.event(route.position).then(
    (answer) => {
      if (!stopped) body.replaceChildren(...detail(answer.event, answer.transaction ?? []));
    },
    (error) => {
      if (stopped) return;
      body.replaceChildren(
        error.status === 404 ? h("p", { class: "notice notice-error", role: "alert" }, `No event at position ${route.position} that this role may read.`) : errorNotice(error),
      );
    },
  );
  return () => {
    stopped = true;
  };
}

function detail(event, transaction) {
  const envelope = [
    ["Position", h("span", { class: "mono" }, position(event.position))],
    ["Stream", h("a", { href: streamHref(event.stream), class: "mono" }, event.stream)],
    ["Time", when(event.time)],
    ["Transaction", h("span", { class: "mono" }, String(event.tx ?? "–"))],
  ];
  if (event.type !== undefined) envelope.push(["Type", event.type ?? "–"]);
  if (event.key !== undefined) envelope.push(["Key", h("span", { class: "mono" }, event.key ?? "–")]);
  const facts = h("dl", { class: "facts" }, envelope.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  const parts = [h("section", { class: "card" }, h("h2", {}, "Envelope"), facts)];
  if (event.headers && Object.keys(event.headers).length > 0) {
    parts.push(h("section", { class: "card" }, h("h2", {}, "Headers"), h("pre", { class: "json" }, JSON.stringify(event.headers, null, 2))));
  }
  // textContent of a <pre>: the data is shown, never interpreted.
  parts.push(h("section", { class: "card" }, h("h2", {}, "Data"), h("pre", { class: "json", id: "event-data" }, JSON.stringify(event.data, null, 2))));
  parts.push(
    h(
      "section",
      { class: "card" },
      h("h2", {}, "Its transaction"),
      table(
        [{ title: "Position", class: "num mono" }, { title: "Stream" }, { title: "Data" }],
        transaction.map((e) => [
          e.position === event.position ? h("span", { class: "mono", "aria-current": "true" }, `${e.position} (this one)`) : h("a", { href: eventHref(e.position) }, position(e.position)),
          h("span", { class: "mono" }, e.stream),
          h("code", { class: "event-data" }, preview(e.data, 120)),
        ]),
        { caption: "Events of the same transaction", empty: "No other events this role may read." },
      ),
    ),
  );
  return parts;
}
