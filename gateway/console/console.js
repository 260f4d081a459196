// The console's entry point: sign-in, the session box in the navigation,
// and the page of the current hash route. Each page module exports
// render(main, route) and may return a function that stops what it started
// (timers, EventSource) when the route changes.

import * as api from "./api.js";
import { refreshRelativeTimes, replace } from "./dom.js";
import { absolute, relative } from "./format.js";
import { fragmentToken, parse } from "./router.js";
import * as sampler from "./sampler.js";
import * as signin from "./pages/signin.js";
import * as streams from "./pages/streams.js";
import * as stream from "./pages/stream.js";
import * as event from "./pages/event.js";
import * as subscriptions from "./pages/subscriptions.js";
import * as webhooks from "./pages/webhooks.js";
import * as worker from "./pages/worker.js";

const pages = { streams, stream, event, subscriptions, webhooks, worker };
const main = document.getElementById("main");
const sidebar = document.getElementById("sidebar");
let leave = null;
let session = null;

function signOut(reason) {
  api.signOut(reason);
  sampler.stop();
  sampler.reset();
  session = null;
  render();
}

api.onUnauthorized((error) => {
  if (api.token()) signOut(`The gateway refused the token: ${error.message}${error.sqlstate ? ` (SQLSTATE ${error.sqlstate})` : ""}`);
});

async function render() {
  if (leave) {
    leave();
    leave = null;
  }
  if (!api.token()) {
    sidebar.hidden = true;
    leave = signin.render(main, { reason: api.takeSignOutReason(), onSignIn: signedIn });
    return;
  }
  if (!session) {
    try {
      session = await api.session();
    } catch (error) {
      // A 401 signed out already (and rendered the sign-in page).
      if (error.status !== 401) signOut(`Could not start the session: ${error.message}`);
      return;
    }
    showSession(session);
    sampler.start();
  }
  sidebar.hidden = false;
  const route = parse(location.hash);
  for (const link of sidebar.querySelectorAll("a[data-page]")) {
    const current = link.dataset.page === route.page || (route.page === "stream" && link.dataset.page === "streams");
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  replace(main);
  leave = pages[route.page].render(main, route) ?? null;
  document.title = `${document.getElementById("page-title")?.textContent ?? "Console"} · litebase streams`;
}

function showSession(s) {
  document.getElementById("session-role").textContent = s.role;
  document.getElementById("session-database").textContent = s.database;
  const expires = document.getElementById("session-expires");
  if (s.expires_at === null || s.expires_at === undefined) {
    expires.textContent = "never";
  } else {
    const iso = new Date(s.expires_at * 1000).toISOString();
    expires.textContent = relative(iso);
    expires.title = absolute(iso);
  }
}

function signedIn(value) {
  api.signIn(value);
  sampler.reset();
  session = null;
  if (parse(location.hash).page === "streams" && location.hash !== "#/streams") {
    history.replaceState(null, "", `${location.pathname}#/streams`);
  }
  render();
}

// A sign-in link (`make gateway` prints one): take the token and drop it
// from the address bar and the history before anything else runs.
const linked = fragmentToken(location.hash);
if (linked) {
  history.replaceState(null, "", `${location.pathname}#/streams`);
  api.signIn(linked);
  sampler.reset();
}

document.getElementById("sign-out").addEventListener("click", () => signOut(null));
document.getElementById("skip-link").addEventListener("click", (e) => {
  // The fragment is the route: focus the content without changing it.
  e.preventDefault();
  (document.getElementById("page-title") ?? main).focus();
});
window.addEventListener("hashchange", () => {
  const token = fragmentToken(location.hash);
  if (token) {
    history.replaceState(null, "", `${location.pathname}#/streams`);
    signedIn(token);
  } else {
    render();
  }
});
// "3 s ago" stays true while a page is open.
setInterval(() => refreshRelativeTimes(main), 5000);
render();
