// The Jobs page's "Import and export" section: the hub's registry import and export jobs
// (GET /jobs, POST /jobs/create, DELETE /jobs/{id}) to and from a blob container given by its
// SAS URL, listed with their progress (refreshed while one is queued or running); and the same
// devices.txt downloaded and imported by the console itself, for an operator without a storage
// account (lib/registry-file.js). The console reaches only its own origin (connect-src 'self'),
// so it never talks to the storage account: the hub does, for jobs.
import { h, replace, loading, toast, dialog, confirm, field, table, formatTime, errorText } from "./ui.js";
import { seg } from "./api.js";
import { guard, btn, input, row, code, inlineError, section, emptyLine, toggle, allowed } from "./admin-ui.js";
import { readRegistry, parseImportFile, applyImport } from "./registry-file.js";

const ACTIVE = ["queued", "running"];
const REFRESH_MS = 2000;
const TYPE_LABEL = { export: "Export", import: "Import" };
const FILE_NAME = "devices.txt";
const SAS_PLACEHOLDER = "https://account.blob.core.windows.net/container?sv=…&sig=…";

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/** A container SAS URL from a form field (whitespace from a wrapped paste removed), or throws. */
function containerUri(value, name) {
  const uri = value.replace(/\s+/g, "");
  if (!uri) throw new Error(`${name}: enter the container's SAS URL.`);
  let url;
  try {
    url = new URL(uri);
  } catch {
    throw new Error(`${name}: not a URL.`);
  }
  if (!["https:", "http:", "file:"].includes(url.protocol)) throw new Error(`${name}: an https:// container SAS URL (or file:/// on the hub's machine).`);
  return uri;
}

/** A container URI without its query (the SAS signature is never shown). */
function shownUri(uri) {
  if (!uri) return "—";
  try {
    const u = new URL(uri);
    return u.protocol === "file:" ? u.href : `${u.origin}${u.pathname}`;
  } catch {
    return uri.split("?")[0];
  }
}

function percentBar(percent, testid) {
  const p = Math.max(0, Math.min(100, Number(percent) || 0));
  const ok = h("span", { class: "admin-bar-ok" });
  ok.style.width = `${p}%`;
  return h("div", { class: "admin-progress", dataset: { testid } },
    h("div", { class: "admin-bar", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": String(p), "aria-label": "Job progress" }, ok),
    h("span", { class: "admin-bar-text" }, `${p}%`));
}

/** Saves `text` as a file through a Blob link (no request leaves the page). */
function saveFile(text, name) {
  const url = URL.createObjectURL(new Blob([text], { type: "text/plain;charset=utf-8" }));
  const a = h("a", { href: url, download: name, class: "offscreen" });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** The section: {el, load}. `statusBadge` draws a job status (pages/jobs.js). */
export function importExportSection(app, { statusBadge }) {
  let timer = null;
  let stopped = false;
  let seq = 0;
  app.onLeave(() => { stopped = true; clearTimeout(timer); });

  const list = h("div", { class: "list-box", dataset: { testid: "imports" } });
  const live = h("span", { class: "live-note", dataset: { testid: "imports-live" } });
  const result = h("div", { class: "io-result", dataset: { testid: "registry-result" } });
  const actions = h("div", { class: "io-actions" },
    guard(btn("Export to a container…", exportJob, { kind: "primary", testid: "export-job" }), app, ["RegistryRead"]),
    guard(btn("Import from a container…", importJob, { testid: "import-job" }), app, ["RegistryWrite"]),
    guard(btn("Download identities as a file…", download, { testid: "download-identities" }), app, ["RegistryRead"]),
    guard(btn("Import from a file…", importFile, { testid: "import-file" }), app, ["RegistryWrite"]));
  const el = section("Import and export", [live, btn("Refresh", () => load(), { small: true, testid: "imports-refresh" })],
    h("p", { class: "hint" }, "Every device and module with its keys, tags and desired properties, as devices.txt (one JSON line each). ",
      "Jobs run in the hub against a blob container named by its SAS URL; the file buttons do the same from this browser through the REST API, for registries of modest size."),
    actions, result, list);
  el.dataset.testid = "import-export";

  function showResult(state, ...body) {
    result.dataset.state = state;
    delete result.dataset.jobId;
    const dismiss = btn("Dismiss", () => { replace(result); delete result.dataset.state; delete result.dataset.jobId; }, { small: true, kind: "link", testid: "registry-dismiss" });
    const ok = state === "ok";
    replace(result, h("div", { class: ok ? "result-box" : "error-state", role: ok ? "status" : "alert" }, ...body, " ", dismiss));
  }

  async function load({ quiet = false } = {}) {
    clearTimeout(timer);
    if (!allowed(app, ["RegistryRead"])) {
      list.dataset.state = "empty";
      replace(list, emptyLine("Needs RegistryRead: the signed-in policy does not have it.", "imports-denied"));
      return;
    }
    const my = ++seq;
    if (!quiet) loading(list);
    let jobs;
    try {
      jobs = (await app.api.get("/jobs")).body || [];
    } catch (err) {
      if (stopped || my !== seq) return;
      list.dataset.state = "error";
      replace(list, inlineError(err, "imports-error"));
      return;
    }
    if (stopped || my !== seq) return;
    draw(jobs);
    const active = jobs.some((j) => ACTIVE.includes(j.status));
    live.textContent = active ? "Refreshing while a job runs" : "";
    if (active) timer = setTimeout(() => { if (!stopped) load({ quiet: true }); }, REFRESH_MS);
  }

  function draw(jobs) {
    list.dataset.state = jobs.length ? "ready" : "empty";
    if (!jobs.length) {
      replace(list, emptyLine("No import or export jobs yet.", "imports-empty"));
      return;
    }
    const newest = [...jobs].sort((a, b) => String(b.creationTime || "").localeCompare(String(a.creationTime || "")));
    replace(list, table(["Job", "Type", "Status", "Progress", "Container", "Created", "Ended", "Failure", h("span", { class: "sr-only" }, "Actions")],
      newest.map((j) => {
        const cancel = ACTIVE.includes(j.status)
          ? guard(btn("Cancel", () => cancelJob(j), { small: true, kind: "danger", testid: `cancel-import-${j.jobId}` }), app, ["RegistryWrite"])
          : null;
        const container = j.type === "import"
          ? h("span", {}, code(shownUri(j.inputBlobContainerUri)), " → ", code(shownUri(j.outputBlobContainerUri)))
          : code(shownUri(j.outputBlobContainerUri));
        return row([
          ["Job", code(j.jobId)],
          ["Type", TYPE_LABEL[j.type] || j.type],
          ["Status", statusBadge(j.status)],
          ["Progress", percentBar(j.progress, "import-job-progress")],
          ["Container", container],
          ["Created", formatTime(j.creationTime)],
          ["Ended", formatTime(j.endTimeUtc)],
          ["Failure", j.failureReason ? h("span", { class: "io-failure", dataset: { testid: "import-job-failure" } }, j.failureReason) : "—"],
          ["", h("div", { class: "row-actions" }, cancel), "actions"],
        ], { dataset: { testid: "import-job-row", job: j.jobId, type: j.type, status: j.status } });
      }), { testid: "imports-table", caption: "Import and export jobs" }));
  }

  async function cancelJob(j) {
    const yes = await confirm(`Cancel ${j.type} job ${j.jobId}?`,
      "The hub stops at its next batch. Identities already imported stay imported; an export leaves no partial devices.txt.",
      { confirmLabel: "Cancel job", danger: true, testid: "confirm-cancel-import" });
    if (!yes) return;
    try {
      await app.api.del(`/jobs/${seg(j.jobId)}`);
      toast(`Job ${j.jobId}: cancel requested`, "ok");
    } catch (err) {
      toast(`Could not cancel ${j.jobId}: ${errorText(err)}`, "error");
    }
    await load({ quiet: true });
  }

  function started(job) {
    showResult("ok", h("strong", {}, `${TYPE_LABEL[job.type] || job.type} job ${job.status || "queued"}: `), code(job.jobId), ". Its progress is listed below.");
    result.dataset.jobId = job.jobId;
    load({ quiet: true });
  }

  async function exportJob() {
    const out = input({ testid: "export-job-output", mono: true, rows: 3, placeholder: SAS_PLACEHOLDER });
    const keys = toggle("Exclude keys (authentication is null on every line)", false, "export-job-exclude-keys");
    const job = await dialog({
      title: "Export identities to a container",
      testid: "export-job-dialog",
      wide: true,
      body: h("div", { class: "form" },
        field("Output container SAS URL", out, `The hub writes ${FILE_NAME} there (an existing one is replaced). The SAS needs write and create rights.`),
        keys.el),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: "Start export", kind: "primary", testid: "export-job-start",
          run: async () => (await app.api.post("/jobs/create", {
            type: "export", outputBlobContainerUri: containerUri(out.value, "Output container"),
            excludeKeysInExport: keys.box.checked, storageAuthenticationType: "keyBased",
          })).body,
        },
      ],
    });
    if (job) started(job);
  }

  async function importJob() {
    const inp = input({ testid: "import-job-input", mono: true, rows: 3, placeholder: SAS_PLACEHOLDER });
    const out = input({ testid: "import-job-output", mono: true, rows: 3, placeholder: "Empty: the input container" });
    const job = await dialog({
      title: "Import identities from a container",
      testid: "import-job-dialog",
      wide: true,
      body: h("div", { class: "form" },
        h("p", { class: "hint" }, `Each line of ${FILE_NAME} creates, updates or deletes an identity by its importMode (default createOrUpdate); its tags and desired properties replace the twin's.`),
        field("Input container SAS URL", inp, `Holds ${FILE_NAME}; the SAS needs read rights.`),
        field("Output container SAS URL", out, "The hub writes importErrors.log there, one line per refused line (write and create rights)."),
      ),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: "Start import", kind: "primary", testid: "import-job-start",
          run: async () => {
            const from = containerUri(inp.value, "Input container");
            const to = out.value.trim() ? containerUri(out.value, "Output container") : from;
            return (await app.api.post("/jobs/create", {
              type: "import", inputBlobContainerUri: from, outputBlobContainerUri: to, storageAuthenticationType: "keyBased",
            })).body;
          },
        },
      ],
    });
    if (job) started(job);
  }

  async function download() {
    const keys = toggle("Exclude keys (authentication is null on every line)", false, "download-exclude-keys");
    const status = h("p", { class: "hint", dataset: { testid: "download-progress" }, "aria-live": "polite" });
    const reading = new AbortController(); // dismissed or left: stop reading
    app.onLeave(() => reading.abort());
    const read = await dialog({
      title: "Download identities as a file",
      testid: "download-dialog",
      body: h("div", { class: "form" },
        h("p", {}, `The console reads every device and module with its keys and twin and saves ${FILE_NAME} as an export job writes it, a file that Import from a file or an import job takes back. For a large registry, prefer an export job.`),
        keys.el, status),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: `Download ${FILE_NAME}`, kind: "primary", testid: "download-start",
          run: async () => {
            status.textContent = "Reading the registry…";
            try {
              return await readRegistry(app.api, {
                excludeKeys: keys.box.checked, signal: reading.signal,
                onProgress: ({ devices, modules }) => {
                  status.textContent = `Read ${plural(devices, "device")}${modules ? ` and ${plural(modules, "module")}` : ""}…`;
                },
              });
            } catch (err) {
              status.textContent = "";
              throw err;
            }
          },
        },
      ],
    });
    if (!read || stopped) {
      reading.abort();
      return;
    }
    saveFile(read.text, FILE_NAME);
    const what = `${plural(read.devices, "device")} and ${plural(read.modules, "module")}, ${keys.box.checked ? "without keys" : "with their keys"}`;
    const missing = [...read.gone.map((id) => [id, "deleted while the registry was read"]),
      ...read.unreadable.map((id) => [id, "a browser cannot put this id in a URL: use an export job"])];
    if (!missing.length) {
      showResult("ok", h("strong", {}, `Saved ${FILE_NAME}: `), what, ".");
      return;
    }
    showResult("partial", h("strong", {}, `Saved ${FILE_NAME}: ${what}. Not in the file:`),
      h("ul", { class: "bulk-failures" }, missing.map(([id, why]) => h("li", { dataset: { testid: "registry-failure", deviceId: id } }, h("span", { class: "mono" }, id), ": ", why))));
  }

  async function importFile() {
    const file = h("input", { type: "file", accept: ".txt,.json,.jsonl,.ndjson,text/plain", class: "input", dataset: { testid: "import-file-input" }, "aria-label": `${FILE_NAME} to import` });
    const check = h("div", { class: "io-check", dataset: { testid: "import-file-check" }, "aria-live": "polite" });
    const status = h("p", { class: "hint", dataset: { testid: "import-file-progress" }, "aria-live": "polite" });
    let parsed = null;
    let name = FILE_NAME;
    const pending = dialog({
      title: "Import identities from a file",
      testid: "import-file-dialog",
      wide: true,
      body: h("div", { class: "form" },
        h("p", { class: "hint" }, `A ${FILE_NAME} (JSON lines, as an export writes them). Each line creates, updates or deletes an identity by its importMode (default createOrUpdate); its tags and desired properties replace the twin's, which needs ServiceConnect. Every line is checked first: a file with a bad line imports nothing.`),
        field("File", file), check, status),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: "Import", kind: "primary", testid: "import-file-start", disabled: true,
          run: async () => {
            if (!parsed || !parsed.ok) throw new Error("Choose a file whose every line can be imported.");
            file.disabled = true;
            status.textContent = "Importing…";
            return applyImport(app.api, parsed.items, {
              onProgress: ({ done, total }) => { status.textContent = `Applied ${done} of ${plural(total, "line")}…`; },
            });
          },
        },
      ],
    });
    const start = document.querySelector('dialog[data-testid="import-file-dialog"] [data-testid="import-file-start"]');
    file.addEventListener("change", async () => {
      parsed = null;
      start.disabled = true;
      replace(check);
      delete check.dataset.state;
      const f = file.files && file.files[0];
      if (!f) return;
      name = f.name;
      try {
        parsed = parseImportFile(await f.text());
      } catch (err) {
        check.dataset.state = "invalid";
        replace(check, inlineError(err));
        return;
      }
      parsed.ok = showCheck(check, parsed, f.name);
      start.disabled = !parsed.ok;
    });
    const outcome = await pending;
    if (!outcome || stopped) return;
    const total = parsed.items.length;
    if (!outcome.failures.length) {
      showResult("ok", h("strong", {}, `Imported ${name}: `), `${plural(total, "line")} applied.`);
      return;
    }
    showResult(outcome.applied ? "partial" : "failed",
      h("strong", {}, `Imported ${name}: ${outcome.applied} of ${plural(total, "line")} applied; ${outcome.failures.length} failed:`),
      h("ul", { class: "bulk-failures" }, outcome.failures.map((f) => h("li", { dataset: { testid: "registry-failure", deviceId: f.deviceId, line: String(f.lineNumber) } },
        `Line ${f.lineNumber}, `, h("span", { class: "mono" }, f.moduleId ? `${f.deviceId}/${f.moduleId}` : f.deviceId), `: ${f.reason}`))));
  }

  /** Shows what a read file holds, or why it cannot be imported; true when it can. */
  function showCheck(el, parsed, fileName) {
    const twinLines = parsed.items.filter((it) => it.twin).length;
    const problems = parsed.errors.map((e) => [e.lineNumber, `Line ${e.lineNumber}${e.deviceId ? ` (${e.moduleId ? `${e.deviceId}/${e.moduleId}` : e.deviceId})` : ""}: ${e.message}`]);
    if (parsed.errorCount > parsed.errors.length) problems.push([null, `… and ${parsed.errorCount - parsed.errors.length} more`]);
    if (!parsed.errorCount && !parsed.items.length) problems.push([null, `${fileName} holds no lines.`]);
    if (twinLines && !app.can("ServiceConnect")) {
      problems.push([null, `${plural(twinLines, "line")} set tags or desired properties, and writing a twin needs ServiceConnect, which the signed-in policy lacks. Use Import from a container (RegistryWrite is enough) or a policy with ServiceConnect.`]);
    }
    if (problems.length) {
      el.dataset.state = "invalid";
      replace(el, h("div", { class: "error-state", role: "alert" },
        h("strong", {}, `${fileName} cannot be imported; nothing will be changed.`),
        h("ul", { class: "bulk-failures" }, problems.map(([line, text]) => h("li", { dataset: { testid: "import-file-error", line: line ? String(line) : "" } }, text)))));
      return false;
    }
    el.dataset.state = "valid";
    const modes = Object.entries(parsed.counts).map(([m, n]) => `${n} ${m}`).join(", ");
    replace(el, h("div", { class: "result-box", role: "status" },
      h("strong", {}, `${fileName}: ${plural(parsed.items.length, "line")} to apply`), ` (${modes})`,
      twinLines ? `; ${plural(twinLines, "line")} with tags or desired properties.` : "."));
    return true;
  }

  return { el, load };
}
