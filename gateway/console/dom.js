// Building the page from data. Everything the server sends (stream names,
// event data, error texts) is attacker-controlled as far as the page is
// concerned: it becomes text nodes and attribute values, never markup.
// Nothing in the console uses innerHTML, and the CSP forbids inline script
// and style besides.

import { absolute, relative } from "./format.js";

/// An element: h("td", {class: "num"}, "42", otherNode). Attributes are set
/// with setAttribute (on* handlers given as functions are listeners);
/// children are nodes or strings (text); null and false children are skipped.
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (value === true) {
      element.setAttribute(name, "");
    } else {
      element.setAttribute(name, String(value));
    }
  }
  append(element, children);
  return element;
}

export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/// Replaces the children of `parent`.
export function replace(parent, ...children) {
  parent.replaceChildren();
  return append(parent, children);
}

/// A table: columns [{title, class}], rows of cells (nodes or strings).
export function table(columns, rows, { caption, empty = "Nothing to show.", rowAttributes } = {}) {
  if (rows.length === 0) return h("p", { class: "empty" }, empty);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      {},
      caption ? h("caption", { class: "visually-hidden" }, caption) : null,
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.class }, c.title)))),
      h(
        "tbody",
        {},
        rows.map((cells, i) =>
          h(
            "tr",
            rowAttributes ? rowAttributes(i) : {},
            cells.map((cell, j) => h("td", { class: columns[j].class, "data-label": columns[j].title || null }, cell)),
          ),
        ),
      ),
    ),
  );
}

/// A status badge: the word itself, coloured by its kind.
export function badge(text, kind) {
  return h("span", { class: `badge badge-${kind}` }, text);
}

/// An error as the API gave it: its message and SQLSTATE, as text.
export function errorNotice(error) {
  const sqlstate = error && error.sqlstate ? ` (SQLSTATE ${error.sqlstate})` : "";
  const message = error && error.message ? error.message : String(error);
  return h("p", { class: "notice notice-error", role: "alert" }, message + sqlstate);
}

export function notice(text, kind = "info") {
  return h("p", { class: `notice notice-${kind}`, role: "status" }, text);
}

/// A page heading that takes focus on navigation (screen readers announce
/// the new page; the keyboard continues from there).
export function heading(text, ...rest) {
  return h("h1", { tabindex: "-1", id: "page-title" }, text, ...rest);
}

/// A time as "3 s ago" beside the absolute local time (the relative part
/// is kept current by console.js, see refreshRelativeTimes).
export function when(iso) {
  if (!iso) return "–";
  return h("time", { datetime: iso, title: iso, class: "when" }, h("span", { "data-relative": iso }, relative(iso)), h("span", { class: "muted" }, absolute(iso)));
}

/// A time of day ("01:54:58.019") with "3 s ago" beside it, for the tail;
/// the date is in the tooltip.
export function whenShort(iso) {
  if (!iso) return "–";
  return h("time", { datetime: iso, title: absolute(iso), class: "when" }, h("span", { class: "mono" }, absolute(iso).slice(11)), h("span", { class: "muted", "data-relative": iso }, relative(iso)));
}

/// Brings every "3 s ago" on the page up to date.
export function refreshRelativeTimes(root = document) {
  for (const element of root.querySelectorAll("[data-relative]")) {
    const text = relative(element.dataset.relative);
    if (element.textContent !== text) element.textContent = text;
  }
}

/// "3 s ago" alone, the absolute time in the tooltip (narrow columns).
export function whenRelative(iso) {
  if (!iso) return "–";
  return h("time", { datetime: iso, title: absolute(iso) }, h("span", { "data-relative": iso }, relative(iso)));
}
