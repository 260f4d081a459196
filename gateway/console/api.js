// The gateway's API as the console calls it. The token lives in
// sessionStorage (this tab only, gone when it closes) and goes out as
// `Authorization: Bearer` on every fetch; only EventSource, which cannot set
// headers, carries it as ?access_token= (see eventSourceUrl).

const TOKEN = "litebase-streams-console.token";
const REASON = "litebase-streams-console.signed-out-because";

export function token() {
  return sessionStorage.getItem(TOKEN);
}

export function signIn(value) {
  sessionStorage.setItem(TOKEN, value.trim());
  sessionStorage.removeItem(REASON);
}

/// Forgets the token; `reason` is shown on the sign-in page.
export function signOut(reason) {
  sessionStorage.removeItem(TOKEN);
  if (reason) sessionStorage.setItem(REASON, reason);
  else sessionStorage.removeItem(REASON);
}

/// Why the last sign-out happened (a 401's message), once.
export function takeSignOutReason() {
  const reason = sessionStorage.getItem(REASON);
  sessionStorage.removeItem(REASON);
  return reason;
}

/// An answer other than 2xx: the API's "error" and "sqlstate", and the status.
export class ApiError extends Error {
  constructor(status, message, sqlstate) {
    super(message);
    this.status = status;
    this.sqlstate = sqlstate;
  }
}

let unauthorized = () => {};

/// What to do on a 401 (the console signs out and shows the reason).
export function onUnauthorized(handler) {
  unauthorized = handler;
}

/// A JSON request to the gateway; resolves to the parsed body, rejects with
/// an ApiError.
export async function api(path, { method = "GET" } = {}) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: { Authorization: `Bearer ${token() ?? ""}`, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
    });
  } catch {
    throw new ApiError(0, "The gateway did not answer (network error).", null);
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const message = body && typeof body.error === "string" ? body.error : `HTTP ${response.status}`;
    const error = new ApiError(response.status, message, body && typeof body.sqlstate === "string" ? body.sqlstate : null);
    if (response.status === 401) unauthorized(error);
    throw error;
  }
  return body;
}

/// The path of a pattern's events (JSON page or SSE) with query parameters.
export function eventsPath(pattern, parameters = {}) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(parameters)) {
    if (value !== null && value !== undefined && value !== "") query.set(name, String(value));
  }
  const text = query.toString();
  return `/v1/streams/${encodeURIComponent(pattern)}/events${text ? `?${text}` : ""}`;
}

/// The EventSource URL of a pattern: the token as access_token.
export function eventSourceUrl(pattern, parameters = {}) {
  return eventsPath(pattern, { ...parameters, access_token: token() });
}

export const session = () => api("/v1/console/session");
export const overview = () => api("/v1/console/overview");
export const streams = (after, limit = 100) =>
  api(`/v1/console/streams?${new URLSearchParams({ ...(after ? { after } : {}), limit: String(limit) })}`);
export const event = (position) => api(`/v1/console/events/${encodeURIComponent(position)}`);
export const subscriptions = () => api("/v1/console/subscriptions");
const subscriptionPath = (owner, name) =>
  `/v1/console/subscriptions/${encodeURIComponent(owner)}/${encodeURIComponent(name)}`;
export const deadLetters = (owner, name) => api(`${subscriptionPath(owner, name)}/dead-letters`);
/// action: "retry" or "discard".
export const settleDeadLetter = (owner, name, position, action) =>
  api(`${subscriptionPath(owner, name)}/dead-letters/${encodeURIComponent(position)}/${action}`, { method: "POST" });
export const webhooks = () => api("/v1/console/webhooks");
/// action: "pause" or "resume".
export const setWebhook = (owner, name, action) =>
  api(`/v1/console/webhooks/${encodeURIComponent(owner)}/${encodeURIComponent(name)}/${action}`, { method: "POST" });
/// A page of a pattern's events as JSON (an array), replayed from `start`
/// ({after}, {since} or {from_tx}).
export const page = (pattern, start, maxEvents) => api(eventsPath(pattern, { ...start, max_events: maxEvents }));
