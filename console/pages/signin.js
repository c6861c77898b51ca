// Sign-in: paste a shared access policy connection string. The key never leaves the tab: the
// console signs SAS tokens with it (Web Crypto) and asks the hub who it is
// (GET /console/api/session); a refusal (wrong key, wrong hub, unknown policy) shows the hub's 401.
import { parseConnectionString } from "../lib/sas.js";

export default async function render(root, app) {
  const { h, replace, errorText } = app.ui;
  const textarea = h("textarea", {
    id: "connection-string", rows: 4, spellcheck: "false", autocomplete: "off", autocapitalize: "off",
    placeholder: "HostName=hub.example.com;SharedAccessKeyName=iothubowner;SharedAccessKey=...",
    "aria-describedby": "signin-error signin-hint", required: true,
  });
  const error = h("div", { id: "signin-error", class: "error-state", role: "alert", "aria-live": "assertive" });
  const button = h("button", { type: "submit", id: "sign-in", class: "btn btn-primary" }, "Sign in");

  const showError = (title, text) => {
    replace(error, h("strong", {}, title), h("p", { class: "error-text" }, text));
  };

  const form = h("form", { class: "signin-form", novalidate: true },
    h("div", { class: "field" },
      h("label", { for: "connection-string" }, "Shared access policy connection string"),
      textarea,
      h("div", { class: "hint", id: "signin-hint" }, "Kept in this tab's session storage only; closing the tab or signing out forgets it.")),
    error,
    h("div", { class: "row row-end" }, button));

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    replace(error);
    let session;
    try {
      session = parseConnectionString(textarea.value);
    } catch (err) {
      showError("Not a policy connection string", err.message);
      textarea.focus();
      return;
    }
    button.disabled = true;
    button.textContent = "Signing in…";
    try {
      await app.signIn(session);
    } catch (err) {
      const title = err.status === 401
        ? "The hub refused this connection string (HTTP 401)"
        : err.status ? `The hub answered HTTP ${err.status}` : "Could not reach the hub";
      showError(title, errorText(err));
      button.disabled = false;
      button.textContent = "Sign in";
      textarea.focus();
    }
  });
  textarea.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit();
  });

  replace(root,
    h("div", { class: "signin" },
      h("section", { class: "card" },
        h("h1", {}, "Sign in to ferrohub"),
        h("p", { class: "muted" }, "Paste a shared access policy connection string. The console can do exactly what that policy may."),
        form,
        h("div", { class: "signin-notes" },
          h("p", {}, "Print one on the hub's machine with ", h("code", {}, "ferrohub connection-string --data-dir DIR"),
            ", DIR being the hub's data directory (", h("code", {}, "./data"), " for ", h("code", {}, "scripts/run-hub.sh"),
            "); add ", h("code", {}, "--policy registryRead"), " for a read-only view."),
          h("p", {}, "Device connection strings are refused: they carry a DeviceId and no policy.")))));
  if (app.flash) {
    showError("Your session was refused; sign in again", errorText(app.flash));
  }
  root.dataset.state = "ready";
  textarea.focus();
}
