// Connected apps: the apps the owner let in by OAuth, the devices each may use (and Change),
// and their Revoke buttons; app credentials
// for apps that cannot register themselves (uses app.js's api, showError).
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
      Forms.el("td", {class: "may", text: app.may.join("; "), title: app.scopes.join(" ")}),
      deviceCell(app), Forms.el("td", {text: app.redirect}),
      Forms.el("td", {}, revoke));
  }));
  document.getElementById("apps-empty").hidden = apps.length > 0;
  await loadCredentials();
}

// Which devices the app may use, in words, and a Change form: ids and name patterns, comma
// separated; empty means every device.
function deviceCell(app) {
  const shown = Forms.el("span", {class: "sees", text: app.sees});
  const input = Forms.el("input", {name: "devices", class: "devices-input", placeholder: "all devices",
    value: (app.devices || []).join(", ")});
  const save = Forms.el("button", {type: "submit", class: "save-devices", text: "Save"});
  const form = Forms.el("form", {class: "devices-form", hidden: ""}, input, save);
  const change = Forms.el("button", {type: "button", class: "change-devices secondary", text: "Change"});
  change.addEventListener("click", () => { form.hidden = false; change.hidden = true; input.focus(); });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const listed = input.value.split(/[\s,]+/).filter(Boolean);
    save.disabled = true;
    api("api/oauth/devices", {client_id: app.client_id, devices: listed.length ? listed : null})
      .then(loadApps, (error) => { save.disabled = false; showError(error); });
  });
  return Forms.el("td", {class: "devices"}, shown, " ", change, form);
}

async function loadCredentials() {
  const {credentials} = await api("api/oauth/credentials");
  const body = document.querySelector("#credentials tbody");
  body.replaceChildren(...credentials.map((item) => {
    const remove = Forms.el("button", {type: "button", class: "delete", text: "Delete"});
    remove.addEventListener("click", () => {
      remove.disabled = true;
      api("api/oauth/credentials/delete", {client_id: item.client_id}).then(loadApps, (error) => {
        remove.disabled = false;
        showError(error);
      });
    });
    return Forms.el("tr", {"data-client": item.client_id},
      Forms.el("td", {class: "name", text: item.name}),
      Forms.el("td", {class: "client-id", text: item.client_id}),
      Forms.el("td", {text: item.redirect_uri}),
      Forms.el("td", {text: item.no_pkce ? "not sent (allowed)" : "required"}),
      Forms.el("td", {}, remove));
  }));
  document.getElementById("credentials-empty").hidden = credentials.length > 0;
}

async function makeCredentials(event) {
  event.preventDefault();
  const form = new FormData(event.target);
  const made = await api("api/oauth/credentials", {
    name: form.get("name"), redirect_uri: form.get("redirect_uri"), no_pkce: form.get("no_pkce") === "on"});
  const out = document.getElementById("credentials-made");
  out.textContent = `client id:     ${made.client_id}\nclient secret: ${made.client_secret}\n\n` +
    "Type both into the app now: the secret is not shown again.";
  out.hidden = false;
  event.target.reset();
  await loadCredentials();
}

document.getElementById("add-credentials").addEventListener(
  "submit", (event) => makeCredentials(event).catch(showError));
