// Hash routes: #/streams, #/streams/<pattern>, #/events/<position>,
// #/subscriptions, #/webhooks, #/worker. The fragment never reaches the
// server; a sign-in link may carry #token=<jwt>, which the console takes and
// removes from the address bar at once.

export function parse(hash) {
  const path = hash.replace(/^#\/?/, "");
  const [first, ...rest] = path.split("/");
  const tail = rest.join("/");
  switch (first) {
    case "streams":
      return tail ? { page: "stream", pattern: safeDecode(tail) } : { page: "streams" };
    case "events":
      return { page: "event", position: safeDecode(tail) };
    case "subscriptions":
    case "webhooks":
    case "worker":
      return { page: first };
    default:
      return { page: "streams" };
  }
}

function safeDecode(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

export const streamHref = (pattern) => `#/streams/${encodeURIComponent(pattern)}`;
export const eventHref = (position) => `#/events/${encodeURIComponent(position)}`;

/// The token of a `#token=...` fragment, if that is what the address holds.
export function fragmentToken(hash) {
  if (!hash.startsWith("#token=")) return null;
  const value = new URLSearchParams(hash.slice(1)).get("token");
  return value && value.trim() ? value.trim() : null;
}
