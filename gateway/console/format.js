// Numbers, positions and times as the console shows them.

const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

/// A count with thousands separators; "–" for none.
export function count(n) {
  return n === null || n === undefined ? "–" : integer.format(n);
}

/// A rate per second, one decimal.
export function rate(n) {
  return n === null || n === undefined || Number.isNaN(n) ? "–" : `${decimal.format(n)}/s`;
}

/// A position: plain digits (operators copy them into SQL).
export function position(p) {
  return p === null || p === undefined ? "–" : String(p);
}

/// A duration in seconds as "850 ms", "12 s", "4 min 5 s", "3 h 2 min", "2 d 1 h".
export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  const s = Math.abs(seconds);
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${decimal.format(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/// "3 s ago" / "in 5 s" for a timestamp (ISO text) relative to now.
export function relative(iso) {
  if (!iso) return "–";
  const then = Date.parse(iso);
  if (Number.isNaN(then)) return String(iso);
  const seconds = (Date.now() - then) / 1000;
  if (Math.abs(seconds) < 1) return "just now";
  return seconds > 0 ? `${duration(seconds)} ago` : `in ${duration(-seconds)}`;
}

/// The local absolute time of an ISO timestamp: "2026-12-04 01:12:10.123".
export function absolute(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`
  );
}

/// A PostgreSQL interval as JSON ("00:01:02.5", "1 day 02:00:00") or a
/// number of seconds, as seconds.
export function intervalSeconds(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === "number") return value;
  const text = String(value);
  let seconds = 0;
  const days = text.match(/(-?\d+) days?/);
  if (days) seconds += Number(days[1]) * 86400;
  const clock = text.match(/(-?)(\d+):(\d+):(\d+(?:\.\d+)?)/);
  if (clock) {
    const sign = clock[1] === "-" ? -1 : 1;
    seconds += sign * (Number(clock[2]) * 3600 + Number(clock[3]) * 60 + Number(clock[4]));
  }
  return days || clock ? seconds : null;
}

/// An event's data, on one line and cut to `max` characters.
export function preview(data, max = 160) {
  const text = JSON.stringify(data) ?? "null";
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}
