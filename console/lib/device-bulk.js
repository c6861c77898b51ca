// Several devices at once on the Devices page (issue 69, point 4): a checkbox per row, "select
// all on this page", and Enable, Disable, Delete and Tag on the selection.
//
// Enable, disable and delete go through the hub's bulk registry API, POST /devices with IoT
// Hub's ExportImportDevice items (at most 100 a request); the hub applies the good items and
// answers 400 listing each refused one. Tag is a twin PATCH per device. Whatever fails is listed
// device by device under the buttons, with the hub's reason: nothing fails silently.
import { h, replace, confirm, dialog, field, errorText, requireRight } from "./ui.js";
import { identityPath, twinPath, unaddressable } from "./identity.js";

/** Items the hub takes in one POST /devices (IoT Hub's limit too). */
export const BULK_MAX = 100;
/** Requests in flight at once for the per-device reads and twin patches. */
const PARALLEL = 8;

/** Runs `fn` on every item, `limit` at a time; resolves with [{item, value} | {item, error}]. */
export async function eachLimited(items, limit, fn) {
  const out = new Array(items.length);
  let next = 0;
  async function worker() {
    while (next < items.length) {
      const i = next++;
      try {
        out[i] = { item: items[i], value: await fn(items[i]) };
      } catch (error) {
        out[i] = { item: items[i], error };
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/** The failures a bulk answer lists: [{deviceId, reason}] from its `errors` items. */
function bulkErrors(body) {
  const errors = body && Array.isArray(body.errors) ? body.errors : [];
  return errors.map((e) => ({
    deviceId: String(e?.deviceId ?? ""),
    reason: `${e?.errorCode || "Error"}: ${e?.errorStatus || "refused"}`,
  }));
}

/**
 * Sends bulk items, BULK_MAX a request. Resolves with the devices that failed: those the hub's
 * 400 lists, or every device of a request refused as a whole (no rights, too many, no answer).
 */
export async function postBulk(api, items) {
  const failures = [];
  for (let i = 0; i < items.length; i += BULK_MAX) {
    const chunk = items.slice(i, i + BULK_MAX);
    try {
      await api.post("/devices", chunk);
    } catch (err) {
      const listed = err?.status === 400 ? bulkErrors(err.body) : [];
      failures.push(...(listed.length ? listed : chunk.map((it) => ({ deviceId: it.id, reason: errorText(err) }))));
    }
  }
  return failures;
}

/**
 * The bulk item setting `status` on a device read just before. The whole identity goes back:
 * an update replaces authentication, capabilities, scopes and status reason, so one left out
 * would be reset (an X.509 device would turn into a key device, its thumbprints lost). With
 * updateIfMatchETag a device changed since it was read is refused, not overwritten.
 */
export function statusItem(identity, status) {
  return { ...identity, id: identity.deviceId, importMode: "updateIfMatchETag", eTag: identity.etag, status };
}

/** Enables or disables devices: reads each (GET /devices/{id}), then one bulk update. */
async function setStatuses(api, ids, status) {
  const read = await eachLimited(ids, PARALLEL, async (id) => (await api.get(identityPath(id))).body);
  const failures = read.filter((r) => r.error).map((r) => ({ deviceId: r.item, reason: errorText(r.error) }));
  const items = read.filter((r) => !r.error).map((r) => statusItem(r.value, status));
  return failures.concat(await postBulk(api, items));
}

/** Deletes devices (with their modules and twins) in bulk. */
function deleteAll(api, ids) {
  return postBulk(api, ids.map((id) => ({ id, importMode: "delete" })));
}

/**
 * {tags: {...}} setting one tag; a dotted name is a nested tag ("location.floor" is
 * {location: {floor: v}}), as the search form reads it. Throws on an empty part.
 */
export function tagPatch(name, value) {
  const parts = name.split(".");
  if (parts.some((p) => !p)) throw new Error(`The tag name “${name}” has an empty part (two dots, or a dot at an end).`);
  // Objects without a prototype: a part named "__proto__" stays a plain key.
  const tags = Object.create(null);
  let at = tags;
  parts.slice(0, -1).forEach((p) => { at = at[p] = Object.create(null); });
  at[parts[parts.length - 1]] = value;
  return { tags };
}

/** Merges one tag into each device's twin (PATCH /twins/{id}); resolves with the failures. */
async function tagAll(api, ids, patch) {
  const done = await eachLimited(ids, PARALLEL, (id) => api.patch(twinPath(id), patch));
  return done.filter((r) => r.error).map((r) => ({ deviceId: r.item, reason: errorText(r.error) }));
}

/** Asks for a tag's name and value; resolves with the patch, or null when cancelled. */
function askTag(count) {
  const name = h("input", { type: "text", spellcheck: "false", autocomplete: "off", maxlength: "256", placeholder: "site", dataset: { testid: "bulk-tag-name" } });
  const value = h("input", { type: "text", spellcheck: "false", autocomplete: "off", maxlength: "512", placeholder: "lab", dataset: { testid: "bulk-tag-value" } });
  return dialog({
    title: `Tag ${plural(count)}`,
    testid: "bulk-tag-dialog",
    body: h("div", {},
      field("Tag name", name, "A dotted name sets a nested tag: location.floor"),
      field("Value", value, "Stored as a string; the device's other tags are kept.")),
    actions: [
      { label: "Cancel", value: null, testid: "bulk-tag-cancel" },
      {
        label: "Set tag", kind: "primary", testid: "bulk-tag-submit",
        run: async () => {
          const n = name.value.trim();
          if (!n) throw new Error("Enter the tag's name.");
          return tagPatch(n, value.value);
        },
      },
    ],
  });
}

function plural(n) {
  return `${n} device${n === 1 ? "" : "s"}`;
}

/** "a, b, c and 4 more": the first ids of a selection, for a confirmation. */
function someIds(ids, shown = 5) {
  const head = ids.slice(0, shown).join(", ");
  return ids.length > shown ? `${head} and ${ids.length - shown} more` : head;
}

/** The outcome of an action: a success line, or each failed device with the hub's reason. */
function outcome(el, done, total, failures, onDismiss) {
  const dismiss = h("button", { type: "button", class: "btn btn-small btn-link", dataset: { testid: "bulk-dismiss" }, onclick: onDismiss }, "Dismiss");
  const ok = total - new Set(failures.map((f) => f.deviceId)).size;
  el.dataset.state = failures.length ? (ok > 0 ? "partial" : "failed") : "ok";
  if (!failures.length) {
    replace(el, h("div", { class: "result-box bulk-outcome", role: "status" }, h("strong", {}, `${done} ${plural(total)}.`), " ", dismiss));
    return;
  }
  replace(el, h("div", { class: "error-state bulk-outcome", role: "alert" },
    h("strong", {}, `${done} ${ok} of ${plural(total)}; ${failures.length} failed:`),
    h("ul", { class: "bulk-failures" }, failures.map((f) => h("li", { dataset: { testid: "bulk-failure", deviceId: f.deviceId } },
      h("span", { class: "mono" }, f.deviceId), ": ", f.reason))),
    dismiss));
}

function actionButton(label, testid, kind) {
  return h("button", { type: "button", class: ["btn", "btn-small", kind], dataset: { testid } }, label);
}

/**
 * The selection of a devices table and its action bar:
 *   const bulk = bulkSelection(app, {onDone: () => pager.refresh()});
 *   bulk.reset() before a page of rows is drawn; bulk.headCell() as the table's first head,
 *   bulk.rowCell(deviceId) as each row's first cell; bulk.el above the table.
 * The selection is the ticked rows of the page shown: a reload (after every action) clears it.
 */
export function bulkSelection(app, { onDone }) {
  const selected = new Set();
  let boxes = new Map(); // device id -> its row's checkbox, on the page shown
  let busy = false;
  const headBox = h("input", { type: "checkbox", "aria-label": "Select all devices on this page", dataset: { testid: "select-all" } });
  const count = h("span", { class: "muted", dataset: { testid: "bulk-count" } });
  const result = h("div", { class: "bulk-result", dataset: { testid: "bulk-result" } });
  const buttons = [
    // Enabling or disabling reads each device first (RegistryRead) to send its authentication back.
    requireRight(actionButton("Enable", "bulk-enable"), app, ["RegistryRead", "RegistryWrite"]),
    requireRight(actionButton("Disable", "bulk-disable"), app, ["RegistryRead", "RegistryWrite"]),
    // A twin write is ServiceConnect on the hub, as on IoT Hub (RegistryWrite is not enough).
    requireRight(actionButton("Tag…", "bulk-tag"), app, "ServiceConnect"),
    requireRight(actionButton("Delete…", "bulk-delete", "btn-danger"), app, "RegistryWrite"),
  ];
  const [enableBtn, disableBtn, tagBtn, deleteBtn] = buttons;

  function sync() {
    const n = selected.size;
    count.textContent = n ? `${plural(n)} selected` : "Tick devices to act on several at once";
    for (const b of buttons) b.disabled = busy || n === 0 || b.classList.contains("needs-right");
    const enabled = [...boxes.values()].filter((b) => !b.disabled);
    headBox.disabled = busy || enabled.length === 0;
    headBox.checked = enabled.length > 0 && enabled.every((b) => b.checked);
    headBox.indeterminate = n > 0 && !headBox.checked;
  }

  headBox.addEventListener("change", () => {
    for (const [id, box] of boxes) {
      if (box.disabled) continue;
      box.checked = headBox.checked;
      if (headBox.checked) selected.add(id);
      else selected.delete(id);
    }
    sync();
  });

  async function run(done, work) {
    const ids = [...selected];
    busy = true;
    sync();
    result.dataset.state = "loading";
    replace(result, h("div", { class: "state loading-state", role: "status" }, h("span", { class: "spinner", "aria-hidden": "true" }), `Working on ${plural(ids.length)}…`));
    let failures;
    try {
      failures = await work(ids);
    } catch (err) { // not expected (each step reports per device), but never silent
      failures = ids.map((id) => ({ deviceId: id, reason: errorText(err) }));
    }
    outcome(result, done, ids.length, failures, () => { replace(result); delete result.dataset.state; });
    busy = false;
    await onDone();
    sync();
  }

  enableBtn.addEventListener("click", () => run("Enabled", (ids) => setStatuses(app.api, ids, "enabled")));
  disableBtn.addEventListener("click", () => run("Disabled", (ids) => setStatuses(app.api, ids, "disabled")));
  tagBtn.addEventListener("click", async () => {
    const patch = await askTag(selected.size);
    if (patch) await run("Tagged", (ids) => tagAll(app.api, ids, patch));
  });
  deleteBtn.addEventListener("click", async () => {
    const ids = [...selected];
    const ok = await confirm(`Delete ${plural(ids.length)}?`,
      `${someIds(ids)}: each identity, its modules and its twin are removed, and a connected device is disconnected. It cannot be undone.`,
      { confirmLabel: `Delete ${plural(ids.length)}`, danger: true, testid: "confirm-bulk-delete" });
    if (ok) await run("Deleted", (list) => deleteAll(app.api, list));
  });

  sync();
  return {
    el: h("div", { class: "bulk-bar", role: "group", "aria-label": "Act on the selected devices", dataset: { testid: "bulk-bar" } },
      h("div", { class: "bulk-actions" }, count, h("span", { class: "spacer" }), buttons),
      result),
    reset() {
      selected.clear();
      boxes = new Map();
      sync();
    },
    headCell() {
      return h("th", { scope: "col", class: "select-cell" }, headBox);
    },
    rowCell(deviceId) {
      // "." and ".." cannot be read or patched from a browser (see lib/api.js seg()).
      const reason = unaddressable(deviceId);
      const box = h("input", {
        type: "checkbox", "aria-label": `Select ${deviceId}`, disabled: Boolean(reason), title: reason || undefined,
        dataset: { testid: "select-device" },
      });
      box.addEventListener("change", () => {
        if (box.checked) selected.add(deviceId);
        else selected.delete(deviceId);
        sync();
      });
      boxes.set(deviceId, box);
      sync();
      return h("td", { class: "select-cell", dataset: { label: "Select" } }, box);
    },
  };
}
