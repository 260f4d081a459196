// #/streams/<pattern>: the live tail of a pattern (EventSource) and replay
// in pages from a position, a time or a transaction.
//
// The tail starts at the present and shows the newest event first. The
// browser's EventSource resumes a dropped connection itself with
// Last-Event-ID; when the gateway closes for good (the token expired, a 401
// or 403) it is closed, the reason asked for with a plain request (an
// EventSource sees no status or body) and shown, or the tail starts again
// after the last position it received. While paused, events are kept and
// counted, and shown when it resumes.

import * as api from "../api.js";
import { errorNotice, h, heading, replace, table, when, whenShort } from "../dom.js";
import { count, position, preview } from "../format.js";
import { eventHref } from "../router.js";

/// Rows the tail keeps on the page, and events it keeps while paused.
const SHOWN = 500;
const BUFFERED = 10000;

export function render(main, route) {
  const pattern = route.pattern;
  const tailTab = h("button", { type: "button", role: "tab", id: "tab-tail", "aria-selected": "true", "aria-controls": "panel-tail" }, "Live tail");
  const replayTab = h("button", { type: "button", role: "tab", id: "tab-replay", "aria-selected": "false", "aria-controls": "panel-replay" }, "Replay");
  const tailPanel = h("section", { id: "panel-tail", role: "tabpanel", "aria-labelledby": "tab-tail" });
  const replayPanel = h("section", { id: "panel-replay", role: "tabpanel", "aria-labelledby": "tab-replay", hidden: true });
  const select = (tab) => {
    const tail = tab === "tail";
    tailTab.setAttribute("aria-selected", String(tail));
    replayTab.setAttribute("aria-selected", String(!tail));
    tailPanel.hidden = !tail;
    replayPanel.hidden = tail;
  };
  tailTab.addEventListener("click", () => select("tail"));
  replayTab.addEventListener("click", () => select("replay"));
  main.append(
    h("p", { class: "breadcrumb" }, h("a", { href: "#/streams" }, "Streams"), " / "),
    heading(h("span", { class: "mono", id: "pattern-name" }, pattern)),
    h("div", { class: "tabs", role: "tablist", "aria-label": "Pattern views" }, tailTab, replayTab),
    tailPanel,
    replayPanel,
  );
  const stopTail = tail(tailPanel, pattern);
  replay(replayPanel, pattern);
  return stopTail;
}

function tail(panel, pattern) {
  const state = h("span", { class: "badge badge-neutral", id: "tail-state" }, "connecting");
  const received = h("span", { id: "tail-received", class: "mono" }, "0");
  const buffered = h("span", { id: "tail-buffered", class: "mono" }, "0");
  const pause = h("button", { type: "button", class: "button", id: "tail-pause", "aria-pressed": "false" }, "Pause");
  const clear = h("button", { type: "button", class: "button button-quiet", id: "tail-clear" }, "Clear");
  const problem = h("div", { id: "tail-problem" });
  const rows = h("ol", { class: "event-list", id: "tail-events", "aria-label": "Events, newest first" });
  const empty = h("p", { class: "empty", id: "tail-empty" }, "Waiting for events published from now on (replay shows older ones).");
  panel.append(
    h(
      "div",
      { class: "toolbar" },
      state,
      h("span", { class: "muted" }, "received ", received),
      h("span", { class: "muted", id: "tail-buffered-label" }, "buffered while paused ", buffered),
      h("span", { class: "spacer" }),
      pause,
      clear,
    ),
    problem,
    empty,
    rows,
  );

  let source = null;
  let last = null;
  let paused = false;
  let total = 0;
  let waiting = [];
  let retry = null;
  let stopped = false;

  const setState = (text, kind) => {
    state.textContent = text;
    state.className = `badge badge-${kind}`;
  };
  const show = (event) => {
    empty.hidden = true;
    rows.prepend(eventRow(event));
    while (rows.childElementCount > SHOWN) rows.lastElementChild.remove();
  };
  pause.addEventListener("click", () => {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    pause.setAttribute("aria-pressed", String(paused));
    if (!paused) {
      for (const event of waiting) show(event);
      waiting = [];
      buffered.textContent = "0";
    }
  });
  clear.addEventListener("click", () => {
    rows.replaceChildren();
    empty.hidden = false;
  });

  async function open() {
    if (stopped) return;
    // A plain request first: an unreadable pattern or a bad token is
    // answered with a status and a reason an EventSource would not show.
    try {
      // From the present: the horizon now (no `after` would replay the
      // whole log). A role that may read nothing gets null here, and the
      // page request below says why.
      if (last === null) last = (await api.overview()).horizon;
      await api.page(pattern, last === null ? {} : { after: last }, 0);
    } catch (error) {
      if (stopped) return;
      setState("stopped", "error");
      replace(problem, errorNotice(error));
      // 401 signs out; 400/403/404 will not change: stop. Others (the
      // database away, 503): try again.
      if (![400, 401, 403, 404].includes(error.status)) retry = setTimeout(open, 3000);
      return;
    }
    if (stopped) return;
    replace(problem);
    source = new EventSource(api.eventSourceUrl(pattern, { frames: "message", after: last }));
    source.onopen = () => setState("live", "ok");
    source.onmessage = (message) => {
      let event;
      try {
        event = JSON.parse(message.data);
      } catch {
        return;
      }
      if (typeof event.position !== "number") return;
      last = event.position;
      total += 1;
      received.textContent = count(total);
      if (paused) {
        waiting.push(event);
        if (waiting.length > BUFFERED) waiting.shift();
        buffered.textContent = count(waiting.length);
      } else {
        show(event);
      }
    };
    source.onerror = () => {
      if (stopped) return;
      if (source.readyState === EventSource.CLOSED) {
        // Ended for good (an expired token, a refusal): find out why.
        source.close();
        source = null;
        setState("reconnecting", "warn");
        retry = setTimeout(open, 1000);
      } else {
        setState("reconnecting", "warn"); // EventSource resumes itself
      }
    };
  }
  open();
  return () => {
    stopped = true;
    clearTimeout(retry);
    if (source) source.close();
  };
}

/// One event of the tail: position, time, stream, type and key, and its
/// data on one line. All of it text.
function eventRow(event) {
  return h(
    "li",
    { class: "event-row", "data-position": String(event.position) },
    h("a", { href: eventHref(event.position), class: "mono event-position" }, position(event.position)),
    h("span", { class: "event-time" }, whenShort(event.time)),
    h("span", { class: "event-stream mono" }, event.stream),
    h(
      "span",
      { class: "event-body" },
      event.type ? h("span", { class: "tag" }, event.type) : null,
      event.key ? h("span", { class: "tag tag-key" }, `key ${event.key}`) : null,
      h("code", { class: "event-data" }, preview(event.data)),
    ),
  );
}

function replay(panel, pattern) {
  const mode = h(
    "select",
    { id: "replay-mode", name: "mode" },
    h("option", { value: "after" }, "after position"),
    h("option", { value: "since" }, "since time"),
    h("option", { value: "from_tx" }, "from transaction"),
  );
  const value = h("input", { id: "replay-value", name: "value", value: "0", autocomplete: "off", class: "mono" });
  const size = h("input", { id: "replay-size", name: "size", type: "number", min: "1", max: "1000", value: "50" });
  const hint = h("p", { class: "help", id: "replay-hint" });
  const result = h("div", { id: "replay-result", "aria-live": "polite" });
  const form = h(
    "form",
    { class: "replay-form", id: "replay-form" },
    h("div", { class: "field" }, h("label", { for: "replay-mode" }, "From"), mode),
    h("div", { class: "field field-grow" }, h("label", { for: "replay-value" }, "Value"), value),
    h("div", { class: "field" }, h("label", { for: "replay-size" }, "Page size"), size),
    h("button", { type: "submit", class: "button", id: "replay-submit" }, "Show"),
  );
  const hints = {
    after: "Events after this position (0: from the start).",
    since: "Events committed at or after this time, e.g. 2026-12-04T01:00:00Z or 2026-12-04 01:00:00+00.",
    from_tx: "Events of this transaction id (xid8) and after.",
  };
  const setHint = () => {
    hint.textContent = hints[mode.value];
    if (mode.value === "since" && (value.value === "0" || value.value === "")) {
      value.value = new Date(Date.now() - 5 * 60 * 1000).toISOString();
    }
  };
  mode.addEventListener("change", setHint);
  setHint();
  panel.append(form, hint, result);

  async function show(start, firstOfRun) {
    const limit = Math.min(1000, Math.max(1, Number(size.value) || 50));
    replace(result, h("p", { class: "muted" }, "Loading…"));
    let events;
    try {
      events = await api.page(pattern, start, limit);
    } catch (error) {
      replace(result, errorNotice(error));
      return;
    }
    if (events.length === 0) {
      replace(result, h("p", { class: "empty", id: "replay-empty" }, firstOfRun ? "No events from there." : "No more events."));
      return;
    }
    const lastPosition = events[events.length - 1].position;
    replace(
      result,
      h("p", { class: "muted", id: "replay-summary" }, `${events.length} events, positions ${events[0].position} to ${lastPosition}`),
      table(
        [
          { title: "Position", class: "num mono" },
          { title: "Time" },
          { title: "Stream" },
          { title: "Type" },
          { title: "Data" },
        ],
        events.map((e) => [
          h("a", { href: eventHref(e.position) }, position(e.position)),
          when(e.time),
          h("span", { class: "mono" }, e.stream),
          e.type ?? "",
          h("code", { class: "event-data" }, preview(e.data, 120)),
        ]),
        { caption: "Replayed events", rowAttributes: (i) => ({ class: "replay-row", "data-position": String(events[i].position) }) },
      ),
      // The next page continues after the last position shown.
      events.length === limit
        ? h("div", { class: "pager" }, h("button", { type: "button", class: "button", id: "replay-next", onclick: () => show({ after: lastPosition }, false) }, "Next page"))
        : h("p", { class: "muted" }, "End of the log so far."),
    );
  }
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    show({ [mode.value]: value.value.trim() }, true);
  });
}
