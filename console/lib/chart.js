// A small time chart drawn as inline SVG with DOM calls (no library, no canvas, no inline
// style: the console's Content-Security-Policy has style-src 'self', so every look comes from
// console/chart.css by class).
//
//   const c = timeChart({ testid, title, unit, emptyText });
//   root.append(c.el);
//   c.update({
//     start, end,                     // the x domain, ms since the epoch
//     times: [ms, ...],               // each point's time (the end of its interval)
//     series: [{ key, label, values: [number|null, ...], tone, stat }],  // null = a gap
//     format: (v) => "2.5/s",         // a y value as text (ticks, readout)
//     integer: true,                  // ticks at whole numbers only
//     headline: "30", headlineUnit: "messages",
//     summary: "Device messages: 30 in the last 5 minutes, peak 2.5/s.",
//     empty: false,                   // nothing happened: say so over the plot (emptyText)
//     readout: (i) => "…",            // one point as text (hover, arrow keys)
//     data: { total: 30 },            // set as data-* on the chart's element (null removes)
//   });
//   c.destroy();                      // stops watching the element's width
//
// x is time, y is scaled from 0 to a round number above the largest value, with a few ticks.
// The SVG's viewBox is as wide as the chart's box in CSS pixels (redrawn when that changes), so
// text stays legible from a phone to a wide screen. Pointing at the plot, or focusing it and
// pressing the arrow keys (Home, End), reads out the nearest point; the summary is the text
// alternative of the whole chart.
import { h } from "./ui.js";

const HEIGHT = 180;
const PAD = { top: 10, right: 12, bottom: 24, left: 52 };
const MINUTE = 60_000;

let chartIds = 0;

/** Loads console/chart.css once (a <link>, allowed by style-src 'self'). */
export function useChartCss() {
  if (document.querySelector("link[data-chart-css]")) return;
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = new URL("../chart.css", import.meta.url).pathname;
  link.dataset.chartCss = "";
  document.head.appendChild(link);
}

const svg = (tag, attrs = {}, ...children) => h(`svg:${tag}`, attrs, ...children);

/** Ticks from 0 to a round number at or above `max`: [0, step, 2*step, ...], about `count` of them. */
export function niceTicks(max, { integer = false, count = 4 } = {}) {
  if (!(max > 0) || !Number.isFinite(max)) return [0, 1];
  const rough = max / count;
  const mag = 10 ** Math.floor(Math.log10(rough));
  const steps = integer ? [1, 2, 5, 10] : [1, 2, 2.5, 5, 10];
  let step = steps.map((m) => m * mag).find((s) => s >= rough) || 10 * mag;
  if (integer) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let i = 0; ; i++) {
    const t = +(i * step).toPrecision(12);
    ticks.push(t);
    if (t >= max) break;
  }
  return ticks;
}

/** The spacing of time ticks for a window of `spanMs` on a plot `width` px wide. */
function timeStep(spanMs, width) {
  const steps = [10_000, 15_000, 30_000, ...[1, 2, 5, 10, 15, 30, 60].map((m) => m * MINUTE)];
  const most = Math.max(2, Math.floor(width / 70)); // a label every 70 px at most
  return steps.find((s) => spanMs / s <= most) || 60 * MINUTE;
}

const pad2 = (n) => String(n).padStart(2, "0");
/** "12:05" (local time). */
export function clock(ms) {
  const d = new Date(ms);
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
}
/** "12:05:30" (local time). */
export function clockSeconds(ms) {
  const d = new Date(ms);
  return `${clock(ms)}:${pad2(d.getSeconds())}`;
}

export function timeChart({ testid, title, unit = "", emptyText = "Nothing in this window." }) {
  const id = `chart-${++chartIds}`;
  const titleId = `${id}-title`;
  const summaryId = `${id}-summary`;
  const headline = h("span", { class: "chart-headline", dataset: { testid: `${testid}-headline` } });
  const headlineUnit = h("span", { class: "chart-headline-unit" });
  const legend = h("ul", { class: "chart-legend", dataset: { testid: `${testid}-legend` } });
  const summary = h("p", { class: "chart-summary", id: summaryId, dataset: { testid: `${testid}-summary` } });
  const readout = h("p", { class: "chart-readout", "aria-live": "polite", dataset: { testid: `${testid}-readout` } });
  const plot = h("div", {
    class: "chart-plot", tabindex: "0", role: "group",
    "aria-label": `${title} chart: the arrow keys step through the samples`,
    "aria-describedby": summaryId,
  });
  const el = h("figure", { class: "card chart", dataset: { testid, state: "loading" }, "aria-labelledby": titleId },
    h("div", { class: "chart-head" },
      h("figcaption", { class: "chart-title", id: titleId }, title, unit ? h("span", { class: "chart-unit" }, unit) : null),
      h("span", { class: "chart-figure" }, headline, " ", headlineUnit)),
    legend, plot, readout, summary);

  let last = null; // the last update's data
  let geometry = null; // {x, y, width} of the last drawing
  let cursor = null; // the index read out, or null
  let drawnWidth = 0;
  let frame = 0;

  const widthNow = () => Math.max(240, Math.round(plot.clientWidth || 560));

  function draw() {
    if (!last) return;
    const width = widthNow();
    drawnWidth = width;
    const { start, end, times, series, format, integer, empty } = last;
    const span = Math.max(1, end - start);
    const left = PAD.left, right = width - PAD.right, top = PAD.top, bottom = HEIGHT - PAD.bottom;
    const x = (t) => left + ((Math.min(end, Math.max(start, t)) - start) / span) * (right - left);
    let max = 0;
    for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
    const ticks = niceTicks(max, { integer });
    const top_ = ticks[ticks.length - 1] || 1;
    const y = (v) => bottom - (v / top_) * (bottom - top);
    geometry = { x, y, width };

    const grid = svg("g", { class: "chart-grid-lines" });
    for (const t of ticks) {
      grid.append(svg("line", { class: t === 0 ? "chart-baseline" : "chart-gridline", x1: left, x2: right, y1: y(t), y2: y(t) }),
        svg("text", { class: "chart-axis-text", x: left - 6, y: y(t) + 4, "text-anchor": "end" }, format(t)));
    }
    const step = timeStep(span, right - left);
    const offset = new Date(end).getTimezoneOffset() * MINUTE; // ticks on round local times
    const half = step < MINUTE ? 25 : 16; // about half a label's width at 11 px
    for (let t = Math.ceil((start - offset) / step) * step + offset; t <= end; t += step) {
      // A label near an edge moves inwards, off its tick, rather than being cut.
      const at = Math.min(width - half - 1, Math.max(half, x(t)));
      grid.append(svg("line", { class: "chart-tick", x1: x(t), x2: x(t), y1: bottom, y2: bottom + 4 }),
        svg("text", { class: "chart-axis-text", x: at, y: HEIGHT - 6, "text-anchor": "middle" }, step < MINUTE ? clockSeconds(t) : clock(t)));
    }

    const lines = svg("g", { class: "chart-series" });
    series.forEach((s, i) => {
      const g = svg("g", { class: ["chart-s", `chart-s${i}`, s.tone ? `chart-tone-${s.tone}` : ""], dataset: { series: s.key } });
      // Runs of points without a gap: an area and a line each; a lone point a dot.
      let run = [];
      const flush = () => {
        if (run.length === 1) {
          g.append(svg("circle", { class: "chart-point", cx: run[0][0], cy: run[0][1], r: 2.5 }));
        } else if (run.length > 1) {
          const line = run.map(([px, py], k) => `${k ? "L" : "M"}${px.toFixed(1)} ${py.toFixed(1)}`).join("");
          const area = `${line}L${run[run.length - 1][0].toFixed(1)} ${bottom}L${run[0][0].toFixed(1)} ${bottom}Z`;
          g.append(svg("path", { class: "chart-area", d: area }), svg("path", { class: "chart-line", d: line }));
        }
        run = [];
      };
      s.values.forEach((v, k) => {
        if (v === null || v === undefined || !Number.isFinite(times[k])) flush();
        else run.push([x(times[k]), y(v)]);
      });
      flush();
      lines.append(g);
    });

    const overlay = svg("g", { class: "chart-cursor-layer" });
    const chartSvg = svg("svg", {
      class: "chart-svg", viewBox: `0 0 ${width} ${HEIGHT}`, width, height: HEIGHT,
      role: "img", "aria-labelledby": titleId, "aria-describedby": summaryId, focusable: "false",
    }, grid, lines, overlay);
    if (empty) {
      chartSvg.append(svg("text", { class: "chart-empty-text", x: (left + right) / 2, y: (top + bottom) / 2 + 4, "text-anchor": "middle" }, emptyText));
    }
    plot.replaceChildren(chartSvg);
    if (cursor !== null) showCursor(Math.min(cursor, times.length - 1));
  }

  function showCursor(i) {
    const layer = plot.querySelector(".chart-cursor-layer");
    if (!last || !geometry || !layer || i < 0 || i >= last.times.length) {
      hideCursor();
      return;
    }
    cursor = i;
    const { x, y } = geometry;
    const px = x(last.times[i]);
    layer.replaceChildren(svg("line", { class: "chart-cursor", x1: px, x2: px, y1: PAD.top, y2: HEIGHT - PAD.bottom }));
    last.series.forEach((s, k) => {
      const v = s.values[i];
      if (v === null || v === undefined) return;
      layer.append(svg("circle", { class: ["chart-dot", `chart-s${k}`, s.tone ? `chart-tone-${s.tone}` : ""], cx: px, cy: y(v), r: 3.5 }));
    });
    readout.textContent = last.readout ? last.readout(i) : defaultReadout(i);
    readout.dataset.index = String(i);
  }

  function hideCursor() {
    cursor = null;
    plot.querySelector(".chart-cursor-layer")?.replaceChildren();
    readout.textContent = "";
    delete readout.dataset.index;
  }

  function defaultReadout(i) {
    const parts = last.series.map((s) => `${s.label} ${s.values[i] === null ? "—" : last.format(s.values[i])}`);
    return `${clockSeconds(last.times[i])}: ${parts.join(" · ")}`;
  }

  function nearest(clientX) {
    const box = plot.querySelector("svg")?.getBoundingClientRect();
    if (!box || !box.width || !last || !last.times.length) return -1;
    const px = ((clientX - box.left) / box.width) * geometry.width;
    let best = -1, bestD = Infinity;
    last.times.forEach((t, i) => {
      const d = Math.abs(geometry.x(t) - px);
      if (d < bestD) { bestD = d; best = i; }
    });
    return best;
  }

  plot.addEventListener("pointermove", (e) => showCursor(nearest(e.clientX)));
  plot.addEventListener("pointerleave", () => { if (document.activeElement !== plot) hideCursor(); });
  plot.addEventListener("focus", () => { if (last && last.times.length) showCursor(cursor ?? last.times.length - 1); });
  plot.addEventListener("blur", hideCursor);
  plot.addEventListener("keydown", (e) => {
    if (!last || !last.times.length) return;
    const n = last.times.length;
    const at = cursor ?? n - 1;
    const to = { ArrowLeft: at - 1, ArrowRight: at + 1, Home: 0, End: n - 1, PageUp: at - 6, PageDown: at + 6 }[e.key];
    if (to === undefined) return;
    e.preventDefault();
    showCursor(Math.max(0, Math.min(n - 1, to)));
  });

  // Redrawn when the chart's width changes (a window resized, a phone turned), once per frame.
  const watcher = typeof ResizeObserver === "function" ? new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(() => { if (last && widthNow() !== drawnWidth) draw(); });
  }) : null;
  watcher?.observe(plot);

  function update(data) {
    last = data;
    headline.textContent = data.headline ?? "";
    headlineUnit.textContent = data.headlineUnit ?? "";
    summary.textContent = data.summary ?? "";
    legend.replaceChildren(...data.series.map((s, i) => h("li", {
      class: ["chart-legend-item", `chart-s${i}`, s.tone ? `chart-tone-${s.tone}` : ""],
      dataset: { series: s.key, ...Object.fromEntries(Object.entries(s.stat || {}).filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => [k, String(v)])) },
    }, h("span", { class: "chart-swatch", "aria-hidden": "true" }), s.label, s.text ? h("span", { class: "chart-legend-value" }, s.text) : null)));
    legend.hidden = data.series.length < 2 && !data.series.some((s) => s.text);
    for (const [k, v] of Object.entries(data.data || {})) {
      if (v === null || v === undefined) delete el.dataset[k];
      else el.dataset[k] = String(v);
    }
    el.dataset.state = data.empty ? "empty" : "ready";
    draw();
  }

  /** A message instead of the plot (the history could not be read). */
  function fail(text) {
    last = null;
    geometry = null;
    cursor = null;
    el.dataset.state = "error";
    headline.textContent = "";
    headlineUnit.textContent = "";
    readout.textContent = "";
    summary.textContent = "";
    plot.replaceChildren(h("p", { class: "chart-message" }, text));
  }

  function destroy() {
    watcher?.disconnect();
    cancelAnimationFrame(frame);
  }

  return { el, update, fail, destroy };
}
