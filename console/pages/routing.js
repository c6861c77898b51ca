// Routing (#/routing): endpoints, routes, enrichments and the fallback route from GET /routing,
// edited through the routing API (docs/routing.md), and a "test this route" box that evaluates
// a condition against a sample message (POST /console/api/routing/test). Beside them, what
// routing did: each delivered endpoint's target, health (GET /routing/endpointsHealth), backlog
// and deliveries, and each route's matches, from the hub's metrics (GET /console/api/metrics);
// either read failing leaves those cells at "—", never the page.
import { h, replace, loading, failed, toast, dialog, confirm, jsonEditor, field, badge, table, pageHeader, errorText } from "../lib/ui.js";
import { seg } from "../lib/api.js";
import { parsePrometheus, total, quantile, formatSeconds } from "../lib/metrics.js";
import { useAdminCss, guard, btn, input, select, checkboxes, toggle, row, code, inlineError, section, emptyLine, jsonOf } from "../lib/admin-ui.js";

const SOURCES = ["DeviceMessages", "TwinChangeEvents", "DeviceLifecycleEvents", "DeviceConnectionStateEvents", "DigitalTwinChangeEvents"];
const WRITE = ["RegistryWrite"];
// The target kinds GET /routing shows on an endpoint, as the REST API names them.
const TARGETS = ["storageContainer", "webhook", "nats", "mqtt"];
const HEALTH_BADGE = { healthy: "ok", degraded: "warn", unhealthy: "bad", dead: "bad", unknown: "muted" };
// ferrohub_endpoint_deliveries_total outcomes shown beside `delivered`, in this order.
const NOT_DELIVERED = [["dead_lettered", "dead-lettered"], ["expired", "expired"], ["sent_to_fallback", "sent to fallback"], ["dropped", "dropped"]];

export default async function render(root, app) {
  useAdminCss();
  const body = h("div", { class: "admin-page routing-page" });
  const tester = testBox(app);
  const refresh = btn("Refresh", () => load(), { testid: "routing-refresh", small: true });
  replace(root, pageHeader("Routing", "Where device messages and hub events go: endpoints, routes, enrichments and the fallback route.", refresh), body);

  let first = true;
  async function load() {
    if (first) {
      loading(body);
      root.dataset.state = "loading";
      first = false;
    }
    let config, seen;
    try {
      [config, seen] = await Promise.all([app.api.get("/routing").then((r) => r.body), observed()]);
    } catch (err) {
      if (!app.isCurrent()) return;
      failed(body, err, "Could not read the routing configuration");
      root.dataset.state = "error";
      return;
    }
    if (app.isCurrent()) draw(config, seen);
  }

  /** Endpoint health by name and the metrics' samples, each null when it cannot be read. */
  async function observed() {
    const [health, samples] = await Promise.all([
      app.api.get("/routing/endpointsHealth")
        .then((r) => Object.fromEntries((r.body.value || []).map((x) => [x.endpointId, x])), () => null),
      app.api.get("/console/api/metrics").then((r) => parsePrometheus(r.body), () => null),
    ]);
    return { health, samples };
  }

  function draw(c, seen) {
    const routes = c.routes || [];
    const enrichments = c.enrichments || [];
    const endpoints = c.endpoints || [];
    const names = endpoints.map((e) => e.name);
    body.dataset.state = "ready";
    replace(body,
      fallbackSection(c, seen),
      routesSection(routes, names, seen),
      endpointsSection(endpoints, routes, enrichments, Boolean(c.fallbackRoute && c.fallbackRoute.isEnabled), seen),
      enrichmentsSection(enrichments, names),
      tester.el);
    const nothing = routes.length === 0 && enrichments.length === 0 && endpoints.length <= 1;
    root.dataset.state = nothing ? "empty" : "ready";
  }

  // -- fallback -----------------------------------------------------------------------------
  function fallbackSection(c, seen) {
    const on = Boolean(c.fallbackRoute && c.fallbackRoute.isEnabled);
    const t = toggle("Send device messages that no route matches to the built-in events endpoint", on, "fallback-toggle");
    guard(t.box, app, WRITE);
    if (t.box.disabled) t.el.title = t.box.title;
    t.box.addEventListener("change", async () => {
      t.box.disabled = true;
      try {
        await app.api.put("/routing/fallback", { isEnabled: t.box.checked });
        toast(`Fallback route ${t.box.checked ? "on" : "off"}`, "ok");
      } catch (err) {
        t.box.checked = !t.box.checked;
        toast(`Could not change the fallback: ${errorText(err)}`, "error");
      }
      t.box.disabled = false;
    });
    return section("Fallback route", [badge(on ? "on" : "off", on ? "ok" : "warn")],
      h("div", { class: "fallback-row" }, t.el),
      h("p", { class: "hint" }, "With it off, unmatched device messages are acknowledged and dropped. Hub events never use the fallback."),
      h("p", { class: "hint", dataset: { testid: "unmatched-counts" } }, unmatchedLine(seen.samples)));
  }

  function unmatchedLine(samples) {
    if (!samples) return "Counts of unmatched messages cannot be read now.";
    const count = (outcome) => total(samples, "ferrohub_routing_unmatched_total", (l) => l.outcome === outcome) ?? 0;
    return `Device messages no route matched since the hub started: ${count("fallback")} sent to events by the fallback route, ${count("orphaned")} dropped.`;
  }

  // -- routes --------------------------------------------------------------------------------
  function routesSection(routes, names, seen) {
    const add = guard(btn("Add route", () => editRoute(null, names), { kind: "primary", small: true, testid: "add-route" }), app, WRITE);
    if (!routes.length) {
      return section("Routes", [add], emptyLine("No routes: every device message goes to the built-in events endpoint through the fallback route.", "routes-empty"));
    }
    const rows = routes.map((r) => row([
      ["Name", h("strong", {}, r.name)],
      ["Source", r.source],
      ["Condition", code(r.condition)],
      ["Endpoints", r.endpointNames.join(", ")],
      ["Enabled", badge(r.isEnabled ? "enabled" : "disabled", r.isEnabled ? "ok" : "muted")],
      ["Matched", counted(seen.samples, "ferrohub_route_matched_total", (l) => l.route === r.name), "num"],
      ["", h("div", { class: "row-actions" },
        btn("Test", () => tester.prefill(r.condition), { small: true, testid: `test-route-${r.name}`, title: "Evaluate this condition against a sample message" }),
        guard(btn("Edit", () => editRoute(r, names), { small: true, testid: `edit-route-${r.name}` }), app, WRITE),
        guard(btn("Delete", () => remove("route", () => `/routing/routes/${seg(r.name)}`, r.name), { small: true, kind: "danger", testid: `delete-route-${r.name}` }), app, WRITE)),
      "actions"],
    ], { dataset: { route: r.name } }));
    return section("Routes", [add], table(["Name", "Source", "Condition", "Endpoints", "Enabled", "Matched", h("span", { class: "sr-only" }, "Actions")], rows, { testid: "routes-table", caption: "Routes" }),
      h("p", { class: "hint" }, "Matched: messages and events each route matched since the hub started (the cluster's writer, in a cluster)."));
  }

  async function editRoute(r, names) {
    const name = input({ value: r ? r.name : "", testid: "route-name", disabled: Boolean(r), required: true, placeholder: "alerts" });
    const source = select(SOURCES, { value: r ? r.source : "DeviceMessages", testid: "route-source" });
    const condition = input({ value: r ? r.condition : "true", rows: 3, mono: true, testid: "route-condition" });
    const eps = checkboxes("Endpoints", names, r ? r.endpointNames : ["events"], "route-endpoint");
    const enabled = toggle("Enabled", r ? r.isEnabled : true, "route-enabled");
    const saved = await dialog({
      title: r ? `Edit route ${r.name}` : "Add a route",
      testid: "route-dialog",
      body: h("div", { class: "form" },
        field("Name", name),
        field("Source", source),
        field("Condition", condition, "IoT Hub routing query: $body.temp > 30 AND level = 'high'. \"true\" matches everything."),
        eps.el, enabled.el),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: r ? "Save route" : "Add route", kind: "primary", testid: "route-save",
          run: async () => {
            const n = name.value.trim();
            if (!n) throw new Error("The route needs a name.");
            if (!eps.values().length) throw new Error("Choose at least one endpoint.");
            await app.api.put(`/routing/routes/${seg(n)}`, {
              source: source.value, condition: condition.value.trim() || "true",
              endpointNames: eps.values(), isEnabled: enabled.box.checked,
            });
            return n;
          },
        },
      ],
    });
    if (saved) {
      toast(`Route ${saved} saved`, "ok");
      await load();
    }
  }

  // -- endpoints -----------------------------------------------------------------------------
  function endpointsSection(endpoints, routes, enrichments, fallbackOn, seen) {
    const add = guard(btn("Add endpoint", addEndpoint, { kind: "primary", small: true, testid: "add-endpoint" }), app, WRITE);
    const users = (n) => [
      ...routes.filter((r) => r.endpointNames.includes(n)).map((r) => `route ${r.name}`),
      ...enrichments.filter((e) => e.endpointNames.includes(n)).map((e) => `enrichment ${e.key}`),
    ];
    const rows = endpoints.map((e) => {
      const builtin = e.name === "events";
      const used = users(e.name);
      const shown = builtin && fallbackOn ? [...used, "fallback route"] : used;
      const del = builtin ? null : guard(btn("Delete", () => remove("endpoint", () => `/routing/endpoints/${seg(e.name)}`, e.name,
        "Its stored events are deleted too."), { small: true, kind: "danger", testid: `delete-endpoint-${e.name}` }), app, WRITE);
      if (del && !del.disabled && used.length) {
        del.disabled = true;
        del.title = `In use by ${used.join(", ")}`;
      }
      return row([
        ["Name", h("span", {}, h("strong", {}, e.name), builtin ? [" ", badge("built-in", "info")] : null)],
        ["Partitions", String(e.partitionCount)],
        ["Target", targetOf(e)],
        ["Health", healthOf(e, seen.health)],
        ["Backlog", e[kindOf(e)] ? counted(seen.samples, "ferrohub_endpoint_backlog_events", (l) => l.endpoint === e.name) : "—", "num"],
        ["Deliveries", e[kindOf(e)] ? deliveriesOf(e.name, seen.samples) : "—"],
        ["Used by", shown.length ? shown.join(", ") : "—"],
        ["Read at", code(builtin ? "/events/…" : `/endpoints/${e.name}/…`)],
        ["", h("div", { class: "row-actions" }, del), "actions"],
      ], { dataset: { endpoint: e.name } });
    });
    return section("Endpoints", [add],
      table(["Name", "Partitions", "Target", "Health", "Backlog", "Deliveries", "Used by", "Read API", h("span", { class: "sr-only" }, "Actions")], rows, { testid: "endpoints-table", caption: "Endpoints" }),
      h("p", { class: "hint" }, "Custom endpoints are Event Hubs-compatible streams inside the hub, read with the same read API as events. One with a target also hands its events to a receiver outside the hub: its backlog is what that receiver has not accepted yet."));
  }

  function kindOf(e) {
    return TARGETS.find((k) => e[k]) || null;
  }

  function targetOf(e) {
    const kind = kindOf(e);
    if (!kind) return e.name === "events" ? "inside the hub" : "inside the hub (read API)";
    const t = e[kind];
    return h("span", { dataset: { testid: `target-${e.name}` } }, badge(kind, "info"), " ", code(t.url || t.containerName || ""));
  }

  function healthOf(e, health) {
    if (!kindOf(e)) return "—";
    const x = health && health[e.name];
    if (!x) return "—";
    const status = x.healthStatus;
    const el = h("span", { dataset: { testid: `health-${e.name}` } }, badge(status, HEALTH_BADGE[status] || "muted"));
    if (x.lastKnownError) el.title = `Last error: ${x.lastKnownError}`;
    return el;
  }

  function deliveriesOf(name, samples) {
    if (!samples) return "—";
    const of = (outcome) => total(samples, "ferrohub_endpoint_deliveries_total", (l) => l.endpoint === name && l.outcome === outcome) ?? 0;
    const parts = [`${of("delivered")} delivered`];
    for (const [outcome, label] of NOT_DELIVERED) {
      const n = of(outcome);
      if (n) parts.push(`${n} ${label}`);
    }
    const latency = latencyOf(name, samples);
    if (latency) parts.push(latency);
    return h("span", { dataset: { testid: `deliveries-${name}` } }, parts.join(" · "));
  }

  /** "latency p50 … / p99 …" since the hub started, from enqueueing to acceptance; null before any. */
  function latencyOf(name, samples) {
    const base = "ferrohub_endpoint_delivery_latency_seconds";
    const mine = { [`${base}_bucket`]: (samples[`${base}_bucket`] || []).filter((s) => s.labels.endpoint === name) };
    const p50 = quantile(null, mine, base, 0.5), p99 = quantile(null, mine, base, 0.99);
    if (!p50 || !p99) return null;
    const shown = (q) => (q.over ? `over ${formatSeconds(q.value)}` : formatSeconds(q.value));
    return `latency p50 ${shown(p50)} / p99 ${shown(p99)}`;
  }

  /** A counter or gauge summed over the samples `filter` keeps: 0 when absent, "—" without samples. */
  function counted(samples, metric, filter) {
    return samples ? String(total(samples, metric, filter) ?? 0) : "—";
  }

  async function addEndpoint() {
    const name = input({ testid: "endpoint-name", required: true, placeholder: "hot" });
    const parts = input({ type: "number", value: "1", min: "1", max: "32", testid: "endpoint-partitions" });
    const saved = await dialog({
      title: "Add an endpoint",
      testid: "endpoint-dialog",
      body: h("div", { class: "form" }, field("Name", name), field("Partitions", parts, "1 to 32; a device's messages keep their order within a partition.")),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: "Add endpoint", kind: "primary", testid: "endpoint-save",
          run: async () => {
            const n = name.value.trim();
            const p = Number(parts.value);
            if (!n) throw new Error("The endpoint needs a name.");
            if (!Number.isInteger(p) || p < 1 || p > 32) throw new Error("Partitions: a whole number from 1 to 32.");
            await app.api.put(`/routing/endpoints/${seg(n)}`, { partitionCount: p });
            return n;
          },
        },
      ],
    });
    if (saved) {
      toast(`Endpoint ${saved} created`, "ok");
      await load();
    }
  }

  // -- enrichments ---------------------------------------------------------------------------
  function enrichmentsSection(enrichments, names) {
    const add = guard(btn("Add enrichment", () => editEnrichment(null, names), { kind: "primary", small: true, testid: "add-enrichment" }), app, WRITE);
    if (!enrichments.length) {
      return section("Enrichments", [add], emptyLine("No enrichments. An enrichment adds an application property (a static value, $iothubname or a twin reference) to the messages sent to its endpoints.", "enrichments-empty"));
    }
    const rows = enrichments.map((e) => row([
      ["Property", h("strong", {}, e.key)],
      ["Value", code(e.value)],
      ["Endpoints", e.endpointNames.join(", ")],
      ["", h("div", { class: "row-actions" },
        guard(btn("Edit", () => editEnrichment(e, names), { small: true, testid: `edit-enrichment-${e.key}` }), app, WRITE),
        guard(btn("Delete", () => remove("enrichment", () => `/routing/enrichments/${seg(e.key)}`, e.key), { small: true, kind: "danger", testid: `delete-enrichment-${e.key}` }), app, WRITE)),
      "actions"],
    ], { dataset: { enrichment: e.key } }));
    return section("Enrichments", [add], table(["Property", "Value", "Endpoints", h("span", { class: "sr-only" }, "Actions")], rows, { testid: "enrichments-table", caption: "Enrichments" }));
  }

  async function editEnrichment(e, names) {
    const key = input({ value: e ? e.key : "", testid: "enrichment-key", disabled: Boolean(e), placeholder: "site" });
    const value = input({ value: e ? e.value : "", testid: "enrichment-value", mono: true, placeholder: "$twin.tags.site" });
    const eps = checkboxes("Endpoints", names, e ? e.endpointNames : ["events"], "enrichment-endpoint");
    const saved = await dialog({
      title: e ? `Edit enrichment ${e.key}` : "Add an enrichment",
      testid: "enrichment-dialog",
      body: h("div", { class: "form" },
        field("Application property", key),
        field("Value", value, "A static value, $iothubname, or a twin reference such as $twin.tags.site or $twin.properties.desired.x."),
        eps.el),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: e ? "Save enrichment" : "Add enrichment", kind: "primary", testid: "enrichment-save",
          run: async () => {
            const k = key.value.trim();
            if (!k) throw new Error("The enrichment needs a property name.");
            if (!value.value) throw new Error("The enrichment needs a value.");
            if (!eps.values().length) throw new Error("Choose at least one endpoint.");
            await app.api.put(`/routing/enrichments/${seg(k)}`, { value: value.value, endpointNames: eps.values() });
            return k;
          },
        },
      ],
    });
    if (saved) {
      toast(`Enrichment ${saved} saved`, "ok");
      await load();
    }
  }

  /** Asks, then deletes `pathOf()` (a function: seg() refuses "." and ".." before anything is asked). */
  async function remove(kind, pathOf, name, extra = "") {
    let path;
    try {
      path = pathOf();
    } catch (err) {
      toast(`Cannot delete ${kind} ${name}: ${errorText(err)}`, "error");
      return;
    }
    const yes = await confirm(`Delete ${kind} ${name}?`, `The ${kind} ${name} is removed at once. ${extra}`.trim(), { confirmLabel: "Delete", danger: true, testid: "confirm-delete" });
    if (!yes) return;
    try {
      await app.api.del(path);
      toast(`Deleted ${kind} ${name}`, "ok");
    } catch (err) {
      toast(`Could not delete ${kind} ${name}: ${errorText(err)}`, "error");
    }
    await load();
  }

  await load();
}

/** The "test this route" box: condition + sample message (+ twin) → true / false / parse error. */
function testBox(app) {
  const condition = input({ value: "true", rows: 2, mono: true, testid: "route-test-condition" });
  const body = input({ value: '{"temperature": 35}', rows: 4, mono: true, testid: "route-test-body" });
  const props = jsonEditor({ label: "Application properties (JSON object of strings)", value: {}, rows: 3, testid: "route-test-props" });
  const contentType = input({ value: "application/json", testid: "route-test-content-type" });
  const contentEncoding = input({ value: "utf-8", testid: "route-test-content-encoding" });
  const twin = jsonEditor({ label: "Device twin (optional, for $twin references)", value: "", rows: 4, allowEmpty: true, testid: "route-test-twin",
    hint: 'e.g. {"tags": {"site": "lab"}, "properties": {"desired": {}, "reported": {}}}' });
  const result = h("div", { class: "test-result", dataset: { testid: "route-test-result" }, "aria-live": "polite" });
  const run = guard(btn("Evaluate", evaluate, { kind: "primary", testid: "route-test-run" }), app, ["RegistryRead"]);

  async function evaluate() {
    replace(result);
    delete result.dataset.result;
    let appProperties;
    let twinValue;
    try {
      appProperties = jsonOf(props, "Application properties");
      if (!appProperties || typeof appProperties !== "object" || Array.isArray(appProperties)) throw new Error("Application properties: a JSON object is expected.");
      for (const [k, v] of Object.entries(appProperties)) if (typeof v !== "string") appProperties[k] = typeof v === "object" ? JSON.stringify(v) : String(v);
      twinValue = jsonOf(twin, "Twin");
    } catch (err) {
      result.dataset.result = "error";
      replace(result, inlineError(err));
      return;
    }
    const request = {
      condition: condition.value,
      message: {
        body: body.value,
        appProperties,
        systemProperties: { contentType: contentType.value, contentEncoding: contentEncoding.value },
      },
    };
    if (twinValue) request.twin = twinValue;
    run.disabled = true;
    try {
      const r = await app.api.post("/console/api/routing/test", request);
      const v = String(r.body && r.body.result);
      result.dataset.result = v;
      replace(result, h("span", { class: "result-label" }, "Result"), badge(v, v === "true" ? "ok" : "bad"),
        h("span", { class: "hint" }, v === "true" ? "The route would send this message to its endpoints." : "The route would not match this message."));
    } catch (err) {
      result.dataset.result = "error";
      replace(result, inlineError(err, "route-test-error"));
    } finally {
      run.disabled = false;
    }
  }

  const el = section("Test a route", [],
    h("p", { class: "hint" }, "Evaluates a condition against a sample message, as the hub's router does. Use Test on a route to copy its condition here."),
    h("div", { class: "form test-form" },
      field("Condition", condition),
      h("div", { class: "grid grid-2" },
        h("div", {}, field("Message body", body), h("div", { class: "grid grid-2" }, field("Content type", contentType), field("Content encoding", contentEncoding))),
        h("div", {}, props.el, twin.el)),
      h("div", { class: "form-actions" }, run, result)));
  el.id = "route-test";
  return {
    el,
    prefill(text) {
      condition.value = text;
      el.scrollIntoView({ behavior: "smooth", block: "start" });
      condition.focus({ preventScroll: true });
    },
  };
}
