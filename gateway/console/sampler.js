// Samples the numbers the charts draw, every 2 s while signed in: events/s
// (the growth of the streams' totals in /v1/console/streams), the horizon's
// and the worker's lag (/v1/console/overview) and the largest subscription
// lag (/v1/console/subscriptions). The last minutes are kept in
// sessionStorage, so a reload keeps the charts. Only what the role may read
// is counted: the totals are those of the streams it sees.

import * as api from "./api.js";

const KEY = "litebase-streams-console.samples";
const INTERVAL_MS = 2000;
const KEEP_SECONDS = 600;
/// Per-stream totals kept in memory for the streams table's rates.
const RATE_WINDOW = 10;

let state = load();
let timer = null;
let running = false;
const listeners = new Set();
/// [{t, totals: Map(stream → events)}], oldest first.
const totalsHistory = [];

function load() {
  try {
    const saved = JSON.parse(sessionStorage.getItem(KEY) ?? "null");
    if (saved && Array.isArray(saved.samples)) return saved;
  } catch {
    // A damaged entry: start again.
  }
  return { samples: [], lastTotal: null, lastTime: null };
}

function save() {
  try {
    sessionStorage.setItem(KEY, JSON.stringify(state));
  } catch {
    // Storage full or refused: the charts still draw from memory.
  }
}

export function start() {
  if (timer !== null) return;
  tick();
  timer = setInterval(tick, INTERVAL_MS);
}

export function stop() {
  clearInterval(timer);
  timer = null;
}

/// Drops the samples (signing out: the next role sees other streams).
export function reset() {
  state = { samples: [], lastTotal: null, lastTime: null };
  totalsHistory.length = 0;
  sessionStorage.removeItem(KEY);
}

/// fn(samples) after every sample; returns a function that unsubscribes.
export function subscribe(fn) {
  listeners.add(fn);
  fn(state.samples);
  return () => listeners.delete(fn);
}

export function samples() {
  return state.samples;
}

/// Events/s of one stream over the last ~20 s, or null before two samples.
export function rateOf(stream) {
  if (totalsHistory.length < 2) return null;
  const newest = totalsHistory[totalsHistory.length - 1];
  const oldest = totalsHistory.find((h) => h.totals.has(stream));
  if (!oldest || oldest === newest || !newest.totals.has(stream)) return null;
  return Math.max(0, newest.totals.get(stream) - oldest.totals.get(stream)) / (newest.t - oldest.t);
}

async function tick() {
  if (running) return; // a slow gateway: skip rather than pile up
  running = true;
  try {
    const [streams, overview, subscriptions] = await Promise.allSettled([
      api.streams(null, 500),
      api.overview(),
      api.subscriptions(),
    ]);
    const t = Date.now() / 1000;
    const sample = { t, rate: null, horizonLag: null, deliveryLag: null, subscriptionLag: null };
    if (streams.status === "fulfilled") {
      const totals = new Map(streams.value.streams.map((s) => [s.stream, Number(s.events)]));
      totalsHistory.push({ t, totals });
      while (totalsHistory.length > RATE_WINDOW) totalsHistory.shift();
      const total = [...totals.values()].reduce((a, b) => a + b, 0);
      if (state.lastTotal !== null && t > state.lastTime && t - state.lastTime < 30) {
        sample.rate = Math.max(0, total - state.lastTotal) / (t - state.lastTime);
      }
      state.lastTotal = total;
      state.lastTime = t;
    }
    const status = overview.status === "fulfilled" ? overview.value.status : null;
    if (status) {
      sample.horizonLag = Math.max(0, Number(status.newest_position) - Number(status.horizon));
      sample.deliveryLag = status.lag_positions === null ? null : Number(status.lag_positions);
    }
    if (subscriptions.status === "fulfilled") {
      const lags = subscriptions.value.subscriptions.map((s) => Number(s.lag_seconds ?? 0));
      sample.subscriptionLag = lags.length ? Math.max(...lags) : 0;
    }
    state.samples.push(sample);
    state.samples = state.samples.filter((s) => s.t > t - KEEP_SECONDS);
    save();
    for (const fn of listeners) fn(state.samples);
  } finally {
    running = false;
  }
}
