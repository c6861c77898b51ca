// Policies (#/policies): the hub's shared access policies and their rights
// (GET /console/api/policies). Keys stay hidden until "Show keys" is clicked
// (GET /console/api/policies/{name}/keys, which only a policy holding all four rights may call).
import { h, replace, loading, failed, badge, pageHeader, copyButton } from "../lib/ui.js";
import { seg } from "../lib/api.js";
import { useAdminCss, guard, btn, code, inlineError, section, emptyLine } from "../lib/admin-ui.js";

const ALL = ["RegistryRead", "RegistryWrite", "ServiceConnect", "DeviceConnect"];
const RIGHT_HELP = {
  RegistryRead: "read identities, twins, routing, configurations",
  RegistryWrite: "create, change and delete identities and hub settings",
  ServiceConnect: "service-side messaging: C2D, methods, twin updates, jobs, the read API",
  DeviceConnect: "act as any device",
};

export default async function render(root, app) {
  useAdminCss();
  const body = h("div", { class: "admin-page" });
  replace(root, pageHeader("Shared access policies", "Each policy's rights; keys are shown only on request, to a policy holding all four rights."), body);

  loading(body);
  root.dataset.state = "loading";
  let list;
  try {
    list = (await app.api.get("/console/api/policies")).body || [];
  } catch (err) {
    if (!app.isCurrent()) return;
    failed(body, err, "Could not list the policies");
    root.dataset.state = "error";
    return;
  }
  if (!app.isCurrent()) return;
  if (!list.length) {
    root.dataset.state = "empty";
    replace(body, section("Policies", [], emptyLine("The hub has no shared access policies.", "policies-empty")));
    return;
  }
  root.dataset.state = "ready";
  const me = app.session && app.session.policyName;
  replace(body,
    h("div", { class: "policy-grid", dataset: { testid: "policies" } }, list.map((p) => policyCard(p, p.keyName === me))),
    section("Rights", [], h("dl", { class: "facts" }, ALL.map((r) => h("div", { class: "fact" }, h("dt", {}, r), h("dd", {}, RIGHT_HELP[r]))))));

  function policyCard(p, mine) {
    const rights = String(p.rights || "").split(",").map((s) => s.trim()).filter(Boolean);
    const keys = h("div", { class: "policy-keys", dataset: { testid: `keys-${p.keyName}` }, "aria-live": "polite" });
    const show = guard(btn("Show keys", () => reveal(), { small: true, testid: `show-keys-${p.keyName}` }), app, ALL);
    const hide = btn("Hide keys", () => conceal(), { small: true, testid: `hide-keys-${p.keyName}` });
    hide.hidden = true;

    async function reveal() {
      show.disabled = true;
      replace(keys, h("span", { class: "hint" }, "Loading keys…"));
      try {
        const k = (await app.api.get(`/console/api/policies/${seg(p.keyName)}/keys`)).body;
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

    return h("article", { class: "card policy-card", dataset: { policy: p.keyName } },
      h("div", { class: "section-head" },
        h("h2", { class: "card-title" }, p.keyName, mine ? [" ", badge("signed in", "info")] : null),
        h("div", { class: "section-actions" }, show, hide)),
      h("div", { class: "chips", dataset: { testid: `rights-${p.keyName}` } },
        rights.length ? rights.map((r) => h("span", { title: RIGHT_HELP[r] || "" }, badge(r, "muted"))) : badge("no rights", "warn")),
      keys);
  }
}

function keyLine(label, value, testid) {
  return h("div", { class: "key-line" },
    h("span", { class: "key-label" }, label),
    code(value, testid),
    copyButton(value, { testid: `copy-${testid}`, title: `Copy the ${label.toLowerCase()}` }));
}
