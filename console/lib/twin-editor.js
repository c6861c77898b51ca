// The twin editor of the device and module pages: desired, reported and tags side by side.
// Desired and tags are edited as JSON; saving sends a merge patch of what changed (removed keys
// become null) with If-Match set to the etag the twin was loaded with, so a twin changed in the
// meantime is refused with 412 instead of being overwritten.
import { h, replace, jsonEditor, errorBox, toast, formatTime, loading, failed, ready, errorText } from "./ui.js";

// Twin keys are untrusted and may be "__proto__", "constructor" or "toString": results are built
// as prototype-less objects with own data properties (JSON.stringify still serialises them), and
// membership is tested with Object.hasOwn, never `in`.
const dict = () => Object.create(null);
const put = (obj, key, value) => Object.defineProperty(obj, key, { value, enumerable: true, writable: true, configurable: true });

/** Drops `$metadata` and `$version` (read-only) from a properties section. */
export function stripMeta(section) {
  const out = dict();
  for (const [k, v] of Object.entries(section || {})) if (k !== "$metadata" && k !== "$version") put(out, k, v);
  return out;
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

/** The JSON merge patch turning `before` into `after` (null removes a key); undefined when equal. */
export function mergePatch(before, after) {
  if (!isObject(before) || !isObject(after)) {
    return JSON.stringify(before) === JSON.stringify(after) ? undefined : after;
  }
  const patch = dict();
  let changed = false;
  for (const k of Object.keys(before)) {
    if (!Object.hasOwn(after, k)) { put(patch, k, null); changed = true; }
  }
  for (const [k, v] of Object.entries(after)) {
    if (!Object.hasOwn(before, k)) {
      put(patch, k, v);
      changed = true;
      continue;
    }
    const sub = mergePatch(before[k], v);
    if (sub !== undefined) { put(patch, k, sub); changed = true; }
  }
  return changed ? patch : undefined;
}

/**
 * Renders the twin editor into `el`. `onTwin(twin)` is told about every twin loaded (the page
 * uses it for the PnP view). Returns {reload()}.
 */
export function twinEditor(el, app, { path, onTwin = () => {} }) {
  const canWrite = app.can("ServiceConnect");
  let loaded = null; // {twin, etag, desired, tags}
  const meta = h("div", { class: "twin-meta", dataset: { testid: "twin-meta" } });
  const message = h("div", { dataset: { testid: "twin-message" } });
  const desired = jsonEditor({ label: "Desired properties", testid: "twin-desired", rows: 12, readOnly: !canWrite, hint: "Set by the back end; pushed to the device." });
  const reported = jsonEditor({ label: "Reported properties", testid: "twin-reported", rows: 12, readOnly: true, hint: "Read-only: set by the device." });
  const tags = jsonEditor({ label: "Tags", testid: "twin-tags", rows: 12, readOnly: !canWrite, hint: "Back-end only; the device never sees them." });
  const showMeta = h("input", { type: "checkbox", dataset: { testid: "twin-show-meta" } });
  const saveBtn = app.ui.requireRight(h("button", { type: "button", class: "btn btn-primary", dataset: { testid: "twin-save" } }, "Save changes"), app, "ServiceConnect");
  const reloadBtn = h("button", { type: "button", class: "btn", dataset: { testid: "twin-reload" } }, "Reload");
  const content = h("div", {});

  const updateButtons = () => {
    if (!canWrite) return;
    saveBtn.disabled = !(desired.valid() & tags.valid());
  };
  desired.onChange(updateButtons);
  tags.onChange(updateButtons);

  // Only the read-only reported view depends on "Show metadata"; ticking it must not reset
  // what the user typed in desired or tags.
  function showReported() {
    const rep = loaded?.twin.properties?.reported || {};
    reported.setValue(showMeta.checked ? rep : stripMeta(rep));
  }

  function show(twin, etag) {
    loaded = { twin, etag, desired: stripMeta(twin.properties?.desired), tags: twin.tags || {} };
    desired.setValue(loaded.desired);
    tags.setValue(loaded.tags);
    const rep = twin.properties?.reported || {};
    showReported();
    replace(meta,
      h("span", {}, "etag ", h("code", { dataset: { testid: "twin-etag" } }, etag || twin.etag || "—")),
      h("span", {}, `twin version ${twin.version ?? "—"}`),
      h("span", {}, `desired $version ${twin.properties?.desired?.$version ?? "—"}`),
      h("span", {}, `reported $version ${rep.$version ?? "—"}`),
      h("span", {}, `reported updated ${formatTime(rep.$metadata?.$lastUpdated)}`));
    updateButtons();
    onTwin(twin);
  }

  async function reload() {
    replace(message);
    const first = !loaded;
    if (first) loading(el);
    try {
      const r = await app.api.get(path);
      if (first) mount();
      show(r.body, (r.headers.get("etag") || "").replace(/^"|"$/g, "") || r.body.etag);
      ready(el);
    } catch (err) {
      if (first) failed(el, err);
      else replace(message, errorBox(err, "Could not reload the twin"));
    }
  }

  async function save() {
    replace(message);
    let d, t;
    try {
      d = desired.value;
      t = tags.value;
    } catch (e) {
      replace(message, errorBox(e, "Fix the JSON first"));
      return;
    }
    if (!isObject(d) || !isObject(t)) {
      replace(message, errorBox(new Error("Desired properties and tags must each be a JSON object."), "Not saved"));
      return;
    }
    const body = {};
    const dp = mergePatch(loaded.desired, d);
    const tp = mergePatch(loaded.tags, t);
    if (tp !== undefined) body.tags = tp;
    if (dp !== undefined) body.properties = { desired: dp };
    if (!Object.keys(body).length) {
      replace(message, h("div", { class: "ok-state" }, "Nothing changed."));
      return;
    }
    saveBtn.disabled = true;
    try {
      const r = await app.api.patch(path, body, { ifMatch: loaded.etag });
      show(r.body, (r.headers.get("etag") || "").replace(/^"|"$/g, "") || r.body.etag);
      replace(message, h("div", { class: "ok-state", dataset: { testid: "twin-saved" } },
        `Saved. Desired version is now ${r.body.properties?.desired?.$version ?? "?"}; a connected device gets the change as a desired-property patch.`));
      toast("Twin saved", "ok");
    } catch (err) {
      if (err.status === 412) {
        replace(message, h("div", { class: "error-state", role: "alert", dataset: { testid: "twin-conflict" } },
          h("strong", {}, "The twin changed since you loaded it (HTTP 412)"),
          h("p", { class: "error-text" }, errorText(err)),
          h("p", {}, "Nothing was saved. Reload to see the current twin (your edits will be replaced), then apply them again.")));
      } else {
        replace(message, errorBox(err, "The twin was not saved"));
      }
    } finally {
      updateButtons();
    }
  }

  function mount() {
    replace(el,
      content,
      meta,
      h("div", { class: "twin-grid" }, desired.el, reported.el, tags.el),
      message,
      h("div", { class: "row" },
        saveBtn, reloadBtn,
        h("label", { class: "check" }, showMeta, "Show metadata in reported"),
        canWrite ? null : h("span", { class: "muted" }, "Editing needs ServiceConnect.")));
  }

  saveBtn.addEventListener("click", save);
  reloadBtn.addEventListener("click", reload);
  showMeta.addEventListener("change", () => { if (loaded) showReported(); });
  reload();
  return { reload, get twin() { return loaded?.twin; } };
}
