// Shared access policy connection strings and SAS tokens, signed in the browser (Web Crypto).
//
// A token is `SharedAccessSignature sr={enc(resource)}&sig={enc(base64 HMAC-SHA256)}&se={expiry}&skn={policy}`,
// the HMAC taken with the base64-decoded policy key over `enc(resource) + "\n" + expiry`, where
// enc is encodeURIComponent and the resource is the hub's host name.

const TOKEN_TTL_SECONDS = 3600;
// A cached token is used for 50 of its 60 minutes.
const TOKEN_REUSE_SECONDS = 3000;

let cache = null; // {id, token, renewAt}

export class ConnectionStringError extends Error {}

/** Parses `HostName=...;SharedAccessKeyName=...;SharedAccessKey=...` into {hostName, policyName, key}. */
export function parseConnectionString(text) {
  const cs = String(text || "").trim();
  if (!cs) throw new ConnectionStringError("Paste a shared access policy connection string.");
  if (/^Endpoint=sb:\/\//i.test(cs)) {
    throw new ConnectionStringError(
      "This is an Event Hubs connection string. The console needs the hub's shared access policy connection string (HostName=...;SharedAccessKeyName=...;SharedAccessKey=...).");
  }
  const parts = {};
  for (const piece of cs.split(";")) {
    if (!piece.trim()) continue;
    const at = piece.indexOf("=");
    if (at <= 0) throw new ConnectionStringError(`"${piece.slice(0, 40)}" is not a Name=value pair.`);
    parts[piece.slice(0, at).trim().toLowerCase()] = piece.slice(at + 1).trim();
  }
  if (parts.deviceid !== undefined || parts.moduleid !== undefined) {
    throw new ConnectionStringError(
      "This is a device connection string (it names a DeviceId). Sign in with a shared access policy connection string instead: HostName=...;SharedAccessKeyName=...;SharedAccessKey=... (for example the output of `ferrohub connection-string --data-dir DIR`).");
  }
  const missing = [["hostname", "HostName"], ["sharedaccesskeyname", "SharedAccessKeyName"], ["sharedaccesskey", "SharedAccessKey"]]
    .filter(([k]) => !parts[k]).map(([, name]) => name);
  if (missing.length) throw new ConnectionStringError(`The connection string lacks ${missing.join(", ")}.`);
  decodeKey(parts.sharedaccesskey); // throws when it is not base64
  return { hostName: parts.hostname, policyName: parts.sharedaccesskeyname, key: parts.sharedaccesskey };
}

function decodeKey(b64) {
  try {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    if (!bytes.length) throw new Error("empty");
    return bytes;
  } catch {
    throw new ConnectionStringError("The SharedAccessKey is not valid base64.");
  }
}

/** Base64 of bytes (a Uint8Array, an ArrayBuffer or an array of byte values). */
export function bytesToBase64(buffer) {
  const bytes = buffer instanceof Uint8Array ? buffer : new Uint8Array(buffer);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin);
}

/** Signs a token for `resource` (default: the hub's host name) valid `ttl` seconds. */
export async function signToken({ hostName, policyName, key }, { resource = hostName, ttl = TOKEN_TTL_SECONDS, now = Date.now() } = {}) {
  const expiry = Math.floor(now / 1000) + ttl;
  const sr = encodeURIComponent(resource);
  const cryptoKey = await crypto.subtle.importKey("raw", decodeKey(key), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const mac = await crypto.subtle.sign("HMAC", cryptoKey, new TextEncoder().encode(`${sr}\n${expiry}`));
  let token = `SharedAccessSignature sr=${sr}&sig=${encodeURIComponent(bytesToBase64(mac))}&se=${expiry}`;
  if (policyName) token += `&skn=${encodeURIComponent(policyName)}`;
  return token;
}

/** A hub-scoped token for the session, reused for 50 of its 60 minutes. */
export async function tokenFor(session) {
  const id = `${session.hostName}\n${session.policyName}\n${session.key}`;
  const now = Date.now();
  if (cache && cache.id === id && now < cache.renewAt) return cache.token;
  const token = await signToken(session, { now });
  cache = { id, token, renewAt: now + TOKEN_REUSE_SECONDS * 1000 };
  return token;
}

/** Forgets the cached token (sign-out). */
export function clearTokenCache() {
  cache = null;
}
