// devices.txt, the file of the hub's import and export jobs (docs/import-export.md), made and
// applied by the console itself through the REST API, for an operator without a storage account.
//
// Export: the device twins are paged with the query API (SELECT * FROM devices, then
// devices.modules, x-ms-continuation), each identity is read for its keys (GET /devices/{id},
// GET /devices/{id}/modules), and every identity becomes the line the export job writes
// (server/src/rest/jobs/line.rs export_line): the same fields in the same order. One difference
// the REST API cannot avoid: the export job also writes `$lastUpdatedVersion` in the reported
// properties' `$metadata`, which the twin API leaves out (imports ignore reported properties).
//
// Import: every line is checked first (as the import job reads it, plus the registry's id
// rules); a file with any bad line is refused whole, with line numbers. Then the lines go, in
// file order, through the bulk registry API (POST /devices, at most 100 items, a new request
// when an identity is named again, as the job starts a new batch), which takes every import
// mode the job does; a line's tags and desired properties then replace the twin's
// (PUT /twins/{id}), as the import job replaces them. Unlike the job, identity and twin are two
// requests: a twin the hub refuses is reported for its line, with the identity already written.
import { errorText } from "./ui.js";
import { BULK_MAX, eachLimited } from "./device-bulk.js";
import { identityPath, twinPath } from "./identity.js";

export const IMPORT_MODES = ["create", "update", "updateIfMatchETag", "createOrUpdate", "createOrUpdateIfMatchETag", "delete", "deleteIfMatchETag"];
const ETAG_MODES = new Set(["updateIfMatchETag", "createOrUpdateIfMatchETag", "deleteIfMatchETag"]);
const DELETE_MODES = new Set(["delete", "deleteIfMatchETag"]);
const AUTH_TYPES = ["sas", "selfSigned", "certificateAuthority", "none"];
/** Characters a device or module id may hold besides ASCII letters and digits (engine/src/model.rs). */
const ID_PUNCTUATION = "-:.+%_#*?!(),=@;$'";
const MAX_ID_LEN = 128;
const MAX_STATUS_REASON = 128;
/** Decoded symmetric keys are 16 to 64 bytes (engine/src/model.rs). */
const KEY_BYTES = [16, 64];
/** Twins per query page, and requests in flight at once for identities and twins. */
const PAGE = 100;
const PARALLEL = 8;

// -- export ---------------------------------------------------------------------------------------

/**
 * The export line of an identity (a Device or Module as GET /devices answers, with its keys) and
 * its twin (as the query API or GET /twins answers): the fields and order of the export job's.
 */
export function exportLine(identity, twin, excludeKeys = false) {
  const isModule = Boolean(identity.moduleId);
  const a = identity.authentication || {};
  const keys = a.symmetricKey || {};
  const prints = a.x509Thumbprint || {};
  const props = twin.properties || {};
  // A module's status and capabilities are not in the Module model; its twin has them.
  const source = isModule ? twin : identity;
  const line = {
    id: identity.deviceId,
    eTag: identity.etag,
    generationId: identity.generationId,
    status: source.status,
    statusReason: source.statusReason ?? null,
    statusUpdatedTime: isModule ? twin.statusUpdateTime : identity.statusUpdatedTime,
    lastActivityTime: identity.lastActivityTime,
    authentication: excludeKeys ? null : {
      symmetricKey: { primaryKey: keys.primaryKey ?? null, secondaryKey: keys.secondaryKey ?? null },
      x509Thumbprint: { primaryThumbprint: prints.primaryThumbprint ?? null, secondaryThumbprint: prints.secondaryThumbprint ?? null },
      type: a.type || "sas",
    },
    twinETag: twin.etag,
    version: twin.version,
    tags: twin.tags || {},
    properties: { desired: props.desired, reported: props.reported },
    capabilities: { iotEdge: Boolean(source.capabilities && source.capabilities.iotEdge) },
    // Modules have no scopes (the hub stores none for them).
    deviceScope: isModule ? null : identity.deviceScope ?? null,
    parentScopes: isModule ? [] : identity.parentScopes || [],
  };
  if (isModule) {
    line.moduleId = identity.moduleId;
    line.managedBy = identity.managedBy ?? null;
  }
  if (identity.modelId) line.modelId = identity.modelId;
  return line;
}

/** Every page of a query's rows, following x-ms-continuation. */
async function* queryPages(api, query, signal) {
  let token = null;
  const seen = new Set();
  do {
    const headers = { "x-ms-max-item-count": String(PAGE) };
    if (token) headers["x-ms-continuation"] = token;
    const r = await api.post("/devices/query", { query }, { headers, signal });
    yield Array.isArray(r.body) ? r.body : [];
    token = r.headers && r.headers.get ? r.headers.get("x-ms-continuation") : null;
    if (token && seen.has(token)) throw new Error(`The query ${query} returned the same continuation twice.`);
    if (token) seen.add(token);
  } while (token);
}

const notFound = (err) => err && err.status === 404;
const unaddressable = (err) => err && err.code === "UnaddressableId";

/**
 * Reads the whole registry into export lines: {text, devices, modules, gone, unreadable}.
 * `gone` lists identities deleted while they were read (not in the file: they no longer exist);
 * `unreadable` the ids a browser cannot put in a URL ("." and ".."), not in the file either.
 * Any other failure rejects: a file with identities silently missing is never made.
 */
export async function readRegistry(api, { excludeKeys = false, onProgress = () => {}, signal } = {}) {
  const devices = new Map(); // device id -> {line, modules: [line]}
  const gone = [];
  const unreadable = [];
  const skip = (err, what) => {
    if (notFound(err)) gone.push(what);
    else if (unaddressable(err)) unreadable.push(what);
    else throw err;
  };
  for await (const twins of queryPages(api, "SELECT * FROM devices", signal)) {
    const read = await eachLimited(twins, PARALLEL, (t) => api.get(identityPath(t.deviceId), { signal }));
    for (const r of read) {
      if (r.error) skip(r.error, r.item.deviceId);
      else devices.set(r.item.deviceId, { line: exportLine(r.value.body, r.item, excludeKeys), modules: [] });
    }
    onProgress({ devices: devices.size, modules: 0 });
  }
  // Module twins, then the module identities (keys) of each device that has any.
  const moduleTwins = new Map();
  for await (const twins of queryPages(api, "SELECT * FROM devices.modules", signal)) {
    for (const t of twins) {
      if (!devices.has(t.deviceId)) continue; // its device was gone or unreadable: so is it
      if (!moduleTwins.has(t.deviceId)) moduleTwins.set(t.deviceId, new Map());
      moduleTwins.get(t.deviceId).set(t.moduleId, t);
    }
  }
  let moduleCount = 0;
  const listed = await eachLimited([...moduleTwins.keys()], PARALLEL, (id) => api.get(`${identityPath(id)}/modules`, { signal }));
  for (const r of listed) {
    if (r.error) {
      skip(r.error, r.item);
      devices.delete(r.item);
      continue;
    }
    const twins = moduleTwins.get(r.item);
    const identities = Array.isArray(r.value.body) ? r.value.body : [];
    for (const m of identities) {
      const twin = twins.get(m.moduleId);
      if (!twin) continue; // created after the query: the next file has it
      devices.get(r.item).modules.push(exportLine(m, twin, excludeKeys));
      moduleCount += 1;
    }
    for (const id of twins.keys()) {
      if (!identities.some((m) => m.moduleId === id)) gone.push(`${r.item}/${id}`);
    }
    onProgress({ devices: devices.size, modules: moduleCount });
  }
  // The job's order: by device id, each device followed by its modules. Ids are ASCII, so
  // comparing code units is comparing bytes, as the hub orders them.
  const byId = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
  const lines = [];
  for (const id of [...devices.keys()].sort(byId)) {
    const d = devices.get(id);
    lines.push(d.line, ...d.modules.sort((a, b) => byId(a.moduleId, b.moduleId)));
  }
  return {
    text: lines.map((l) => JSON.stringify(l) + "\n").join(""),
    devices: devices.size, modules: moduleCount, gone, unreadable,
  };
}

// -- import: reading lines ------------------------------------------------------------------------

/** Why an id breaks the registry's rules, or null. */
export function idProblem(id) {
  if (!id) return "must not be empty";
  if (id.length > MAX_ID_LEN) return `is ${id.length} characters long; at most ${MAX_ID_LEN} are allowed`;
  for (const c of id) {
    if (!/^[A-Za-z0-9]$/.test(c) && !ID_PUNCTUATION.includes(c)) {
      return `contains ${JSON.stringify(c)}; only ASCII letters, digits and ${ID_PUNCTUATION} are allowed`;
    }
  }
  return null;
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const absent = (v) => v === undefined || v === null;

function base64Bytes(s) {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(s) || s.length % 4 !== 0) return -1;
  try {
    return atob(s).length;
  } catch {
    return -1;
  }
}

/** The members of an object without those starting with `$` ($metadata, $version). */
function withoutMeta(obj) {
  return Object.fromEntries(Object.entries(obj).filter(([k]) => !k.startsWith("$")));
}

/** Throws the first fault of a parsed line's fields (the import job's reading, and the registry's rules). */
function checkFields(v) {
  const str = (k, x = v[k]) => {
    if (!absent(x) && typeof x !== "string") throw new Error(`${k} must be a string`);
    return absent(x) ? null : x;
  };
  const obj = (k, x) => {
    if (!absent(x) && !isObject(x)) throw new Error(`${k} must be an object`);
    return absent(x) ? null : x;
  };
  if (typeof v.id !== "string" || !v.id) throw new Error("id is missing");
  const idBad = idProblem(v.id);
  if (idBad) throw new Error(`id ${idBad}`);
  const moduleId = str("moduleId");
  if (moduleId !== null) {
    const bad = idProblem(moduleId);
    if (bad) throw new Error(`moduleId ${bad}`);
  }
  const mode = absent(v.importMode) ? "createOrUpdate" : v.importMode;
  if (typeof mode !== "string" || !IMPORT_MODES.includes(mode)) {
    throw new Error(`importMode ${JSON.stringify(mode)} is not supported (${IMPORT_MODES.join(", ")})`);
  }
  const etag = str("eTag");
  if (ETAG_MODES.has(mode) && !etag) throw new Error(`eTag is required for importMode ${mode}`);
  const status = str("status");
  if (status !== null && !["enabled", "disabled"].includes(status.toLowerCase())) {
    throw new Error(`status must be enabled or disabled, not ${JSON.stringify(status)}`);
  }
  const reason = str("statusReason");
  if (reason !== null && reason.length > MAX_STATUS_REASON) throw new Error(`statusReason is longer than ${MAX_STATUS_REASON} characters`);
  const auth = obj("authentication", v.authentication);
  if (auth) {
    const type = str("authentication.type", auth.type);
    if (type !== null && !AUTH_TYPES.includes(type)) throw new Error(`authentication.type must be ${AUTH_TYPES.join(", ")}, not ${JSON.stringify(type)}`);
    const keys = obj("authentication.symmetricKey", auth.symmetricKey);
    for (const k of ["primaryKey", "secondaryKey"]) {
      const key = keys && str(`authentication.symmetricKey.${k}`, keys[k]);
      if (!key) continue;
      const n = base64Bytes(key);
      if (n < KEY_BYTES[0] || n > KEY_BYTES[1]) throw new Error(`authentication.symmetricKey.${k} must be base64 of ${KEY_BYTES[0]} to ${KEY_BYTES[1]} bytes`);
    }
    const prints = obj("authentication.x509Thumbprint", auth.x509Thumbprint);
    for (const k of ["primaryThumbprint", "secondaryThumbprint"]) if (prints) str(`authentication.x509Thumbprint.${k}`, prints[k]);
  }
  const caps = obj("capabilities", v.capabilities);
  if (caps && !absent(caps.iotEdge) && typeof caps.iotEdge !== "boolean") throw new Error("capabilities.iotEdge must be true or false");
  str("deviceScope");
  str("managedBy");
  if (!absent(v.parentScopes) && !(Array.isArray(v.parentScopes) && v.parentScopes.every((s) => typeof s === "string"))) {
    throw new Error("parentScopes must be a list of strings");
  }
  const tags = obj("tags", v.tags);
  const properties = obj("properties", v.properties);
  const desired = properties ? obj("properties.desired", properties.desired) : null;
  return { moduleId, mode, etag, tags, desired };
}

/** The bulk item and twin write a line asks for, or its fault: {item} | {error}. */
export function readLine(text) {
  let v;
  try {
    v = JSON.parse(text);
  } catch (e) {
    // The parser's own "(line 1 column 9)" would contradict the file's line number: keep the column.
    return { error: { message: `the line is not JSON: ${e.message.replace(/\s*\(line \d+ column (\d+)\)/, " (column $1)")}` } };
  }
  if (!isObject(v)) return { error: { message: "the line is not a JSON object" } };
  let f;
  try {
    f = checkFields(v);
  } catch (e) {
    return { error: { deviceId: typeof v.id === "string" ? v.id : null, moduleId: typeof v.moduleId === "string" ? v.moduleId : null, message: e.message } };
  }
  // What POST /devices reads (ExportImportDevice); the rest of an export line is the job's.
  const body = { id: v.id, importMode: f.mode };
  if (f.moduleId) body.moduleId = f.moduleId;
  if (f.etag) body.eTag = f.etag;
  for (const k of ["status", "statusReason", "authentication", "capabilities", "deviceScope", "parentScopes", "managedBy"]) {
    if (!absent(v[k])) body[k] = v[k];
  }
  let twin = null;
  if (!DELETE_MODES.has(f.mode) && (f.tags || f.desired)) {
    twin = {};
    if (f.tags) twin.tags = withoutMeta(f.tags);
    if (f.desired) twin.properties = { desired: withoutMeta(f.desired) };
  }
  return { item: { deviceId: v.id, moduleId: f.moduleId, mode: f.mode, body, twin } };
}

/**
 * Reads a devices.txt: {items, errors, errorCount, counts}. Blank lines are skipped (as by the
 * job); `errors` holds the first `maxErrors` faults with their line numbers (1-based).
 */
export function parseImportFile(text, { maxErrors = 10 } = {}) {
  const items = [];
  const errors = [];
  let errorCount = 0;
  const counts = {};
  text.replace(/^\uFEFF/, "").split("\n").forEach((raw, i) => {
    const line = raw.trim();
    if (!line) return;
    const r = readLine(line);
    if (r.error) {
      errorCount += 1;
      if (errors.length < maxErrors) errors.push({ lineNumber: i + 1, ...r.error });
      return;
    }
    counts[r.item.mode] = (counts[r.item.mode] || 0) + 1;
    items.push({ lineNumber: i + 1, ...r.item });
  });
  return { items, errors, errorCount, counts };
}

// -- import: applying -----------------------------------------------------------------------------

const keyOf = (deviceId, moduleId) => JSON.stringify([deviceId, moduleId || null]);

/** Bulk requests in file order: at most BULK_MAX items, a new one when an identity comes again. */
export function chunks(items) {
  const out = [];
  let cur = [];
  let names = new Set();
  for (const it of items) {
    const k = keyOf(it.deviceId, it.moduleId);
    if (cur.length >= BULK_MAX || names.has(k)) {
      out.push(cur);
      cur = [];
      names = new Set();
    }
    cur.push(it);
    names.add(k);
  }
  if (cur.length) out.push(cur);
  return out;
}

/** Sends one chunk; resolves with a Map of identity key -> the hub's reason for each refused item. */
async function postChunk(api, chunk) {
  const refused = new Map();
  try {
    await api.post("/devices", chunk.map((it) => it.body));
  } catch (err) {
    const listed = err && err.status === 400 && err.body && Array.isArray(err.body.errors) ? err.body.errors : [];
    for (const e of listed) {
      refused.set(keyOf(String(e.deviceId ?? ""), e.moduleId), `${e.errorCode || "Error"}: ${e.errorStatus || "refused"}`);
    }
    // Refused as a whole (rights, size, no answer), or listing none: every item failed.
    if (!refused.size) for (const it of chunk) refused.set(keyOf(it.deviceId, it.moduleId), errorText(err));
  }
  return refused;
}

/**
 * Applies read lines in file order. Resolves with {applied, failures: [{lineNumber, deviceId,
 * moduleId, reason}]}; onProgress({done, total}) after each request.
 */
export async function applyImport(api, items, { onProgress = () => {} } = {}) {
  const failures = [];
  let applied = 0;
  let done = 0;
  for (const chunk of chunks(items)) {
    const refused = await postChunk(api, chunk);
    const ok = [];
    for (const it of chunk) {
      const reason = refused.get(keyOf(it.deviceId, it.moduleId));
      if (reason) failures.push({ lineNumber: it.lineNumber, deviceId: it.deviceId, moduleId: it.moduleId, reason });
      else ok.push(it);
    }
    const twins = await eachLimited(ok.filter((it) => it.twin), PARALLEL, (it) => api.put(twinPath(it.deviceId, it.moduleId), it.twin));
    const twinFailed = new Set();
    for (const r of twins) {
      if (!r.error) continue;
      twinFailed.add(r.item);
      failures.push({
        lineNumber: r.item.lineNumber, deviceId: r.item.deviceId, moduleId: r.item.moduleId,
        reason: `the identity was imported, but its tags and desired properties were refused: ${errorText(r.error)}`,
      });
    }
    applied += ok.filter((it) => !twinFailed.has(it)).length;
    done += chunk.length;
    onProgress({ done, total: items.length });
  }
  failures.sort((a, b) => a.lineNumber - b.lineNumber);
  return { applied, failures };
}
