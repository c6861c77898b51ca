// The Devices page's plain search: a device id prefix, a status, a connection state and one
// tag, turned into a twin query (docs/query.md) that runs through the same paged
// POST /devices/query as a query typed by hand. Every typed value becomes a quoted string
// literal or a [[quoted]] name here, so nothing typed in the form can change the query's shape.
import { h, field, replace } from "./ui.js";

/** A search the form cannot express; its message is shown under the form. */
export class SearchError extends Error {}

const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;
const JSON_NUMBER = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$/;

/**
 * 'text' as a string literal. The hub's lexer, like IoT Hub's, takes backslash escapes
 * (`\'`, `\\`); a doubled `''` would end the literal and the hub would refuse the query.
 */
export function quote(text) {
  return `'${String(text).replace(/[\\']/g, (c) => `\\${c}`)}'`;
}

/** `tags.site`, `tags.location.building`, `tags.[[rack-pos]]`: a dotted tag name as a path. */
export function tagPath(name) {
  const parts = name.split(".");
  return "tags" + parts.map((p) => {
    if (!p) throw new SearchError(`The tag name “${name}” has an empty part (two dots, or a dot at an end).`);
    if (IDENT.test(p)) return `.${p}`;
    // [[name]] cannot hold "]]", and a final "]" would close it early.
    if (p.includes("]]") || p.endsWith("]")) throw new SearchError(`The tag name part “${p}” cannot be written in a query (it holds “]]” or ends with “]”).`);
    return `.[[${p}]]`;
  }).join("");
}

/**
 * The condition on one tag. A value typed as a number or a boolean also matches the tag set as
 * that JSON type (`IN` keeps the hub's tag index usable, where an OR would not); a name without
 * a value finds the twins that have the tag at all.
 */
function tagCondition(name, value) {
  const path = tagPath(name);
  if (value === "") return `IS_DEFINED(${path})`;
  const typed = (JSON_NUMBER.test(value) && Number.isFinite(Number(value))) || value === "true" || value === "false";
  return typed ? `${path} IN [${quote(value)}, ${value}]` : `${path} = ${quote(value)}`;
}

/**
 * The query for {prefix, status: ""|"enabled"|"disabled", connection: ""|"Connected"|
 * "Disconnected", tagName, tagValue}; throws SearchError when the criteria cannot be written.
 */
export function buildQuery(c) {
  const prefix = (c.prefix || "").trim();
  const tagName = (c.tagName || "").trim();
  const tagValue = c.tagValue || "";
  const terms = [];
  if (prefix) terms.push(`STARTSWITH(deviceId, ${quote(prefix)})`);
  if (c.status === "enabled" || c.status === "disabled") terms.push(`status = ${quote(c.status)}`);
  if (c.connection === "Connected" || c.connection === "Disconnected") terms.push(`connectionState = ${quote(c.connection)}`);
  if (tagName) terms.push(tagCondition(tagName, tagValue));
  else if (tagValue) throw new SearchError("Enter the tag's name as well as its value.");
  return `SELECT * FROM devices${terms.length ? ` WHERE ${terms.join(" AND ")}` : ""}`;
}

function select(id, testid, options, value) {
  return h("select", { id, dataset: { testid } },
    options.map(([v, text]) => h("option", { value: v, selected: v === value }, text)));
}

/**
 * The search form. `onSearch(query, criteria)` runs when it is submitted (the Find button, or
 * Enter in any of its fields, selects included) with criteria the form could write.
 */
export function searchForm({ initial = {}, onSearch }) {
  const input = (id, testid, value, attrs) => h("input", {
    type: "text", id, value: value || "", spellcheck: "false", autocomplete: "off", dataset: { testid }, ...attrs,
  });
  const prefix = input("find-prefix", "find-prefix", initial.prefix, { maxlength: "128", placeholder: "sensor-" });
  const status = select("find-status", "find-status", [["", "Any"], ["enabled", "Enabled"], ["disabled", "Disabled"]], initial.status || "");
  const connection = select("find-connection", "find-connection",
    [["", "Any"], ["Connected", "Connected"], ["Disconnected", "Disconnected"]], initial.connection || "");
  const tagName = input("find-tag-name", "find-tag-name", initial.tagName, { maxlength: "256", placeholder: "site" });
  const tagValue = input("find-tag-value", "find-tag-value", initial.tagValue, { maxlength: "512", placeholder: "lab" });
  const errorLine = h("div", { class: "find-error", role: "alert", dataset: { testid: "find-error" } });
  const findBtn = h("button", { type: "submit", class: "btn btn-primary", dataset: { testid: "find" } }, "Find");
  const clearBtn = h("button", { type: "button", class: "btn", dataset: { testid: "find-clear" } }, "Clear");
  const criteria = () => ({
    prefix: prefix.value, status: status.value, connection: connection.value, tagName: tagName.value, tagValue: tagValue.value,
  });
  const form = h("form", { class: "find-form", role: "search", "aria-label": "Find devices", dataset: { testid: "device-search" } },
    field("Device id starts with", prefix),
    field("Status", status),
    field("Connection", connection),
    field("Tag name", tagName),
    field("Tag value", tagValue),
    h("div", { class: "find-actions" }, findBtn, clearBtn),
    errorLine);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    let query;
    try {
      query = buildQuery(criteria());
    } catch (err) {
      if (!(err instanceof SearchError)) throw err;
      replace(errorLine, err.message);
      return;
    }
    replace(errorLine);
    onSearch(query, criteria());
  });
  // Enter submits a form only from its text fields; the selects should search too.
  form.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && e.target instanceof HTMLSelectElement) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  clearBtn.addEventListener("click", () => {
    prefix.value = tagName.value = tagValue.value = "";
    status.value = connection.value = "";
    form.requestSubmit();
  });
  return { el: form, criteria };
}
