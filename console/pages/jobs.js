// Jobs (#/jobs): scheduled jobs (twin updates and device methods over a query condition) from
// the jobs query API (GET /jobs/v2/query, paged by x-ms-continuation), their progress
// (refreshed while any is active), create and cancel; and the registry's import and export
// (lib/import-export.js): jobs to and from a blob container, and devices.txt as a file.
import { h, replace, loading, toast, dialog, confirm, jsonEditor, field, badge, table, pageHeader, pager, formatTime, facts, errorBox, errorText } from "../lib/ui.js";
import { seg } from "../lib/api.js";
import { useAdminCss, guard, btn, input, select, row, code, inlineError, section, emptyLine, jsonOf, progress, header, stampId } from "../lib/admin-ui.js";
import { importExportSection } from "../lib/import-export.js";

const WRITE = ["ServiceConnect", "RegistryWrite"];
const ACTIVE = ["queued", "scheduled", "running"];
const PAGE_SIZE = 20;
const REFRESH_MS = 2000;

const TYPES = [["", "All types"], ["scheduleUpdateTwin", "Twin update"], ["scheduleDeviceMethod", "Device method"]];
const STATUSES = [["", "All statuses"], "queued", "scheduled", "running", "completed", "failed", "cancelled"];
const TYPE_LABEL = { scheduleUpdateTwin: "Twin update", scheduleDeviceMethod: "Device method" };

export function statusBadge(status) {
  const kind = { completed: "ok", running: "info", queued: "muted", scheduled: "muted", failed: "bad", cancelled: "warn" }[status] || "muted";
  return h("span", { dataset: { testid: "job-status", status } }, badge(status || "unknown", kind));
}

function outcomeOf(outcome) {
  if (!outcome || (typeof outcome === "object" && !Object.keys(outcome).length)) return "—";
  const m = outcome.deviceMethodResponse;
  if (m) return h("span", {}, badge(`status ${m.status}`, m.status >= 200 && m.status < 300 ? "ok" : "warn"), " ", code(JSON.stringify(m.payload)));
  return code(JSON.stringify(outcome));
}

export default async function render(root, app) {
  useAdminCss();
  let timer = null;
  let stopped = false;
  app.onLeave(() => { stopped = true; clearTimeout(timer); });

  const typeFilter = select(TYPES, { testid: "jobs-type-filter", id: "jobs-type" });
  const statusFilter = select(STATUSES, { testid: "jobs-status-filter", id: "jobs-status" });
  const create = guard(btn("New job", () => createJob(), { kind: "primary", testid: "create-job" }), app, WRITE, "any");
  const listBox = h("div", { class: "list-box" });
  const live = h("span", { class: "live-note", dataset: { testid: "jobs-live" } });
  const p = pager({ fetchPage, testid: "jobs-pager" });
  const io = importExportSection(app, { statusBadge });

  replace(root,
    pageHeader("Jobs", "Scheduled twin updates and device methods over a query condition, and the registry's import and export.", create),
    section("Scheduled jobs", [live],
      h("div", { class: "filters" }, field("Type", typeFilter), field("Status", statusFilter)),
      listBox, p.el),
    io.el);

  typeFilter.addEventListener("change", () => reload());
  statusFilter.addEventListener("change", () => reload());

  let firstPage = true;
  async function fetchPage(token, { signal, isCurrent }) {
    clearTimeout(timer);
    if (firstPage) loading(listBox);
    let r;
    try {
      r = await app.api.get("/jobs/v2/query", {
        query: { jobType: typeFilter.value || undefined, jobStatus: statusFilter.value || undefined },
        headers: { "x-ms-max-item-count": String(PAGE_SIZE), ...(token ? { "x-ms-continuation": token } : {}) },
        signal,
      });
    } catch (err) {
      if (stopped || !isCurrent()) return null; // left, or replaced by a newer request
      replace(listBox, errorBox(err, "Could not list the jobs"));
      listBox.dataset.state = "error";
      if (firstPage) root.dataset.state = "error";
      return null;
    }
    if (stopped || !isCurrent()) return null;
    const jobs = Array.isArray(r.body) ? r.body : (r.body && r.body.items) || [];
    const next = header(r.headers, "x-ms-continuation") || (r.body && r.body.continuationToken) || null;
    drawJobs(jobs, token);
    if (firstPage) {
      root.dataset.state = jobs.length || token || typeFilter.value || statusFilter.value ? "ready" : "empty";
      firstPage = false;
    } else if (root.dataset.state === "error" || (root.dataset.state === "empty" && jobs.length)) {
      root.dataset.state = "ready";
    }
    const active = jobs.some((j) => ACTIVE.includes(j.status));
    live.textContent = active ? "Refreshing while jobs are active" : "";
    if (active) timer = setTimeout(() => { if (!stopped) p.refresh().catch(() => {}); }, REFRESH_MS);
    return next;
  }

  function drawJobs(jobs, token) {
    listBox.dataset.state = jobs.length ? "ready" : "empty";
    if (!jobs.length) {
      const filtered = typeFilter.value || statusFilter.value;
      replace(listBox, emptyLine(filtered ? "No jobs match these filters." : token ? "No more jobs." : "No scheduled jobs yet. Create one with New job.", "jobs-empty"));
      return;
    }
    const rows = jobs.map((j) => {
      const s = j.deviceJobStatistics || {};
      const cancellable = ACTIVE.includes(j.status);
      const cancel = cancellable
        ? guard(btn("Cancel", () => cancelJob(j), { small: true, kind: "danger", testid: `cancel-job-${j.jobId}` }), app, WRITE, "any")
        : null;
      return row([
        ["Job", btn(j.jobId, () => showJob(j.jobId), { kind: "link", testid: `job-${j.jobId}`, title: "Details" })],
        ["Type", TYPE_LABEL[j.type] || j.type],
        ["Status", statusBadge(j.status)],
        ["Condition", code(j.queryCondition || "")],
        ["Start", formatTime(j.startTime)],
        ["Progress", progress(s.succeededCount || 0, s.failedCount || 0, s.deviceCount || 0, `job-progress-${j.jobId}`)],
        ["", h("div", { class: "row-actions" }, cancel), "actions"],
      ], { dataset: { job: j.jobId, status: j.status } });
    });
    replace(listBox, table(["Job", "Type", "Status", "Condition", "Start", "Devices", h("span", { class: "sr-only" }, "Actions")], rows, { testid: "jobs-table", caption: "Scheduled jobs" }));
  }

  function reload() {
    clearTimeout(timer);
    return p.reload().catch(() => {});
  }

  async function cancelJob(j) {
    const yes = await confirm(`Cancel job ${j.jobId}?`, "Devices not yet reached are left as they are. A finished job is not changed.",
      { confirmLabel: "Cancel job", danger: true, testid: "confirm-cancel" });
    if (!yes) return;
    try {
      const r = await app.api.post(`/jobs/v2/${seg(j.jobId)}/cancel`);
      toast(`Job ${j.jobId}: ${r.body && r.body.status}`, "ok");
    } catch (err) {
      toast(`Could not cancel ${j.jobId}: ${errorText(err)}`, "error");
    }
    await p.refresh().catch(() => {});
  }

  async function showJob(id) {
    const box = h("div", { class: "job-detail" });
    loading(box);
    const open = dialog({ title: `Job ${id}`, body: box, wide: true, testid: "job-dialog", actions: [{ label: "Close", value: null, testid: "dialog-close" }] });
    try {
      const j = (await app.api.get(`/jobs/v2/${seg(id)}`)).body;
      const s = j.deviceJobStatistics || {};
      const spec = j.updateTwin || j.cloudToDeviceMethod || null;
      replace(box,
        facts([
          ["Type", TYPE_LABEL[j.type] || j.type],
          ["Status", statusBadge(j.status)],
          ["Query condition", code(j.queryCondition || "")],
          ["Created", formatTime(j.createdTime)],
          ["Start", formatTime(j.startTime)],
          ["End", formatTime(j.endTime)],
          ["Max execution", `${j.maxExecutionTimeInSeconds} s`],
          ["Devices", `${s.deviceCount || 0} (succeeded ${s.succeededCount || 0}, failed ${s.failedCount || 0}, running ${s.runningCount || 0}, pending ${s.pendingCount || 0})`],
          j.failureReason ? ["Failure", j.failureReason] : null,
        ], "job-facts"),
        spec ? h("div", {}, h("h3", { class: "sub-title" }, j.updateTwin ? "Twin patch" : "Method call"), h("pre", { class: "json-view" }, JSON.stringify(spec, null, 2))) : null,
        h("h3", { class: "sub-title" }, "Devices"),
        await deviceRows(id));
    } catch (err) {
      replace(box, errorBox(err, "Could not read the job"));
    }
    await open;
  }

  async function deviceRows(id) {
    if (id.includes("'")) return emptyLine("Per-device rows are not shown for ids with quotes.");
    try {
      const r = await app.api.post("/devices/query", { query: `SELECT * FROM devices.jobs WHERE devices.jobs.jobId = '${id}'` }, { headers: { "x-ms-max-item-count": "100" } });
      const items = r.body || [];
      if (!items.length) return emptyLine("No device has a row for this job yet.", "job-devices-empty");
      const more = header(r.headers, "x-ms-continuation");
      return h("div", {},
        table(["Device", "Status", "Updated", "Outcome"], items.map((d) => row([
          ["Device", d.moduleId ? `${d.deviceId}/${d.moduleId}` : d.deviceId],
          ["Status", statusBadge(d.status)],
          ["Updated", formatTime(d.lastUpdatedDateTimeUtc || d.endTimeUtc)],
          ["Outcome", d.error ? `${d.error.code}: ${d.error.description}` : outcomeOf(d.outcome)],
        ])), { testid: "job-devices" }),
        more ? h("p", { class: "hint" }, "The first 100 devices are shown.") : null);
    } catch (err) {
      return inlineError(err);
    }
  }

  async function createJob() {
    const id = input({ value: stampId("job"), testid: "job-id" });
    const type = select([["scheduleUpdateTwin", "Twin update (scheduleUpdateTwin)"], ["scheduleDeviceMethod", "Device method (scheduleDeviceMethod)"]], { testid: "job-type" });
    const condition = input({ value: "", rows: 2, mono: true, testid: "job-condition", placeholder: "tags.site = 'lab'   (or * for every device)" });
    const start = input({ type: "datetime-local", testid: "job-start" });
    start.step = "1";
    const maxExec = input({ type: "number", value: "3600", min: "1", testid: "job-max-exec" });
    const patch = jsonEditor({ label: "Twin patch (tags and properties.desired are merged)", rows: 7, testid: "job-twin-patch",
      value: { tags: {}, properties: { desired: {} } } });
    const method = input({ testid: "job-method-name", placeholder: "reboot" });
    const payload = jsonEditor({ label: "Payload (JSON)", value: {}, rows: 4, testid: "job-method-payload" });
    const timeout = input({ type: "number", value: "30", min: "5", max: "300", testid: "job-method-timeout" });
    const twinPart = h("div", { class: "form-part" }, patch.el);
    const methodPart = h("div", { class: "form-part" }, field("Method name", method), payload.el, field("Response timeout (seconds)", timeout, "5 to 300."));
    const sync = () => {
      twinPart.hidden = type.value !== "scheduleUpdateTwin";
      methodPart.hidden = !twinPart.hidden;
    };
    type.addEventListener("change", sync);
    sync();
    const created = await dialog({
      title: "New scheduled job",
      testid: "job-create-dialog",
      wide: true,
      body: h("div", { class: "form" },
        h("div", { class: "grid grid-2" }, field("Job id", id), field("Type", type)),
        field("Query condition", condition, "A WHERE condition on device twins (tags.site = 'lab', deviceId IN ['a', 'b']), * for all devices, or FROM devices.modules WHERE …"),
        h("div", { class: "grid grid-2" },
          field("Start time (local)", start, "Empty: start now."),
          field("Max execution time (seconds)", maxExec)),
        twinPart, methodPart),
      actions: [
        { label: "Cancel", value: null, testid: "dialog-cancel" },
        {
          label: "Create job", kind: "primary", testid: "job-save",
          run: async () => {
            const jobId = id.value.trim();
            if (!jobId) throw new Error("The job needs an id.");
            const q = condition.value.trim();
            if (!q) throw new Error("The job needs a query condition (* for every device).");
            const body = { jobId, type: type.value, queryCondition: q, maxExecutionTimeInSeconds: Number(maxExec.value) || 3600 };
            if (start.value) {
              const t = new Date(start.value);
              if (Number.isNaN(t.getTime())) throw new Error("Start time: not a valid time.");
              body.startTime = t.toISOString();
            }
            if (type.value === "scheduleUpdateTwin") {
              body.updateTwin = jsonOf(patch, "Twin patch");
            } else {
              if (!method.value.trim()) throw new Error("The method job needs a method name.");
              body.cloudToDeviceMethod = {
                methodName: method.value.trim(),
                payload: jsonOf(payload, "Payload"),
                responseTimeoutInSeconds: Number(timeout.value) || 30,
              };
            }
            const r = await app.api.put(`/jobs/v2/${seg(jobId)}`, body);
            return r.body || { jobId, status: "queued" };
          },
        },
      ],
    });
    if (created) {
      toast(`Job ${created.jobId} ${created.status}`, "ok");
      typeFilter.value = "";
      statusFilter.value = "";
      await reload();
    }
  }

  await p.reload().catch(() => {});
  io.load();
}
