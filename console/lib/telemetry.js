// The live telemetry tail of the device and module pages, over the hub's read API
// (docs/read-api.md): long polls of GET /events/consumergroups/{g}/partitions/{p}/messages.
//
// A device's events always land in partition crc32(deviceId) % partitionCount, so the tail
// long-polls that one partition only: the hub speaks HTTP/1.1 and a browser opens at most six
// connections to it, which one long poll per partition would use up (the method call, C2D send
// and twin save of the same page would then wait). It starts at the partition's end (the
// sequence number after the last enqueued one, so nothing appended in between is missed) and
// keeps only this identity's events.
import { h, replace, field, toast, formatTime, errorText } from "./ui.js";
import { seg } from "./api.js";

const POLL_SECONDS = 20;
const MAX_KEPT = 500;

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** CRC-32 (IEEE) of a string's UTF-8 bytes, as crc32fast computes it. */
export function crc32(text) {
  let c = 0xffffffff;
  for (const b of new TextEncoder().encode(text)) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** The partition a device's events go to. */
export function partitionOf(deviceId, partitionCount) {
  return crc32(deviceId) % Math.max(1, partitionCount);
}

/** {text, json, binary} of an event's base64 body. */
export function decodeBody(b64) {
  let bytes;
  try {
    const bin = atob(b64 || "");
    bytes = Uint8Array.from(bin, (ch) => ch.charCodeAt(0));
  } catch {
    return { text: b64, binary: true };
  }
  try {
    const text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    try {
      return { text, json: JSON.parse(text) };
    } catch {
      return { text };
    }
  } catch {
    return { text: b64, binary: true };
  }
}

/** One line for a short JSON value, indented for a long one. */
function prettyJson(v) {
  const line = JSON.stringify(v);
  return line.length <= 100 ? line : JSON.stringify(v, null, 2);
}

/**
 * One event as the tails show it: time, partition and sequence number, the sending device (with
 * `withDevice`), its source when not telemetry, the body, and its properties.
 */
export function eventCard(ev, { withDevice = false, testid = "tail-event" } = {}) {
  const body = decodeBody(ev.body);
  const sys = ev.systemProperties || {};
  const props = Object.entries(ev.properties || {});
  const sysShown = ["message-id", "correlation-id", "content-type", "content-encoding", "dt-dataschema", "dt-subject"]
    .filter((k) => sys[k] !== undefined);
  const device = sys["iothub-connection-device-id"];
  return h("article", { class: "event", dataset: { testid } },
    h("div", { class: "event-head" },
      h("strong", {}, formatTime(ev.enqueuedTimeUtc)),
      withDevice && device !== undefined ? h("span", { class: "event-device", dataset: { testid: "event-device" } }, device) : null,
      h("span", {}, `partition ${ev.partitionId} · #${ev.sequenceNumber}`),
      sys["iothub-connection-module-id"] ? h("span", {}, `module ${sys["iothub-connection-module-id"]}`) : null,
      sys["iothub-message-source"] && sys["iothub-message-source"] !== "Telemetry"
        ? h("span", { class: "event-source", dataset: { testid: "event-source" } }, sys["iothub-message-source"]) : null,
      body.binary ? h("span", {}, "binary (base64)") : null),
    h("pre", { class: "event-body", dataset: { testid: "tail-body" } }, body.json !== undefined ? prettyJson(body.json) : body.text),
    props.length || sysShown.length ? h("div", { class: "props", dataset: { testid: "tail-props" } },
      props.map(([k, v]) => h("span", { class: "prop", dataset: { testid: "tail-prop" } }, `${k}: ${v}`)),
      sysShown.map((k) => h("span", { class: "prop prop-sys", title: "system property" }, `${k}: ${sys[k]}`))) : null);
}

/** Saves events as a JSON lines file named `name` (the body decoded when it is text or JSON). */
export function downloadJsonLines(events, name) {
  const lines = events.map((ev) => {
    const body = decodeBody(ev.body);
    return JSON.stringify({
      enqueuedTimeUtc: ev.enqueuedTimeUtc, partitionId: ev.partitionId, sequenceNumber: ev.sequenceNumber, offset: ev.offset,
      systemProperties: ev.systemProperties, properties: ev.properties,
      body: body.binary ? null : (body.json !== undefined ? body.json : body.text), bodyBase64: ev.body,
    });
  });
  const blob = new Blob([lines.join("\n") + "\n"], { type: "application/x-ndjson" });
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name, class: "offscreen" });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
  toast(`Downloaded ${events.length} events`, "ok", 2000);
}

/** Renders the tail into `el`; it starts when `start()` is called and stops on leave. */
export function telemetryTail(el, app, { deviceId, moduleId = null }) {
  const canRead = app.can("ServiceConnect");
  const events = [];
  let running = false;
  let controller = null;
  let group = "$Default";
  let partition = null;
  let next = null; // next sequence number to read
  let errors = 0;
  let stopped = false;

  const groupSelect = h("select", { dataset: { testid: "tail-group" }, disabled: !canRead }, h("option", { value: "$Default" }, "$Default"));
  const toggle = app.ui.requireRight(h("button", { type: "button", class: "btn btn-primary", dataset: { testid: "tail-toggle" } }, "Start"), app, "ServiceConnect");
  const clearBtn = h("button", { type: "button", class: "btn", dataset: { testid: "tail-clear" } }, "Clear");
  const downloadBtn = h("button", { type: "button", class: "btn", dataset: { testid: "tail-download" }, disabled: true }, "Download JSON lines");
  const status = h("div", { class: "tail-status", dataset: { testid: "tail-status" }, "aria-live": "polite" }, canRead ? "Not started." : "Reading telemetry needs ServiceConnect.");
  const count = h("span", { class: "muted", dataset: { testid: "tail-count" } }, "0 events");
  const list = h("div", { class: "tail-list", dataset: { testid: "tail-list" } },
    h("div", { class: "state empty-state", dataset: { testid: "tail-empty" } }, "Events from this " + (moduleId ? "module" : "device") + " appear here as the hub receives them."));

  replace(el,
    h("div", { class: "tail-toolbar" },
      field("Consumer group", groupSelect),
      toggle, clearBtn, downloadBtn, h("span", { class: "spacer" }), count),
    status,
    list);

  const setStatus = (text, kind) => {
    status.textContent = text;
    status.classList.toggle("error-text", kind === "error");
  };

  function add(batch) {
    const mine = batch.filter((ev) => {
      const sys = ev.systemProperties || {};
      if (sys["iothub-connection-device-id"] !== deviceId) return false;
      return moduleId ? sys["iothub-connection-module-id"] === moduleId : true;
    });
    if (!mine.length) return;
    list.querySelector("[data-testid=tail-empty]")?.remove();
    for (const ev of mine) {
      events.push(ev);
      list.prepend(eventCard(ev));
    }
    while (events.length > MAX_KEPT) {
      events.shift();
      list.lastElementChild?.remove();
    }
    count.textContent = `${events.length} event${events.length === 1 ? "" : "s"}`;
    downloadBtn.disabled = false;
  }

  /** Resolves when `ms` have passed or `signal` is aborted, whichever comes first. */
  function sleep(ms, signal) {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal.addEventListener("abort", done, { once: true });
    });
  }

  async function locate(signal) {
    const base = `/events/consumergroups/${seg(group)}/partitions`;
    if (partition === null || next === null) {
      // The partition count is the length of GET /events/partitions (the session does not say it).
      const parts = (await app.api.get("/events/partitions", { signal })).body;
      if (!Array.isArray(parts) || !parts.length) throw new Error("The hub listed no event partitions (GET /events/partitions).");
      partition = partitionOf(deviceId, parts.length);
      const p = parts.find((x) => Number(x.partitionId) === partition);
      next = p && p.lastEnqueuedSequenceNumber !== null && p.lastEnqueuedSequenceNumber !== undefined
        ? p.lastEnqueuedSequenceNumber + 1
        : (p ? p.beginSequenceNumber : null);
    }
    return `${base}/${partition}/messages`;
  }

  // One loop per start(): it runs while its controller is the current one, so a pause/resume or
  // a consumer-group change (a new controller) ends it even while it waits in its back-off.
  async function loop() {
    const ctl = controller;
    const live = () => ctl === controller && !ctl.signal.aborted && running && !stopped;
    let path = null;
    const since = formatTime(new Date().toISOString()).slice(11);
    while (live()) {
      try {
        if (!path) path = await locate(ctl.signal);
        if (!live()) return;
        setStatus(`Listening on partition ${partition} (consumer group ${group}) since ${since}…`);
        const query = { timeout: POLL_SECONDS, max: 100 };
        if (next === null) query.from = "end";
        else query.sequenceNumber = next;
        const r = await app.api.get(path, { query, signal: ctl.signal });
        if (!live()) return;
        const batch = r.body?.events || [];
        if (batch.length) next = batch[batch.length - 1].sequenceNumber + 1;
        else if (r.body?.nextSequenceNumber !== null && r.body?.nextSequenceNumber !== undefined) next = r.body.nextSequenceNumber;
        errors = 0;
        add(batch);
      } catch (err) {
        if (err.name === "AbortError" || !live()) return;
        errors++;
        if (err.status === 401 || err.status === 404 || err.code === "UnaddressableId" || errors > 5) {
          pause();
          setStatus(`Stopped: ${errorText(err)}`, "error");
          return;
        }
        setStatus(`Read failed (${errorText(err)}); retrying…`, "error");
        await sleep(1000 * errors, ctl.signal);
      }
    }
  }

  function start() {
    if (running || stopped || !canRead) return;
    running = true;
    errors = 0;
    controller?.abort();
    controller = new AbortController();
    toggle.textContent = "Pause";
    toggle.setAttribute("aria-pressed", "false");
    loop();
  }

  function pause() {
    running = false;
    controller?.abort();
    toggle.textContent = "Resume";
    setStatus(`Paused at partition ${partition ?? "?"}${next !== null ? `, sequence ${next}` : ""}; resuming continues from there.`);
  }

  toggle.addEventListener("click", () => (running ? pause() : start()));
  clearBtn.addEventListener("click", () => {
    events.length = 0;
    list.replaceChildren(h("div", { class: "state empty-state", dataset: { testid: "tail-empty" } }, "Cleared. New events appear here."));
    count.textContent = "0 events";
    downloadBtn.disabled = true;
  });
  downloadBtn.addEventListener("click", () => downloadJsonLines(events, `${deviceId}${moduleId ? "-" + moduleId : ""}-telemetry.jsonl`));
  groupSelect.addEventListener("change", () => {
    group = groupSelect.value;
    const was = running;
    if (running) pause();
    next = null;
    partition = null;
    if (was) start();
  });

  if (canRead) {
    app.api.get("/events/consumergroups").then((r) => {
      const groups = Array.isArray(r.body) ? r.body : [];
      replace(groupSelect, groups.map((g) => h("option", { value: g, selected: g === group }, g)));
    }).catch((err) => setStatus(`Could not list consumer groups: ${errorText(err)}`, "error"));
  }

  app.onLeave(() => {
    stopped = true;
    running = false;
    controller?.abort();
  });
  return { start, pause, get running() { return running; } };
}
