// The signed-in session, kept in this tab's sessionStorage only: {hostName, policyName, key}.
import { clearTokenCache } from "./sas.js";

export const STORAGE_KEY = "ferrohub.console.session";

export function load() {
  try {
    const raw = sessionStorage.getItem(STORAGE_KEY);
    if (!raw) return null;
    const s = JSON.parse(raw);
    if (s && typeof s.hostName === "string" && typeof s.policyName === "string" && typeof s.key === "string") return s;
  } catch {
    // A damaged entry is the same as none.
  }
  return null;
}

export function save({ hostName, policyName, key }) {
  sessionStorage.setItem(STORAGE_KEY, JSON.stringify({ hostName, policyName, key }));
}

export function clear() {
  sessionStorage.removeItem(STORAGE_KEY);
  clearTokenCache();
}
