// Helpers shared by the admin pages (routing, jobs, configurations, certificates, policies),
// on top of lib/ui.js. Same rule: no innerHTML, untrusted strings only become text nodes.
import { h, replace, errorText, field, requireRight, missingRights } from "./ui.js";

/** Loads console/admin.css once (a <link>, allowed by style-src 'self'). */
export function useAdminCss() {
  if (document.querySelector("link[data-admin-css]")) return;
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = new URL("../admin.css", import.meta.url).pathname;
  link.dataset.adminCss = "";
  document.head.appendChild(link);
}

/**
 * Disables `el` unless the policy holds the rights: guard(btn, app, ["RegistryWrite"]),
 * guard(btn, app, ["ServiceConnect", "RegistryWrite"], "any"). The tooltip names what is missing.
 * The same function as ui.requireRight (one implementation).
 */
export function guard(el, app, rights, mode = "all") {
  return requireRight(el, app, rights, mode);
}

export function allowed(app, rights, mode = "all") {
  return missingRights(app, rights, mode).length === 0;
}

/** A button: btn("Add route", fn, {kind: "primary", testid, small}). */
export function btn(label, onclick, { kind = "", testid, small = false, title, type = "button" } = {}) {
  return h("button", {
    type, class: ["btn", kind ? `btn-${kind}` : "", small ? "btn-small" : ""],
    dataset: testid ? { testid } : undefined, title, onclick,
  }, label);
}

/** A text input (or textarea when rows is given). */
export function input({ value = "", placeholder, testid, rows, type = "text", required, min, max, mono, id, disabled, autocomplete = "off" } = {}) {
  const attrs = {
    class: [rows ? "textarea" : "input", mono ? "mono" : ""], placeholder, required, min, max, id, disabled,
    dataset: testid ? { testid } : undefined, spellcheck: "false", autocomplete,
  };
  const el = rows ? h("textarea", { ...attrs, rows }) : h("input", { ...attrs, type });
  el.value = value;
  return el;
}

/** A <select> of options (strings or [value, label]). */
export function select(options, { value, testid, id } = {}) {
  const el = h("select", { class: "select", id, dataset: testid ? { testid } : undefined },
    options.map((o) => {
      const [v, l] = Array.isArray(o) ? o : [o, o];
      return h("option", { value: v }, l);
    }));
  if (value !== undefined) el.value = value;
  return el;
}

/**
 * A group of checkboxes, one per name: {el, values()}. `checked` names start ticked.
 */
export function checkboxes(legend, names, checked = [], testid = "checks") {
  const boxes = names.map((n) => {
    const box = h("input", { type: "checkbox", value: n, checked: checked.includes(n), dataset: { testid: `${testid}-${n}` } });
    return { n, box, el: h("label", { class: "check" }, box, h("span", {}, n)) };
  });
  const el = h("fieldset", { class: "fieldset checks", dataset: { testid } },
    h("legend", {}, legend), boxes.map((b) => b.el));
  return { el, values: () => boxes.filter((b) => b.box.checked).map((b) => b.n) };
}

/** A labelled checkbox (a switch look from admin.css). */
export function toggle(label, checked, testid) {
  const box = h("input", { type: "checkbox", class: "switch-input", checked, dataset: testid ? { testid } : undefined });
  return { box, el: h("label", { class: "switch" }, box, h("span", { class: "switch-track", "aria-hidden": "true" }), h("span", {}, label)) };
}

/** A row of a table: cells are [label, content] pairs (the label shows on narrow screens). */
export function row(cells, attrs = {}) {
  return h("tr", attrs, cells.map(([label, content, cls]) => h("td", { "data-label": label, class: cls }, content)));
}

/** A monospace inline code span. */
export function code(text, testid) {
  return h("code", { class: "code", dataset: testid ? { testid } : undefined }, text);
}

/** An inline error inside a section (keeps the page usable). */
export function inlineError(err, testid) {
  return h("div", { class: "error-state inline-error", role: "alert", dataset: testid ? { testid } : undefined },
    h("p", { class: "error-text" }, errorText(err)));
}

/** A section with a title bar that can hold actions: section(title, actions, ...body). */
export function section(title, actions, ...body) {
  return h("section", { class: "card admin-section" },
    h("div", { class: "section-head" }, h("h2", { class: "card-title" }, title),
      actions && actions.length ? h("div", { class: "section-actions" }, actions) : null),
    ...body);
}

/** A small muted empty line inside a section. */
export function emptyLine(text, testid) {
  return h("p", { class: "empty-line", dataset: testid ? { testid } : undefined }, text);
}

/** Reads a JSON textarea editor's value, throwing a message that names the field. */
export function jsonOf(editor, name) {
  try {
    return editor.value;
  } catch (e) {
    throw new Error(`${name}: ${e.message}`);
  }
}

/** A progress bar: done of total (succeeded in one colour, failed in another). */
export function progress(succeeded, failed, total, testid) {
  const pct = (n) => (total > 0 ? Math.min(100, (100 * n) / total) : 0);
  const ok = h("span", { class: "admin-bar-ok" });
  const bad = h("span", { class: "admin-bar-bad" });
  ok.style.width = `${pct(succeeded)}%`;
  bad.style.width = `${pct(failed)}%`;
  return h("div", { class: "admin-progress", dataset: testid ? { testid } : undefined },
    h("div", { class: "admin-bar", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": String(total || 0),
      "aria-valuenow": String(succeeded + failed), "aria-label": "Devices done" }, ok, bad),
    h("span", { class: "admin-bar-text" }, `${succeeded + failed}/${total}${failed ? ` · ${failed} failed` : ""}`));
}

/** A header value from a fetch Headers object (or a plain object). */
export function header(headers, name) {
  if (!headers) return null;
  if (typeof headers.get === "function") return headers.get(name);
  return headers[name] ?? headers[name.toLowerCase()] ?? null;
}

/** Sets the page root's data-state. */
export function setState(root, state) {
  root.dataset.state = state;
}

/** Replace helper re-export for pages that import only this module. */
export { replace, field };

/** A short, unique-enough id: prefix-yyyymmdd-hhmmss. */
export function stampId(prefix) {
  const d = new Date();
  const p = (n) => String(n).padStart(2, "0");
  return `${prefix}-${d.getFullYear()}${p(d.getMonth() + 1)}${p(d.getDate())}-${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}`;
}
