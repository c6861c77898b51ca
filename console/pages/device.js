// A device's (or a module's, at #/devices/{id}/modules/{mid}) page: identity, connection state
// and last activity, then tabs: twin editor, live telemetry, direct method, C2D (devices),
// modules (devices) and Plug and Play.
import { identityPath, twinPath, identityHash, setStatus, deleteIdentity, regenerateKeys, showConnectionStrings } from "../lib/identity.js";
import { twinEditor } from "../lib/twin-editor.js";
import { telemetryTail } from "../lib/telemetry.js";
import { methodPanel, c2dPanel, modulesPanel, pnpPanel } from "../lib/device-ops.js";

const IDENTITY_REFRESH_MS = 5000;
const TAB_KEY = "ferrohub.console.device-tab";

export default async function render(root, app, { deviceId, moduleId = null }) {
  const ui = app.ui;
  const { h, replace } = ui;
  const label = moduleId ? `${deviceId} / ${moduleId}` : deviceId;
  const breadcrumb = () => h("div", { class: "breadcrumb" }, h("a", { href: "#/devices" }, "Devices"));
  let path, twinUrl;
  try {
    // Refuses ids "." and ".." (browsers collapse them): no request goes to a collapsed path.
    path = identityPath(deviceId, moduleId);
    twinUrl = twinPath(deviceId, moduleId);
  } catch (err) {
    ui.failed(root, err, `The ${moduleId ? "module" : "device"} ${label} cannot be opened in the console`);
    root.prepend(breadcrumb());
    return;
  }
  ui.loading(root);

  // The identity needs RegistryRead; a ServiceConnect-only policy (`service`) reads the same
  // facts from the twin instead.
  async function loadIdentity() {
    if (app.can("RegistryRead") || !app.can("ServiceConnect")) return (await app.api.get(path)).body;
    const t = (await app.api.get(twinUrl)).body;
    return {
      deviceId: t.deviceId, moduleId: t.moduleId, status: t.status, statusReason: t.statusReason,
      connectionState: t.connectionState, lastActivityTime: t.lastActivityTime,
      cloudToDeviceMessageCount: t.cloudToDeviceMessageCount, modelId: t.modelId || undefined,
      authentication: { type: t.authenticationType, x509Thumbprint: t.x509Thumbprint },
    };
  }

  let identity;
  try {
    identity = await loadIdentity();
  } catch (err) {
    if (!app.isCurrent()) return;
    ui.failed(root, err, err.status === 404 ? `No ${moduleId ? "module" : "device"} ${label}` : undefined);
    root.prepend(breadcrumb());
    return;
  }
  if (!app.isCurrent()) return;

  // ---- identity card ------------------------------------------------------------------------
  const factsEl = h("div", { dataset: { testid: "identity" } });
  const statusBtn = moduleId ? null : ui.requireRight(h("button", { type: "button", class: "btn", dataset: { testid: "toggle-status" } }), app, "RegistryWrite");
  const connBtn = ui.requireRight(h("button", { type: "button", class: "btn", dataset: { testid: "conn-string" } }, "Connection string"), app, "RegistryRead");
  const keysBtn = ui.requireRight(h("button", { type: "button", class: "btn", dataset: { testid: "regen" } }, "Regenerate keys"), app, "RegistryWrite");
  const deleteBtn = ui.requireRight(h("button", { type: "button", class: "btn btn-danger", dataset: { testid: "delete" } }, "Delete"), app, "RegistryWrite");
  let c2d = null;

  function showIdentity(d) {
    identity = d;
    const connected = d.connectionState === "Connected";
    const enabled = d.status !== "disabled";
    replace(factsEl, ui.facts([
      ["Connection", h("span", { dataset: { testid: "connection-state", state: d.connectionState } },
        ui.badge(connected ? "connected" : "disconnected", connected ? "info" : "muted"))],
      moduleId ? null : ["Status", ui.badge(enabled ? "enabled" : "disabled", enabled ? "ok" : "muted")],
      ["Last activity", h("span", { title: ui.formatAgo(d.lastActivityTime), dataset: { testid: "last-activity" } }, ui.formatTime(d.lastActivityTime))],
      d.connectionStateUpdatedTime ? ["Connection changed", ui.formatTime(d.connectionStateUpdatedTime)] : null,
      ["Authentication", d.authentication?.type || "—"],
      d.authentication?.x509Thumbprint?.primaryThumbprint
        ? ["Thumbprints", h("code", { class: "mono" }, [d.authentication.x509Thumbprint.primaryThumbprint, d.authentication.x509Thumbprint.secondaryThumbprint].filter(Boolean).join(" / "))]
        : null,
      ["C2D queue", h("span", { dataset: { testid: "identity-c2d-count" } }, String(d.cloudToDeviceMessageCount ?? 0))],
      d.modelId ? ["Model id", h("code", {}, d.modelId)] : null,
      d.generationId ? ["Generation", h("code", {}, d.generationId)] : null,
      d.statusReason ? ["Status reason", d.statusReason] : null,
    ]));
    if (statusBtn) {
      statusBtn.textContent = enabled ? "Disable" : "Enable";
      statusBtn.dataset.next = enabled ? "disabled" : "enabled";
    }
    const sas = d.authentication?.type === "sas";
    connBtn.hidden = !sas;
    keysBtn.hidden = !sas;
    if (c2d) c2d.showDepth(d.cloudToDeviceMessageCount);
  }

  // Every refresh either shows the facts or says why it could not (the next success restores them).
  async function refreshIdentity() {
    try {
      const d = await loadIdentity();
      if (!app.isCurrent()) return null;
      showIdentity(d);
      return d;
    } catch (err) {
      if (!app.isCurrent() || err.name === "AbortError") return null;
      replace(factsEl, err.status === 404
        ? ui.errorBox(err, "This identity no longer exists")
        : ui.errorBox(err, `Could not refresh the identity (retrying every ${IDENTITY_REFRESH_MS / 1000} s)`));
      return null;
    }
  }

  statusBtn?.addEventListener("click", async () => {
    statusBtn.disabled = true;
    try {
      showIdentity(await setStatus(app, deviceId, statusBtn.dataset.next));
    } catch (err) {
      ui.toast(ui.errorText(err), "error");
    } finally {
      statusBtn.disabled = false;
    }
  });
  connBtn.addEventListener("click", () => showConnectionStrings(app, deviceId, moduleId));
  keysBtn.addEventListener("click", async () => {
    const d = await regenerateKeys(app, deviceId, moduleId);
    if (d) showIdentity(d);
  });
  deleteBtn.addEventListener("click", async () => {
    try {
      if (await deleteIdentity(app, deviceId, moduleId)) app.navigate(moduleId ? identityHash(deviceId) : "#/devices");
    } catch { /* toast shown */ }
  });

  // ---- tabs ---------------------------------------------------------------------------------
  const panels = {};
  const tabs = [
    ["twin", "Twin"],
    ["telemetry", "Telemetry"],
    ["method", "Direct method"],
    moduleId ? null : ["c2d", "Cloud-to-device"],
    moduleId ? null : ["modules", "Modules"],
    moduleId ? null : ["pnp", "Plug and Play"],
  ].filter(Boolean);
  const tabButtons = {};
  const tabList = h("div", { class: "tabs", role: "tablist", "aria-label": "Device views" });
  for (const [id, text] of tabs) {
    panels[id] = h("section", { class: "card", role: "tabpanel", id: `panel-${id}`, "aria-labelledby": `tab-${id}`, hidden: true, dataset: { testid: `panel-${id}` } });
    tabButtons[id] = h("button", {
      type: "button", class: "tab", role: "tab", id: `tab-${id}`, "aria-controls": `panel-${id}`, "aria-selected": "false", tabindex: "-1",
      dataset: { testid: `tab-${id}` },
    }, text);
    tabButtons[id].addEventListener("click", () => select(id));
    tabList.appendChild(tabButtons[id]);
  }
  tabList.addEventListener("keydown", (e) => {
    const ids = tabs.map(([id]) => id);
    const at = ids.indexOf(document.activeElement?.id?.replace(/^tab-/, ""));
    if (at < 0) return;
    let to = null;
    if (e.key === "ArrowRight") to = ids[(at + 1) % ids.length];
    else if (e.key === "ArrowLeft") to = ids[(at - 1 + ids.length) % ids.length];
    else if (e.key === "Home") to = ids[0];
    else if (e.key === "End") to = ids[ids.length - 1];
    if (to) {
      e.preventDefault();
      select(to);
      tabButtons[to].focus();
    }
  });

  let tail = null;
  let pnp = null;
  let twin = null;
  const started = new Set();
  function select(id) {
    for (const [t] of tabs) {
      const on = t === id;
      panels[t].hidden = !on;
      tabButtons[t].setAttribute("aria-selected", String(on));
      tabButtons[t].tabIndex = on ? 0 : -1;
    }
    sessionStorage.setItem(TAB_KEY, id);
    if (started.has(id)) return;
    started.add(id);
    if (id === "twin") {
      twin = twinEditor(panels.twin, app, {
        path: twinUrl,
        onTwin: (t) => pnp?.show(t),
      });
    } else if (id === "telemetry") {
      tail = telemetryTail(panels.telemetry, app, { deviceId, moduleId });
      tail.start();
    } else if (id === "method") {
      methodPanel(panels.method, app, { deviceId, moduleId });
    } else if (id === "c2d") {
      c2d = c2dPanel(panels.c2d, app, {
        deviceId,
        queueDepth: () => identity.cloudToDeviceMessageCount,
        onSent: async () => (await refreshIdentity())?.cloudToDeviceMessageCount ?? null,
      });
    } else if (id === "modules") {
      modulesPanel(panels.modules, app, { deviceId });
    } else if (id === "pnp") {
      pnp = pnpPanel(panels.pnp, app, { deviceId, moduleId });
      ui.loading(panels.pnp);
      if (twin?.twin) pnp.show(twin.twin);
      else app.api.get(twinPath(deviceId)).then((r) => pnp.show(r.body)).catch((err) => ui.failed(panels.pnp, err));
    }
  }

  replace(root,
    h("div", { class: "breadcrumb" }, h("a", { href: "#/devices" }, "Devices"),
      moduleId ? [" / ", h("a", { href: identityHash(deviceId) }, deviceId)] : null),
    ui.pageHeader(label, moduleId ? "Module identity" : "Device identity", statusBtn, connBtn, keysBtn, deleteBtn),
    ui.card(null, factsEl),
    tabList,
    tabs.map(([id]) => panels[id]));
  showIdentity(identity);
  const saved = sessionStorage.getItem(TAB_KEY);
  select(tabs.some(([id]) => id === saved) ? saved : "twin");
  ui.ready(root);

  const timer = setInterval(refreshIdentity, IDENTITY_REFRESH_MS);
  app.onLeave(() => clearInterval(timer));
}
