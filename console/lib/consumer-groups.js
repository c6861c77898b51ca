// The consumer groups of the built-in endpoint, on the Overview page beside its partitions:
// list (GET /events/consumergroups), add (PUT /events/consumergroups/{group}) and delete
// (DELETE, after a confirmation). All three need ServiceConnect. The hub checks names (1 to 50
// letters, digits, - . _ $) and the limit of 20 groups; its 400 or 409 is shown as it answers,
// so the page never holds a second, drifting copy of those rules. $Default always exists: the
// hub refuses to delete it (400), so its Delete button is disabled, saying why.
import { h, replace, card, table, confirm, errorBox, toast, requireRight, loading, empty, ready } from "./ui.js";
import { seg } from "./api.js";

const DEFAULT_GROUP = "$Default";
const MAX_GROUPS = 20; // the hub's limit, shown as "n of 20"

/** The card: {el, load()}. load() reads the groups again. */
export function consumerGroupsCard(app) {
  const listEl = h("div", { dataset: { testid: "consumer-groups" } });
  const countEl = h("span", { class: "muted", dataset: { testid: "consumer-group-count" } });
  const errorEl = h("div", { dataset: { testid: "consumer-group-error" } });
  const nameInput = h("input", {
    type: "text", id: "consumer-group-name", spellcheck: "false", autocomplete: "off", placeholder: "analytics",
    dataset: { testid: "consumer-group-name" },
  });
  const addBtn = requireRight(h("button", { type: "submit", class: "btn btn-primary", dataset: { testid: "consumer-group-add" } }, "Add"), app, "ServiceConnect");
  if (addBtn.disabled) nameInput.disabled = true;
  const form = h("form", { class: "search-bar", style: { marginTop: "12px" }, "aria-label": "Add a consumer group" },
    h("label", { class: "sr-only", for: "consumer-group-name" }, "Consumer group name"), nameInput, addBtn);

  async function load() {
    if (!app.can("ServiceConnect")) {
      listEl.dataset.state = "empty";
      replace(listEl, h("p", { class: "muted" }, "Needs ServiceConnect, which the signed-in policy does not have."));
      return;
    }
    loading(listEl);
    let groups;
    try {
      groups = (await app.api.get("/events/consumergroups")).body || [];
    } catch (err) {
      replace(listEl, errorBox(err));
      listEl.dataset.state = "error";
      return;
    }
    countEl.textContent = `${groups.length} of ${MAX_GROUPS} in use.`;
    if (!groups.length) return empty(listEl, "No consumer groups.");
    replace(listEl, table(["Name", h("span", { class: "sr-only" }, "Actions")], groups.map(groupRow),
      { testid: "consumer-groups-table", caption: "Consumer groups" }));
    ready(listEl);
  }

  function groupRow(name) {
    const del = requireRight(h("button", {
      type: "button", class: "btn btn-small btn-danger", dataset: { testid: "consumer-group-delete" }, "aria-label": `Delete ${name}`,
    }, "Delete"), app, "ServiceConnect");
    if (name === DEFAULT_GROUP) {
      del.disabled = true;
      del.title = "$Default always exists: the hub refuses to delete it";
    }
    del.addEventListener("click", () => remove(name, del));
    return h("tr", { dataset: { testid: "consumer-group-row", group: name } },
      h("td", { class: "mono" }, name), h("td", { class: "actions" }, del));
  }

  async function remove(name, button) {
    const ok = await confirm(`Delete the consumer group ${name}?`,
      "Its checkpoints are deleted with it; a reader using it is refused from then on (404).",
      { confirmLabel: "Delete", danger: true, testid: "confirm-group-delete" });
    if (!ok) return;
    button.disabled = true;
    replace(errorEl);
    try {
      await app.api.del(`/events/consumergroups/${seg(name)}`);
      toast(`Consumer group ${name} deleted`, "ok");
    } catch (err) {
      replace(errorEl, errorBox(err, `The hub refused to delete ${name}`));
      button.disabled = false;
      return;
    }
    await load();
  }

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = nameInput.value.trim();
    replace(errorEl);
    if (!name) {
      replace(errorEl, errorBox(new Error("Enter a name."), "Nothing was sent"));
      return;
    }
    addBtn.disabled = true;
    try {
      await app.api.put(`/events/consumergroups/${seg(name)}`);
      nameInput.value = "";
      toast(`Consumer group ${name} added`, "ok");
      await load();
    } catch (err) {
      replace(errorEl, errorBox(err, `The hub refused ${name}`));
    } finally {
      addBtn.disabled = false;
    }
  });

  const el = card("Consumer groups (built-in endpoint)",
    h("p", { class: "hint" }, "Named readers of the partitions, each with its own checkpoints (the read API and Event Hubs clients read with one). ", countEl),
    listEl,
    form,
    errorEl);
  el.dataset.testid = "consumer-groups-card";
  return { el, load };
}
