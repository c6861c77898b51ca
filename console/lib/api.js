// The hub's REST API, called from the signed-in tab with SAS tokens it signs itself.
//
//   const api = createApi(session);
//   const { status, headers, body } = await api.get("/devices/d1");
//
// Every call adds api-version=2021-04-12 unless the query sets one. A JSON body is sent as JSON;
// an answer is parsed as JSON when it is JSON, else kept as text. Statuses from 400 reject with
// an ApiError carrying the status, the IoT Hub error name (`code`) and its text.
import { tokenFor } from "./sas.js";

export const API_VERSION = "2021-04-12";

export class ApiError extends Error {
  constructor(status, code, message, body = null, headers = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.body = body;
    this.headers = headers;
  }
}

/** Splits IoT Hub's error body (`{"Message":"ErrorCode:Name;text", "errorCode": N, ...}`). */
export function errorFromBody(status, body, statusText = "") {
  let code = "";
  let message = "";
  let number = null;
  if (body && typeof body === "object") {
    const raw = typeof body.Message === "string" ? body.Message : (typeof body.message === "string" ? body.message : "");
    const m = /^ErrorCode:([^;]*);([\s\S]*)$/.exec(raw);
    if (m) {
      code = m[1];
      message = m[2];
    } else {
      message = raw;
    }
    if (typeof body.errorCode === "number" || typeof body.errorCode === "string") number = body.errorCode;
    if (!message && typeof body.ExceptionMessage === "string") message = body.ExceptionMessage;
  } else if (typeof body === "string") {
    message = body.trim().slice(0, 500);
  }
  if (!message) message = statusText || `HTTP ${status}`;
  const err = new ApiError(status, code, message, body);
  err.number = number;
  return err;
}

function quoteEtag(etag) {
  if (etag === "*" || /^".*"$/.test(etag)) return etag;
  return `"${etag}"`;
}

function buildUrl(path, query) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v === undefined || v === null) continue;
    url.searchParams.set(k, String(v));
  }
  if (!url.searchParams.has("api-version")) url.searchParams.set("api-version", API_VERSION);
  return url.pathname + url.search;
}

async function parseBody(response) {
  if (response.status === 204 || response.status === 304) return null;
  const type = response.headers.get("content-type") || "";
  const text = await response.text();
  if (!text) return null;
  if (/json/i.test(type) || /^\s*[[{]/.test(text)) {
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }
  return text;
}

export function createApi(session) {
  /**
   * opts: {query, headers, body, ifMatch, signal, contentType}. A string body is sent as is
   * (text/plain unless contentType says otherwise); anything else but undefined as JSON.
   */
  async function request(method, path, opts = {}) {
    checkPath(path);
    const headers = new Headers(opts.headers || {});
    headers.set("Authorization", await tokenFor(session));
    if (opts.ifMatch) headers.set("If-Match", quoteEtag(opts.ifMatch));
    let body;
    if (opts.body !== undefined) {
      if (typeof opts.body === "string") {
        body = opts.body;
        if (!headers.has("Content-Type")) headers.set("Content-Type", opts.contentType || "text/plain; charset=utf-8");
      } else if (opts.body instanceof Blob || opts.body instanceof ArrayBuffer) {
        // Sent without a Content-Type unless one is given (a C2D message's content type is the sender's).
        body = opts.body;
        if (opts.contentType && !headers.has("Content-Type")) headers.set("Content-Type", opts.contentType);
      } else {
        body = JSON.stringify(opts.body);
        if (!headers.has("Content-Type")) headers.set("Content-Type", "application/json; charset=utf-8");
      }
    }
    let response;
    try {
      response = await fetch(buildUrl(path, opts.query), {
        method, headers, body, signal: opts.signal, cache: "no-store", credentials: "omit",
      });
    } catch (e) {
      if (e && e.name === "AbortError") throw e;
      throw new ApiError(0, "NetworkError", `The hub did not answer (${e && e.message ? e.message : e}).`);
    }
    const parsed = await parseBody(response);
    if (response.status >= 400) {
      const err = errorFromBody(response.status, parsed, response.statusText);
      err.headers = response.headers;
      throw err;
    }
    return { status: response.status, headers: response.headers, body: parsed };
  }

  return {
    request,
    get: (path, opts = {}) => request("GET", path, opts),
    put: (path, body, opts = {}) => request("PUT", path, { ...opts, body }),
    post: (path, body, opts = {}) => request("POST", path, { ...opts, body }),
    patch: (path, body, opts = {}) => request("PATCH", path, { ...opts, body }),
    del: (path, opts = {}) => request("DELETE", path, opts),
  };
}

/** Why an id cannot be a URL path segment, or null when it can. */
export function unaddressableReason(id) {
  if (id === "." || id === "..") {
    return `The id "${id}" cannot be used in a URL: browsers collapse "." and ".." path segments.`;
  }
  return null;
}

/**
 * Percent-encodes one path segment (device ids may hold characters like `#`, `%`, `/`). The only
 * way an id enters a REST path: "." and ".." are valid IoT Hub ids, but a browser collapses such
 * a segment (DELETE /devices/d/modules/.. would become DELETE /devices/d), so they are refused
 * with an ApiError (status 0, code UnaddressableId) before any request is made.
 */
export function seg(id) {
  const reason = unaddressableReason(id);
  if (reason) throw new ApiError(0, "UnaddressableId", reason);
  return encodeURIComponent(id);
}

// A dot segment as the URL parser sees it: ".", "..", and their %2e spellings.
const DOT_SEGMENT = /^(?:\.|%2e){1,2}$/i;

/** Last line of defence: refuses a path holding a dot segment (it would reach another resource). */
function checkPath(path) {
  const pathname = String(path).split(/[?#]/)[0];
  if (pathname.split("/").some((s) => DOT_SEGMENT.test(s))) {
    throw new ApiError(0, "UnaddressableId", `The path ${pathname} holds a "." or ".." segment, which browsers collapse; it was not requested.`);
  }
}
