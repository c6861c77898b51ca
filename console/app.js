// The console's shell: session gate, hash router, navigation and page life cycle.
//
// Each page is `pages/{name}.js` exporting `default async function render(root, app, params)`,
// loaded on demand. `app` = {api, info, session, can, navigate, onLeave, ui, ...}; a page sets
// `data-state` on its root (ui.loading / ui.empty / ui.failed / ui.ready) and registers its
// cleanup (timers, AbortControllers) with app.onLeave(fn), run when the user navigates away.
import * as sessionStore from "./lib/session.js";
import { createApi, ApiError } from "./lib/api.js";
import { clearTokenCache } from "./lib/sas.js";
import * as ui from "./lib/ui.js";

const PAGES = ["signin", "overview", "activity", "devices", "stream", "routing", "jobs", "configurations", "certificates", "provisioning", "policies"];

const page = document.getElementById("page");
const nav = document.getElementById("main-nav");
const navToggle = document.getElementById("nav-toggle");

const state = { session: null, info: null, api: null, flash: null };
let renderToken = 0;
let leaveHandlers = [];

/** {name, params} for a location hash. Ids are percent-encoded in hashes. */
export function parseRoute(hash) {
  const path = (hash || "").replace(/^#\/?/, "");
  if (!path) return { name: "overview", params: {} };
  const parts = path.split("/");
  const dec = (s) => {
    try { return decodeURIComponent(s); } catch { return s; }
  };
  if (parts[0] === "devices" && parts.length >= 2 && parts[1] !== "") {
    if (parts.length === 2) return { name: "device", params: { deviceId: dec(parts[1]) } };
    if (parts.length === 4 && parts[2] === "modules" && parts[3] !== "") {
      return { name: "device", params: { deviceId: dec(parts[1]), moduleId: dec(parts[3]) } };
    }
    return { name: "notfound", params: { path } };
  }
  if (parts.length === 1 && PAGES.includes(parts[0])) return { name: parts[0], params: {} };
  return { name: "notfound", params: { path } };
}

function runLeave() {
  // A dialog belongs to the page it was opened from: close it (ui.dialog resolves it with null).
  for (const dlg of document.querySelectorAll("dialog[open]")) {
    try { dlg.close(); } catch (e) { console.warn("console: could not close a dialog", e); }
  }
  const handlers = leaveHandlers;
  leaveHandlers = [];
  for (const fn of handlers) {
    try { fn(); } catch (e) { console.warn("console: cleanup failed", e); }
  }
}

function updateShell(routeName) {
  const signedIn = Boolean(state.session && state.info);
  document.body.classList.toggle("signed-out", !signedIn);
  document.getElementById("whoami").textContent = signedIn ? state.session.policyName : "";
  document.getElementById("hub-name").textContent = signedIn ? (state.info.hubName || state.info.hostName || "") : "";
  const section = routeName === "device" ? "devices" : routeName;
  for (const a of nav.querySelectorAll("a[data-route]")) {
    if (a.dataset.route === section) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.title = signedIn ? `${pageTitle(routeName)} · ${state.info.hubName || "ferrohub"} · ferrohub console` : "Sign in · ferrohub console";
}

function pageTitle(name) {
  const t = { device: "Device", notfound: "Not found", stream: "Live events" }[name] || name;
  return t.charAt(0).toUpperCase() + t.slice(1);
}

function closeNav() {
  document.body.classList.remove("nav-open");
  navToggle.setAttribute("aria-expanded", "false");
}

async function fetchInfo(api) {
  const r = await api.get("/console/api/session");
  return r.body;
}

/** Checks a session with the hub (GET /console/api/session), then keeps it. Throws the hub's refusal. */
async function signIn(session) {
  const api = createApi(session);
  const info = await fetchInfo(api);
  sessionStore.save(session);
  Object.assign(state, { session, api, info, flash: null });
  navigate("#/overview");
}

function signOut(flash = null) {
  runLeave();
  sessionStore.clear();
  Object.assign(state, { session: null, api: null, info: null, flash });
  updateShell("signin");
  if (location.hash === "#/signin") route();
  else location.hash = "#/signin";
}

function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function makeApp(token) {
  return {
    api: state.api,
    info: state.info,
    session: state.session,
    flash: state.flash,
    ui,
    can: (permission) => Boolean(state.info && (state.info.permissions || []).includes(permission)),
    navigate,
    onLeave(fn) {
      if (token === renderToken) leaveHandlers.push(fn);
      else fn(); // the user has already moved on
    },
    isCurrent: () => token === renderToken,
    signIn,
    signOut,
    async refreshInfo() {
      state.info = await fetchInfo(state.api);
      this.info = state.info;
      return state.info;
    },
    /**
     * Signs with another key of the signed-in policy from now on (the policies page, after it
     * regenerated the key in use): the session kept in the tab, the cached token and the API
     * client all change to it.
     */
    useKey(key) {
      const session = { ...state.session, key };
      sessionStore.save(session);
      clearTokenCache();
      state.session = session;
      state.api = createApi(session);
      this.session = state.session;
      this.api = state.api;
    },
    /** The hub's host name as devices use it (for device connection strings). */
    deviceHostName() {
      return (state.info && state.info.hostName) || (state.session && state.session.hostName) || location.hostname;
    },
  };
}

async function route() {
  runLeave();
  closeNav();
  const token = ++renderToken;
  const r = parseRoute(location.hash);
  if (!state.session) {
    state.session = sessionStore.load();
    state.api = state.session ? createApi(state.session) : null;
  }
  if (!state.session && r.name !== "signin") {
    // The hash changes, so hashchange renders the sign-in page (once).
    location.replace("#/signin");
    return;
  }
  if (state.session && r.name === "signin" && state.info) {
    location.replace("#/overview");
    return;
  }
  ui.loading(page);
  if (state.session && !state.info) {
    try {
      state.info = await fetchInfo(state.api);
    } catch (err) {
      if (token !== renderToken) return;
      if (err instanceof ApiError && err.status === 401) {
        signOut(err);
        return;
      }
      updateShell(r.name);
      ui.failed(page, err, "Could not reach the hub");
      return;
    }
    if (token !== renderToken) return;
    if (r.name === "signin") {
      location.replace("#/overview");
      return;
    }
  }
  updateShell(r.name);
  if (r.name === "notfound") {
    page.dataset.state = "error";
    ui.replace(page, ui.pageHeader("Not found"), h404(r.params.path));
    return;
  }
  let mod;
  try {
    mod = await import(`./pages/${r.name}.js`);
  } catch (err) {
    if (token !== renderToken) return;
    ui.failed(page, new Error(`The ${r.name} page could not be loaded (${err.message}).`), "Page not available");
    return;
  }
  if (token !== renderToken) return;
  try {
    await mod.default(page, makeApp(token), r.params);
  } catch (err) {
    if (token !== renderToken || (err && err.name === "AbortError")) return;
    ui.failed(page, err);
  }
}

function h404(path) {
  return ui.h("div", { class: "error-state", role: "alert" },
    ui.h("strong", {}, "404: no such page"),
    ui.h("p", { class: "error-text" }, `Nothing lives at #/${path}. `, ui.h("a", { href: "#/overview" }, "Back to the overview")));
}

navToggle.addEventListener("click", () => {
  const open = !document.body.classList.contains("nav-open");
  document.body.classList.toggle("nav-open", open);
  navToggle.setAttribute("aria-expanded", String(open));
  if (open) nav.querySelector("a")?.focus();
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && document.body.classList.contains("nav-open")) {
    closeNav();
    navToggle.focus();
  }
});
document.getElementById("sign-out").addEventListener("click", () => signOut());
// The skip link focuses the page without touching the hash (the hash is the route).
document.getElementById("skip-link").addEventListener("click", () => page.focus());
window.addEventListener("hashchange", route);
window.addEventListener("unhandledrejection", (e) => {
  // Long polls cancelled on navigation are expected.
  if (e.reason && e.reason.name === "AbortError") e.preventDefault();
});
route();
