// Panels of the device page that call the device: direct methods, cloud-to-device messages,
// Plug and Play commands, and the modules list.
import { h, replace, field, jsonEditor, errorBox, toast, formatAgo, badge, table, loading, empty, failed, ready, confirm, requireRight } from "./ui.js";
import { identityPath, twinPath, identityHash, createIdentityDialog, deleteIdentity, showConnectionStrings, blockUnaddressable } from "./identity.js";
import { seg } from "./api.js";

function numberInput(value, min, max, testid) {
  return h("input", { type: "number", value: String(value), min: String(min), max: String(max), step: "1", dataset: { testid } });
}

function readTimeout(input, min, max, name) {
  const n = Number(input.value);
  if (!Number.isInteger(n) || n < min || n > max) throw new Error(`${name} must be a whole number from ${min} to ${max}.`);
  return n;
}

function resultBlock(statusText, payload, testid) {
  return h("div", { class: "result-box", dataset: { testid } },
    h("strong", { dataset: { testid: `${testid}-status` } }, statusText),
    h("pre", { dataset: { testid: `${testid}-payload` } }, payload === undefined ? "" : JSON.stringify(payload, null, 2)));
}

/** Direct method call: POST /twins/{id}[/modules/{mid}]/methods. */
export function methodPanel(el, app, { deviceId, moduleId }) {
  const name = h("input", { type: "text", spellcheck: "false", autocomplete: "off", dataset: { testid: "method-name" }, placeholder: "e.g. reboot" });
  const payload = jsonEditor({ label: "Payload (JSON, empty for null)", value: "{}", rows: 5, testid: "method-payload", allowEmpty: true });
  const responseTimeout = numberInput(30, 5, 300, "method-response-timeout");
  const connectTimeout = numberInput(0, 0, 300, "method-connect-timeout");
  const invoke = requireRight(h("button", { type: "submit", class: "btn btn-primary", dataset: { testid: "method-invoke" } }, "Invoke method"), app, "ServiceConnect");
  const result = h("div", { "aria-live": "polite" }, idleResult("No call yet. The device's answer (status and payload) shows here."));
  const form = h("form", {},
    field("Method name", name),
    payload.el,
    h("div", { class: "inline-fields" },
      field("Response timeout (s)", responseTimeout, "5 to 300"),
      field("Connect timeout (s)", connectTimeout, "Wait this long for the device to come online")),
    h("div", { class: "row" }, invoke));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    replace(result);
    let body;
    try {
      if (!name.value.trim()) throw new Error("Enter the method name.");
      body = {
        methodName: name.value.trim(),
        payload: payload.value,
        responseTimeoutInSeconds: readTimeout(responseTimeout, 5, 300, "The response timeout"),
        connectTimeoutInSeconds: readTimeout(connectTimeout, 0, 300, "The connect timeout"),
      };
    } catch (err) {
      replace(result, errorBox(err, "Not sent"));
      return;
    }
    replace(result, idleResult("Waiting for the device's answer…"));
    invoke.disabled = true;
    invoke.textContent = "Waiting for the device…";
    const started = performance.now();
    try {
      const r = await app.api.post(`${twinPath(deviceId, moduleId)}/methods`, body);
      const ms = Math.round(performance.now() - started);
      replace(result, resultBlock(`Status ${r.body?.status} · answered in ${ms} ms`, r.body?.payload, "method-result"));
    } catch (err) {
      replace(result, h("div", { dataset: { testid: "method-error" } }, errorBox(err, "The call failed")));
    } finally {
      invoke.disabled = false;
      invoke.textContent = "Invoke method";
    }
  });
  replace(el, twoColumns(form, result));
}

function idleResult(text) {
  return h("div", { class: "result-idle" }, text);
}

function twoColumns(form, result) {
  return h("div", { class: "split" }, form, h("div", { class: "split-result" }, h("h3", {}, "Result"), result));
}

/** C2D send (POST /devices/{id}/messages/deviceBound) with properties, ack mode and queue depth. */
export function c2dPanel(el, app, { deviceId, queueDepth = () => null, onSent = () => {} }) {
  const body = h("textarea", { rows: 5, spellcheck: "false", dataset: { testid: "c2d-body" }, class: "json-editor" });
  const props = h("div", { class: "kv-list", dataset: { testid: "c2d-props" } });
  const addProp = h("button", { type: "button", class: "btn btn-small", dataset: { testid: "c2d-add-prop" } }, "+ Property");
  const messageId = h("input", { type: "text", dataset: { testid: "c2d-message-id" }, placeholder: "generated when empty" });
  const correlationId = h("input", { type: "text", dataset: { testid: "c2d-correlation-id" } });
  const contentType = h("input", { type: "text", dataset: { testid: "c2d-content-type" }, placeholder: "e.g. application/json" });
  const ack = h("select", { dataset: { testid: "c2d-ack" } }, ["none", "positive", "negative", "full"].map((v) => h("option", { value: v }, v)));
  const ttl = h("input", { type: "number", min: "1", step: "1", dataset: { testid: "c2d-ttl" }, placeholder: "hub default" });
  const send = requireRight(h("button", { type: "submit", class: "btn btn-primary", dataset: { testid: "c2d-send" } }, "Send message"), app, "ServiceConnect");
  const purge = requireRight(h("button", { type: "button", class: "btn btn-danger", dataset: { testid: "c2d-purge" } }, "Purge queue"), app, "ServiceConnect");
  const depth = h("strong", { dataset: { testid: "c2d-queue-depth" } }, "—");
  const result = h("div", { "aria-live": "polite" });

  const addRow = (k = "", v = "") => {
    const key = h("input", { type: "text", value: k, placeholder: "name", "aria-label": "Property name", dataset: { testid: "c2d-prop-name" } });
    const val = h("input", { type: "text", value: v, placeholder: "value", "aria-label": "Property value", dataset: { testid: "c2d-prop-value" } });
    const rm = h("button", { type: "button", class: "btn btn-small", "aria-label": "Remove property" }, "✕");
    const rowEl = h("div", { class: "kv-row" }, key, val, rm);
    rm.addEventListener("click", () => rowEl.remove());
    props.appendChild(rowEl);
    key.focus();
  };
  addProp.addEventListener("click", () => addRow());

  const showDepth = (n) => { depth.textContent = n === null || n === undefined ? "—" : String(n); };
  showDepth(queueDepth());

  const ascii = (s, what) => {
    if (!/^[\x20-\x7e]*$/.test(s)) throw new Error(`${what} must be printable ASCII (it travels as an HTTP header).`);
    return s;
  };

  const form = h("form", {},
    h("div", { class: "field" }, h("label", { for: (body.id = "c2d-body") }, "Body"), body),
    h("div", { class: "field" }, h("span", { class: "label" }, "Application properties"), props, h("div", {}, addProp),
      h("div", { class: "hint" }, "Names travel as HTTP headers, so they are sent (and arrive at the device) in lower case.")),
    h("div", { class: "inline-fields" },
      field("Message id", messageId), field("Correlation id", correlationId),
      field("Content type", contentType), field("Acknowledgement", ack), field("Expires after (s)", ttl)),
    h("div", { class: "row" }, send, purge, h("span", { class: "spacer" }), h("span", { class: "muted" }, "Queued for the device: "), depth),
    result);

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    replace(result);
    const headers = {};
    try {
      for (const r of props.querySelectorAll(".kv-row")) {
        const [k, v] = r.querySelectorAll("input");
        const name = k.value.trim();
        if (!name && !v.value) continue;
        if (!/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/.test(name)) throw new Error(`"${name}" is not a valid property name (letters, digits and !#$%&'*+.^_\`|~-).`);
        // HTTP header names are case-insensitive: the device gets them lower-cased, so send them so.
        const lower = name.toLowerCase();
        if (headers[`iothub-app-${lower}`] !== undefined) throw new Error(`The property ${lower} is given twice (names are not case-sensitive).`);
        headers[`iothub-app-${lower}`] = ascii(v.value, `The value of ${name}`);
      }
      headers["iothub-messageid"] = ascii(messageId.value.trim() || crypto.randomUUID(), "The message id");
      if (correlationId.value.trim()) headers["iothub-correlationid"] = ascii(correlationId.value.trim(), "The correlation id");
      if (contentType.value.trim()) headers["Content-Type"] = ascii(contentType.value.trim(), "The content type");
      headers["iothub-ack"] = ack.value;
      if (ttl.value) {
        const s = Number(ttl.value);
        if (!Number.isInteger(s) || s < 1) throw new Error("The expiry must be a whole number of seconds.");
        headers["iothub-expiry"] = new Date(Date.now() + s * 1000).toISOString();
      }
    } catch (err) {
      replace(result, errorBox(err, "Not sent"));
      return;
    }
    send.disabled = true;
    try {
      await app.api.post(`${identityPath(deviceId)}/messages/deviceBound`, new Blob([body.value]), { headers });
      replace(result, h("div", { class: "ok-state", dataset: { testid: "c2d-sent" } }, `Queued message ${headers["iothub-messageid"]} (ack: ${ack.value}).`));
      toast("Message queued", "ok");
      showDepth(await onSent());
    } catch (err) {
      replace(result, errorBox(err, "The message was not queued"));
    } finally {
      send.disabled = false;
    }
  });
  purge.addEventListener("click", async () => {
    if (!(await confirm("Purge the queue?", `Every message waiting for ${deviceId} is removed without feedback.`, { confirmLabel: "Purge", danger: true }))) return;
    try {
      const r = await app.api.del(`${identityPath(deviceId)}/commands`);
      toast(`Purged ${r.body?.totalMessagesPurged ?? 0} messages`, "ok");
      showDepth(await onSent());
    } catch (err) {
      replace(result, errorBox(err, "Not purged"));
    }
  });
  replace(el, form);
  return { showDepth };
}

/** The modules of a device: GET /devices/{id}/modules, with create, delete, connection strings. */
export function modulesPanel(el, app, { deviceId }) {
  const list = h("div", {});
  const add = requireRight(h("button", { type: "button", class: "btn btn-primary", dataset: { testid: "new-module" } }, "New module"), app, "RegistryWrite");
  async function load() {
    loading(list);
    try {
      const mods = (await app.api.get(`${identityPath(deviceId)}/modules`)).body || [];
      if (!mods.length) return empty(list, "This device has no modules.");
      replace(list, table(["Module", "Connection", "Auth", "Last activity", h("span", { class: "sr-only" }, "Actions")], mods.map((m) => {
        const cs = requireRight(h("button", { type: "button", class: "btn btn-small", dataset: { testid: "module-conn-string" } }, "Connection string"), app, "RegistryRead");
        cs.addEventListener("click", () => showConnectionStrings(app, deviceId, m.moduleId));
        const del = requireRight(h("button", { type: "button", class: "btn btn-small btn-danger", dataset: { testid: "module-delete" } }, "Delete"), app, "RegistryWrite");
        del.addEventListener("click", async () => { try { if (await deleteIdentity(app, deviceId, m.moduleId)) load(); } catch { /* toast shown */ } });
        // A module named "." or ".." is listed, but nothing can address it (browsers collapse the segment).
        const blocked = blockUnaddressable([cs, del], deviceId, m.moduleId);
        const connected = m.connectionState === "Connected";
        return h("tr", { dataset: { testid: "module-row" } },
          h("td", { class: "id-cell" },
            blocked ? h("span", { title: cs.title }, m.moduleId) : h("a", { href: identityHash(deviceId, m.moduleId) }, m.moduleId),
            blocked ? h("div", { class: "hint" }, "not addressable from a browser") : null,
            m.managedBy ? h("div", { class: "hint" }, `managed by ${m.managedBy}`) : null),
          h("td", {}, badge(connected ? "connected" : "disconnected", connected ? "info" : "muted")),
          h("td", {}, m.authentication?.type || "—"),
          h("td", {}, formatAgo(m.lastActivityTime)),
          h("td", { class: "actions" }, m.authentication?.type === "sas" ? cs : null, del));
      }), { testid: "modules-table", caption: "Modules", cards: true }));
      ready(list);
    } catch (err) {
      failed(list, err);
    }
  }
  add.addEventListener("click", async () => { if (await createIdentityDialog(app, { deviceId })) load(); });
  replace(el, h("div", { class: "row", style: { marginBottom: "12px" } }, h("span", { class: "muted" }, "Modules have their own identity, twin, methods and telemetry."), h("span", { class: "spacer" }), add), list);
  load();
  return { reload: load };
}

/** Components of a twin: desired or reported properties whose value is an object with "__t": "c". */
export function componentsOf(twin) {
  const names = new Set();
  for (const section of [twin?.properties?.desired, twin?.properties?.reported]) {
    for (const [k, v] of Object.entries(section || {})) {
      if (v && typeof v === "object" && !Array.isArray(v) && v.__t === "c") names.add(k);
    }
  }
  return [...names].sort();
}

/** Plug and Play: the model id, components and a command call (POST /digitaltwins/{id}/...commands/{cmd}). */
export function pnpPanel(el, app, { deviceId, moduleId }) {
  function show(twin) {
    const modelId = twin?.modelId || "";
    if (moduleId) return empty(el, "Digital twins exist for devices only (as on IoT Hub); see the device's page.");
    if (!modelId) return empty(el, "This device has not announced a Plug and Play model id (it connects without model-id).");
    const comps = componentsOf(twin);
    const component = h("select", { dataset: { testid: "pnp-component" } },
      h("option", { value: "" }, "(default component)"), comps.map((c) => h("option", { value: c }, c)));
    const command = h("input", { type: "text", spellcheck: "false", dataset: { testid: "pnp-command" }, placeholder: "e.g. getMaxMinReport" });
    const payload = jsonEditor({ label: "Payload (JSON, empty for null)", value: "", rows: 5, testid: "pnp-payload", allowEmpty: true });
    const responseTimeout = numberInput(30, 5, 300, "pnp-response-timeout");
    const connectTimeout = numberInput(0, 0, 300, "pnp-connect-timeout");
    const run = requireRight(h("button", { type: "submit", class: "btn btn-primary", dataset: { testid: "pnp-invoke" } }, "Run command"), app, "ServiceConnect");
    const result = h("div", { "aria-live": "polite" }, idleResult("No command run yet."));
    const form = h("form", {},
      h("div", { class: "inline-fields" }, field("Component", component), field("Command", command)),
      payload.el,
      h("div", { class: "inline-fields" }, field("Response timeout (s)", responseTimeout), field("Connect timeout (s)", connectTimeout)),
      h("div", { class: "row" }, run));
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      replace(result);
      let query, body, path;
      try {
        if (!command.value.trim()) throw new Error("Enter the command name.");
        body = payload.value;
        query = {
          responseTimeoutInSeconds: readTimeout(responseTimeout, 5, 300, "The response timeout"),
          connectTimeoutInSeconds: readTimeout(connectTimeout, 0, 300, "The connect timeout"),
        };
        const base = `/digitaltwins/${seg(deviceId)}`;
        path = component.value
          ? `${base}/components/${seg(component.value)}/commands/${seg(command.value.trim())}`
          : `${base}/commands/${seg(command.value.trim())}`;
      } catch (err) {
        replace(result, errorBox(err, "Not sent"));
        return;
      }
      run.disabled = true;
      try {
        const r = await app.api.post(path, body === null ? "null" : JSON.stringify(body), { query, contentType: "application/json" });
        replace(result, resultBlock(`Status ${r.headers.get("x-ms-command-statuscode") ?? "?"}`, r.body, "pnp-result"));
      } catch (err) {
        replace(result, errorBox(err, "The command failed"));
      } finally {
        run.disabled = false;
      }
    });
    const compCards = comps.map((c) => {
      const d = twin.properties?.desired?.[c] || {}, rp = twin.properties?.reported?.[c] || {};
      const strip = (o) => Object.fromEntries(Object.entries(o).filter(([k]) => k !== "__t" && !k.startsWith("$")));
      return h("div", { class: "card", dataset: { testid: "pnp-component-card" } },
        h("h3", {}, c),
        h("div", { class: "grid grid-2" },
          h("div", {}, h("div", { class: "label" }, "Desired"), h("pre", { class: "event-body" }, JSON.stringify(strip(d), null, 2))),
          h("div", {}, h("div", { class: "label" }, "Reported"), h("pre", { class: "event-body" }, JSON.stringify(strip(rp), null, 2)))));
    });
    replace(el,
      h("p", {}, "Model ", h("code", { dataset: { testid: "pnp-model-id" } }, modelId)),
      h("h3", {}, comps.length ? `Components (${comps.length})` : "No components"),
      compCards,
      h("h3", { style: { marginTop: "16px" } }, "Run a command"),
      twoColumns(form, result));
    ready(el);
  }
  return { show };
}
