// Line charts of the sampled numbers (uPlot, vendored: vendor/uPlot.*).
// uPlot draws on a canvas and sizes its parts through the CSSOM, which the
// console's CSP (style-src 'self') allows.

import { h } from "./dom.js";
import { count, duration } from "./format.js";
import * as sampler from "./sampler.js";

const COLOURS = ["#2f6fde", "#d9822b", "#1f9d6b", "#a04bd1"];

/// A chart card in `container`: title, series [{label, value: sample → y}],
/// formatted y values. Returns {update(samples), destroy()}.
export function lineChart(container, { title, series, format, integer = false }) {
  const body = h("div", { class: "chart-body" });
  const card = h("figure", { class: "chart" }, h("figcaption", {}, title), body);
  container.append(card);
  const uPlot = window.uPlot;
  if (!uPlot) {
    body.append(h("p", { class: "empty" }, "Charts need vendor/uPlot.iife.min.js."));
    return { update() {}, destroy() {} };
  }
  const width = () => Math.max(240, body.clientWidth || 320);
  const height = () => (width() < 420 ? 120 : 160);
  const grid = { stroke: "#e6e9ee", width: 1 };
  const plot = new uPlot(
    {
      width: width(),
      height: height(),
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      scales: {
        // The last minutes up to now: at least one, at most ten (what the
        // sampler keeps), whatever the samples cover.
        x: {
          time: true,
          range: (u, min) => {
            const now = Date.now() / 1000;
            const from = Number.isFinite(min) ? Math.min(min, now - 60) : now - 60;
            return [Math.max(from, now - 600), now];
          },
        },
        y: { range: (u, min, max) => [0, Math.max(integer ? 4 : 1, (Number.isFinite(max) ? max : 0) * 1.15)] },
      },
      axes: [
        // Times of day only (uPlot's default adds the date under the first
        // tick, which overlaps the next one in a card this narrow).
        { stroke: "#5b6472", grid, ticks: grid, space: 70, values: (u, ticks) => ticks.map(clockTime) },
        {
          stroke: "#5b6472",
          grid,
          ticks: grid,
          size: 64,
          incrs: integer ? [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 1e6, 1e7] : undefined,
          values: (u, ticks) => ticks.map(format),
        },
      ],
      series: [
        {},
        ...series.map((s, i) => ({
          label: s.label,
          stroke: COLOURS[i % COLOURS.length],
          width: 1.5,
          points: { show: false },
          value: (u, v) => (v === null ? "–" : format(v)),
        })),
      ],
    },
    [[], ...series.map(() => [])],
    body,
  );
  // Resized in the next frame and only when the width changed: resizing
  // inside the observer's callback would notify it again in the same frame.
  let drawnWidth = width();
  const resize = new ResizeObserver(() =>
    requestAnimationFrame(() => {
      if (width() === drawnWidth) return;
      drawnWidth = width();
      plot.setSize({ width: drawnWidth, height: height() });
    }),
  );
  resize.observe(body);
  return {
    update(samples) {
      plot.setData([samples.map((s) => s.t), ...series.map((s) => samples.map((sample) => s.value(sample)))]);
    },
    destroy() {
      resize.disconnect();
      plot.destroy();
    },
  };
}

/// 14:05:30 (the viewer's time zone).
function clockTime(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}

/// The charts of the sampler's numbers, by name.
const SAMPLED = {
  events: {
    title: "Events/s",
    series: [{ label: "events/s", value: (s) => s.rate }],
    format: (v) => (v >= 100 ? count(v) : String(Math.round(v * 10) / 10)),
  },
  lag: {
    title: "Lag (positions)",
    series: [
      { label: "horizon", value: (s) => s.horizonLag },
      { label: "delivery", value: (s) => s.deliveryLag },
    ],
    format: count,
    integer: true,
  },
  subscriptionLag: {
    title: "Largest subscription lag",
    series: [{ label: "lag", value: (s) => s.subscriptionLag }],
    format: duration,
  },
};

/// The named charts of the sampler's numbers in `container`, following
/// the sampler; returns the function that stops and removes them.
export function sampledCharts(container, names) {
  const charts = names.map((name) => lineChart(container, SAMPLED[name]));
  const unsubscribe = sampler.subscribe((samples) => charts.forEach((chart) => chart.update(samples)));
  return () => {
    unsubscribe();
    charts.forEach((chart) => chart.destroy());
  };
}
