// The dashboard: devices (live over SSE), their tools, the audit log, photos and setup.
"use strict";

const {el} = Forms;
const state = {csrf: "", devices: [], selected: null, shown: "", toolsKey: "", auditCursor: null, events: []};

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": state.csrf},
    body: JSON.stringify(body),
  };
  const response = await fetch(path, options);
  if (response.status === 401) {
    location.href = "login";
    throw new Error("sign in first");
  }
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error || `${path}: HTTP ${response.status}`);
  return answer;
}

function showError(error) {
  const box = document.getElementById("error");
  box.textContent = error ? error.message || String(error) : "";
  box.hidden = !error;
}

// --- pages -----------------------------------------------------------------------------------

const loaders = {devices: () => {}, audit: () => loadAudit(false), photos: loadPhotos,
  setup: () => Promise.all([loadSetup(), loadEnrollments()]),
  apps: () => loadApps()};

function showPage() {
  const page = (location.hash || "#devices").slice(1);
  const name = page in loaders ? page : "devices";
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== `page-${name}`;
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("current", link.dataset.page === name);
  showError(null);
  Promise.resolve(loaders[name]()).catch(showError);
}

// --- devices ---------------------------------------------------------------------------------

function watchDevices() {
  const live = document.getElementById("live");
  const events = new EventSource("api/events");
  events.addEventListener("devices", (event) => {
    state.devices = JSON.parse(event.data);
    renderDevices();
  });
  events.addEventListener("pending", (event) => renderPending(JSON.parse(event.data)));
  events.onopen = () => { live.textContent = "live"; live.classList.add("on"); };
  events.onerror = () => { live.textContent = "reconnecting…"; live.classList.remove("on"); };
  // What devices report on their own: the open device's list grows as events arrive.
  new EventSource("api/device-events").addEventListener("event", (message) => {
    const event = JSON.parse(message.data);
    if (event.id === state.selected) showEvents([event, ...state.events]);
  });
}

const SHOWN_EVENTS = 20;

function showEvents(events) {
  state.events = events.slice(0, SHOWN_EVENTS);
  document.getElementById("no-events").hidden = state.events.length > 0;
  document.getElementById("device-events").replaceChildren(...state.events.map((event) => el("li",
    {"data-logger": event.logger, "data-level": event.level,
     text: `${new Date(event.at * 1000).toLocaleTimeString()} ${event.logger || "event"}` +
       ` (${event.level}): ${JSON.stringify(event.data)}${event.coalesced ? ` (+${event.coalesced} folded)` : ""}`})));
}

function renderPending(pending) {
  const box = document.getElementById("pending-cap");
  box.hidden = pending.refused === 0 && pending.waiting < pending.max;
  box.textContent = `${pending.waiting} of at most ${pending.max} devices wait for approval` +
    (pending.refused ? `; ${pending.refused} new devices were refused because the list was full.` : ".") +
    " Approve, reject or forget some, or raise [devices] max_pending.";
}

function renderDevices() {
  const body = document.querySelector("#devices tbody");
  body.replaceChildren(...state.devices.map(deviceRow));
  document.getElementById("no-devices").hidden = state.devices.length > 0;
  const selected = state.devices.find((d) => d.id === state.selected);
  if (state.selected && !selected) closeDevice();
  else if (selected && summaryKey(selected) !== state.shown) openDevice(selected.id).catch(showError);
}

function summaryKey(device) {
  return JSON.stringify([device.device, device.status, device.tools]);
}

function deviceRow(device) {
  const row = el("tr", {"data-device": device.id, "data-status": device.status});
  const name = el("button", {type: "button", class: "link", text: device.device, title: device.id});
  name.addEventListener("click", () => openDevice(device.id).catch(showError));
  const actions = el("td", {class: "actions"});
  const action = (label, handler) => {
    const button = el("button", {type: "button", text: label, "data-action": label.toLowerCase()});
    button.addEventListener("click", () => handler().catch(showError));
    actions.append(button);
  };
  if (device.status === "pending") {
    action("Approve", () => api("api/devices/approve", {device: device.id}));
    action("Reject", () => api("api/devices/reject", {device: device.id}));
  }
  action("Rename", async () => startRename(row, device));
  action("Forget", async () => {
    if (confirm(`Forget ${device.device}? Its names go; if it comes back it is a new device.`)) {
      await api("api/devices/forget", {device: device.id});
    }
  });
  const status = el("span", {class: `status ${device.status}`, text: device.status});
  const notes = el("td", {}, status);
  if (device.conflict) notes.append(el("small", {class: "error", text: device.conflict}));
  if (device.upstream) notes.append(el("small", {class: "upstream", text: `voice: ${device.upstream.state}`}));
  const rejected = device.rejected.length ? ` (${device.rejected.length} rejected)` : "";
  row.append(el("td", {class: "alias"}, name), notes, el("td", {text: device.board || ""}),
    el("td", {text: device.firmware || ""}), el("td", {text: device.transport || ""}),
    el("td", {text: device.last_seen}), el("td", {text: `${device.tools}${rejected}`}), actions);
  return row;
}

function startRename(row, device) {
  const cell = row.querySelector(".alias");
  const input = el("input", {name: "alias", value: device.device, maxlength: 32, "aria-label": "new name"});
  const save = el("button", {type: "submit", text: "Save"});
  const form = el("form", {class: "rename"}, input, save);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    api("api/devices/rename", {device: device.id, name: input.value}).catch(showError);
  });
  cell.replaceChildren(form);
  input.focus();
}

async function openDevice(id) {
  const {device, tools, events} = await api(`api/dashboard/tools?device=${encodeURIComponent(id)}`);
  showEvents(events);
  state.selected = id;
  state.shown = summaryKey(device);
  const panel = document.getElementById("device");
  panel.hidden = false;
  panel.dataset.device = id;
  document.getElementById("device-title").textContent = `${device.device} · ${device.status}`;
  const note = device.status === "pending" ? "Waiting for approval: its tools work once you approve it."
    : device.status === "offline" ? "Offline: calls fail until it reconnects." : "";
  document.getElementById("device-note").textContent = note;
  // Keep the forms (and the results they show) unless the tools themselves changed.
  const toolsKey = JSON.stringify([id, tools.map((t) => [t.tool, t.user_refusal, t.inputSchema])]);
  if (toolsKey !== state.toolsKey) {
    state.toolsKey = toolsKey;
    document.getElementById("tools").replaceChildren(...tools.map((tool) => toolCard(device, tool)));
  }
  await markConfirm(id);
}

function closeDevice() {
  state.selected = null;
  state.shown = state.toolsKey = "";
  document.getElementById("device").hidden = true;
}

const FOLD_AT = 140; // characters of a tool's description shown before "more"

function description(text) {
  // Stock firmware's descriptions run to paragraphs: a long one folds, so that a board's cards
  // stay a screen or two, and opens where it stands.
  const first = text.split("\n")[0];
  if (text.length <= FOLD_AT && first === text) return el("p", {class: "description", text});
  const cut = first.length > FOLD_AT ? `${first.slice(0, FOLD_AT).trimEnd()}…` : first;
  return el("details", {class: "description"},
    el("summary", {}, el("span", {class: "cut", text: cut}), " ", el("span", {class: "more", text: "more"}),
      el("span", {class: "less", text: "less"})),
    el("p", {class: "full", text}));
}

function toolCard(device, tool) {
  const card = el("article", {class: "tool-card", "data-tool": tool.tool});
  const badges = el("span", {class: "badges"});
  if (tool.user_only) badges.append(el("span", {class: "badge user", text: "user only"}));
  if (tool.model_refusal && !tool.user_only) badges.append(el("span", {class: "badge", text: "hidden from the model"}));
  card.append(el("h3", {}, el("code", {text: tool.tool}), badges));
  if (tool.description) card.append(description(tool.description));
  if (tool.user_refusal) card.append(el("p", {class: "note", text: tool.user_refusal}));
  card.append(Forms.build(tool, async (args) => {
    const answer = await api("api/call", {device: device.id, tool: tool.tool, arguments: args});
    return answer.result;
  }));
  return card;
}

async function pair() {
  const answer = await api("api/devices/pair", {seconds: 120});
  document.getElementById("pairing").textContent = `New devices are approved as they arrive until ${answer.until}.`;
}

// --- audit log -------------------------------------------------------------------------------

// A record's time (ISO 8601, the writer's local offset) as the devices tab shows times:
// "2026-11-22 03:15:02 UTC". Unreadable times are shown as written.
function shownTime(time) {
  const date = new Date(String(time || "").replace(/([+-]\d\d)(\d\d)$/, "$1:$2"));
  if (Number.isNaN(date.getTime())) return time || "";
  const iso = date.toISOString();
  return `${iso.slice(0, 10)} ${iso.slice(11, 19)} UTC`;
}

async function loadAudit(more) {
  const filter = new FormData(document.getElementById("audit-filter"));
  const query = new URLSearchParams({limit: "50"});
  for (const key of ["device", "outcome", "kind"]) if (filter.get(key)) query.set(key, filter.get(key));
  if (more && state.auditCursor) query.set("cursor", state.auditCursor);
  const page = await api(`api/audit?${query}`);
  const body = document.querySelector("#audit tbody");
  const rows = page.records.map((r) => {
    const kind = r.kind || "call";  // records older than kinds are calls
    // A call shows its tool and arguments; an admin action or a login what it was and why.
    const what = kind === "call" ? el("code", {text: r.tool}) : el("span", {text: r.action});
    const detail = kind === "call" ? el("code", {text: JSON.stringify(r.arguments)}) : el("span", {text: r.message || ""});
    return el("tr", {"data-outcome": r.outcome, "data-kind": kind},
      el("td", {text: shownTime(r.time)}), el("td", {text: kind}), el("td", {text: r.caller}), el("td", {text: r.from || ""}),
      el("td", {text: r.device || r.device_id || ""}), el("td", {}, what), el("td", {}, detail),
      el("td", {class: r.outcome === "ok" ? "ok" : "error", text: r.outcome, title: r.message || ""}),
      el("td", {text: r.duration_ms ?? ""}));
  });
  if (more) body.append(...rows); else body.replaceChildren(...rows);
  state.auditCursor = page.next_cursor || null;
  document.getElementById("audit-more").hidden = !state.auditCursor;
  const empty = document.getElementById("audit-empty");
  empty.hidden = body.children.length > 0;
  empty.textContent = page.enabled === false ? "The audit log is turned off (audit_log = false)." : "Nothing recorded.";
}

// --- photos ----------------------------------------------------------------------------------

async function loadPhotos() {
  const box = document.getElementById("photos");
  const response = await fetch("api/photos");
  const photos = response.ok ? (await response.json()).photos || [] : [];
  box.replaceChildren(...photos.map((p) => el("figure", {class: "photo"},
    el("img", {src: p.url, alt: p.question || `photo from ${p.alias}`, loading: "lazy"}),
    el("figcaption", {text: `${p.alias || p.device} · ${p.taken_at}${p.question ? ` · ${p.question}` : ""}`}))));
  document.getElementById("photos-empty").hidden = photos.length > 0;
}

// --- setup -----------------------------------------------------------------------------------

function copyButton(text) {
  const button = el("button", {type: "button", class: "copy", text: "Copy"});
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Select and copy";
    }
  });
  return button;
}

function fact(list, label, value, note, secret = false) {
  if (!value) return;
  // A secret stays masked (shoulder-surfing, screen sharing) until asked for; Copy copies it.
  const code = el("code", {text: secret ? "•".repeat(12) : value});
  const show = secret ? [el("button", {type: "button", class: "reveal", text: "Show"})] : [];
  for (const button of show) {
    button.addEventListener("click", () => {
      const hidden = button.textContent === "Show";
      code.textContent = hidden ? value : "•".repeat(12);
      button.textContent = hidden ? "Hide" : "Show";
    });
  }
  list.append(el("dt", {text: label}), el("dd", {"data-secret": secret ? "masked" : null}, code, ...show,
    copyButton(value), ...(note ? [el("small", {text: note})] : [])));
}

async function loadSetup() {
  const setup = await api("api/setup");
  // Without a known address the API says what to set instead of a URL: no flash command of it
  state.websocketUrl = setup.websocket_url.startsWith("ws") ? setup.websocket_url : "";
  const list = document.getElementById("setup-devices");
  list.replaceChildren();
  fact(list, "Device token", setup.device_token, "what our firmware and the simulator present", true);
  fact(list, "Device WebSocket URL", setup.websocket_url);
  fact(list, "OTA URL (stock xiaozhi firmware)", setup.ota_url,
    "set it as the board's OTA address: it checks in, then waits for your approval here");
  fact(list, "MCP URL", setup.mcp_url, setup.host_token_required ? "with the host token as a Bearer token" : "");
  const proxy = setup.voice_proxy;
  if (proxy) {
    fact(list, "Voice server (stock devices keep their assistant)", proxy.ota_url || "per device",
      "their check-ins and conversations go on to it through the gateway (docs/voice-proxy.md)");
    for (const [device, url] of Object.entries(proxy.devices)) fact(list, `Voice server of ${device}`, url);
  }
  // The hosts in the gateway's order, each with which entry to pick and where it goes; any
  // other config the gateway offers follows under its own key.
  const hosts = setup.hosts || [];
  const known = new Set(hosts.map((h) => h.key));
  const rest = Object.keys(setup.configs).filter((key) => !known.has(key)).map((key) => ({key, title: key, note: ""}));
  document.getElementById("host-configs").replaceChildren(...[...hosts, ...rest].filter((h) => setup.configs[h.key]).map((h) =>
    el("div", {class: "config", "data-host": h.key}, el("h3", {text: h.title}),
      ...(h.note ? [el("p", {class: "note", text: h.note})] : []),
      el("pre", {text: setup.configs[h.key]}), copyButton(setup.configs[h.key]))));
}

async function enroll(event) {
  event.preventDefault();
  const name = new FormData(event.target).get("name");
  const issued = await api("api/enroll", {name});
  const out = document.getElementById("enrolled");
  const gateway = ` --gateway ${issued.urls.ws || state.websocketUrl || "ws://<this machine>:8765/xiaozhi/v1/"}`;
  out.textContent = `token: ${issued.token}\n\nflash the board with it:\n  esp-mcp-gateway flash --port /dev/ttyUSB0 --firmware <MicroPython .bin> \\\n    --name ${name} --token ${issued.token}${gateway} --wifi <SSID> --wifi-password <password>`;
  out.hidden = false;
  await loadEnrollments();
}

async function addBoard(event) {
  event.preventDefault();
  const form = new FormData(event.target);
  const body = {url: form.get("url")};
  for (const key of ["name", "token"]) if (form.get(key)) body[key] = form.get(key);
  const answer = await api("api/devices/add", body);
  const out = document.getElementById("board-added");
  out.textContent = `Added ${answer.added.device} (${answer.added.id}): its tools are served once the gateway reaches it.`;
  out.hidden = false;
  event.target.reset();
}

// --- start -----------------------------------------------------------------------------------

async function start() {
  const session = await api("api/session");
  state.csrf = session.csrf;
  const logout = document.getElementById("logout");
  logout.hidden = !session.sign_in;
  logout.addEventListener("click", () => api("api/logout", {}).then(() => { location.href = "login"; }, showError));
  document.getElementById("pair").addEventListener("click", () => pair().catch(showError));
  document.getElementById("audit-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    loadAudit(false).catch(showError);
  });
  document.getElementById("audit-more").addEventListener("click", () => loadAudit(true).catch(showError));
  document.getElementById("enroll").addEventListener("submit", (event) => enroll(event).catch(showError));
  document.getElementById("add-board").addEventListener("submit", (event) => addBoard(event).catch(showError));
  window.addEventListener("hashchange", showPage);
  watchDevices();
  watchWaiting();
  showPage();
}

start().catch(showError);
