// Overview: the hub at a glance, refreshed every few seconds. Device counts from
// GET /statistics/devices (RegistryRead), hub facts from GET /console/api/session, rates and
// latencies from two samples of GET /console/api/metrics, partitions from GET /events/partitions
// (ServiceConnect), the built-in endpoint's consumer groups (lib/consumer-groups.js), recent
// warnings and errors from GET /console/api/errors.
import { consumerGroupsCard } from "../lib/consumer-groups.js";
import { parsePrometheus, rate, total, quantile, formatSeconds, formatRate, formatBytes } from "../lib/metrics.js";

const REFRESH_MS = 5000;

export default async function render(root, app) {
  const ui = app.ui;
  const { h, replace } = ui;
  const updated = h("span", { class: "muted", "aria-live": "off", dataset: { testid: "overview-updated" } });
  const refreshBtn = h("button", { type: "button", class: "btn btn-small", dataset: { testid: "overview-refresh" } }, "Refresh");

  const kpi = {
    total: h("div", { class: "stat-value", dataset: { testid: "devices-total" } }, "—"),
    totalSub: h("div", { class: "stat-sub" }),
    connected: h("div", { class: "stat-value", dataset: { testid: "devices-connected" } }, "—"),
    connectedSub: h("div", { class: "stat-sub" }),
    d2c: h("div", { class: "stat-value", dataset: { testid: "rate-d2c" } }, "—"),
    d2cSub: h("div", { class: "stat-sub" }),
    uptime: h("div", { class: "stat-value", dataset: { testid: "uptime" } }, "—"),
    uptimeSub: h("div", { class: "stat-sub" }),
  };
  const stat = (label, value, sub) => h("section", { class: "card stat" }, h("div", { class: "stat-label" }, label), value, sub);
  const hubBody = h("div", { dataset: { testid: "hub-facts" } });
  const trafficBody = h("div", { dataset: { testid: "traffic" } });
  const partitionsBody = h("div", { dataset: { testid: "partitions" } });
  const errorsBody = h("div", { dataset: { testid: "recent-errors" } });
  // Read on arrival and on Refresh, not every 5 seconds: it is edited here, not watched.
  const groups = consumerGroupsCard(app);

  replace(root,
    ui.pageHeader("Overview", `${app.info.hubName} · ${app.info.hostName}`, updated, refreshBtn),
    h("div", { class: "kpi-grid" },
      stat("Devices", kpi.total, kpi.totalSub),
      stat("Connected", kpi.connected, kpi.connectedSub),
      stat("Device messages", kpi.d2c, kpi.d2cSub),
      stat("Uptime", kpi.uptime, kpi.uptimeSub)),
    ui.card("Traffic and latency", trafficBody),
    h("div", { class: "grid grid-2" },
      ui.card("Hub", hubBody),
      ui.card("Partitions (built-in endpoint)", partitionsBody)),
    h("div", { style: { marginTop: "16px" } }, groups.el),
    h("div", { style: { marginTop: "16px" } }, ui.card("Recent warnings and errors", errorsBody)));
  [hubBody, trafficBody, partitionsBody, errorsBody].forEach((el) => ui.loading(el));

  let before = null; // {samples, at}
  let busy = false;
  let first = true;
  let stopped = false;

  const needs = (el, right) => {
    el.dataset.state = "empty";
    replace(el, h("p", { class: "muted" }, `Needs ${right}, which the signed-in policy does not have.`));
  };

  async function refreshInfo() {
    const info = await app.refreshInfo();
    replace(hubBody, ui.facts([
      ["Hub name", info.hubName],
      ["Host name", info.hostName],
      ["Version", info.version],
      ["Started", ui.formatTime(info.startedAtUtc)],
      ["Uptime", ui.formatDuration(info.uptimeSeconds)],
      info.node ? ["Node", info.node] : null,
      ["Policy", info.policy],
      ["Rights", (info.permissions || []).join(", ") || "none"],
      // Public, so a plain link downloads it (GET /console/api/ca.pem takes no token).
      ["CA certificate", h("a", { href: "/console/api/ca.pem", download: "ferrohub-ca.pem", dataset: { testid: "ca-download" } },
        "Download ferrohub-ca.pem")],
    ], "hub-facts-list"));
    ui.ready(hubBody);
    kpi.uptime.textContent = ui.formatDuration(info.uptimeSeconds);
    kpi.uptimeSub.textContent = `since ${ui.formatTime(info.startedAtUtc)} · v${info.version}`;
    kpi.connected.textContent = String(info.connectedDevices ?? "—");
    kpi.connectedSub.textContent = "devices and modules online now";
    return info;
  }

  async function refreshStats() {
    if (!app.can("RegistryRead")) {
      kpi.total.textContent = "—";
      kpi.totalSub.textContent = "needs RegistryRead";
      return;
    }
    const s = (await app.api.get("/statistics/devices")).body;
    kpi.total.textContent = String(s.totalDeviceCount);
    kpi.totalSub.replaceChildren(
      h("span", { dataset: { testid: "devices-enabled" } }, `${s.enabledDeviceCount} enabled`), " · ",
      h("span", { dataset: { testid: "devices-disabled" } }, `${s.disabledDeviceCount} disabled`));
  }

  async function refreshMetrics() {
    const text = (await app.api.get("/console/api/metrics")).body;
    const now = { samples: parsePrometheus(typeof text === "string" ? text : ""), at: performance.now() };
    const prev = before;
    before = now;
    const dt = prev ? (now.at - prev.at) / 1000 : 0;
    const r = (name, filter) => (prev ? rate(prev.samples, now.samples, name, dt, filter) : null);
    const q = (base, p) => quantile(prev ? prev.samples : null, now.samples, base, p);
    const d2cRate = r("ferrohub_d2c_messages_total");
    kpi.d2c.textContent = prev ? formatRate(d2cRate) : "…";
    kpi.d2cSub.textContent = `${(total(now.samples, "ferrohub_d2c_messages_total") ?? 0).toLocaleString()} since start`;
    const lat = (base) => {
      const p50 = q(base, 0.5), p99 = q(base, 0.99);
      if (!p50) return h("span", { class: "muted" }, "no samples yet");
      return h("span", { title: `${p50.window}, ${p50.count.toLocaleString()} messages` },
        `p50 ${formatSeconds(p50.value)} · p99 ${p99 && p99.over ? "> " : ""}${formatSeconds(p99?.value)}`);
    };
    const conns = (now.samples.ferrohub_connections || [])
      .filter((s) => s.value > 0)
      .map((s) => `${s.labels.protocol || "?"}${s.labels.transport ? "/" + s.labels.transport : ""}: ${s.value}`)
      .join(", ");
    const rows = [
      ["Device to cloud", r("ferrohub_d2c_messages_total"), "rate-d2c-detail"],
      ["D2C bytes (MQTT)", r("ferrohub_d2c_bytes_total"), "rate-d2c-bytes", true],
      ["C2D sent", r("ferrohub_c2d_sent_total"), "rate-c2d-sent"],
      ["C2D delivered", r("ferrohub_c2d_delivered_total"), "rate-c2d-delivered"],
      ["Method calls", r("ferrohub_method_calls_total"), "rate-methods"],
      ["Twin operations", r("ferrohub_twin_operations_total"), "rate-twin"],
      ["Refused requests", r("ferrohub_requests_refused_total"), "rate-refused"],
    ];
    const v = (testid, content) => h("span", { dataset: { testid } }, content);
    replace(trafficBody,
      h("div", { class: "facts-wide" },
        ui.facts(rows.map(([label, value, id, bytes]) => [label,
          v(id, prev ? (bytes ? `${formatBytes(value)}/s` : formatRate(value)) : "measuring…")])),
        ui.facts([
          ["Telemetry append latency", v("lat-d2c", lat("ferrohub_d2c_append_seconds"))],
          ["MQTT PUBACK latency", v("lat-puback", lat("ferrohub_mqtt_puback_seconds"))],
          ["Open connections", conns || "none"],
          ["C2D queued (estimate)", String(total(now.samples, "ferrohub_c2d_messages_queued_estimate") ?? "—")],
          ["Resident memory", formatBytes(total(now.samples, "process_resident_memory_bytes"))],
        ])),
      h("p", { class: "hint", style: { marginTop: "12px" } }, prev ? `Rates over the last ${dt.toFixed(1)} s; latency quantiles from the hub's histograms.` : "Rates appear with the next sample."));
    ui.ready(trafficBody);
  }

  async function refreshPartitions() {
    if (!app.can("ServiceConnect")) return needs(partitionsBody, "ServiceConnect");
    const parts = (await app.api.get("/events/partitions")).body || [];
    if (!parts.length) return ui.empty(partitionsBody, "No partitions.");
    replace(partitionsBody, ui.table(["Partition", "Retained", "Last sequence", "Last enqueued"], parts.map((p) => {
      const retained = p.isEmpty || p.lastEnqueuedSequenceNumber === null ? 0 : p.lastEnqueuedSequenceNumber - p.beginSequenceNumber + 1;
      return h("tr", {},
        h("td", {}, p.partitionId),
        h("td", { class: "num" }, retained.toLocaleString()),
        h("td", { class: "num" }, p.lastEnqueuedSequenceNumber ?? "—"),
        h("td", { class: "nowrap", title: p.lastEnqueuedTimeUtc || "" }, p.lastEnqueuedTimeUtc ? ui.formatAgo(p.lastEnqueuedTimeUtc) : "—"));
    }), { testid: "partitions-table", caption: "Partitions" }));
    ui.ready(partitionsBody);
  }

  async function refreshErrors() {
    const list = (await app.api.get("/console/api/errors")).body || [];
    if (!list.length) return ui.empty(errorsBody, "No warnings or errors logged since the hub started.");
    replace(errorsBody, ui.table(["Time", "Level", "Message"], list.slice(0, 15).map((e) => h("tr", {},
      h("td", { class: "mono nowrap" }, ui.formatTime(e.timeUtc)),
      h("td", {}, ui.badge(e.level, e.level === "ERROR" ? "bad" : "warn")),
      h("td", {}, h("div", { class: "log-message" }, e.message), h("div", { class: "hint" }, e.target)))), { testid: "errors-table", caption: "Recent warnings and errors" }),
      list.length > 15 ? h("p", { class: "hint" }, `Showing the newest 15 of ${list.length}.`) : null);
    ui.ready(errorsBody);
  }

  async function refresh() {
    if (busy || stopped) return;
    busy = true;
    refreshBtn.disabled = true;
    const parts = [
      [refreshInfo, hubBody], [refreshStats, null], [refreshMetrics, trafficBody],
      [refreshPartitions, partitionsBody], [refreshErrors, errorsBody],
    ];
    const results = await Promise.allSettled(parts.map(([fn]) => fn()));
    if (stopped) return;
    results.forEach((res, i) => {
      if (res.status === "rejected") {
        const el = parts[i][1];
        if (el) ui.failed(el, res.reason);
        else { kpi.total.textContent = "—"; kpi.totalSub.textContent = ui.errorText(res.reason); }
      }
    });
    if (first) {
      first = false;
      if (results.every((x) => x.status === "rejected")) ui.failed(root, results[0].reason);
      else ui.ready(root);
    }
    updated.textContent = `Updated ${ui.formatTime(new Date().toISOString()).slice(11)}`;
    busy = false;
    refreshBtn.disabled = false;
  }

  refreshBtn.addEventListener("click", () => { refresh(); groups.load(); });
  const timer = setInterval(refresh, REFRESH_MS);
  app.onLeave(() => { stopped = true; clearInterval(timer); });
  await Promise.all([refresh(), groups.load()]);
  // A second metrics sample soon after the first, so rates show without waiting a whole period.
  const quick = setTimeout(() => { if (!stopped && !busy) refreshMetrics().catch((err) => ui.failed(trafficBody, err)); }, 1500);
  app.onLeave(() => clearTimeout(quick));
}
