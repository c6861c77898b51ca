// Devices: a plain search (lib/device-search.js) and the twin query language over
// POST /devices/query (paged server-side with x-ms-max-item-count / x-ms-continuation), create,
// enable/disable, delete, regenerate keys and connection strings; several devices at once
// through lib/device-bulk.js.
import {
  identityHash, createIdentityDialog, setStatus, deleteIdentity, showConnectionStrings, blockUnaddressable,
} from "../lib/identity.js";
import { h } from "../lib/ui.js";
import { searchForm } from "../lib/device-search.js";
import { bulkSelection } from "../lib/device-bulk.js";

const DEFAULT_QUERY = "SELECT * FROM devices";
const EXAMPLES = [
  ["All", DEFAULT_QUERY],
  ["Connected", "SELECT * FROM devices WHERE connectionState = 'Connected'"],
  ["Disabled", "SELECT * FROM devices WHERE status = 'disabled'"],
  ["Plug and Play", "SELECT * FROM devices WHERE IS_DEFINED(modelId) AND modelId != ''"],
];

const TAGS_SHOWN = 12; // a twin may hold many tags: the cell and its tooltip show the first ones

/** [["site", "lab"], ["location.floor", "2"]]: scalar tags under dotted paths, in twin order. */
function flattenTags(tags, prefix = "", out = []) {
  for (const [k, v] of Object.entries(tags || {})) {
    if (out.length > TAGS_SHOWN) break;
    const path = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) flattenTags(v, path, out);
    else out.push([path, typeof v === "string" ? v : JSON.stringify(v)]);
  }
  return out;
}

/** The Tags column: "key: value" pairs on one clipped line, one pair a line in the tooltip. */
function tagsCell(tags) {
  const pairs = flattenTags(tags);
  if (!pairs.length) return h("td", { class: "tags-cell muted", dataset: { testid: "tags" } }, "—");
  const more = pairs.length > TAGS_SHOWN;
  const shown = pairs.slice(0, TAGS_SHOWN);
  const lines = shown.map(([k, v]) => `${k}: ${v}`);
  return h("td", { class: "tags-cell", dataset: { testid: "tags" } },
    h("span", { class: "clip", title: lines.join("\n") + (more ? "\n…" : "") },
      shown.map(([k, v], i) => [i ? ", " : null, h("span", { class: "tag-key" }, `${k}:`), ` ${v}`]),
      more ? ", …" : null));
}

/** Two overlapping sheets: the copy icon (drawn, so no icon font or file is needed). */
function copyIcon() {
  return h("svg:svg", { viewBox: "0 0 16 16", width: "14", height: "14", "aria-hidden": "true", fill: "none", stroke: "currentColor", "stroke-width": "1.5" },
    h("svg:rect", { x: "5.5", y: "5.5", width: "8", height: "8", rx: "1.5" }),
    h("svg:path", { d: "M10.5 3.5v-1a1 1 0 0 0-1-1h-6a1 1 0 0 0-1 1v6a1 1 0 0 0 1 1h1" }));
}

export default async function render(root, app) {
  const ui = app.ui;
  const { replace } = ui;
  const canRead = app.can("RegistryRead") || app.can("ServiceConnect");
  const canWrite = app.can("RegistryWrite");
  const params = new URLSearchParams(sessionStorage.getItem("ferrohub.console.devices") || "");
  let query = params.get("q") || DEFAULT_QUERY;
  let pageSize = Number(params.get("n")) || 25;
  let findCriteria = {};
  try { findCriteria = JSON.parse(params.get("f") || "{}") || {}; } catch { /* a damaged entry: start empty */ }

  const queryInput = h("input", {
    type: "search", id: "device-query", value: query, spellcheck: "false", autocomplete: "off",
    dataset: { testid: "device-query" }, "aria-describedby": "device-query-hint",
  });
  const runBtn = h("button", { type: "submit", class: "btn btn-primary", dataset: { testid: "run-query" } }, "Run query");
  const sizeSelect = h("select", { "aria-label": "Rows per page", dataset: { testid: "page-size" } },
    [10, 25, 50, 100].map((n) => h("option", { value: String(n), selected: n === pageSize }, `${n} per page`)));
  const newBtn = ui.requireRight(h("button", { type: "button", class: "btn btn-primary", dataset: { testid: "new-device" } }, "New device"), app, "RegistryWrite");
  const listEl = h("div", { dataset: { testid: "device-list" } });
  const countEl = h("span", { class: "muted", dataset: { testid: "device-count" } });

  const pager = ui.pager({ fetchPage: loadPage, testid: "devices-pager" });
  // After a bulk action the page shown is read again (statuses, tags, deleted rows).
  const bulk = bulkSelection(app, { onDone: () => pager.refresh() });

  async function loadPage(continuation, { signal, isCurrent }) {
    ui.loading(listEl);
    bulk.reset(); // a selection is of the rows shown: the rows about to be drawn start with none
    const headers = { "x-ms-max-item-count": String(pageSize) };
    if (continuation) headers["x-ms-continuation"] = continuation;
    let r;
    try {
      r = await app.api.post("/devices/query", { query }, { headers, signal });
    } catch (err) {
      if (!isCurrent()) return null; // a newer query replaced this one
      ui.failed(listEl, err, err.status === 400 ? "The query was refused" : undefined);
      root.dataset.state = "error";
      return null;
    }
    if (!isCurrent()) return null;
    const rows = Array.isArray(r.body) ? r.body : [];
    const itemType = r.headers.get("x-ms-item-type") || "";
    if (!rows.length) {
      ui.empty(listEl, continuation ? "No more rows." : "No devices match this query.",
        !continuation && query === DEFAULT_QUERY && canWrite ? h("p", {}, "Create one with “New device”.") : null);
      root.dataset.state = "empty";
    } else {
      replace(listEl, itemType === "twin" && rows[0].deviceId !== undefined ? twinTable(rows) : rawTable(rows));
      ui.ready(listEl);
      root.dataset.state = "ready";
    }
    countEl.textContent = rows.length ? `${rows.length} row${rows.length === 1 ? "" : "s"} on this page` : "";
    return r.headers.get("x-ms-continuation");
  }

  function twinTable(rows) {
    const isModules = rows.some((t) => t.moduleId);
    // Bulk actions are on devices: a list of modules has no checkboxes.
    return ui.table(
      [isModules ? null : bulk.headCell(), isModules ? "Device / module" : "Device", "Status", "Connection", "Tags",
        h("th", { scope: "col", class: "hide-medium" }, "Auth"), "Last activity",
        h("th", { scope: "col", class: "hide-medium", title: "Cloud-to-device messages queued" }, "C2D"),
        h("span", { class: "sr-only" }, "Actions")].filter(Boolean),
      rows.map((t) => row(t, !isModules)), { testid: "devices-table", caption: "Devices", cards: true });
  }

  function row(t, selectable) {
    const id = t.deviceId;
    const mid = t.moduleId || null;
    const label = mid ? `${id}/${mid}` : id;
    const enabled = t.status !== "disabled";
    const actions = [];
    if (!mid) {
      const toggle = ui.requireRight(h("button", {
        type: "button", class: "btn btn-small", dataset: { testid: enabled ? "disable" : "enable" },
        "aria-label": `${enabled ? "Disable" : "Enable"} ${id}`,
      }, enabled ? "Disable" : "Enable"), app, "RegistryWrite");
      toggle.addEventListener("click", () => act(toggle, () => setStatus(app, id, enabled ? "disabled" : "enabled")));
      actions.push(toggle);
    }
    if (t.authenticationType === "sas") {
      // The dialog also regenerates keys.
      const cs = ui.requireRight(h("button", { type: "button", class: "btn btn-small", dataset: { testid: "conn-string" }, "aria-label": `Connection string and keys of ${label}` }, "Connection string"), app, "RegistryRead");
      cs.addEventListener("click", () => showConnectionStrings(app, id, mid));
      actions.push(cs);
    }
    const del = ui.requireRight(h("button", { type: "button", class: "btn btn-small btn-danger", dataset: { testid: "delete" }, "aria-label": `Delete ${label}` }, "Delete"), app, "RegistryWrite");
    del.addEventListener("click", async () => {
      try {
        if (await deleteIdentity(app, id, mid)) pager.refresh();
      } catch { /* toast shown */ }
    });
    actions.push(del);
    // An identity named "." or ".." is listed, but no request can address it (browsers collapse
    // the segment): its actions are disabled with the reason as their tooltip.
    const blocked = blockUnaddressable(actions, id, mid);
    const connected = t.connectionState === "Connected";
    return h("tr", { dataset: { testid: "device-row", deviceId: label } },
      selectable ? bulk.rowCell(id) : null,
      idCell(id, mid, label, blocked ? del.title : null, t.modelId),
      h("td", {}, ui.badge(enabled ? "enabled" : "disabled", enabled ? "ok" : "muted")),
      h("td", {}, ui.badge(connected ? "connected" : "disconnected", connected ? "info" : "muted")),
      tagsCell(t.tags),
      h("td", { class: "hide-narrow hide-medium" }, t.authenticationType || "—"),
      h("td", { title: t.lastActivityTime || "" }, ui.formatAgo(t.lastActivityTime)),
      h("td", { class: "num hide-narrow hide-medium" }, String(t.cloudToDeviceMessageCount ?? 0)),
      h("td", { class: "actions" }, actions));
  }

  // A long id is clipped to its column (the table must fit the window whatever the ids): the
  // full id is the tooltip, stays in the text (select, find in page) and has a copy button.
  function idCell(id, mid, label, blockedReason, modelId) {
    const name = blockedReason
      ? h("span", { class: "clip", title: blockedReason }, label)
      : h("a", { class: "clip", href: identityHash(id, mid), title: label, dataset: { testid: "device-link" } }, label);
    const copy = h("button", {
      type: "button", class: "btn-icon", title: "Copy the id", "aria-label": `Copy the id ${label}`, dataset: { testid: "copy-id" },
    }, copyIcon());
    copy.addEventListener("click", async () => {
      try {
        await ui.copyText(label);
        ui.toast("Copied to the clipboard", "ok", 2000);
      } catch (err) {
        ui.toast(`Could not copy: ${ui.errorText(err)}`, "error");
      }
    });
    return h("td", { class: "id-cell clip-cell" },
      h("div", { class: "id-line" }, name, copy),
      blockedReason ? h("div", { class: "hint" }, "not addressable from a browser") : null,
      modelId ? h("div", { class: "hint clip", title: modelId }, modelId) : null);
  }

  function rawTable(rows) {
    const keys = [...new Set(rows.flatMap((r) => (r && typeof r === "object" ? Object.keys(r) : ["value"])))].slice(0, 8);
    return ui.table(keys, rows.map((r) => h("tr", { dataset: { testid: "query-row" } }, keys.map((k) => {
      const v = r && typeof r === "object" ? r[k] : r;
      return h("td", { class: typeof v === "object" && v !== null ? "mono" : "" }, v === undefined ? "" : typeof v === "object" ? JSON.stringify(v) : String(v));
    }))), { testid: "query-table", caption: "Query result" });
  }

  async function act(button, fn) {
    button.disabled = true;
    try {
      await fn();
      await pager.refresh();
    } catch (err) {
      ui.toast(ui.errorText(err), "error");
      button.disabled = false;
    }
  }

  function run() {
    query = queryInput.value.trim() || DEFAULT_QUERY;
    pageSize = Number(sizeSelect.value);
    sessionStorage.setItem("ferrohub.console.devices", new URLSearchParams({
      q: query, n: String(pageSize), f: JSON.stringify(findCriteria),
    }).toString());
    return pager.reload();
  }

  const finder = searchForm({
    initial: findCriteria,
    onSearch: (q, criteria) => {
      // The generated query goes to the query box, where an expert can refine it.
      findCriteria = criteria;
      queryInput.value = q;
      run();
    },
  });
  const form = h("form", { class: "search-bar", role: "search", "aria-label": "Twin query" },
    h("label", { class: "sr-only", for: "device-query" }, "Twin query"), queryInput, sizeSelect, runBtn);
  form.addEventListener("submit", (e) => { e.preventDefault(); run(); });
  sizeSelect.addEventListener("change", run);
  newBtn.addEventListener("click", async () => {
    const created = await createIdentityDialog(app);
    if (created) await pager.reload();
  });

  replace(root,
    ui.pageHeader("Devices", "Find devices by id, state or tag, or with the twin query language; results are paged by the hub.", newBtn),
    h("section", { class: "card" },
      finder.el,
      form,
      h("p", { class: "hint query-hint", id: "device-query-hint" },
        "Find writes its query (IoT Hub query language) into this box: edit it and press Enter to refine."),
      h("div", { class: "row", style: { marginBottom: "12px" } },
        h("span", { class: "muted" }, "Examples:"),
        EXAMPLES.map(([label, q]) => h("button", {
          type: "button", class: "btn btn-small btn-link", onclick: () => { queryInput.value = q; run(); },
        }, label)),
        h("span", { class: "spacer" }), countEl),
      bulk.el,
      listEl,
      pager.el));
  if (!canRead) {
    ui.failed(root, Object.assign(new Error("Listing devices needs RegistryRead or ServiceConnect."), { status: 0 }), "Not allowed");
    return;
  }
  await pager.reload();
}
