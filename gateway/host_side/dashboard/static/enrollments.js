// Issued device tokens (flash, image, provision, the Setup page's form) and their Revoke buttons
// (uses app.js's api and showError).
"use strict";

async function loadEnrollments() {
  const {enrollments} = await api("api/enrollments");
  const body = document.querySelector("#enrollments tbody");
  body.replaceChildren(...enrollments.map((issued) => {
    const revoke = Forms.el("button", {type: "button", class: "revoke", text: "Revoke"});
    revoke.addEventListener("click", () => {
      revoke.disabled = true;
      api("api/enrollments/revoke", {id: issued.id}).then(loadEnrollments, (error) => {
        revoke.disabled = false;
        showError(error);
      });
    });
    const used = issued.device_id ? (issued.device ? `${issued.device} (${issued.device_id})` : issued.device_id) : "not used yet";
    return Forms.el("tr", {"data-enrollment": issued.id},
      Forms.el("td", {}, Forms.el("code", {text: issued.id})), Forms.el("td", {class: "name", text: issued.name}),
      Forms.el("td", {text: used}), Forms.el("td", {text: issued.issued}), Forms.el("td", {}, revoke));
  }));
  document.getElementById("enrollments-empty").hidden = enrollments.length > 0;
}
