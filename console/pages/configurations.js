// Configurations (#/configurations): automatic device configurations (GET /configurations),
// with the reconciler's system metrics (targeted / applied) and custom metrics; view, create
// (target condition, priority, desired content, metric queries, labels), edit what IoT Hub lets
// change after creation (etag-checked), delete.
import { h, replace, loading, failed, toast, dialog, confirm, jsonEditor, field, badge, table, pageHeader, formatTime, facts, errorText } from "../lib/ui.js";
import { seg } from "../lib/api.js";
import { useAdminCss, guard, btn, input, select, row, code, inlineError, section, emptyLine, jsonOf, stampId } from "../lib/admin-ui.js";

const WRITE = ["RegistryWrite"];

export default async function render(root, app) {
  useAdminCss();
  const body = h("div", { class: "admin-page" });
  const create = guard(btn("New configuration", () => edit(null), { kind: "primary", testid: "create-configuration" }), app, WRITE);
  const refresh = btn("Refresh", () => load(), { testid: "configurations-refresh" });
  replace(root, pageHeader("Configurations", "Automatic device configurations: desired properties applied to every twin a target condition selects.", refresh, create), body);

  let first = true;
  async function load() {
    if (first) {
      loading(body);
      root.dataset.state = "loading";
    }
    let list;
    try {
      list = (await app.api.get("/configurations", { query: { top: 100 } })).body || [];
    } catch (err) {
      if (!app.isCurrent()) return;
      failed(body, err, "Could not list the configurations");
      root.dataset.state = "error";
      return;
    }
    first = false;
    if (!app.isCurrent()) return;
    draw(list);
  }

  function draw(list) {
    if (!list.length) {
      root.dataset.state = "empty";
      replace(body, section("Configurations", [],
        emptyLine("No configurations yet. A configuration sets desired properties on every device twin its target condition selects; the highest priority wins.", "configurations-empty")));
      return;
    }
    root.dataset.state = "ready";
    const rows = list.map((c) => {
      const sys = (c.systemMetrics && c.systemMetrics.results) || {};
      const custom = Object.entries((c.metrics && c.metrics.results) || {});
      return row([
        ["Id", btn(c.id, () => view(c.id), { kind: "link", testid: `configuration-${c.id}`, title: "Details" })],
        ["Priority", String(c.priority)],
        ["Target", code(c.targetCondition || "*")],
        ["Targeted", h("span", { class: "num", dataset: { testid: `targeted-${c.id}` } }, String(sys.targetedCount ?? "—"))],
        ["Applied", h("span", { class: "num", dataset: { testid: `applied-${c.id}` } }, String(sys.appliedCount ?? "—"))],
        ["Metrics", custom.length ? h("span", { class: "chips" }, custom.map(([k, v]) => badge(`${k}: ${v}`, "info"))) : "—"],
        ["Created", formatTime(c.createdTimeUtc)],
        ["", h("div", { class: "row-actions" },
          guard(btn("Edit", () => edit(c), { small: true, testid: `edit-configuration-${c.id}` }), app, WRITE),
          guard(btn("Delete", () => remove(c), { small: true, kind: "danger", testid: `delete-configuration-${c.id}` }), app, WRITE)),
        "actions"],
      ], { dataset: { configuration: c.id } });
    });
    replace(body, section("Configurations", [h("span", { class: "hint" }, `${list.length} configuration${list.length === 1 ? "" : "s"}; metrics counted now`)],
      table(["Id", "Priority", "Target condition", "Targeted", "Applied", "Custom metrics", "Created", h("span", { class: "sr-only" }, "Actions")], rows,
        { testid: "configurations-table", caption: "Configurations" })));
  }

  async function view(id) {
    const box = h("div", {});
    loading(box);
    const open = dialog({ title: `Configuration ${id}`, body: box, wide: true, testid: "configuration-dialog", actions: [{ label: "Close", value: null, testid: "dialog-close" }] });
    try {
      const c = (await app.api.get(`/configurations/${seg(id)}`)).body;
      const sys = c.systemMetrics || {};
      const metrics = c.metrics || {};
      const labels = Object.entries(c.labels || {});
      replace(box,
        facts([
          ["Priority", String(c.priority)],
          ["Target condition", code(c.targetCondition || "*")],
          ["Labels", labels.length ? h("span", { class: "chips" }, labels.map(([k, v]) => badge(`${k}=${v}`, "muted"))) : "—"],
          ["Created", formatTime(c.createdTimeUtc)],
          ["Last updated", formatTime(c.lastUpdatedTimeUtc)],
          ["Etag", code(c.etag || "")],
        ], "configuration-facts"),
        h("h3", { class: "sub-title" }, "Metrics"),
        table(["Metric", "Count", "Query"], [
          ...Object.entries((sys.results) || {}).map(([k, v]) => row([["Metric", h("span", {}, k, " ", badge("system", "muted"))], ["Count", String(v)], ["Query", code((sys.queries || {})[k] || "")]])),
          ...Object.entries(metrics.results || {}).map(([k, v]) => row([["Metric", k], ["Count", String(v)], ["Query", code((metrics.queries || {})[k] || "")]])),
        ], { testid: "configuration-metrics" }),
        h("h3", { class: "sub-title" }, "Content"),
        h("pre", { class: "json-view", dataset: { testid: "configuration-content" } }, JSON.stringify(c.content || {}, null, 2)));
    } catch (err) {
      replace(box, inlineError(err));
    }
    await open;
  }

  async function edit(c) {
    const kindOf = c && c.content && c.content.moduleContent ? "moduleContent" : "deviceContent";
    const id = input({ value: c ? c.id : stampId("config"), testid: "configuration-id", disabled: Boolean(c) });
    const priority = input({ type: "number", value: String(c ? c.priority : 10), min: "0", testid: "configuration-priority" });
    const target = input({ value: c ? c.targetCondition : "", rows: 2, mono: true, testid: "configuration-target", placeholder: "tags.environment = 'prod'" });
    const kind = select([["deviceContent", "Device twins (deviceContent)"], ["moduleContent", "Module twins (moduleContent)"]], { value: kindOf, testid: "configuration-kind" });
    kind.disabled = Boolean(c);
    const content = jsonEditor({
      label: "Desired content: properties.desired paths to values", rows: 6, testid: "configuration-content-editor", readOnly: Boolean(c),
      value: c ? (c.content && c.content[kindOf]) || {} : { "properties.desired.settings": { interval: 30 } },
      hint: c ? "Content cannot change after creation (IoT Hub's rule): create a new configuration instead." : null,
    });
    const metrics = jsonEditor({
      label: "Custom metrics (name → query, at most 5)", rows: 4, testid: "configuration-metrics-editor",
      value: c ? (c.metrics && c.metrics.queries) || {} : {},
      hint: "e.g. {\"reported\": \"SELECT deviceId FROM devices WHERE properties.reported.settings.interval = 30\"}",
    });
    const labels = jsonEditor({ label: "Labels (name → text)", rows: 3, testid: "configuration-labels", value: c ? c.labels || {} : {} });
    const checkLine = h("div", { class: "check-result", dataset: { testid: "configuration-check-result" }, "aria-live": "polite" });
    const check = btn("Check queries", async () => {
      replace(checkLine);
      try {
        const r = await app.api.post("/configurations/testQueries", { targetCondition: target.value.trim(), customMetricQueries: jsonOf(metrics, "Custom metrics") });
        const errs = [];
        if (r.body.targetConditionError) errs.push(`Target condition: ${r.body.targetConditionError}`);
        for (const [k, v] of Object.entries(r.body.customMetricQueryErrors || {})) if (v) errs.push(`Metric ${k}: ${v}`);
        replace(checkLine, errs.length ? inlineError(new Error(errs.join(" · "))) : badge("Queries are valid", "ok"));
      } catch (err) {
        replace(checkLine, inlineError(err));
      }
    }, { small: true, testid: "configuration-check" });
    guard(check, app, ["RegistryRead"]);

    const saved = await dialog({
      title: c ? `Edit configuration ${c.id}` : "New configuration",
      testid: "configuration-edit-dialog",
      wide: true,
      body: h("div", { class: "form" },
        h("div", { class: "grid grid-2" }, field("Id", id), field("Priority", priority, "Higher wins; on a tie, the newer configuration.")),
        field("Target condition", target, "A WHERE condition on twins; empty or * targets every device; FROM devices.modules WHERE … for module twins."),
        field("Applies to", kind),
        content.el, metrics.el, labels.el,
        h("div", { class: "form-actions" }, check, checkLine)),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: c ? "Save" : "Create", kind: "primary", testid: "configuration-save",
          run: async () => {
            const cid = id.value.trim();
            if (!cid) throw new Error("The configuration needs an id.");
            const p = Number(priority.value);
            if (!Number.isInteger(p) || p < 0) throw new Error("Priority: a whole number from 0.");
            const doc = {
              id: cid, schemaVersion: "1.0", priority: p, targetCondition: target.value.trim(),
              labels: jsonOf(labels, "Labels"),
              content: c ? c.content : { [kind.value]: jsonOf(content, "Content") },
              metrics: { queries: jsonOf(metrics, "Custom metrics") },
            };
            if (c) await app.api.put(`/configurations/${seg(cid)}`, doc, { ifMatch: c.etag || "*" });
            else await app.api.put(`/configurations/${seg(cid)}`, doc);
            return cid;
          },
        },
      ],
    });
    if (saved) {
      toast(`Configuration ${saved} ${c ? "saved" : "created"}`, "ok");
      await load();
    }
  }

  async function remove(c) {
    const yes = await confirm(`Delete configuration ${c.id}?`,
      "Twins it applied to lose the desired properties it set (or get the next configuration's values).",
      { confirmLabel: "Delete", danger: true, testid: "confirm-delete" });
    if (!yes) return;
    try {
      await app.api.del(`/configurations/${seg(c.id)}`, { ifMatch: "*" });
      toast(`Deleted configuration ${c.id}`, "ok");
    } catch (err) {
      toast(`Could not delete ${c.id}: ${errorText(err)}`, "error");
    }
    await load();
  }

  await load();
}
