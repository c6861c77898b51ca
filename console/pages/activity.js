// Activity (#/activity): the hub over time. Charts of the last hour (or a shorter window) from
// GET /console/api/history?minutes=N (RegistryRead or ServiceConnect): the node samples its
// counters every 10 s and keeps an hour in memory; each point counts what happened in its
// interval (a gauge: its value at the interval's end), and the last point runs up to the moment
// of asking. Refreshed every 10 s while the page is shown (not while the tab is hidden), stopped
// when it is left. Charts are drawn by lib/chart.js.
import { timeChart, useChartCss, clockSeconds } from "../lib/chart.js";

const WINDOWS = [5, 15, 30, 60];
const REFRESH_MS = 10_000;

// The window chosen last, kept while the console is open in this tab.
let chosenMinutes = 60;

/**
 * kind: "rate" (a counter drawn per second: count / seconds of its interval), "count" (a counter
 * drawn per sample), "gauge" (a value at each sample), "latency" (milliseconds, null = no
 * observation in the interval: a gap).
 */
export const CHARTS = [
  {
    id: "device-messages", title: "Device messages", kind: "rate", noun: ["message", "messages"],
    series: [{ key: "deviceMessages", label: "Device messages" }],
    quiet: "No device messages in this window.",
  },
  {
    id: "connected-devices", title: "Connected devices", kind: "gauge",
    series: [{ key: "connectedDevices", label: "Connected devices" }],
    quiet: "No devices connected in this window.",
  },
  {
    id: "c2d", title: "Cloud-to-device messages", kind: "rate", noun: ["message", "messages"],
    series: [{ key: "c2dSent", label: "Sent" }, { key: "c2dDelivered", label: "Delivered", tone: "ok" }],
    quiet: "No cloud-to-device messages sent or delivered in this window.",
  },
  {
    id: "method-calls", title: "Direct method calls", kind: "rate", noun: ["call", "calls"],
    series: [{ key: "methodCalls", label: "Method calls" }],
    quiet: "No direct method calls in this window.",
  },
  {
    id: "twin-operations", title: "Twin operations", kind: "rate", noun: ["operation", "operations"],
    series: [{ key: "twinOperations", label: "Twin operations" }],
    quiet: "No twin reads or updates in this window.",
  },
  {
    id: "refusals", title: "Throttled and refused requests", kind: "count", noun: ["request", "requests"],
    series: [{ key: "throttled", label: "Throttled", tone: "warn" }, { key: "refused", label: "Refused", tone: "bad" }],
    quiet: "Nothing throttled or refused in this window.",
  },
  {
    id: "log", title: "Logged warnings and errors", kind: "count", noun: ["entry", "entries"],
    series: [{ key: "warnings", label: "Warnings", tone: "warn" }, { key: "errors", label: "Errors", tone: "bad" }],
    quiet: "No warnings or errors logged in this window.",
  },
  {
    id: "puback", title: "MQTT PUBACK latency", kind: "latency",
    series: [{ key: "pubackP50Ms", label: "p50" }, { key: "pubackP99Ms", label: "p99", tone: "warn" }],
    quiet: "No PUBACKs in this window: no device sent a QoS 1 message over MQTT.",
  },
];

const UNITS = { rate: "per second", count: "per 10 s sample", gauge: "devices", latency: "milliseconds" };

// ---- numbers as text ------------------------------------------------------------------------

const count = (n) => Math.round(n).toLocaleString("en-US");
const plural = (n, [one, many]) => `${count(n)} ${Math.round(n) === 1 ? one : many}`;

/** An axis tick: "0", "0.25", "2.5", "1,000". */
function tick(v) {
  return Math.abs(v) >= 1000 ? Math.round(v).toLocaleString("en-US") : String(+v.toPrecision(3));
}

/** "0/s", "0.05/s", "2.5/s", "1,204/s". */
function perSecond(r) {
  if (!(r > 0)) return "0/s";
  if (r < 1) return `${+r.toFixed(2)}/s`;
  if (r < 10) return `${+r.toFixed(1)}/s`;
  return `${count(r)}/s`;
}

/** "0.42 ms", "3.1 ms", "240 ms", "2.50 s". */
function millis(v) {
  if (v === null || v === undefined) return "—";
  if (v < 1) return `${v.toFixed(2)} ms`;
  if (v < 10) return `${v.toFixed(1)} ms`;
  if (v < 1000) return `${Math.round(v)} ms`;
  return `${(v / 1000).toFixed(2)} s`;
}

/** "0.4 s", "10 s". */
const span = (s) => `${s < 10 ? +s.toFixed(1) : Math.round(s)} s`;

const windowText = (m) => (m === 60 ? "the last hour" : `the last ${m} minutes`);
const windowLabel = (m) => (m === 60 ? "1 hour" : `${m} min`);

const sum = (xs) => xs.reduce((a, x) => a + x, 0);
const peakOf = (xs) => xs.reduce((a, x) => (x !== null && x > a ? x : a), 0);
const latestOf = (xs) => {
  for (let i = xs.length - 1; i >= 0; i--) if (xs[i] !== null) return xs[i];
  return null;
};

/** What one chart shows of an answer's points: the argument of chart.update(). */
export function chartData(def, points, { start, end, minutes }) {
  const times = points.map((p) => Date.parse(p.at));
  const seconds = points.map((p) => Math.max(0, Number(p.seconds) || 0));
  const when = (i) => `${clockSeconds(times[i])} (${span(seconds[i])})`;
  const raw = def.series.map((s) => points.map((p) => {
    const v = p[s.key];
    return v === null || v === undefined || !Number.isFinite(Number(v)) ? null : Number(v);
  }));
  const base = { start, end, times };
  const inWindow = windowText(minutes);

  if (def.kind === "rate" || def.kind === "count") {
    const counts = raw.map((xs) => xs.map((v) => v ?? 0));
    // A last point shorter than a second is read as a second: a rate over a blink is noise.
    const values = def.kind === "rate" ? counts.map((xs) => xs.map((c, i) => c / Math.max(seconds[i], 1))) : counts;
    const totals = counts.map(sum);
    const total = sum(totals);
    const peaks = values.map(peakOf);
    const fmtPeak = (v) => (def.kind === "rate" ? perSecond(v) : `${count(v)} in one sample`);
    const several = def.series.length > 1;
    const named = def.series.map((s, k) => `${s.label.toLowerCase()} ${count(totals[k])}`).join(", ");
    const summary = total === 0
      ? def.quiet
      : several
        ? `${def.title}: ${named} in ${inWindow}; peak ${fmtPeak(Math.max(...peaks))}.`
        : `${def.title}: ${count(total)} in ${inWindow}, peak ${fmtPeak(peaks[0])}.`;
    return {
      ...base,
      series: def.series.map((s, k) => ({
        ...s, values: values[k], text: several ? count(totals[k]) : null,
        stat: { total: totals[k], peak: +peaks[k].toFixed(3) },
      })),
      format: tick,
      integer: def.kind === "count",
      headline: count(total),
      headlineUnit: `${Math.round(total) === 1 ? def.noun[0] : def.noun[1]} in ${inWindow}`,
      summary,
      empty: total === 0,
      readout: (i) => `${when(i)}: ` + def.series.map((s, k) => def.kind === "rate"
        ? `${s.label} ${perSecond(values[k][i])} (${count(counts[k][i])})`
        : `${s.label} ${count(counts[k][i])}`).join(" · "),
      data: { total, peak: +Math.max(...peaks).toFixed(3), latest: null },
    };
  }

  if (def.kind === "gauge") {
    const values = raw[0].map((v) => v ?? 0);
    const latest = values.length ? values[values.length - 1] : 0;
    const peak = peakOf(values);
    return {
      ...base,
      series: [{ ...def.series[0], values, stat: { latest, peak } }],
      format: tick,
      integer: true,
      headline: count(latest),
      headlineUnit: "now",
      summary: peak === 0
        ? def.quiet
        : `${def.title}: ${count(latest)} now, at most ${count(peak)} in ${inWindow}.`,
      empty: peak === 0,
      readout: (i) => `${clockSeconds(times[i])}: ${count(values[i])} connected`,
      data: { total: null, latest, peak },
    };
  }

  // Latency: a gap where the interval saw no PUBACK.
  const latest = raw.map(latestOf);
  const peaks = raw.map(peakOf);
  const observed = raw[0].filter((v) => v !== null).length;
  return {
    ...base,
    series: def.series.map((s, k) => ({ ...s, values: raw[k], text: millis(latest[k]), stat: { latest: latest[k], peak: peaks[k] } })),
    format: tick,
    integer: false,
    headline: observed ? millis(latest[0]) : "—",
    headlineUnit: observed ? "p50, latest" : "",
    summary: observed
      ? `${def.title}: latest p50 ${millis(latest[0])}, p99 ${millis(latest[1])}; highest p99 ${millis(peaks[1])} in ${inWindow} (${plural(observed, ["sample", "samples"])} with PUBACKs).`
      : def.quiet,
    empty: observed === 0,
    readout: (i) => `${when(i)}: ` + (raw[0][i] === null
      ? "no PUBACKs"
      : def.series.map((s, k) => `${s.label} ${millis(raw[k][i])}`).join(" · ")),
    data: { total: null, latest: latest[0], peak: peaks[1] ?? peaks[0], samples: observed },
  };
}

export default async function render(root, app) {
  const ui = app.ui;
  const { h, replace } = ui;
  useChartCss();
  const subtitle = "This node's traffic over time, sampled every 10 seconds and kept in memory for an hour.";

  if (!app.can("RegistryRead") && !app.can("ServiceConnect")) {
    denied(null);
    return;
  }

  function denied(err) {
    root.dataset.state = "empty";
    const policy = app.session?.policyName || app.info?.policy || "the signed-in policy";
    replace(root,
      ui.pageHeader("Activity", subtitle),
      h("section", { class: "card" },
        h("div", { class: "state empty-state", role: "note", dataset: { testid: "activity-denied" } },
          h("p", {}, h("strong", {}, "Activity needs RegistryRead or ServiceConnect. "),
            `The policy ${policy} has ${(app.info?.permissions || []).join(", ") || "neither"}, so the hub does not show it its counters.`),
          h("p", { class: "hint" }, "Sign in with a service-side policy (registryRead, service or iothubowner) to see the charts."),
          err ? h("p", { class: "hint mono" }, ui.errorText(err)) : null)));
  }

  const radios = WINDOWS.map((m) => h("input", {
    type: "radio", name: "activity-window", value: String(m), checked: m === chosenMinutes,
    dataset: { testid: `activity-window-${m}` },
  }));
  const windowPicker = h("fieldset", { class: "segmented", dataset: { testid: "activity-window" } },
    h("legend", { class: "sr-only" }, "Window"),
    radios.map((r, i) => h("label", { class: "segment" }, r, h("span", {}, windowLabel(WINDOWS[i])))));
  const refreshBtn = h("button", { type: "button", class: "btn btn-small", dataset: { testid: "activity-refresh" } }, "Refresh");
  const updated = h("span", { class: "muted activity-updated", dataset: { testid: "activity-updated" } });
  const notes = h("div", { class: "activity-notes" });
  const status = h("div", { class: "activity-status", dataset: { testid: "activity-status" } });
  const charts = CHARTS.map((def) => ({
    def,
    chart: timeChart({ testid: `chart-${def.id}`, title: def.title, unit: UNITS[def.kind], emptyText: def.quiet }),
  }));
  const grid = h("div", { class: "chart-grid", dataset: { testid: "activity-charts" } }, charts.map((c) => c.chart.el));

  root.dataset.state = "loading";
  replace(root,
    ui.pageHeader("Activity", subtitle, h("span", { class: "activity-window-label" }, "Window"), windowPicker, refreshBtn),
    h("div", { class: "activity-bar" }, updated, notes),
    status,
    grid);

  let seq = 0;
  let controller = null;
  let timer = 0;
  let stopped = false;
  let shown = false; // an answer has been drawn
  let waitingToBeSeen = false; // a refresh skipped while the tab was hidden

  function draw(body) {
    const points = Array.isArray(body.points) ? body.points : [];
    const minutes = Number(body.minutes) || chosenMinutes;
    const end = points.length ? Date.parse(points[points.length - 1].at) : Date.now();
    const start = end - minutes * 60_000;
    // The history's beginning: before the window's, unless the node began keeping it since.
    const first = points.length ? Date.parse(points[0].at) - (Number(points[0].seconds) || 0) * 1000 : start;
    // The charts span the window, or only the part of it the node has kept (a minute at least).
    const from = Math.min(end - 60_000, Math.max(start, first));
    for (const { def, chart } of charts) chart.update(chartData(def, points, { start: from, end, minutes }));
    grid.dataset.minutes = String(minutes);
    grid.dataset.points = String(points.length);

    const interval = Number(body.intervalSeconds) || 10;
    const noteList = [];
    if (body.node) {
      noteList.push(h("p", { class: "hint", dataset: { testid: "activity-node" } },
        "Node ", h("strong", {}, body.node), ": in a cluster each node charts the devices connected to it and the requests it served."));
    }
    if (!points.length) {
      noteList.push(h("p", { class: "hint", dataset: { testid: "activity-coverage" } }, `No samples yet: the node takes one every ${interval} s.`));
    } else if (first > start + interval * 1000) {
      noteList.push(h("p", { class: "hint", dataset: { testid: "activity-coverage" } },
        `The history begins at ${clockSeconds(first)}, when this node began keeping it.`));
    }
    replace(notes, noteList);
  }

  function schedule() {
    clearTimeout(timer);
    if (!stopped) timer = setTimeout(tick, REFRESH_MS);
  }

  function tick() {
    if (stopped) return;
    if (document.hidden) {
      waitingToBeSeen = true; // refreshed when the tab is shown again
      return;
    }
    load();
  }

  async function load() {
    if (stopped) return;
    clearTimeout(timer);
    const my = ++seq;
    controller?.abort();
    const ctl = new AbortController();
    controller = ctl;
    const minutes = chosenMinutes;
    root.setAttribute("aria-busy", "true");
    try {
      const r = await app.api.get("/console/api/history", { query: { minutes }, signal: ctl.signal });
      if (stopped || my !== seq) return;
      draw(r.body || {});
      shown = true;
      replace(status);
      updated.textContent = `${windowText(minutes).replace(/^t/, "T")} · updated ${clockSeconds(Date.now())} · every ${REFRESH_MS / 1000} s`;
      root.dataset.state = "ready";
    } catch (err) {
      if (stopped || my !== seq || err?.name === "AbortError") return;
      if (err?.status === 401) {
        stopped = true;
        denied(err);
        return;
      }
      if (!shown) {
        root.dataset.state = "error";
        for (const { chart } of charts) chart.fail("The history could not be read.");
      }
      replace(status, ui.errorBox(err, shown
        ? `The last refresh failed; the charts show the previous answer. Trying again in ${REFRESH_MS / 1000} s`
        : "The hub's history could not be read"));
    } finally {
      if (my === seq) {
        root.removeAttribute("aria-busy");
        if (controller === ctl) controller = null;
        schedule();
      }
    }
  }

  for (const r of radios) {
    r.addEventListener("change", () => {
      if (!r.checked) return;
      chosenMinutes = Number(r.value);
      load();
    });
  }
  refreshBtn.addEventListener("click", () => load());
  const onVisible = () => {
    if (!document.hidden && waitingToBeSeen && !stopped) {
      waitingToBeSeen = false;
      load();
    }
  };
  document.addEventListener("visibilitychange", onVisible);
  app.onLeave(() => {
    stopped = true;
    clearTimeout(timer);
    controller?.abort();
    document.removeEventListener("visibilitychange", onVisible);
    for (const { chart } of charts) chart.destroy();
  });

  await load();
}
