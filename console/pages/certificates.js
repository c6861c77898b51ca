// Certificates (#/certificates): the certificate authorities X.509 CA-signed devices chain to
// (GET /certificates), with their details; upload a PEM (PUT /certificates/{name}) and delete.
import { h, replace, loading, failed, toast, dialog, confirm, field, table, pageHeader, formatTime, facts, copyButton, errorText } from "../lib/ui.js";
import { seg } from "../lib/api.js";
import { useAdminCss, guard, btn, input, row, code, section, emptyLine } from "../lib/admin-ui.js";

const WRITE = ["RegistryWrite"];

/** "AB:CD:…" from a hex thumbprint, for reading; copying keeps the hub's form. */
function colons(hex) {
  return String(hex || "").toUpperCase().replace(/(..)(?=.)/g, "$1:");
}

export default async function render(root, app) {
  useAdminCss();
  const body = h("div", { class: "admin-page" });
  const upload = guard(btn("Add CA certificate", () => add(), { kind: "primary", testid: "add-certificate" }), app, WRITE);
  replace(root, pageHeader("Certificates", "Certificate authorities: devices authenticating with X.509 certificates they signed are accepted.", upload), body);

  let first = true;
  async function load() {
    if (first) {
      loading(body);
      root.dataset.state = "loading";
    }
    let list;
    try {
      list = (await app.api.get("/certificates")).body || [];
    } catch (err) {
      if (!app.isCurrent()) return;
      failed(body, err, "Could not list the certificate authorities");
      root.dataset.state = "error";
      return;
    }
    first = false;
    if (!app.isCurrent()) return;
    if (!list.length) {
      root.dataset.state = "empty";
      replace(body, section("Certificate authorities", [],
        emptyLine("No certificate authorities. Devices can still use self-signed X.509 certificates registered by thumbprint; add a CA to accept every device certificate it signs.", "certificates-empty")));
      return;
    }
    root.dataset.state = "ready";
    const rows = list.map((c) => row([
      ["Name", btn(c.name, () => details(c), { kind: "link", testid: `certificate-${c.name}`, title: "Details" })],
      ["Subject", c.subject || "—"],
      ["SHA-1 thumbprint", code(c.thumbprint || "", `thumbprint-${c.name}`)],
      ["Added", formatTime(c.created)],
      ["", h("div", { class: "row-actions" },
        guard(btn("Delete", () => remove(c), { small: true, kind: "danger", testid: `delete-certificate-${c.name}` }), app, WRITE)),
      "actions"],
    ], { dataset: { certificate: c.name } }));
    replace(body, section("Certificate authorities", [],
      table(["Name", "Subject (CN)", "SHA-1 thumbprint", "Added", h("span", { class: "sr-only" }, "Actions")], rows, { testid: "certificates-table", caption: "Certificate authorities" })));
  }

  function details(c) {
    return dialog({
      title: `Certificate authority ${c.name}`,
      wide: true,
      testid: "certificate-dialog",
      body: facts([
        ["Name", c.name],
        ["Subject (CN)", c.subject || "—"],
        ["SHA-1 thumbprint", h("span", { class: "copy-line" }, code(colons(c.thumbprint)), copyButton(c.thumbprint || "", { testid: "copy-sha1" }))],
        ["SHA-256 thumbprint", h("span", { class: "copy-line" }, code(colons(c.thumbprintSha256)), copyButton(c.thumbprintSha256 || "", { testid: "copy-sha256" }))],
        ["Added", formatTime(c.created)],
      ], "certificate-facts"),
      actions: [{ label: "Close", value: null, testid: "dialog-close" }],
    });
  }

  async function add() {
    const name = input({ testid: "certificate-name", placeholder: "fleet-root" });
    const pem = input({ rows: 10, mono: true, testid: "certificate-pem", placeholder: "-----BEGIN CERTIFICATE-----\n…\n-----END CERTIFICATE-----" });
    const file = h("input", { type: "file", accept: ".pem,.crt,.cer", class: "input", dataset: { testid: "certificate-file" } });
    file.addEventListener("change", async () => {
      const f = file.files && file.files[0];
      if (!f) return;
      pem.value = await f.text();
      if (!name.value.trim()) name.value = f.name.replace(/\.(pem|crt|cer)$/i, "");
    });
    const saved = await dialog({
      title: "Add a CA certificate",
      testid: "certificate-add-dialog",
      body: h("div", { class: "form" },
        field("Name", name),
        field("PEM file", file, "Or paste the certificate below."),
        field("Certificate (PEM)", pem)),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: "Add certificate", kind: "primary", testid: "certificate-save",
          run: async () => {
            const n = name.value.trim();
            if (!n) throw new Error("The certificate needs a name.");
            if (!pem.value.includes("BEGIN CERTIFICATE")) throw new Error("Paste a PEM certificate (-----BEGIN CERTIFICATE-----).");
            await app.api.put(`/certificates/${seg(n)}`, { certificate: pem.value });
            return n;
          },
        },
      ],
    });
    if (saved) {
      toast(`Certificate authority ${saved} added`, "ok");
      await load();
    }
  }

  async function remove(c) {
    const yes = await confirm(`Delete certificate authority ${c.name}?`,
      "Devices whose certificates chain only to it can no longer connect.", { confirmLabel: "Delete", danger: true, testid: "confirm-delete" });
    if (!yes) return;
    try {
      await app.api.del(`/certificates/${seg(c.name)}`);
      toast(`Deleted ${c.name}`, "ok");
    } catch (err) {
      toast(`Could not delete ${c.name}: ${errorText(err)}`, "error");
    }
    await load();
  }

  await load();
}
