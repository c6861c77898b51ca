// Small DOM helpers shared by every page. No innerHTML anywhere: untrusted strings (device ids,
// twin values, message bodies) only ever become text nodes or attribute values.

/**
 * h("button", {class: "btn", onclick: fn, disabled: true, dataset: {testid: "x"}}, "Text", child, [more])
 * Attributes: `class`, `style` (an object, assigned to el.style), `dataset`, `on*` functions
 * (event listeners), booleans (set when true, left out when false), `value`/`checked` as
 * properties, anything else as an attribute. Children: nodes, strings, numbers, arrays; null,
 * undefined and false are skipped.
 */
export function h(tag, attrs, ...children) {
  const el = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.setAttribute("class", Array.isArray(v) ? v.filter(Boolean).join(" ") : v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2).toLowerCase(), v);
    else if (k === "value" || k === "checked" || k === "selected" || k === "indeterminate") el[k] = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Replaces an element's children. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** Loading state: a spinner line; sets el's data-state="loading". */
export function loading(el, text = "Loading…") {
  el.dataset.state = "loading";
  replace(el, h("div", { class: "state loading-state", role: "status" }, h("span", { class: "spinner", "aria-hidden": "true" }), text));
  return el;
}

/** Empty state: a message; sets el's data-state="empty". */
export function empty(el, text = "Nothing here yet.", ...extra) {
  el.dataset.state = "empty";
  replace(el, h("div", { class: "state empty-state" }, h("p", {}, text), ...extra));
  return el;
}

/** The one-line description of an error: "401 IotHubUnauthorizedAccess: text". */
export function errorText(err) {
  if (!err) return "Unknown error";
  if (typeof err.status === "number" && err.status > 0) {
    return `${err.status}${err.code ? " " + err.code : ""}: ${err.message}`;
  }
  return err.message || String(err);
}

/** An inline error block (for a form or a section) with the hub's status and message. */
export function errorBox(err, title = "The hub refused the request") {
  return h("div", { class: "error-state", role: "alert" },
    h("strong", {}, typeof err?.status === "number" && err.status > 0 ? `${title} (HTTP ${err.status})` : title),
    h("p", { class: "error-text" }, errorText(err)));
}

/** Error state: the hub's status code and message; sets el's data-state="error". */
export function failed(el, err, title) {
  el.dataset.state = "error";
  replace(el, errorBox(err, title || (err?.status ? "The hub refused the request" : "Something went wrong")));
  if (err && !(err.status > 0) && !(err.name === "ApiError")) console.info("console:", err);
  return el;
}

/** Marks a page (or section) ready. */
export function ready(el) {
  el.dataset.state = "ready";
  return el;
}

let toastBox = null;
/** A transient note at the bottom right; kind: "ok" | "error" | "info". */
export function toast(text, kind = "info", ms = 3000) {
  if (!toastBox || !toastBox.isConnected) {
    toastBox = h("div", { class: "toasts", "aria-live": "polite", role: "status" });
    document.body.appendChild(toastBox);
  }
  const t = h("div", { class: ["toast", `toast-${kind}`], dataset: { testid: "toast" } }, text);
  toastBox.appendChild(t);
  setTimeout(() => t.remove(), kind === "error" ? ms * 2 : ms);
  return t;
}

/**
 * A modal dialog (native <dialog>: focus stays inside, Escape closes it).
 *   dialog({title, body, actions: [{label, value, kind: "primary"|"danger"|"", testid, run}]})
 * resolves with the chosen action's value (or what its async `run()` returns), null when
 * dismissed. A `run` that throws shows the error in the dialog, which stays open; one that
 * returns `undefined` keeps it open too (validation).
 */
export function dialog({ title, body, actions = [{ label: "Close", value: null }], testid, wide = false }) {
  return new Promise((resolve) => {
    const errorLine = h("div", { class: "dialog-error", role: "alert" });
    // The primary action is the form's submit button, so Enter in a field runs it.
    const buttons = actions.map((a) => h("button", {
      type: a.kind === "primary" ? "submit" : "button",
      class: ["btn", a.kind ? `btn-${a.kind}` : ""],
      dataset: a.testid ? { testid: a.testid } : undefined,
      disabled: a.disabled,
    }, a.label));
    const dlg = h("dialog", { class: ["dialog", wide ? "dialog-wide" : ""], "aria-labelledby": "dialog-title", dataset: testid ? { testid } : undefined },
      h("form", { method: "dialog", class: "dialog-form", onsubmit: (e) => e.preventDefault() },
        h("h2", { id: "dialog-title", class: "dialog-title" }, title),
        h("div", { class: "dialog-body" }, body),
        errorLine,
        h("div", { class: "dialog-actions" }, buttons)));
    let done = false;
    const finish = (value) => {
      if (done) return;
      done = true;
      dlg.close();
      dlg.remove();
      resolve(value);
    };
    dlg.addEventListener("cancel", (e) => { e.preventDefault(); finish(null); });
    dlg.addEventListener("close", () => finish(null));
    actions.forEach((a, i) => buttons[i].addEventListener("click", async (e) => {
      e.preventDefault(); // no form submission: the dialog may be gone by then
      if (!a.run) return finish(a.value === undefined ? null : a.value);
      replace(errorLine);
      buttons.forEach((b) => { b.dataset.wasDisabled = b.disabled ? "1" : ""; b.disabled = true; });
      try {
        const v = await a.run();
        if (v !== undefined) return finish(v);
      } catch (e) {
        replace(errorLine, errorText(e));
      }
      buttons.forEach((b) => { b.disabled = b.dataset.wasDisabled === "1"; });
    }));
    document.body.appendChild(dlg);
    dlg.showModal();
    const first = dlg.querySelector("input:not([disabled]), textarea:not([disabled]), select:not([disabled])")
      || buttons.find((b) => !b.disabled);
    if (first) first.focus();
  });
}

/** A yes/no confirmation; resolves true when confirmed. */
export async function confirm(title, text, { confirmLabel = "Confirm", danger = false, testid = "confirm" } = {}) {
  const v = await dialog({
    title,
    body: h("p", {}, text),
    actions: [
      { label: "Cancel", value: false, testid: "dialog-cancel" },
      { label: confirmLabel, value: true, kind: danger ? "danger" : "primary", testid },
    ],
  });
  return v === true;
}

/**
 * Server-side paging with continuation tokens (the query API's x-ms-continuation):
 *   const p = pager({fetchPage: async (token, {signal, isCurrent}) => {
 *     const r = await api.post(..., {signal}); if (!isCurrent()) return null;
 *     ...render rows...; return nextTokenOrNull; }});
 *   container.append(p.el); await p.reload();
 * `p.el` holds "Previous" / "Next" buttons and "Page N". `reload()` starts again at page 1 (and
 * supersedes a request in flight: its signal is aborted, isCurrent() turns false and its answer
 * is ignored); `refresh()` reloads the current page, and does nothing while a request is in flight.
 */
export function pager({ fetchPage, testid = "pager" }) {
  const tokens = [null];
  let index = 0;
  let next = null;
  let busy = false;
  let seq = 0; // the number of the latest request; older answers are ignored
  let inflight = null; // its AbortController
  const label = h("span", { class: "pager-label", "aria-live": "polite" }, "Page 1");
  const prev = h("button", { type: "button", class: "btn btn-small", dataset: { testid: `${testid}-prev` }, disabled: true }, "‹ Previous");
  const nextBtn = h("button", { type: "button", class: "btn btn-small", dataset: { testid: `${testid}-next` }, disabled: true }, "Next ›");
  const el = h("div", { class: "pager", dataset: { testid } }, prev, label, nextBtn);
  const update = () => {
    label.textContent = `Page ${index + 1}`;
    prev.disabled = busy || index === 0;
    nextBtn.disabled = busy || !next;
  };
  async function go(i) {
    const my = ++seq;
    inflight?.abort();
    const ctl = new AbortController();
    inflight = ctl;
    const isCurrent = () => my === seq;
    busy = true;
    update();
    let token;
    try {
      token = (await fetchPage(tokens[i], { signal: ctl.signal, isCurrent })) || null;
    } catch (err) {
      if (!isCurrent()) return; // superseded: its failure no longer matters
      inflight = null;
      busy = false;
      update();
      throw err;
    }
    if (!isCurrent()) return;
    inflight = null;
    next = token;
    index = i;
    tokens[i + 1] = next;
    tokens.length = i + 2;
    busy = false;
    update();
  }
  prev.addEventListener("click", () => { if (!busy) go(index - 1); });
  nextBtn.addEventListener("click", () => { if (!busy) go(index + 1); });
  return {
    el,
    reload: () => { tokens.length = 1; return go(0); },
    refresh: () => (busy ? Promise.resolve() : go(index)),
    get page() { return index + 1; },
  };
}

/**
 * A JSON textarea with live validation:
 *   const ed = jsonEditor({label, value, id, rows, readOnly, testid, allowEmpty});
 *   ed.el (label + textarea + error line), ed.textarea, ed.valid(), ed.value (parsed; throws when
 *   invalid), ed.text, ed.setValue(obj), ed.onChange(fn).
 */
export function jsonEditor({ label, value = {}, id, rows = 12, readOnly = false, testid, allowEmpty = false, hint }) {
  const taId = id || `json-${Math.random().toString(36).slice(2, 9)}`;
  const textarea = h("textarea", {
    id: taId, class: "json-editor", rows, spellcheck: "false", autocomplete: "off", readonly: readOnly,
    dataset: testid ? { testid } : undefined, "aria-describedby": `${taId}-error`,
  });
  const errorLine = h("div", { class: "json-error", id: `${taId}-error`, "aria-live": "polite" });
  const listeners = [];
  const parse = () => {
    const text = textarea.value;
    if (!text.trim()) {
      if (allowEmpty) return null;
      throw new SyntaxError("Empty: enter a JSON value.");
    }
    return JSON.parse(text);
  };
  const validate = () => {
    try {
      parse();
      textarea.classList.remove("invalid");
      textarea.removeAttribute("aria-invalid");
      errorLine.textContent = "";
      return true;
    } catch (e) {
      textarea.classList.add("invalid");
      textarea.setAttribute("aria-invalid", "true");
      errorLine.textContent = `Invalid JSON: ${e.message}`;
      return false;
    }
  };
  textarea.addEventListener("input", () => {
    const ok = validate();
    listeners.forEach((fn) => fn(ok));
  });
  const setValue = (v) => {
    textarea.value = typeof v === "string" ? v : JSON.stringify(v, null, 2);
    validate();
  };
  setValue(value);
  const el = h("div", { class: "field json-field" },
    label ? h("label", { for: taId }, label) : null,
    hint ? h("div", { class: "hint" }, hint) : null,
    textarea, errorLine);
  return {
    el, textarea, setValue,
    valid: validate,
    get value() { return parse(); },
    get text() { return textarea.value; },
    onChange(fn) { listeners.push(fn); },
  };
}

/** Copies `text` (a string or a function returning one) to the clipboard. */
export async function copyText(text) {
  const value = typeof text === "function" ? await text() : text;
  try {
    await navigator.clipboard.writeText(value);
  } catch {
    // Clipboard API refused (permissions): fall back to a selected, off-screen textarea.
    const ta = h("textarea", { class: "offscreen", readonly: true, "aria-hidden": "true" });
    ta.value = value;
    document.body.appendChild(ta);
    ta.select();
    try { document.execCommand("copy"); } finally { ta.remove(); }
  }
  return value;
}

/** A button that copies `text` (a string or a function) and says so. */
export function copyButton(text, { label = "Copy", testid, small = true, title } = {}) {
  const btn = h("button", { type: "button", class: ["btn", small ? "btn-small" : ""], dataset: testid ? { testid } : undefined, title }, label);
  btn.addEventListener("click", async () => {
    try {
      await copyText(text);
      toast("Copied to the clipboard", "ok", 2000);
    } catch (e) {
      toast(`Could not copy: ${errorText(e)}`, "error");
    }
  });
  return btn;
}

/** "2026-11-21 20:01:02" in local time, "never" for IoT Hub's zero time, "—" when absent. */
export function formatTime(iso) {
  if (!iso) return "—";
  if (/^0001-01-01/.test(iso)) return "never";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** "3 d 4 h", "5 min 2 s" for a number of seconds. */
export function formatDuration(seconds) {
  const s = Math.max(0, Math.floor(seconds || 0));
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60), ss = s % 60;
  if (d) return `${d} d ${hh} h`;
  if (hh) return `${hh} h ${m} min`;
  if (m) return `${m} min ${ss} s`;
  return `${ss} s`;
}

/** "12 s ago" relative to now, for an ISO time. */
export function formatAgo(iso) {
  if (!iso || /^0001-01-01/.test(iso)) return "never";
  const t = new Date(iso).getTime();
  if (Number.isNaN(t)) return "—";
  const s = (Date.now() - t) / 1000;
  return s < 1 ? "just now" : `${formatDuration(s)} ago`;
}

/** A labelled form field: field("Device id", input, hint). The input gets an id if it has none. */
export function field(label, input, hint) {
  if (!input.id) input.id = `f-${Math.random().toString(36).slice(2, 9)}`;
  return h("div", { class: "field" }, h("label", { for: input.id }, label), input, hint ? h("div", { class: "hint" }, hint) : null);
}

/** A small coloured label: badge("connected", "ok"); kinds ok | warn | bad | muted | info. */
export function badge(text, kind = "muted") {
  return h("span", { class: ["badge", `badge-${kind}`] }, text);
}

/**
 * A <table> from column heads and rows (<tr> elements). `cards: true` turns each row into a
 * card on narrow screens, each cell labelled with its column's head (set `data-label` on the
 * cells, or let `labelCells` do it from the heads' text). A head may be a <th> of its own (to
 * give it a class).
 */
export function table(heads, rows, { testid, caption, cards = false } = {}) {
  const t = h("table", { class: ["table", cards ? "table-cards" : ""], dataset: testid ? { testid } : undefined },
    caption ? h("caption", { class: "sr-only" }, caption) : null,
    h("thead", {}, h("tr", {}, heads.map((x) => (x instanceof HTMLTableCellElement ? x : h("th", { scope: "col" }, x))))),
    h("tbody", {}, rows));
  if (cards) labelCells(t);
  return h("div", { class: "table-wrap" }, t);
}

/** Sets each body cell's data-label to its column head's text (for the narrow-screen cards). */
export function labelCells(tableEl) {
  const labels = [...tableEl.querySelectorAll("thead th")].map((th) => th.textContent.trim());
  for (const tr of tableEl.querySelectorAll("tbody tr")) {
    [...tr.children].forEach((td, i) => { if (!td.dataset.label && labels[i]) td.dataset.label = labels[i]; });
  }
}

/** Definition list of [term, value] pairs. */
export function facts(pairs, testid) {
  return h("dl", { class: "facts", dataset: testid ? { testid } : undefined },
    pairs.filter(Boolean).map(([k, v]) => h("div", { class: "fact" }, h("dt", {}, k), h("dd", {}, v))));
}

/** A titled card section. */
export function card(title, ...children) {
  return h("section", { class: "card" }, title ? h("h2", { class: "card-title" }, title) : null, ...children);
}

/** Page header: title, optional subtitle and action buttons. */
export function pageHeader(title, subtitle, ...actions) {
  return h("header", { class: "page-header" },
    h("div", {}, h("h1", {}, title), subtitle ? h("p", { class: "subtitle" }, subtitle) : null),
    actions.length ? h("div", { class: "page-actions" }, actions) : null);
}

/** The rights among `rights` the policy lacks ("all" mode), or all of them when it holds none ("any" mode). */
export function missingRights(app, rights, mode = "all") {
  if (mode === "any") return rights.some((r) => app.can(r)) ? [] : rights;
  return rights.filter((r) => !app.can(r));
}

/**
 * Disables `el` when the signed-in policy lacks `right` (a name, or a list of names all needed,
 * or, with mode "any", of which one is enough), with a tooltip naming what is missing.
 * lib/admin-ui.js's guard() is this function.
 */
export function requireRight(el, app, right, mode = "all") {
  const lacking = missingRights(app, Array.isArray(right) ? right : [right], mode);
  if (lacking.length) {
    el.disabled = true;
    const what = mode === "any" ? lacking.join(" or ") : lacking.join(", ");
    el.title = `Needs ${what}: the signed-in policy does not have ${lacking.length > 1 && mode !== "any" ? "them" : "it"}`;
    el.classList.add("needs-right");
    el.dataset.needs = lacking.join(",");
  }
  return el;
}
