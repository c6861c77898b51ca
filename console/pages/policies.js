// Policies (#/policies): the hub's shared access policies and their rights
// (GET /console/api/policies). Keys stay hidden until "Show keys" is clicked
// (GET /console/api/policies/{name}/keys, which only a policy holding all four rights may call).
//
// A policy holding all four rights may also change them, as IoT Hub's portal does:
//   add a policy or change its rights   PUT    /console/api/policies/{name}  {"rights": [...]}
//   regenerate its primary or secondary POST   /console/api/policies/{name}/regenerate {"key": ...}
//   remove it                           DELETE /console/api/policies/{name}
// The hub decides (a bad name, no right, a 17th policy, none left with all four rights are
// refused with its 400, shown in the dialog, which stays open); the list is read again after
// each change.
//
// The console signs every call with the signed-in policy's key, so changes to that policy are
// handled here: regenerating the key the console signs with switches the session to the new
// key (read with the policy's other key, which the regeneration left alone); removing the
// policy signs out; changing its rights reads the session's rights again.
import { h, replace, loading, failed, badge, pageHeader, copyButton, dialog, toast, field, errorText } from "../lib/ui.js";
import { createApi, seg, ApiError } from "../lib/api.js";
import { useAdminCss, guard, btn, input, code, inlineError, section, emptyLine } from "../lib/admin-ui.js";

const ALL = ["RegistryRead", "RegistryWrite", "ServiceConnect", "DeviceConnect"];
const RIGHT_HELP = {
  RegistryRead: "read identities, twins, routing, configurations",
  RegistryWrite: "create, change and delete identities and hub settings",
  ServiceConnect: "service-side messaging: C2D, methods, twin updates, jobs, the read API",
  DeviceConnect: "act as any device",
};
// What the hub accepts (engine/src/policies.rs); shown as a hint, checked by the hub.
const MAX_POLICIES = 16;
const NAME_RULE = "1 to 64 letters, digits, '-', '.' or '_'";
// In a cluster, the other nodes take a change within about a second (REFRESH_EVERY).
const SETTLE_MS = 5000;

const keysPath = (name) => `/console/api/policies/${seg(name)}/keys`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export default async function render(root, app) {
  useAdminCss();
  const body = h("div", { class: "admin-page" });
  const add = guard(btn("Add policy", () => addPolicy(), { kind: "primary", testid: "add-policy" }), app, ALL);
  replace(root, pageHeader("Shared access policies", "Each policy's rights; keys are shown only on request, to a policy holding all four rights.", add), body);

  let list = [];
  let first = true;

  async function load() {
    if (first) loading(body);
    root.dataset.state = "loading";
    try {
      list = (await app.api.get("/console/api/policies")).body || [];
    } catch (err) {
      if (!app.isCurrent()) return;
      failed(body, err, "Could not list the policies");
      root.dataset.state = "error";
      return;
    }
    first = false;
    if (!app.isCurrent()) return;
    // A 17th policy is refused by the hub: say so on the button instead of after the dialog.
    if (!add.classList.contains("needs-right")) {
      const full = list.length >= MAX_POLICIES;
      add.disabled = full;
      add.title = full ? `The hub holds at most ${MAX_POLICIES} policies: remove one first` : "";
    }
    if (!list.length) {
      root.dataset.state = "empty";
      replace(body, section("Policies", [], emptyLine("The hub has no shared access policies.", "policies-empty")));
      return;
    }
    const me = app.session && app.session.policyName;
    replace(body,
      h("div", { class: "policy-grid", dataset: { testid: "policies" } }, list.map((p) => policyCard(p, p.keyName === me))),
      section("Rights", [],
        h("dl", { class: "facts" }, ALL.map((r) => h("div", { class: "fact" }, h("dt", {}, r), h("dd", {}, RIGHT_HELP[r])))),
        h("p", { class: "hint" },
          `Changes need all four rights. Names: ${NAME_RULE}; at most ${MAX_POLICIES} policies; RegistryWrite brings RegistryRead; `
          + "at least one policy always keeps all four rights. In a cluster, the other nodes take a change within about a second.")));
    root.dataset.state = "ready";
  }

  function policyCard(p, mine) {
    const rights = rightsOf(p);
    const keys = h("div", { class: "policy-keys", dataset: { testid: `keys-${p.keyName}` }, "aria-live": "polite" });
    const show = guard(btn("Show keys", () => reveal(), { small: true, testid: `show-keys-${p.keyName}` }), app, ALL);
    const hide = btn("Hide keys", () => conceal(), { small: true, testid: `hide-keys-${p.keyName}` });
    hide.hidden = true;

    async function reveal() {
      show.disabled = true;
      replace(keys, h("span", { class: "hint" }, "Loading keys…"));
      try {
        const k = (await app.api.get(keysPath(p.keyName))).body;
        const host = (app.session && app.session.hostName) || app.info.hostName;
        const cs = `HostName=${host};SharedAccessKeyName=${p.keyName};SharedAccessKey=${k.primaryKey}`;
        replace(keys,
          keyLine("Primary key", k.primaryKey, `primary-key-${p.keyName}`),
          keyLine("Secondary key", k.secondaryKey, `secondary-key-${p.keyName}`),
          keyLine("Connection string", cs, `connection-string-${p.keyName}`));
        show.hidden = true;
        hide.hidden = false;
        hide.focus();
      } catch (err) {
        replace(keys, inlineError(err, `keys-error-${p.keyName}`));
      }
      show.disabled = false;
    }

    function conceal() {
      replace(keys);
      hide.hidden = true;
      show.hidden = false;
      show.focus();
    }

    const change = (label, fn, testid, kind = "") => guard(btn(label, fn, { small: true, kind, testid }), app, ALL);
    return h("article", { class: "card policy-card", dataset: { policy: p.keyName } },
      h("div", { class: "section-head" },
        h("h2", { class: "card-title" }, p.keyName, mine ? [" ", badge("signed in", "info")] : null),
        h("div", { class: "section-actions" }, show, hide)),
      h("div", { class: "chips", dataset: { testid: `rights-${p.keyName}` } },
        rights.length ? rights.map((r) => h("span", { title: RIGHT_HELP[r] || "" }, badge(r, "muted"))) : badge("no rights", "warn")),
      h("div", { class: "policy-actions", role: "group", "aria-label": `Change ${p.keyName}` },
        change("Edit rights", () => editRights(p, mine), `edit-policy-${p.keyName}`),
        change("Regenerate primary key", () => regenerate(p, "primary", mine), `regenerate-primary-${p.keyName}`),
        change("Regenerate secondary key", () => regenerate(p, "secondary", mine), `regenerate-secondary-${p.keyName}`),
        change("Remove", () => remove(p, mine), `remove-policy-${p.keyName}`, "danger")),
      keys);
  }

  // -- add, edit -------------------------------------------------------------------------------

  async function addPolicy() {
    const name = input({ testid: "policy-name", placeholder: "ops", id: "policy-name" });
    const picker = rightsPicker([]);
    const saved = await dialog({
      title: "Add a shared access policy",
      testid: "policy-dialog",
      body: h("div", { class: "form" },
        field("Name", name, `${NAME_RULE}. New keys are generated for it.`),
        picker.el),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: "Add policy", kind: "primary", testid: "policy-save",
          run: async () => {
            const n = name.value.trim();
            if (!n) throw new Error("The policy needs a name.");
            // PUT on an existing name would change its rights: that is "Edit rights".
            if (list.some((p) => p.keyName === n)) throw new Error(`A policy named ${n} exists already: use its "Edit rights".`);
            const rights = picker.values();
            if (!rights.length) throw new Error("Tick at least one right.");
            await app.api.put(`/console/api/policies/${seg(n)}`, { rights });
            return n;
          },
        },
      ],
    });
    if (!saved) return;
    toast(`Policy ${saved} added`, "ok");
    await load();
  }

  async function editRights(p, mine) {
    const picker = rightsPicker(rightsOf(p));
    const saved = await dialog({
      title: `Rights of ${p.keyName}`,
      testid: "policy-dialog",
      body: h("div", { class: "form" },
        h("p", { class: "hint" }, "Its keys stay as they are; clients using them get the new rights from their next token."),
        mine ? h("p", { class: "hint", dataset: { testid: "edit-self-note" } },
          "The console is signed in with this policy: without all four rights it can no longer change policies.") : null,
        picker.el),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: "Save rights", kind: "primary", testid: "policy-save",
          run: async () => {
            const rights = picker.values();
            if (!rights.length) throw new Error("Tick at least one right.");
            await app.api.put(`/console/api/policies/${seg(p.keyName)}`, { rights });
            return true;
          },
        },
      ],
    });
    if (!saved) return;
    toast(`Rights of ${p.keyName} changed`, "ok");
    if (mine) {
      // The console's buttons follow the session's rights: read them again, and draw the page anew.
      try {
        await app.refreshInfo();
      } catch (err) {
        toast(`Could not read the session's rights again: ${errorText(err)}`, "error");
      }
      if (app.isCurrent()) app.navigate("#/policies");
      return;
    }
    await load();
  }

  // -- regenerate ----------------------------------------------------------------------------

  async function regenerate(p, which, mine) {
    const slot = `${which}Key`;
    const other = which === "primary" ? "secondary" : "primary";
    // Is this the key the console signs with? Only the signed-in policy's keys can be.
    let before = null;
    if (mine) {
      try {
        before = (await app.api.get(keysPath(p.keyName))).body;
      } catch (err) {
        toast(`Could not read the keys of ${p.keyName}: ${errorText(err)}`, "error");
        return;
      }
    }
    const inUse = Boolean(before && before[slot] === app.session.key);
    const done = await dialog({
      title: `Regenerate the ${which} key of ${p.keyName}?`,
      testid: "regenerate-dialog",
      body: h("div", {},
        h("p", {}, `Every client using the ${which} key of ${p.keyName} (its connection strings and the SAS tokens signed with it) `
          + `is refused from its next request until it is given the new key. The ${other} key keeps working: move clients to it first to rotate without an outage.`),
        inUse ? h("p", { class: "hint", dataset: { testid: "regenerate-self-note" } },
          `The console is signed in with this key: it switches to the new ${which} key itself.`) : null),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: `Regenerate ${which} key`, kind: "danger", testid: "confirm-regenerate",
          run: async () => {
            await app.api.post(`/console/api/policies/${seg(p.keyName)}/regenerate`, { key: which });
            return true;
          },
        },
      ],
    });
    if (!done) return;
    if (inUse) {
      try {
        await switchKey(p.keyName, which, before);
      } catch (err) {
        // The key the console signed with is gone and the new one could not be taken up.
        toast(`The ${which} key was regenerated, but the console could not switch to it (${errorText(err)}): sign in again.`, "error", 10000);
        app.signOut();
        return;
      }
      toast(`New ${which} key for ${p.keyName}; the console now signs with it`, "ok");
    } else {
      toast(`New ${which} key for ${p.keyName}`, "ok");
    }
    await load();
  }

  /**
   * After the signed-in key was regenerated: reads the new key with the policy's other key (which
   * the regeneration left valid), makes the session sign with it, and checks that the hub takes
   * it. In a cluster another node may need about a second to hold the change, hence the retries.
   */
  async function switchKey(name, which, before) {
    const slot = `${which}Key`;
    const otherKey = which === "primary" ? before.secondaryKey : before.primaryKey;
    const viaOther = createApi({ ...app.session, key: otherKey });
    const deadline = Date.now() + SETTLE_MS;
    let fresh = null;
    for (;;) {
      const k = (await viaOther.get(keysPath(name))).body;
      if (k && k[slot] && k[slot] !== before[slot]) {
        fresh = k[slot];
        break;
      }
      if (Date.now() > deadline) throw new Error(`the hub still reports the old ${which} key`);
      await sleep(250);
    }
    app.useKey(fresh);
    for (;;) {
      try {
        await app.api.get("/console/api/session");
        return;
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 401) || Date.now() > deadline) throw err;
        await sleep(250);
      }
    }
  }

  // -- remove --------------------------------------------------------------------------------

  async function remove(p, mine) {
    const done = await dialog({
      title: `Remove policy ${p.keyName}?`,
      testid: "remove-dialog",
      body: h("div", {},
        h("p", {}, `Every client using ${p.keyName}'s keys (its connection strings and SAS tokens) is refused from its next request. This cannot be undone: a policy added again under this name gets new keys.`),
        mine ? h("p", { class: "error-state", role: "note", dataset: { testid: "remove-self-warning" } },
          `The console is signed in with ${p.keyName}: it will be signed out, and you need another policy's connection string to sign in again.`) : null),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: mine ? "Remove and sign out" : "Remove", kind: "danger", testid: "confirm-remove",
          run: async () => {
            await app.api.del(`/console/api/policies/${seg(p.keyName)}`);
            return true;
          },
        },
      ],
    });
    if (!done) return;
    if (mine) {
      toast(`Policy ${p.keyName} removed; the console signed out`, "ok", 6000);
      app.signOut();
      return;
    }
    toast(`Policy ${p.keyName} removed`, "ok");
    await load();
  }

  await load();
}

/** A policy's rights from the list's "RegistryRead, RegistryWrite, ..." string. */
function rightsOf(p) {
  return String(p.rights || "").split(",").map((s) => s.trim()).filter(Boolean);
}

/**
 * The four rights as checkboxes, each with what it allows: {el, values()}. Ticking RegistryWrite
 * ticks RegistryRead and holds it (the hub gives RegistryRead with RegistryWrite anyway).
 */
function rightsPicker(checked) {
  const boxes = {};
  const rows = ALL.map((r) => {
    const box = h("input", { type: "checkbox", value: r, checked: checked.includes(r), dataset: { testid: `policy-right-${r}` }, id: `policy-right-${r}` });
    boxes[r] = box;
    return h("label", { class: "check right-check", for: box.id },
      box, h("span", {}, h("span", { class: "right-name" }, r), h("span", { class: "hint right-help" }, RIGHT_HELP[r])));
  });
  const implied = h("span", { class: "hint", id: "policy-read-implied" });
  const sync = () => {
    const write = boxes.RegistryWrite.checked;
    if (write) boxes.RegistryRead.checked = true;
    boxes.RegistryRead.disabled = write;
    implied.textContent = write ? "RegistryRead comes with RegistryWrite." : "";
  };
  boxes.RegistryWrite.addEventListener("change", sync);
  sync();
  const el = h("fieldset", { class: "fieldset rights-checks", dataset: { testid: "policy-rights" } },
    h("legend", {}, "Rights"), rows, implied);
  return { el, values: () => ALL.filter((r) => boxes[r].checked) };
}

function keyLine(label, value, testid) {
  return h("div", { class: "key-line" },
    h("span", { class: "key-label" }, label),
    code(value, testid),
    copyButton(value, { testid: `copy-${testid}`, title: `Copy the ${label.toLowerCase()}` }));
}
