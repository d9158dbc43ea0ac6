// The devices panel inside an MCP host (MCP Apps): each device's state, last photo, and a form
// per tool built from its schema (forms.js, shared with the dashboard). It talks to nothing but
// the host, over the ext-apps postMessage JSON-RPC bridge: ui/initialize, then tools/call and
// resources/read, which the host sends through its own MCP session (its policy, its audit).
"use strict";

const Bridge = (() => {
  let next = 1;
  const pending = new Map();
  const handlers = {};
  const send = (message) => window.parent.postMessage({jsonrpc: "2.0", ...message}, "*");
  window.addEventListener("message", (event) => {
    if (event.source !== window.parent) return;
    const message = event.data;
    if (!message || message.jsonrpc !== "2.0") return;
    if (message.method === undefined) {  // an answer to one of ours
      const waiting = pending.get(message.id);
      if (!waiting) return;
      pending.delete(message.id);
      if (message.error) waiting.reject(new Error(message.error.message || "the host refused"));
      else waiting.resolve(message.result || {});
      return;
    }
    const handler = handlers[message.method];
    const answer = handler ? handler(message.params || {}) : undefined;
    if (message.id !== undefined) send({id: message.id, result: answer || {}});
  });
  return {
    request(method, params) {
      const id = next++;
      return new Promise((resolve, reject) => {
        pending.set(id, {resolve, reject});
        send({id, method, params});
      });
    },
    notify: (method, params) => send({method, params}),
    on: (method, handler) => { handlers[method] = handler; },
  };
})();

const {el} = Forms;
const panel = {args: {}, devices: [], cursor: null, photos: new Map()};

function showError(error) {
  const box = document.getElementById("error");
  box.textContent = error ? error.message || String(error) : "";
  box.hidden = !error;
}

// list_devices' answer: structuredContent for hosts that negotiated the panel, else its text.
function answerOf(result) {
  const structured = result.structuredContent;
  if (structured && Array.isArray(structured.devices)) return structured;
  for (const block of result.content || []) {
    if (block.type !== "text") continue;
    try {
      const parsed = JSON.parse(block.text);
      if (parsed && Array.isArray(parsed.devices)) return parsed;
    } catch { /* not the listing */ }
  }
  const said = (result.content || []).filter((b) => b.type === "text").map((b) => b.text).join(" ");
  throw new Error(said || "list_devices gave no device list");
}

function show(result, append = false) {
  const answer = answerOf(result);
  panel.devices = append ? panel.devices.concat(answer.devices) : answer.devices;
  panel.cursor = answer.next_cursor || null;
  showError(null);
  render();
}

async function listDevices(cursor) {
  const args = {...panel.args};
  delete args.cursor;
  if (cursor) args.cursor = cursor;
  show(await Bridge.request("tools/call", {name: "list_devices", arguments: args}), Boolean(cursor));
}

function statusOf(device) {
  if (device.state !== "approved") return device.state;
  return device.online ? "online" : "offline";
}

function render() {
  document.getElementById("devices").replaceChildren(...panel.devices.map(card));
  document.getElementById("empty").hidden = panel.devices.length > 0;
  document.getElementById("more").hidden = !panel.cursor;
  const online = panel.devices.filter((d) => statusOf(d) === "online").length;
  document.getElementById("summary").textContent = `${online} of ${panel.devices.length} online`;
}

function card(device) {
  const status = statusOf(device);
  const article = el("article", {class: "device", "data-device": device.id, "data-status": status});
  article.append(el("h2", {}, el("span", {class: "alias", text: device.device, title: device.id}),
    el("span", {class: `status ${status}`, text: status})));
  const facts = [device.board, device.firmware, device.transport, device.last_seen && `seen ${device.last_seen}`];
  article.append(el("p", {class: "facts", text: facts.filter(Boolean).join(" · ")}));
  if (device.conflict) article.append(el("p", {class: "error", text: device.conflict}));
  if (device.photo) article.append(photo(device));
  if (device.events) article.append(recentEvents(device.events));
  for (const tool of device.tools) {
    const box = el("details", {class: "tool-card", "data-tool": tool.tool});
    box.append(el("summary", {}, el("code", {text: tool.tool})));
    if (tool.description) box.append(el("p", {class: "description", text: tool.description}));
    box.append(Forms.build(tool, (args) => callDevice(device, tool, args)));
    article.append(box);
  }
  for (const rejected of device.rejected || []) {
    article.append(el("p", {class: "note", text: `${rejected.tool} rejected: ${rejected.reason}`}));
  }
  return article;
}

function recentEvents(events) {
  // What the device reported on its own, newest first (device://<name>/events has more).
  const list = el("ol", {class: "events"});
  for (const event of events) {
    const when = new Date(event.at * 1000).toLocaleTimeString();
    list.append(el("li", {"data-logger": event.logger,
      text: `${when} ${event.logger || "event"}: ${JSON.stringify(event.data)}`}));
  }
  return el("section", {class: "recent-events"}, el("h3", {text: "Recent events"}), list);
}

async function callDevice(device, tool, args) {
  const result = await Bridge.request("tools/call", {
    name: "call_device_tool", arguments: {device: device.id, tool: tool.tool, arguments: args},
  });
  // A call that took a photo links to it: show the new one.
  if ((result.content || []).some((b) => b.type === "resource_link")) listDevices().catch(showError);
  return result;
}

function photo(device) {
  const image = el("img", {alt: `last photo of ${device.device}`});
  const taken = new Date(device.photo.taken_at * 1000).toLocaleString();
  const caption = el("figcaption", {text: `last photo, ${taken}`});
  const key = `${device.photo.uri}@${device.photo.taken_at}`;
  if (!panel.photos.has(key)) panel.photos.set(key, readPhoto(device.photo.uri));
  panel.photos.get(key).then((src) => { image.src = src; })
    .catch((error) => { caption.textContent = `the photo cannot be shown: ${error.message}`; });
  return el("figure", {class: "photo"}, image, caption);
}

async function readPhoto(uri) {
  const {contents} = await Bridge.request("resources/read", {uri});
  const item = (contents || [])[0] || {};
  if (typeof item.blob !== "string" || !/^image\/[\w.+-]+$/.test(item.mimeType || "")) {
    throw new Error("not an image");
  }
  return `data:${item.mimeType};base64,${item.blob}`;
}

// This host's calls that wait for the owner's yes (a device's confirm tools): Allow or Deny goes
// back through the host as the app-only tool waiting_calls, for this host's own calls only.
const WAIT_POLL_MS = 3000;

async function refreshWaiting(decide) {
  const result = await Bridge.request("tools/call", {name: "waiting_calls", arguments: decide || {}});
  if (result.isError) showError(new Error((result.content || []).map((b) => b.text).join(" ")));
  renderWaiting(((result.structuredContent || {}).calls) || []);
}

function renderWaiting(calls) {
  document.getElementById("waiting").hidden = calls.length === 0;
  document.getElementById("waiting-calls").replaceChildren(...calls.map((call) => {
    const line = el("p", {class: "waiting", "data-call": call.id},
      el("code", {text: call.tool}), ` on ${call.device} with ${JSON.stringify(call.arguments)} `);
    for (const [label, decision] of [["Allow", "allow"], ["Deny", "deny"]]) {
      const button = el("button", {type: "button", text: label, "data-action": decision});
      button.addEventListener("click", () => refreshWaiting({id: call.id, decision}).catch(showError));
      line.append(button);
    }
    return line;
  }));
}

Bridge.on("ui/notifications/tool-input", (params) => { panel.args = params.arguments || {}; });
Bridge.on("ui/notifications/tool-result", (params) => {
  try { show(params); } catch (error) { showError(error); }
});
document.getElementById("refresh").addEventListener("click", () => {
  listDevices().catch(showError);
  refreshWaiting().catch(showError);
});
document.getElementById("more").addEventListener("click", () => listDevices(panel.cursor).catch(showError));
function reportSize() {  // the host sizes the frame to fit, once the handshake is done
  new ResizeObserver(() => {
    const box = document.documentElement;
    Bridge.notify("ui/notifications/size-changed", {width: box.scrollWidth, height: box.scrollHeight});
  }).observe(document.documentElement);
}

Bridge.request("ui/initialize", {
  protocolVersion: "2026-01-26",
  appInfo: {name: "esp-mcp-gateway devices", version: "1"},
  appCapabilities: {availableDisplayModes: ["inline"]},
}).then(() => {
  Bridge.notify("ui/notifications/initialized", {});
  reportSize();
  refreshWaiting().catch(() => {});  // a host without the tool: no list
  setInterval(() => refreshWaiting().catch(() => {}), WAIT_POLL_MS);
}).catch(showError);
