// Live events (#/stream): everything that reaches the built-in endpoint, hub-wide, as
// `az iot hub monitor-events` shows it: device messages, and the connection, lifecycle, twin
// change and digital twin change events that routes send to `events`. One long poll of
// GET /console/api/stream reads every partition (a browser keeps six connections to the hub, so
// not one poll per partition); its cursor continues where the last answer ended, so a pause
// and resume misses nothing the hub still retains.
import { h, replace, field, errorText, pageHeader, badge } from "../lib/ui.js";
import { eventCard, downloadJsonLines } from "../lib/telemetry.js";

const POLL_SECONDS = 20;
const MAX_KEPT = 500;
const SOURCES = ["Telemetry", "deviceConnectionStateEvents", "deviceLifecycleEvents", "twinChangeEvents", "digitalTwinChangeEvents"];

export default async function render(root, app) {
  const canRead = app.can("ServiceConnect");
  const events = [];
  let cursor = null;
  let running = false;
  let controller = null;
  let errors = 0;
  let left = false;

  const deviceInput = h("input", {
    type: "search", id: "stream-device", class: "input", placeholder: "any device", spellcheck: "false", autocomplete: "off",
    dataset: { testid: "stream-device" },
  });
  const toggle = app.ui.requireRight(h("button", { type: "button", class: "btn btn-primary", dataset: { testid: "stream-toggle" } }, "Pause"), app, "ServiceConnect");
  const clearBtn = h("button", { type: "button", class: "btn", dataset: { testid: "stream-clear" } }, "Clear");
  const downloadBtn = h("button", { type: "button", class: "btn", dataset: { testid: "stream-download" }, disabled: true }, "Download JSON lines");
  const status = h("div", { class: "tail-status", dataset: { testid: "stream-status" }, "aria-live": "polite" });
  const count = h("span", { class: "muted", dataset: { testid: "stream-count" } }, "0 events");
  const list = h("div", { class: "tail-list", dataset: { testid: "stream-list" } }, emptyNote("Events appear here as the hub receives them."));

  replace(root,
    pageHeader("Live events", "Everything that reaches the built-in events endpoint, from every device, as it arrives."),
    h("section", { class: "card" },
      h("form", { class: "tail-toolbar", onsubmit: (e) => { e.preventDefault(); applyFilter(); } },
        field("Device id", deviceInput),
        toggle, clearBtn, downloadBtn, h("span", { class: "spacer" }), count),
      h("p", { class: "hint" },
        "Device messages always arrive here while the fallback route is on (or a route sends them to events). ",
        "Connection, lifecycle and twin change events arrive only when a route with that source sends them to events, as in IoT Hub. Sources: ",
        SOURCES.map((s) => badge(s, "muted"))),
      status,
      list));
  root.dataset.state = "ready";

  function emptyNote(text) {
    return h("div", { class: "state empty-state", dataset: { testid: "stream-empty" } }, text);
  }

  const setStatus = (text, kind) => {
    status.textContent = text;
    status.classList.toggle("error-text", kind === "error");
  };

  function add(batch) {
    if (!batch.length) return;
    list.querySelector("[data-testid=stream-empty]")?.remove();
    for (const ev of batch) {
      events.push(ev);
      list.prepend(eventCard(ev, { withDevice: true, testid: "stream-event" }));
    }
    while (events.length > MAX_KEPT) {
      events.shift();
      list.lastElementChild?.remove();
    }
    count.textContent = `${events.length} event${events.length === 1 ? "" : "s"}`;
    downloadBtn.disabled = false;
  }

  function sleep(ms, signal) {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
    });
  }

  // One loop per start(); a pause, a new filter or leaving the page (a new or aborted
  // controller) ends it, even while it waits.
  async function loop() {
    const ctl = controller;
    const live = () => ctl === controller && !ctl.signal.aborted && running && !left;
    const device = deviceInput.value.trim();
    while (live()) {
      try {
        const query = { timeout: cursor === null ? 0 : POLL_SECONDS };
        // "Listening" only once a cursor is held: from then on nothing that arrives is missed.
        if (cursor !== null) {
          query.cursor = cursor;
          if (!errors) setStatus(device ? `Listening for ${device}'s events…` : "Listening for every device's events…");
        } else {
          setStatus("Starting…");
        }
        if (device) query.deviceId = device;
        const r = await app.api.get("/console/api/stream", { query, signal: ctl.signal });
        if (!live()) return;
        cursor = r.body.cursor;
        errors = 0;
        add(r.body.events || []);
      } catch (err) {
        if (err.name === "AbortError" || !live()) return;
        errors++;
        if (err.status === 401 || err.status === 400 || errors > 5) {
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
    if (running || left || !canRead) return;
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
    toggle.setAttribute("aria-pressed", "true");
    setStatus("Paused; resuming shows what arrived meanwhile.");
  }

  // A new filter applies from the current cursor on: what was shown stays.
  function applyFilter() {
    if (!running) return;
    pause();
    start();
  }

  toggle.addEventListener("click", () => (running ? pause() : start()));
  clearBtn.addEventListener("click", () => {
    events.length = 0;
    list.replaceChildren(emptyNote("Cleared. New events appear here."));
    count.textContent = "0 events";
    downloadBtn.disabled = true;
  });
  downloadBtn.addEventListener("click", () => downloadJsonLines(events, "events.jsonl"));
  app.onLeave(() => {
    left = true;
    running = false;
    controller?.abort();
  });

  if (canRead) start();
  else setStatus("Reading events needs ServiceConnect.", "error");
}
