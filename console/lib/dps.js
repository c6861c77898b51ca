// The Device Provisioning Service's service API (api-version 2021-10-01), called from the tab
// like lib/api.js calls the hub's REST API, but signed with a *provisioning* policy's key: DPS
// accepts no hub policy. The key comes from GET /console/api/provisioning/policies/{name}/keys
// (only a hub policy holding all four rights may read it) and never leaves the tab.
//
//   const dps = createDpsClient({hostName, policyName, key});
//   const { body, headers } = await dps.post("/enrollments/query", { query: "*" });
//
// Refusals reject with a DpsError built from DPS's error body
// ({errorCode, trackingId, message, timestampUtc}): status, errorCode and message, readable
// through ui.errorText ("412 412001: …").
import { signToken, bytesToBase64, parseConnectionString } from "./sas.js";
import { ApiError, seg } from "./api.js";

export const DPS_API_VERSION = "2021-10-01";

// Tokens live 60 minutes and are reused for 50, as the hub's (lib/sas.js).
const TOKEN_TTL_SECONDS = 3600;
const TOKEN_REUSE_MS = 3000 * 1000;

/** A DPS refusal: an ApiError (so ui.errorText and ui.errorBox read it) with DPS's fields. */
export class DpsError extends ApiError {
  constructor(status, errorCode, message, { trackingId = null, timestampUtc = null, body = null } = {}) {
    super(status, errorCode ? String(errorCode) : "", message, body);
    this.name = "DpsError";
    this.errorCode = errorCode;
    this.trackingId = trackingId;
    this.timestampUtc = timestampUtc;
  }
}

/** A DpsError from an answer's status and body (DPS's JSON error body, IoT Hub's, or text). */
export function dpsErrorFromBody(status, body, statusText = "") {
  let code = null;
  let message = "";
  let trackingId = null;
  let timestampUtc = null;
  if (body && typeof body === "object") {
    if (typeof body.errorCode === "number" || typeof body.errorCode === "string") code = body.errorCode;
    message = typeof body.message === "string" ? body.message : (typeof body.Message === "string" ? body.Message : "");
    trackingId = typeof body.trackingId === "string" ? body.trackingId : null;
    timestampUtc = typeof body.timestampUtc === "string" ? body.timestampUtc : null;
  } else if (typeof body === "string") {
    message = body.trim().slice(0, 500);
  }
  if (!message) message = statusText || `HTTP ${status}`;
  return new DpsError(status, code, message, { trackingId, timestampUtc, body });
}

/** The `/enrollments/{id}` or `/enrollmentGroups/{id}` path of a record. */
export function enrollmentPath(kind, id) {
  return `/${kind === "group" ? "enrollmentGroups" : "enrollments"}/${seg(id)}`;
}

function quoteEtag(etag) {
  if (etag === "*" || /^".*"$/.test(etag)) return etag;
  return `"${etag}"`;
}

async function parseBody(response) {
  if (response.status === 204) return null;
  const text = await response.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/**
 * A client of the service API signed with a provisioning policy ({hostName, policyName, key};
 * or a provisioning connection string). The token's resource is the host name, skn the policy.
 */
export function createDpsClient(credentials) {
  const creds = typeof credentials === "string" ? parseConnectionString(credentials) : credentials;
  let cached = null; // {token, renewAt}

  async function token() {
    const now = Date.now();
    if (cached && now < cached.renewAt) return cached.token;
    const t = await signToken(creds, { resource: creds.hostName, ttl: TOKEN_TTL_SECONDS, now });
    cached = { token: t, renewAt: now + TOKEN_REUSE_MS };
    return t;
  }

  /** opts: {body, ifMatch, headers, signal}. A body is sent as JSON. */
  async function request(method, path, opts = {}) {
    const url = new URL(path, window.location.origin);
    url.searchParams.set("api-version", DPS_API_VERSION);
    const headers = new Headers(opts.headers || {});
    headers.set("Authorization", await token());
    if (opts.ifMatch) headers.set("If-Match", quoteEtag(opts.ifMatch));
    let body;
    if (opts.body !== undefined) {
      body = JSON.stringify(opts.body);
      headers.set("Content-Type", "application/json; charset=utf-8");
    }
    let response;
    try {
      response = await fetch(url.pathname + url.search, {
        method, headers, body, signal: opts.signal, cache: "no-store", credentials: "omit",
      });
    } catch (e) {
      if (e && e.name === "AbortError") throw e;
      throw new DpsError(0, null, `The provisioning service did not answer (${e && e.message ? e.message : e}).`);
    }
    const parsed = await parseBody(response);
    if (response.status >= 400) throw dpsErrorFromBody(response.status, parsed, response.statusText);
    return { status: response.status, headers: response.headers, body: parsed };
  }

  return {
    hostName: creds.hostName,
    policyName: creds.policyName,
    request,
    get: (path, opts = {}) => request("GET", path, opts),
    put: (path, body, opts = {}) => request("PUT", path, { ...opts, body }),
    post: (path, body, opts = {}) => request("POST", path, { ...opts, body }),
    del: (path, opts = {}) => request("DELETE", path, opts),
  };
}

function base64ToBytes(b64) {
  let bin;
  try {
    bin = atob(String(b64 || "").trim());
  } catch {
    throw new Error("The group key is not valid base64.");
  }
  if (!bin.length) throw new Error("The group key is empty.");
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

/**
 * A symmetric-key group member's device key: base64(HMAC-SHA256(base64decode(group key),
 * registration id)), as `az iot dps enrollment-group compute-device-key` derives it.
 */
export async function deriveDeviceKey(groupKey, registrationId) {
  if (!registrationId) throw new Error("Enter a registration id.");
  const key = await crypto.subtle.importKey("raw", base64ToBytes(groupKey), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const mac = await crypto.subtle.sign("HMAC", key, new TextEncoder().encode(registrationId));
  return bytesToBase64(mac);
}

/** The attestation's short name: "Symmetric key", "X.509" (or the type as given). */
export function attestationLabel(record) {
  const type = record && record.attestation && record.attestation.type;
  return { symmetricKey: "Symmetric key", x509: "X.509" }[type] || type || "—";
}

/**
 * The body that replaces a record with `changes` applied: the record as read (symmetric keys
 * are not in a read and the service keeps them; an X.509 slot holding only `info` keeps its
 * certificate), without what the service computes itself.
 */
export function replacement(record, changes) {
  const body = { ...record, ...changes };
  delete body.registrationState;
  delete body.createdDateTimeUtc;
  delete body.lastUpdatedDateTimeUtc;
  return body;
}
