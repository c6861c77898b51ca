// Provisioning (#/provisioning): the hub's Device Provisioning Service. The ID scope and global
// endpoint devices register with (GET /console/api/provisioning, any service-side policy), the
// provisioning policies and their connection strings; individual enrollments and enrollment
// groups (list, create with a symmetric key or an X.509 certificate, edit under the record's
// etag, disable or enable, delete, show keys), an enrollment's registration record, a group's
// registrations and the device keys derived from its key.
//
// The DPS service API accepts only a provisioning policy's token, so the page reads the
// provisioning owner policy's key (GET /console/api/provisioning/policies/{name}/keys, which
// needs a hub policy holding all four rights) and signs its DPS calls in the tab (lib/dps.js).
// Another policy sees the ID scope and a note saying so, with every enrollment action disabled.
import { h, replace, loading, failed, toast, confirm, pageHeader, table, formatTime, facts, copyButton, errorBox, errorText, pager, badge } from "../lib/ui.js";
import { seg } from "../lib/api.js";
import { useAdminCss, guard, allowed, btn, input, row, code, inlineError, section, emptyLine, header } from "../lib/admin-ui.js";
import { createDpsClient, enrollmentPath, deriveDeviceKey, replacement } from "../lib/dps.js";
import { enrollmentDialog, attestationDialog, attestationSummary, kindInfo, recordId, statusBadge, staleText } from "../lib/enrollment-forms.js";

const ALL = ["RegistryRead", "RegistryWrite", "ServiceConnect", "DeviceConnect"];
const OWNER = "provisioningserviceowner";
const PAGE_SIZE = 20;

export default async function render(root, app) {
  useAdminCss();
  const body = h("div", { class: "admin-page" });
  replace(root, pageHeader("Provisioning", "The Device Provisioning Service on this hub: enrollments admit devices, which register and are assigned to the hub."), body);
  loading(body);
  root.dataset.state = "loading";

  let overview;
  try {
    overview = (await app.api.get("/console/api/provisioning")).body || {};
  } catch (err) {
    if (!app.isCurrent()) return;
    failed(body, err, "Could not read the provisioning service");
    root.dataset.state = "error";
    return;
  }
  if (!app.isCurrent()) return;
  const policies = overview.policies || [];
  const owner = policies.find((p) => p.keyName === OWNER)
    || policies.find((p) => /EnrollmentWrite/.test(p.rights || ""));
  const mayManage = allowed(app, ALL) && Boolean(owner);
  const keyCache = new Map(); // policy name -> keys answer

  async function policyKeys(name) {
    if (!keyCache.has(name)) keyCache.set(name, (await app.api.get(`/console/api/provisioning/policies/${seg(name)}/keys`)).body);
    return keyCache.get(name);
  }

  const individual = h("div", { dataset: { testid: "enrollments-section" } });
  const groups = h("div", { dataset: { testid: "groups-section" } });
  replace(body, serviceCard(), mayManage ? null : deniedNote(), individual, groups);

  if (!mayManage) {
    replace(individual, listShell("individual", null).el);
    replace(groups, listShell("group", null).el);
    root.dataset.state = "ready";
    return;
  }
  let dps;
  try {
    const k = await policyKeys(owner.keyName);
    dps = createDpsClient(k.connectionString);
  } catch (err) {
    if (!app.isCurrent()) return;
    replace(individual, section("Individual enrollments", [], inlineError(err, "enrollments-error")));
    replace(groups);
    root.dataset.state = "error";
    return;
  }
  if (!app.isCurrent()) return;
  const one = listShell("individual", dps);
  const many = listShell("group", dps);
  replace(individual, one.el);
  replace(groups, many.el);
  await Promise.all([one.load(), many.load()]);
  if (app.isCurrent()) root.dataset.state = "ready";

  // -- the service: ID scope, endpoint, policies ----------------------------------------------
  function serviceCard() {
    const rows = policies.map((p) => {
      const keys = h("div", { class: "policy-keys", dataset: { testid: `provisioning-keys-${p.keyName}` }, "aria-live": "polite" });
      const show = guard(btn("Show connection string", () => reveal(), { small: true, testid: `show-connection-string-${p.keyName}` }), app, ALL);
      const hide = btn("Hide", () => conceal(), { small: true, testid: `hide-connection-string-${p.keyName}` });
      hide.hidden = true;
      async function reveal() {
        show.disabled = true;
        replace(keys, h("span", { class: "hint" }, "Loading…"));
        try {
          const k = await policyKeys(p.keyName);
          replace(keys, h("div", { class: "key-line" },
            h("span", { class: "key-label" }, "Connection string"),
            code(k.connectionString, `provisioning-connection-string-${p.keyName}`),
            copyButton(k.connectionString, { testid: `copy-provisioning-connection-string-${p.keyName}`, title: "Copy the connection string" })));
          show.hidden = true;
          hide.hidden = false;
          hide.focus();
        } catch (err) {
          replace(keys, inlineError(err, `provisioning-keys-error-${p.keyName}`));
        }
        show.disabled = false;
      }
      function conceal() {
        replace(keys);
        hide.hidden = true;
        show.hidden = false;
        show.focus();
      }
      const rights = String(p.rights || "").split(",").map((s) => s.trim()).filter(Boolean);
      return h("div", { class: "provisioning-policy", dataset: { policy: p.keyName } },
        h("div", { class: "section-head" },
          h("strong", {}, p.keyName),
          h("div", { class: "section-actions" }, show, hide)),
        h("div", { class: "chips" }, rights.length ? rights.map((r) => badge(r, "muted")) : badge("no rights", "warn")),
        keys);
    });
    const scope = overview.idScope || "";
    const endpoint = overview.globalEndpoint || "";
    return section("Provisioning service", [],
      facts([
        ["ID scope", h("span", { class: "copy-line" }, code(scope, "id-scope"), copyButton(scope, { testid: "copy-id-scope", title: "Copy the ID scope" }))],
        ["Global endpoint", h("span", { class: "copy-line" }, code(endpoint, "global-endpoint"), copyButton(endpoint, { testid: "copy-global-endpoint", title: "Copy the global endpoint" }))],
      ], "provisioning-facts"),
      h("p", { class: "hint" }, `A device registers at ${endpoint || "the hub's host name"} (port 443, MQTT 8883 or AMQP 5671) with this ID scope and its registration id, then connects to the hub it is assigned.`),
      h("h3", { class: "sub-title" }, "Provisioning policies"),
      h("p", { class: "hint" }, "The service API's own credentials (service SDKs and az iot dps take these connection strings; hub policies are refused)."),
      h("div", { class: "provisioning-policies", dataset: { testid: "provisioning-policies" } }, rows));
  }

  function deniedNote() {
    const lacking = ALL.filter((r) => !app.can(r));
    const why = owner
      ? `The signed-in policy (${app.session.policyName}) lacks ${lacking.join(", ")}.`
      : "The provisioning service has no policy that may write enrollments.";
    return h("div", { class: "card note-card", role: "note", dataset: { testid: "provisioning-denied" } },
      h("strong", {}, "Enrollments need a policy holding all four rights"),
      h("p", {}, "Enrollments and registration records are managed with the provisioning service's own key, which the console reads only for a hub policy holding RegistryRead, RegistryWrite, ServiceConnect and DeviceConnect (as iothubowner does). ",
        why, " Sign in with such a policy to list, create and change enrollments."));
  }

  // -- a list of enrollments or groups, with its detail panel --------------------------------------
  function listShell(kind, client) {
    const info = kindInfo(kind);
    const isGroup = kind === "group";
    const prefix = isGroup ? "groups" : "enrollments";
    const title = isGroup ? "Enrollment groups" : "Individual enrollments";
    const listBox = h("div", { class: "list-box", dataset: { testid: prefix } });
    const errorEl = h("div", { dataset: { testid: `${prefix}-error` }, "aria-live": "polite" });
    const detail = h("div", { class: "enrollment-detail-box", dataset: { testid: `${isGroup ? "group" : "enrollment"}-detail` }, "aria-live": "polite" });
    const create = guard(btn(isGroup ? "New group" : "New enrollment", () => createOne(), { kind: "primary", small: true, testid: isGroup ? "new-group" : "new-enrollment" }), app, ALL);
    const refresh = guard(btn("Refresh", () => reload(), { small: true, testid: `${prefix}-refresh` }), app, ALL);
    const intro = isGroup
      ? "A group admits many devices: with a symmetric key, each device signs with a key derived from the group key and its registration id; with X.509, each device presents a certificate its signing certificate issued."
      : "An individual enrollment admits one device, by its registration id, with a symmetric key or its X.509 certificate.";
    let openId = null; // the record whose details are shown
    let p = null;
    if (client) p = pager({ fetchPage, testid: `${prefix}-pager` });

    const el = section(title, [refresh, create], h("p", { class: "hint" }, intro), errorEl, listBox, p ? p.el : null, detail);
    el.dataset.testid = `${prefix}-card`;
    if (!client) {
      create.disabled = true;
      refresh.disabled = true;
      listBox.dataset.state = "empty";
      replace(listBox, emptyLine(`Not shown: ${title.toLowerCase()} need a policy holding all four rights (see the note above).`, `${prefix}-denied`));
    }

    async function fetchPage(token, { signal, isCurrent }) {
      let r;
      try {
        r = await client.post(`/${isGroup ? "enrollmentGroups" : "enrollments"}/query`, { query: "*" }, {
          headers: { "x-ms-max-item-count": String(PAGE_SIZE), ...(token ? { "x-ms-continuation": token } : {}) }, signal,
        });
      } catch (err) {
        if (!isCurrent()) return null;
        listBox.dataset.state = "error";
        replace(listBox, errorBox(err, `Could not list the ${title.toLowerCase()}`));
        return null;
      }
      if (!isCurrent()) return null;
      const items = Array.isArray(r.body) ? r.body : [];
      draw(items, token);
      return header(r.headers, "x-ms-continuation") || null;
    }

    function draw(items, token) {
      if (!items.length) {
        listBox.dataset.state = "empty";
        replace(listBox, emptyLine(token ? "No more on this page." : (isGroup
          ? "No enrollment groups yet. Create one with New group: a symmetric-key group lets a whole fleet register with keys derived from one group key."
          : "No individual enrollments yet. Create one with New enrollment, then register a device with its registration id and key."), `${prefix}-empty`));
        return;
      }
      const heads = isGroup
        ? ["Group", "Attestation", "Status", "Updated", h("span", { class: "sr-only" }, "Actions")]
        : ["Registration id", "Device id", "Attestation", "Status", "Updated", h("span", { class: "sr-only" }, "Actions")];
      replace(listBox, table(heads, items.map(recordRow), { testid: `${prefix}-table`, caption: title }));
      listBox.dataset.state = "ready";
    }

    function recordRow(record) {
      const id = recordId(kind, record);
      const enabled = record.provisioningStatus !== "disabled";
      const open = btn(id, () => openDetail(record), { kind: "link", testid: "open", title: "Details, keys and registrations" });
      const actions = h("div", { class: "row-actions" },
        guard(btn("Edit", () => edit(record), { small: true, testid: "edit" }), app, ALL),
        guard(btn(enabled ? "Disable" : "Enable", (e) => toggle(record, e.currentTarget), { small: true, testid: "toggle" }), app, ALL),
        guard(btn("Delete", () => remove(record), { small: true, kind: "danger", testid: "delete" }), app, ALL));
      for (const b of actions.querySelectorAll("button")) b.setAttribute("aria-label", `${b.textContent} ${id}`);
      const cells = [["Id", open]];
      if (!isGroup) cells.push(["Device id", record.deviceId || h("span", { class: "muted" }, `${id} (default)`)]);
      cells.push(
        ["Attestation", attestationSummary(record)],
        ["Status", statusBadge(record.provisioningStatus, "status")],
        ["Updated", formatTime(record.lastUpdatedDateTimeUtc)],
        ["", actions, "actions"]);
      return row(cells, { dataset: { record: id, status: enabled ? "enabled" : "disabled", etag: record.etag || "" } });
    }

    async function reload() {
      if (!p) return;
      replace(errorEl);
      await p.reload().catch(() => {});
    }

    async function createOne() {
      replace(errorEl);
      const saved = await enrollmentDialog(client, kind);
      if (!saved) return;
      toast(`${isGroup ? "Group" : "Enrollment"} ${recordId(kind, saved)} created`, "ok");
      await reload();
    }

    async function edit(record) {
      replace(errorEl);
      const saved = await enrollmentDialog(client, kind, record);
      // Saved or refused (a 412 shows in the dialog), the list is read again.
      await p.refresh().catch(() => {});
      if (saved) {
        toast(`Saved ${recordId(kind, saved)}`, "ok");
        if (openId === recordId(kind, saved)) openDetail(saved);
      }
    }

    async function toggle(record, button) {
      const id = recordId(kind, record);
      const to = record.provisioningStatus === "disabled" ? "enabled" : "disabled";
      replace(errorEl);
      button.disabled = true;
      try {
        const r = await client.put(enrollmentPath(kind, id), replacement(record, { provisioningStatus: to }), { ifMatch: record.etag });
        toast(`${id} ${to}`, "ok");
        if (openId === id && r.body) openDetail(r.body);
      } catch (err) {
        replace(errorEl, errorBox(err.status === 412 ? new Error(staleText(err, info.noun)) : err,
          `Could not ${to === "enabled" ? "enable" : "disable"} ${id}`));
        button.disabled = false;
      }
      await p.refresh().catch(() => {});
    }

    async function remove(record) {
      const id = recordId(kind, record);
      const yes = await confirm(`Delete the ${info.noun} ${id}?`, isGroup
        ? "Devices can no longer register through it. Devices that already did keep their hub identities, and their registration records stay until deleted."
        : "The device can no longer register with it. The hub device it created stays, and so does its registration record (delete that from the details first to remove it).",
      { confirmLabel: "Delete", danger: true, testid: "confirm-delete" });
      if (!yes) return;
      replace(errorEl);
      try {
        await client.del(enrollmentPath(kind, id), { ifMatch: record.etag });
        toast(`Deleted ${id}`, "ok");
        if (openId === id) closeDetail();
      } catch (err) {
        replace(errorEl, errorBox(err.status === 412 ? new Error(staleText(err, info.noun)) : err, `Could not delete ${id}`));
      }
      await p.refresh().catch(() => {});
    }

    function closeDetail() {
      openId = null;
      delete detail.dataset.record;
      replace(detail);
    }

    function openDetail(record) {
      const id = recordId(kind, record);
      openId = id;
      detail.dataset.record = id;
      const twin = record.initialTwin;
      const showKeys = btn(record.attestation && record.attestation.type === "x509" ? "Show certificate" : "Show keys", async () => {
        try {
          await attestationDialog(client, kind, record);
        } catch (err) {
          toast(`Could not read the attestation of ${id}: ${errorText(err)}`, "error");
        }
      }, { small: true, testid: "show-attestation" });
      const close = btn("Close", () => closeDetail(), { small: true, testid: "close-detail" });
      replace(detail,
        h("div", { class: "enrollment-detail" },
          h("div", { class: "section-head" },
            h("h3", { class: "card-title" }, `${isGroup ? "Group" : "Enrollment"} ${id}`),
            h("div", { class: "section-actions" }, showKeys, close)),
          facts([
            [info.idLabel, code(id)],
            isGroup ? null : ["Device id", record.deviceId || `${id} (the registration id)`],
            ["Attestation", attestationSummary(record)],
            ["Status", statusBadge(record.provisioningStatus, "detail-status")],
            ["Etag", code(record.etag || "—", "detail-etag")],
            ["Created", formatTime(record.createdDateTimeUtc)],
            ["Updated", formatTime(record.lastUpdatedDateTimeUtc)],
          ], "detail-facts"),
          twin ? h("div", {}, h("h4", { class: "sub-title" }, "Initial twin"), h("pre", { class: "json-view", dataset: { testid: "detail-twin" } }, JSON.stringify(twin, null, 2))) : null,
          isGroup ? groupParts(record) : registrationPart(id)));
      detail.scrollIntoView({ block: "nearest" });
      close.focus();
    }

    // An individual enrollment's registration record: GET /registrations/{id}.
    function registrationPart(id) {
      const box = h("div", { class: "list-box", dataset: { testid: "registration-record" } });
      const again = btn("Refresh", () => load(), { small: true, testid: "registration-refresh" });
      async function load() {
        loading(box);
        let rec;
        try {
          rec = (await client.get(`/registrations/${seg(id)}`)).body || {};
        } catch (err) {
          if (err.status === 404) {
            box.dataset.state = "empty";
            replace(box, emptyLine(`No registration record: no device has registered with this enrollment yet. A device registers at ${overview.globalEndpoint} with ID scope ${overview.idScope} and registration id ${id}.`, "registration-none"));
          } else {
            box.dataset.state = "error";
            replace(box, inlineError(err, "registration-error"));
          }
          return;
        }
        const del = guard(btn("Delete record", () => deleteRecord(rec), { small: true, kind: "danger", testid: "registration-delete" }), app, ALL);
        replace(box, registrationFacts(rec), h("div", { class: "form-actions" }, del));
        box.dataset.state = "ready";
      }
      async function deleteRecord(rec) {
        const yes = await confirm(`Delete the registration record of ${id}?`,
          "The hub device stays. The record is written again the next time the device registers.",
          { confirmLabel: "Delete record", danger: true, testid: "confirm-registration-delete" });
        if (!yes) return;
        try {
          await client.del(`/registrations/${seg(id)}`, { ifMatch: rec.etag });
          toast(`Registration record of ${id} deleted`, "ok");
        } catch (err) {
          toast(`Could not delete the record of ${id}: ${errorText(err)}`, "error");
        }
        await load();
      }
      load();
      return h("div", {}, h("div", { class: "section-head" }, h("h4", { class: "sub-title" }, "Registration record"), again), box);
    }

    // A group's derived device keys and registrations.
    function groupParts(record) {
      const id = recordId(kind, record);
      const sas = record.attestation && record.attestation.type === "symmetricKey";
      const regBox = h("div", { class: "list-box", dataset: { testid: "group-registrations" } });
      const regPager = pager({ fetchPage: fetchRegistrations, testid: "group-registrations-pager" });
      const again = btn("Refresh", () => regPager.reload().catch(() => {}), { small: true, testid: "group-registrations-refresh" });

      async function fetchRegistrations(token, { signal, isCurrent }) {
        let r;
        try {
          r = await client.post(`/registrations/${seg(id)}/query`, {}, {
            headers: { "x-ms-max-item-count": String(PAGE_SIZE), ...(token ? { "x-ms-continuation": token } : {}) }, signal,
          });
        } catch (err) {
          if (!isCurrent()) return null;
          regBox.dataset.state = "error";
          replace(regBox, inlineError(err, "group-registrations-error"));
          return null;
        }
        if (!isCurrent()) return null;
        const items = Array.isArray(r.body) ? r.body : [];
        if (!items.length) {
          regBox.dataset.state = "empty";
          replace(regBox, emptyLine(token ? "No more registrations." : `No device has registered through ${id} yet.`, "group-registrations-empty"));
          return null;
        }
        replace(regBox, table(["Registration id", "Device id", "Status", "Assigned hub", "Updated", h("span", { class: "sr-only" }, "Actions")],
          items.map((rec) => row([
            ["Registration id", code(rec.registrationId)],
            ["Device id", rec.deviceId || "—"],
            ["Status", registrationBadge(rec.status)],
            ["Assigned hub", rec.assignedHub || "—"],
            ["Updated", formatTime(rec.lastUpdatedDateTimeUtc)],
            ["", h("div", { class: "row-actions" }, guard(btn("Delete", () => deleteMember(rec), { small: true, kind: "danger", testid: "registration-delete", title: `Delete the registration record of ${rec.registrationId}` }), app, ALL)), "actions"],
          ], { dataset: { registration: rec.registrationId } })), { testid: "group-registrations-table", caption: `Registrations of ${id}` }));
        regBox.dataset.state = "ready";
        return header(r.headers, "x-ms-continuation") || null;
      }

      async function deleteMember(rec) {
        const yes = await confirm(`Delete the registration record of ${rec.registrationId}?`,
          "The hub device stays. The record is written again the next time the device registers.",
          { confirmLabel: "Delete record", danger: true, testid: "confirm-registration-delete" });
        if (!yes) return;
        try {
          await client.del(`/registrations/${seg(rec.registrationId)}`, { ifMatch: rec.etag });
          toast(`Registration record of ${rec.registrationId} deleted`, "ok");
        } catch (err) {
          toast(`Could not delete the record of ${rec.registrationId}: ${errorText(err)}`, "error");
        }
        await regPager.refresh().catch(() => {});
      }

      loading(regBox);
      regPager.reload().catch(() => {});
      return h("div", {},
        sas ? deriveForm(id) : h("p", { class: "hint" }, "Each device presents a certificate issued by the group's signing certificate; its registration id is the certificate's CN."),
        h("div", { class: "section-head" }, h("h4", { class: "sub-title" }, "Registrations"), again),
        regBox, regPager.el);
    }

    // "Derive a device key": HMAC-SHA256 of the registration id with the group's primary key.
    function deriveForm(id) {
      const rid = input({ testid: "derive-registration-id", placeholder: "sensor-0042", id: "derive-registration-id" });
      const out = h("div", { class: "derive-result", dataset: { testid: "derive-result" }, "aria-live": "polite" });
      const go = h("button", { type: "submit", class: "btn btn-small btn-primary", dataset: { testid: "derive-key" } }, "Derive key");
      const form = h("form", { class: "search-bar derive-form", "aria-label": "Derive a device key" },
        h("label", { class: "sr-only", for: "derive-registration-id" }, "Registration id"), rid, go);
      form.addEventListener("submit", async (e) => {
        e.preventDefault();
        const regId = rid.value.trim();
        replace(out);
        if (!regId) {
          replace(out, inlineError(new Error("Enter the device's registration id."), "derive-error"));
          return;
        }
        go.disabled = true;
        try {
          const mech = (await client.post(`${enrollmentPath("group", id)}/attestationmechanism`)).body || {};
          const key = await deriveDeviceKey(mech.symmetricKey && mech.symmetricKey.primaryKey, regId);
          replace(out, h("div", { class: "key-line" },
            h("span", { class: "key-label" }, `Key of ${regId}`),
            code(key, "derived-key"),
            copyButton(key, { testid: "copy-derived-key", title: "Copy the device key" })));
          out.dataset.registrationId = regId;
        } catch (err) {
          replace(out, inlineError(err, "derive-error"));
        }
        go.disabled = false;
      });
      return h("div", {},
        h("h4", { class: "sub-title" }, "Derive a device key"),
        h("p", { class: "hint" }, "A member device signs with base64(HMAC-SHA256(group key, registration id)), computed here in the tab from the group's primary key (as az iot dps enrollment-group compute-device-key does)."),
        form, out);
    }

    return {
      el,
      load() {
        if (!client) return Promise.resolve();
        loading(listBox);
        return reload();
      },
    };
  }
}

function registrationBadge(status) {
  const kind = { assigned: "ok", assigning: "info", failed: "bad", disabled: "muted", unassigned: "warn" }[status] || "muted";
  return h("span", { dataset: { testid: "registration-status", status: status || "" } }, badge(status || "unknown", kind));
}

/** A registration record's facts (GET /registrations/{id}). */
function registrationFacts(rec) {
  return facts([
    ["Status", registrationBadge(rec.status)],
    ["Assigned hub", h("span", { dataset: { testid: "registration-hub" } }, rec.assignedHub || "—")],
    ["Device id", h("span", { dataset: { testid: "registration-device" } }, rec.deviceId || "—")],
    ["Substatus", rec.substatus || "—"],
    ["Created", formatTime(rec.createdDateTimeUtc)],
    ["Updated", formatTime(rec.lastUpdatedDateTimeUtc)],
    ["Etag", code(rec.etag || "—")],
    rec.errorCode ? ["Error", `${rec.errorCode}: ${rec.errorMessage || ""}`] : null,
  ], "registration-facts");
}
