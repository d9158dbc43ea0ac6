// Connected apps: the apps the owner let in by OAuth, and their Revoke buttons (uses app.js's api, el).
"use strict";

async function loadApps() {
  const {apps} = await api("api/oauth/apps");
  const body = document.querySelector("#apps tbody");
  body.replaceChildren(...apps.map((app) => {
    const revoke = Forms.el("button", {type: "button", class: "revoke", text: "Revoke"});
    revoke.addEventListener("click", () => {
      revoke.disabled = true;
      api("api/oauth/revoke", {client_id: app.client_id}).then(loadApps, (error) => {
        revoke.disabled = false;
        showError(error);
      });
    });
    return Forms.el("tr", {"data-client": app.client_id},
      Forms.el("td", {class: "name", text: app.name, title: app.client_id}),
      Forms.el("td", {text: app.allowed}), Forms.el("td", {text: app.last_used || "never"}),
      Forms.el("td", {class: "may", text: app.may.join("; "), title: app.scopes.join(" ")}), Forms.el("td", {text: app.redirect}),
      Forms.el("td", {}, revoke));
  }));
  document.getElementById("apps-empty").hidden = apps.length > 0;
}
