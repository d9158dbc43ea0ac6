// Calls waiting for your yes (a device's confirm tools), live over SSE, with Allow and Deny;
// and each tool's "Ask me first" box (uses app.js's api and showError).
"use strict";

function watchWaiting() {
  const events = new EventSource("api/calls/events");
  events.addEventListener("calls", (event) => renderWaiting(JSON.parse(event.data)));
}

function renderWaiting(calls) {
  const {el} = Forms;
  document.getElementById("waiting").hidden = calls.length === 0;
  document.querySelector("#waiting-calls tbody").replaceChildren(...calls.map((call) => {
    const actions = el("td", {class: "actions"});
    for (const [label, verb] of [["Allow", "allow"], ["Deny", "deny"]]) {
      const button = el("button", {type: "button", text: label, "data-action": verb});
      button.addEventListener("click", () => {
        for (const other of actions.querySelectorAll("button")) other.disabled = true;
        api(`api/calls/${verb}`, {id: call.id}).catch(showError);
      });
      actions.append(button);
    }
    return el("tr", {"data-call": call.id},
      el("td", {text: call.caller}), el("td", {text: call.device}),
      el("td", {}, el("code", {text: call.tool})),
      el("td", {}, el("code", {text: JSON.stringify(call.arguments)})),
      el("td", {text: call.since}), actions);
  }));
}

async function markConfirm(deviceId) {
  const {tools} = await api(`api/dashboard/confirm?device=${encodeURIComponent(deviceId)}`);
  for (const card of document.querySelectorAll("#tools .tool-card[data-tool]")) {
    const tool = card.dataset.tool;
    if (!(tool in tools) || card.querySelector("input.confirm")) continue;
    const box = Forms.el("input", {type: "checkbox", class: "confirm", name: "confirm"});
    box.checked = tools[tool];
    box.addEventListener("change", () => {
      api("api/dashboard/confirm", {device: deviceId, tool, confirm: box.checked}).catch((error) => {
        box.checked = !box.checked;
        showError(error);
      });
    });
    card.querySelector("h3").after(Forms.el("label", {class: "confirm"}, box,
      " Ask me first: calls from MCP hosts wait for my yes"));
  }
}
