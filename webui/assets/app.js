// DOQ admin UI: a dependency-free single-page app over the public REST API.
"use strict";

// -- small helpers ------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "on") for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
    else if (key === "text") el.textContent = value;
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const fmt1 = (x) => (Number(x) || 0).toFixed(1);
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

// A name that may wrap after its "_", "." and "-" (not mid-word): text with <wbr> there.
function breakable(name) {
  return String(name).split(/(?<=[_.\-])/).flatMap((part, i) => (i ? [h("wbr"), part] : [part]));
}

// Header cells; those of numeric columns sit right-aligned, over their numbers.
function heads(names, numeric = []) {
  return names.map((t) => h("th", { class: numeric.includes(t) ? "num" : undefined, text: t }));
}
const encode = (name) => encodeURIComponent(name);

class ApiError extends Error {
  constructor(status, body) {
    const detail = (body && body.detail) || (status ? `HTTP ${status}` : "request failed");
    const errors = (body && Array.isArray(body.errors)) ? body.errors : [];
    const said = errors.map((e) => e.message).join("; ");
    // the message often repeats the detail ("Failed to get ...: <queue>"): say it once
    super(!said ? detail : said.startsWith(detail) ? said : `${detail}: ${said}`);
    this.status = status;
    this.detail = detail;
    this.errors = errors;
    this.code = body && body.code;
  }
}

// -- the API key (a node with auth.keys_file answers 401 without one) ---------------------------

const KEY_STORE = "doq-api-key";
const apiKey = {
  get() { return sessionStorage.getItem(KEY_STORE) || ""; },
  set(value) {
    if (value) sessionStorage.setItem(KEY_STORE, value);
    else sessionStorage.removeItem(KEY_STORE);
    this.label();
  },
  label() {
    const button = document.getElementById("key-button");
    button.textContent = this.get() ? "API key ✓" : "API key";
  },
  // Ask for a key (once at a time); the view is drawn again with the new one.
  ask(reason) {
    const dialog = document.getElementById("key-dialog");
    if (dialog.open) return;
    document.getElementById("key-reason").textContent = reason;
    const input = document.getElementById("key-input");
    input.value = "";
    dialog.addEventListener("close", () => {
      if (dialog.returnValue === "ok" && input.value.trim()) this.set(input.value.trim());
      else if (dialog.returnValue === "forget") this.set("");
      else return;
      showNode();
      render();
    }, { once: true });
    dialog.showModal();
    input.focus();
  },
};

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (apiKey.get()) init.headers["Authorization"] = `Bearer ${apiKey.get()}`;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    health.unreachable();
    throw new ApiError(0, { detail: "Cannot reach this DOQ node" });
  }
  if (resp.status === 204) return null;
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (!resp.ok) {
    if (resp.status === 503) health.check();
    const error = new ApiError(resp.status, data || { detail: text });
    if (resp.status === 401) {
      apiKey.ask(apiKey.get() ? `The key was refused: ${error.message}`
                              : "This DOQ node needs an API key (auth.keys_file is set).");
    }
    throw error;
  }
  return data;
}

// -- the banner: this node's reachability and leader --------------------------------------------

const health = {
  timer: null,
  show(text, kind) {
    const banner = document.getElementById("banner");
    banner.textContent = text;
    banner.className = "banner" + (kind === "warn" ? " warn" : "");
    banner.hidden = false;
  },
  hide() { document.getElementById("banner").hidden = true; },
  unreachable() {
    this.show(`Cannot reach the DOQ node at ${location.host}: it may be down. Retrying…`);
  },
  async check() {
    let resp;
    try {
      resp = await fetch("/readyz", { cache: "no-store" });
    } catch (e) {
      this.unreachable();
      return;
    }
    const text = (await resp.text()).trim();
    if (resp.status === 200) this.hide();
    else this.show(`This node is not ready (${text || resp.status}): writes fail until the ` +
                   "cluster has a leader and a quorum again.", "warn");
  },
  start() {
    this.check();
    this.timer = setInterval(() => this.check(), 2000);
  },
};

async function showNode() {
  try {
    const status = await api("GET", "/internal/status");
    document.getElementById("node-info").textContent = `node ${status.node_id}`;
  } catch (e) { /* the banner says why */ }
}

// -- confirmation dialog ------------------------------------------------------------------------

function confirmAction(text, action) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = action;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

// -- polling ------------------------------------------------------------------------------------

function poller(fn, ms) {
  let stopped = false, busy = false;
  const tick = async () => {
    if (stopped || busy) return;
    busy = true;
    try { await fn(); } finally { busy = false; }
  };
  tick();
  const id = setInterval(tick, ms);
  return () => { stopped = true; clearInterval(id); };
}

// -- forms --------------------------------------------------------------------------------------

function field(label, input, extra) {
  const name = input.getAttribute("name");
  return h("label", { class: extra || "" }, label, input,
           h("span", { class: "field-error", "data-error-for": name }));
}

function clearErrors(form) {
  form.querySelectorAll(".field-error").forEach((el) => { el.textContent = ""; });
  const general = form.querySelector(".form-error");
  if (general) general.textContent = "";
}

// Put each server problem next to its field (location body.x.y -> field y), the rest on top.
function showErrors(form, err) {
  clearErrors(form);
  const loose = [];
  for (const problem of err.errors || []) {
    const where = String(problem.location || "").split(".").pop();
    const slot = where && form.querySelector(`[data-error-for="${where}"]`);
    if (slot) slot.textContent = problem.message;
    else loose.push(problem.message);
  }
  const general = form.querySelector(".form-error");
  general.textContent = loose.length ? `${err.detail}: ${loose.join("; ")}`
    : (err.errors && err.errors.length ? "" : err.message);
}

function settingsBadges(type, settings, hiddenDlq = false) {
  const s = settings || {};
  return [
    h("span", { class: "badge", text: type }),
    type === "fair" && s.strategy ? h("span", { class: "badge", text: s.strategy.toLowerCase() }) : null,
    s.max_unacked ? h("span", { class: "badge", text: `max unacked ${s.max_unacked}` }) : null,
    s.ack_timeout ? h("span", { class: "badge", text: `ack ${s.ack_timeout}s` }) : null,
    ...lifecycleBadges(s, hiddenDlq),
  ].filter(Boolean);
}

// The message-lifecycle settings (retries, dead letters, limits) as badges.
function lifecycleBadges(s, hiddenDlq = false) {
  const badge = (text) => h("span", { class: "badge", text });
  return [
    s.max_deliveries ? badge(`max deliveries ${s.max_deliveries}`) : null,
    s.dead_letter_queue ? badge(`DLQ → ${s.dead_letter_queue}`) : null,
    hiddenDlq ? badge("DLQ (not visible to this key)") : null,
    s.backoff_initial ? badge(`back-off ${s.backoff_initial}–${s.backoff_max}s`) : null,
    s.message_ttl ? badge(`TTL ${s.message_ttl}s`) : null,
    s.max_messages ? badge(`max ${s.max_messages} (${s.overflow || "reject"})`) : null,
    s.dedup_window ? badge(`dedup ${s.dedup_window}s`) : null,
    s.max_in_flight ? badge(`max in flight ${s.max_in_flight}`) : null,
    s.group_rate ? badge(`${s.group_rate}/s per group` +
                         (s.group_burst > 1 ? ` (burst ${s.group_burst})` : "")) : null,
  ].filter(Boolean);
}

// Inputs for the lifecycle settings of a queue (values: its current settings).
const LIFECYCLE_NUMBERS = [["max_deliveries", "Max deliveries (0: unlimited)"],
  ["backoff_initial", "Back-off, first (s)"], ["backoff_max", "Back-off, longest (s)"],
  ["message_ttl", "Message TTL (s, 0: none)"], ["max_messages", "Max messages (0: unlimited)"],
  ["dedup_window", "Dedup window (s, 0: off)"],
  ["max_in_flight", "Max unacked in the queue (0: unlimited)"],
  ["group_rate", "Deliveries per second per group (0: unlimited)", "any"],
  ["group_burst", "Burst per group", "1", 1]];

// hidden: the queue's dead-letter queue is one the key may not see (its field is disabled,
// and lifecycleValues leaves it out so that saving keeps it)
function lifecycleFields(s, hidden = false) {
  const overflow = h("select", { name: "overflow" },
    h("option", { value: "reject", text: "reject new messages" }),
    h("option", { value: "drop_oldest", text: "drop the oldest" }));
  overflow.value = s.overflow || "reject";
  return [
    ...LIFECYCLE_NUMBERS.map(([key, label, step, fallback]) => field(label,
      h("input", { name: key, type: "number", min: fallback ? String(fallback) : "0",
                   step: step || "1", value: s[key] || fallback || 0 }))),
    hidden ? field("Dead-letter queue", h("input", {
      name: "dead_letter_queue", disabled: true, value: "",
      placeholder: "one your key may not see (kept)" }))
      : field("Dead-letter queue", h("input", { name: "dead_letter_queue",
                                                value: s.dead_letter_queue || "" })),
    field("When full", overflow),
  ];
}

function lifecycleValues(data) {
  const out = { overflow: String(data.get("overflow") || "reject") };
  if (data.has("dead_letter_queue")) {           // absent when disabled: kept as it is
    out.dead_letter_queue = String(data.get("dead_letter_queue") || "").trim();
  }
  for (const [key, , , fallback] of LIFECYCLE_NUMBERS) {
    const raw = String(data.get(key) || "").trim();
    out[key] = raw === "" ? (fallback || 0) : Number(raw);
  }
  return out;
}

// -- the queues page ----------------------------------------------------------------------------

function queuesView(root) {
  const state = { queues: [], sort: "name", asc: true, filter: "" };
  const filter = h("input", { type: "search", id: "filter", placeholder: "Filter by name",
                              "aria-label": "filter queues by name" });
  filter.addEventListener("input", () => { state.filter = filter.value; draw(); });
  const createForm = buildCreateForm(() => refresh());
  createForm.hidden = true;
  const toggle = h("button", { id: "new-queue", type: "button", text: "Create queue", on: {
    click: () => { createForm.hidden = !createForm.hidden; if (!createForm.hidden) createForm.querySelector("input").focus(); },
  } });
  const flash = h("div", { class: "success", id: "queues-flash" });
  const count = h("span", { class: "badge", id: "queue-count" });
  const body = h("tbody");
  const columns = [
    ["name", "Name"], ["type", "Type"], ["settings", "Settings"], ["ready", "Ready", true],
    ["unacked", "Unacked", true], ["total", "Total", true], ["enqueue_rps", "Enq/s", true],
    ["dequeue_rps", "Deq/s", true], ["ack_rps", "Ack/s", true], ["nack_rps", "Nack/s", true],
    ["actions", ""],
  ];
  const narrowHidden = new Set(["type", "settings", "enqueue_rps", "dequeue_rps", "ack_rps",
                                "nack_rps"]);
  const head = h("tr", {}, columns.map(([key, label, num]) => {
    const sortable = key !== "settings" && key !== "actions";
    return h("th", { class: `${num ? "num " : ""}${sortable ? "sortable " : ""}${narrowHidden.has(key) ? "wide-only" : ""}`, "data-key": key,
                     text: label, on: sortable ? { click: () => {
                       state.asc = state.sort === key ? !state.asc : true;
                       state.sort = key; draw();
                     } } : undefined });
  }));
  const error = h("div", { class: "form-error", id: "queues-error" });
  root.append(
    h("h1", {}, "Queues", count),
    h("div", { class: "panel" },
      h("div", { class: "row" }, filter, h("span", { class: "spacer" }), toggle),
      createForm, flash),
    error,
    h("div", { class: "panel table-wrap" }, h("table", { id: "queues" }, h("thead", {}, head), body)),
  );

  function draw() {
    head.querySelectorAll("th").forEach((th) => {
      th.classList.toggle("sorted", th.dataset.key === state.sort);
      th.classList.toggle("asc", th.dataset.key === state.sort && state.asc);
    });
    const needle = state.filter.trim().toLowerCase();
    const rows = state.queues.filter((q) => q.name.toLowerCase().includes(needle));
    const key = state.sort;
    rows.sort((a, b) => {
      const x = a[key], y = b[key];
      const c = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
      return state.asc ? c : -c;
    });
    count.textContent = String(state.queues.length);
    const dlqs = new Set(state.queues.map((q) => (q.settings || {}).dead_letter_queue)
      .filter(Boolean));
    body.replaceChildren(...(rows.length ? rows.map((q) => h("tr", { "data-queue": q.name },
      h("td", { class: "name-cell" }, h("a", { href: `/queues/${encode(q.name)}`, "data-link": true }, breakable(q.name)),
        dlqs.has(q.name) ? h("span", { class: "badge wide-only", "data-dlq": q.name,
                                       title: "the dead-letter queue of another queue",
                                       text: "DLQ" }) : null,
        q.paused ? h("span", { class: "badge warn", "data-paused": q.name,
                               title: "delivers nothing until resumed", text: "paused" })
          : null,
        q.paused_groups ? h("span", { class: "badge wide-only", text:
          `${q.paused_groups} group${q.paused_groups > 1 ? "s" : ""} paused` }) : null),
      h("td", { class: "wide-only" }, h("span", { class: "badge", text: q.type })),
      h("td", { class: "wide-only settings-cell" },
        settingsBadges(q.type, q.settings, q.dead_letter_queue_hidden).slice(1)),
      h("td", { class: "num", "data-col": "ready", text: q.ready }),
      h("td", { class: "num", "data-col": "unacked", text: q.unacked }),
      h("td", { class: "num", "data-col": "total", text: q.total }),
      h("td", { class: "num wide-only", text: fmt1(q.enqueue_rps) }),
      h("td", { class: "num wide-only", text: fmt1(q.dequeue_rps) }),
      h("td", { class: "num wide-only", text: fmt1(q.ack_rps) }),
      h("td", { class: "num wide-only", text: fmt1(q.nack_rps) }),
      h("td", { "data-col": "actions" }, h("button", { class: "ghost", type: "button", "data-delete": q.name,
                                text: "Delete", on: { click: () => removeQueue(q.name) } })),
    )) : [h("tr", {}, h("td", { class: "empty", colspan: columns.length,
      text: state.queues.length ? "No queue matches the filter." : "No queues yet." }))]));
  }

  async function removeQueue(name) {
    if (!(await confirmAction(`Delete queue “${name}” and all its messages?`, "Delete"))) return;
    try {
      await api("DELETE", `/API/v1/queues/${encode(name)}`);
      flash.textContent = `Queue ${name} deleted.`;
      error.textContent = "";
    } catch (e) {
      error.textContent = `Could not delete ${name}: ${e.message}`;
    }
    refresh();
  }

  async function refresh() {
    try {
      state.queues = (await api("GET", "/API/v1/queues")).queues || [];
      draw();
    } catch (e) { /* the banner explains unreachable nodes; keep the last table */ }
  }

  function buildCreateForm(done) {
    const type = h("select", { name: "type" }, h("option", { value: "delayed", text: "delayed" }),
                   h("option", { value: "fair", text: "fair" }));
    const strategy = h("select", { name: "strategy" },
                       h("option", { value: "round_robin", text: "round robin" }),
                       h("option", { value: "weighted", text: "weighted" }));
    const fairOnly = [field("Strategy", strategy), field("Max unacked per group",
      h("input", { name: "max_unacked", type: "number", min: "0", value: "0" }))];
    const form = h("form", { id: "create-queue", class: "panel", novalidate: true },
      h("h2", { text: "New queue" }),
      h("div", { class: "fields" },
        field("Name", h("input", { name: "name", required: true, maxlength: "1024",
                                   autocomplete: "off" })),
        field("Type", type), ...fairOnly,
        field("Ack timeout (s)", h("input", { name: "ack_timeout", type: "number", value: "1800" }))),
      h("details", { id: "create-lifecycle" }, h("summary", { text: "Retries, dead letters, limits" }),
        h("div", { class: "fields" }, ...lifecycleFields({}))),
      h("div", { class: "form-error" }),
      h("div", { class: "row" }, h("button", { type: "submit", text: "Create" }),
        h("span", { class: "note", text: "Fair queues share delivery between message groups." })));
    const sync = () => fairOnly.forEach((el) => { el.hidden = type.value !== "fair"; });
    type.addEventListener("change", sync);
    sync();
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(form);
      const data = new FormData(form);
      const name = String(data.get("name") || "").trim();
      const settings = {};
      const timeout = String(data.get("ack_timeout") || "").trim();
      if (timeout !== "") settings.ack_timeout = Number(timeout);
      if (type.value === "fair") {
        settings.strategy = strategy.value;
        settings.max_unacked = Number(data.get("max_unacked") || 0);
      }
      for (const [key, value] of Object.entries(lifecycleValues(data))) {
        // only what differs from the defaults
        if (value && value !== "reject" && !(key === "group_burst" && value === 1)) {
          settings[key] = value;
        }
      }
      try {
        const made = await api("POST", "/API/v1/queues", { name, type: type.value, settings });
        form.reset();
        sync();
        form.hidden = true;
        flash.textContent = made.existed
          ? `Queue ${name} exists already: nothing changed (it is ${made.type}).`
          : `Queue ${name} created.`;
        done();
      } catch (e) {
        showErrors(form, e);
      }
    });
    return form;
  }

  return poller(refresh, 1000);
}

// -- one queue ----------------------------------------------------------------------------------

function sparkline(values) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 100 30");
  svg.setAttribute("preserveAspectRatio", "none");
  if (values.length > 1) {
    const max = Math.max(...values, 1e-9);
    const step = 100 / (values.length - 1);
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", values.map((v, i) =>
      `${(i * step).toFixed(2)},${(28 - (v / max) * 26).toFixed(2)}`).join(" "));
    svg.append(line);
  }
  return svg;
}

function queueView(root, name) {
  const path = `/API/v1/queues/${encode(name)}`;
  const samples = { ready: [], unacked: [], total: [], enqueue_rps: [], dequeue_rps: [],
                    ack_rps: [], nack_rps: [] };
  const labels = { ready: "Ready", unacked: "Unacked", total: "Total", enqueue_rps: "Enqueue/s",
                   dequeue_rps: "Dequeue/s", ack_rps: "Ack/s", nack_rps: "Nack/s" };
  const badges = h("span", { class: "row", id: "queue-badges" });
  const cards = h("div", { class: "cards", id: "cards" });
  const failure = h("div", { class: "form-error", id: "queue-error" });
  const message = h("div", { id: "message" });
  let info = null, settingsForm = null, stop = null, controls = null, groups = null;
  let consumers = null, schedules = null, browse = null;
  const changed = () => { refresh(); if (browse) browse.reload(); };  // after a message moved
  const del = h("button", { class: "danger", type: "button", id: "delete-queue",
                            text: "Delete queue", on: { click: removeQueue } });
  root.append(h("h1", {}, h("a", { href: "/", "data-link": true, text: "Queues" }), "›",
                h("span", { id: "queue-name" }, breakable(name)), badges, h("span", { class: "spacer" }), del),
              failure, cards);
  const panels = h("div", { class: "grid" });
  root.append(panels);

  function drawCards() {
    cards.replaceChildren(...Object.keys(labels).map((key) => h("div", { class: "card", "data-card": key },
      h("div", { class: "label", text: labels[key] }),
      h("div", { class: "value", text: key.endsWith("_rps") ? fmt1(info[key]) : info[key] }),
      sparkline(samples[key]))));
  }

  async function refresh() {
    try {
      info = await api("GET", path);
    } catch (e) {
      if (e.status === 400 || e.status === 404) {
        failure.textContent = (e.errors[0] && e.errors[0].message) || e.message;
        if (stop) stop();
      }
      return;
    }
    failure.textContent = "";
    for (const key of Object.keys(samples)) {
      samples[key].push(Number(info[key]) || 0);
      if (samples[key].length > 600) samples[key].shift();
    }
    badges.replaceChildren(...settingsBadges(info.type, info.settings, info.dead_letter_queue_hidden), ...(info.paused
      ? [h("span", { class: "badge warn", id: "paused-badge", text: "paused" })] : []));
    drawCards();
    if (!settingsForm) {
      // the small panels side by side; then, full width, the message acted on, the browse
      // list, the settings (their fields in columns) and the schedules (seven columns)
      settingsForm = buildSettings();
      controls = controlsPanel(path, name, refresh);
      panels.prepend(controls);
      panels.append(buildEnqueue(), buildDequeue(), buildLookup());
      groups = info.type === "fair" ? groupsPanel(path) : null;
      consumers = consumersPanel(path);
      schedules = schedulesPanel(path);
      addRedrive();
      browse = browsePanel(path, showMessage);
      root.append(h("div", { class: "panel", id: "message-panel" }, h("h2", { text: "Message" }),
                    message, h("p", { class: "note", id: "message-empty",
                                      text: "Dequeue or look up a message to act on it here." })),
                  browse, ...(groups ? [groups] : []), consumers, settingsForm, schedules);
      browse.load(null);                                    // what the queue holds, at once
    }
    controls.update(info);
    if (groups) groups.refresh();
    if (consumers) consumers.refresh();
    if (schedules) schedules.refresh();
  }

  async function removeQueue() {
    if (!(await confirmAction(`Delete queue “${name}” and all its messages?`, "Delete"))) return;
    try {
      await api("DELETE", path);
      navigate("/");
    } catch (e) {
      failure.textContent = `Could not delete the queue: ${e.message}`;
    }
  }

  function buildSettings() {
    const s = info.settings || {};
    const fair = info.type === "fair";
    const strategy = h("select", { name: "strategy" },
      h("option", { value: "round_robin", text: "round robin" }),
      h("option", { value: "weighted", text: "weighted" }));
    strategy.value = (s.strategy || "ROUND_ROBIN").toLowerCase();
    const form = h("form", { id: "settings", class: "panel", novalidate: true },
      h("h2", { text: "Settings" }),
      h("div", { class: "fields" },
        fair ? field("Strategy", strategy) : null,
        fair ? field("Max unacked per group", h("input", { name: "max_unacked", type: "number",
                                                            min: "0", value: s.max_unacked || 0 })) : null,
        field("Ack timeout (s)", h("input", { name: "ack_timeout", type: "number",
                                              value: s.ack_timeout || 1800 })),
        ...lifecycleFields(s, info.dead_letter_queue_hidden)),
      h("div", { class: "form-error" }),
      h("div", { class: "row" }, h("button", { type: "submit", text: "Save settings" }),
        h("span", { class: "success", "data-result": "settings" })));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(form);
      const data = new FormData(form);
      const settings = { ack_timeout: Number(data.get("ack_timeout")), ...lifecycleValues(data) };
      if (fair) {
        settings.strategy = strategy.value;
        settings.max_unacked = Number(data.get("max_unacked") || 0);
      }
      const done = form.querySelector("[data-result]");
      done.textContent = "";
      try {
        await api("PUT", path, { settings });
        done.textContent = "Saved.";
        refresh();
      } catch (e) { showErrors(form, e); }
    });
    return form;
  }

  // On a queue that is some queue's dead-letter queue: move its messages back.
  async function addRedrive() {
    let users = [];
    try {
      users = ((await api("GET", "/API/v1/queues")).queues || [])
        .filter((q) => (q.settings || {}).dead_letter_queue === name).map((q) => q.name);
    } catch (e) { return; }
    if (!users.length) return;
    const count = h("input", { name: "count", type: "number", min: "1", placeholder: "all",
                               "aria-label": "how many" });
    const result = h("div", { class: "note", "data-result": "redrive" });
    const form = h("form", { id: "redrive", class: "panel", novalidate: true },
      h("h2", { text: "Redrive" }),
      h("p", { class: "note", text: `The dead-letter queue of ${users.join(", ")}. Move its ` +
        "messages back to where they came from, deliveries reset." }),
      h("div", { class: "row" }, count, h("button", { type: "submit", text: "Redrive" })), result);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const body = count.value ? { count: Number(count.value) } : {};
      try {
        const out = await api("POST", `${path}/redrive`, body);
        result.className = "success";
        result.textContent = `Moved ${out.moved}` +
          (out.failed.length ? `; ${out.failed.length} not moved (${out.failed[0].detail})` : ".");
        refresh();
      } catch (e) { result.className = "form-error"; result.textContent = e.message; }
    });
    panels.append(form);
  }

  function buildEnqueue() {
    const delayed = info.type === "delayed";
    const form = h("form", { id: "enqueue", class: "panel", novalidate: true },
      h("h2", { text: "Enqueue" }),
      h("div", { class: "fields" },
        field("Content", h("textarea", { name: "content", rows: "3" }), "wide"),
        field("Priority", h("input", { name: "priority", type: "number", min: "0", value: "0" })),
        delayed ? field("or deliver at", h("input", { name: "deliver_at", type: "datetime-local" })) : null,
        field("Group", h("input", { name: "group", placeholder: "default" })),
        field("Id (optional)", h("input", { name: "id", inputmode: "numeric", placeholder: "generated" })),
        field("Metadata (key=value per line)", h("textarea", { name: "metadata", rows: "2" }), "wide")),
      delayed ? h("p", { class: "note", text: "Delayed queues deliver lower priorities first; a priority " +
        "that is a future unix time (set by “deliver at”) holds the message until then." }) : null,
      h("div", { class: "form-error" }),
      h("div", { class: "row" }, h("button", { type: "submit", text: "Enqueue" }),
        h("span", { class: "success", "data-result": "enqueue" })));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(form);
      const data = new FormData(form);
      const at = String(data.get("deliver_at") || "");
      const body = { content: String(data.get("content") || ""),
                     priority: at ? Math.floor(new Date(at).getTime() / 1000)
                                  : Number(data.get("priority") || 0) };
      const group = String(data.get("group") || "").trim();
      if (group) body.group = group;
      const id = String(data.get("id") || "").trim();
      if (id) body.id = id;
      const metadata = {};
      for (const line of String(data.get("metadata") || "").split("\n")) {
        const eq = line.indexOf("=");
        if (line.trim() && eq > 0) metadata[line.slice(0, eq).trim()] = line.slice(eq + 1).trim();
        else if (line.trim()) {
          form.querySelector('[data-error-for="metadata"]').textContent = `expected key=value: “${line}”`;
          return;
        }
      }
      if (Object.keys(metadata).length) body.metadata = metadata;
      const done = form.querySelector("[data-result]");
      done.textContent = "";
      try {
        const out = await api("POST", `${path}/messages`, body);
        done.textContent = `Enqueued id ${out.id}.`;
        form.querySelector('[name="content"]').value = "";
        refresh();
      } catch (e) { showErrors(form, e); }
    });
    return form;
  }

  function buildDequeue() {
    const ack = h("input", { type: "checkbox", name: "ack", id: "dequeue-ack" });
    const error = h("div", { class: "form-error" });
    const form = h("form", { id: "dequeue", class: "panel" }, h("h2", { text: "Dequeue" }),
      h("label", { class: "inline" }, ack, "acknowledge at once (at most once)"),
      h("p", { class: "note", text: "Without it the message stays unacked until you ack, nack or " +
        "touch it below, or its ack timeout runs out." }),
      error, h("div", { class: "row" }, h("button", { type: "submit", text: "Dequeue" })));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      error.textContent = "";
      try {
        const msg = await api("GET", `${path}/messages?ack=${ack.checked}&consumer=admin-ui`);
        showMessage(msg, ack.checked ? "delivered and acknowledged" : "delivered, waiting for an ack");
        changed();
      } catch (e) { error.textContent = e.message; }
    });
    return form;
  }

  function buildLookup() {
    const id = h("input", { name: "lookup", inputmode: "numeric", placeholder: "message id",
                            "aria-label": "message id" });
    const error = h("div", { class: "form-error" });
    const form = h("form", { id: "lookup", class: "panel" }, h("h2", { text: "Look up by id" }),
      h("div", { class: "row" }, id, h("button", { type: "submit", text: "Get" })), error);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      error.textContent = "";
      try {
        showMessage(await api("GET", `${path}/messages/${encode(id.value.trim())}`), "stored");
      } catch (e) { error.textContent = e.message; }
    });
    return form;
  }

  function showMessage(msg, where) {
    const empty = document.getElementById("message-empty");
    if (empty) empty.hidden = true;
    const result = h("div", { class: "note", id: "message-result" });
    const priority = h("input", { type: "number", min: "0", value: msg.priority, name: "new_priority",
                                  "aria-label": "new priority", style: "width: 9rem" });
    const act = (label, fn) => h("button", { type: "button", class: "ghost", "data-action": label,
      text: label, on: { click: async () => {
        result.className = "note";
        try {
          result.textContent = await fn();
          result.className = "success";
          changed();
        } catch (e) {
          result.textContent = e.message;
          result.className = "form-error";
        }
      } } });
    const base = `${path}/messages/${encode(msg.id)}`;
    // a delivery shown here is settled only while it is the current one (its token)
    const fenced = msg.delivery ? { delivery: msg.delivery } : {};
    message.replaceChildren(h("div", { class: "message", "data-id": msg.id },
      h("dl", {},
        h("dt", { text: "ID" }), h("dd", { class: "mono", "data-field": "id", text: msg.id }),
        h("dt", { text: "State" }), h("dd", { "data-field": "state", text: where }),
        h("dt", { text: "Group" }), h("dd", { text: msg.group || "default" }),
        h("dt", { text: "Priority" }), h("dd", { "data-field": "priority", text: msg.priority }),
        h("dt", { text: "Content" }), h("dd", { class: "mono", "data-field": "content", text: msg.content }),
        h("dt", { text: "Metadata" }), h("dd", { class: "mono", text: JSON.stringify(msg.metadata || {}) }),
        h("dt", { text: "Deliveries" }), h("dd", { "data-field": "deliveries", text: msg.deliveries || 0 }),
        msg.last_error ? h("dt", { text: "Last error" }) : null,
        msg.last_error ? h("dd", { class: "mono", "data-field": "last_error", text: msg.last_error }) : null,
        msg.expires_at ? h("dt", { text: "Expires" }) : null,
        msg.expires_at ? h("dd", { "data-field": "expires_at",
                                   text: new Date(msg.expires_at).toLocaleString() }) : null,
        msg.delivery ? h("dt", { text: "Delivery" }) : null,
        msg.delivery ? h("dd", { class: "mono", "data-field": "delivery", text: msg.delivery }) : null),
      h("div", { class: "row" },
        act("Ack", async () => { await api("POST", `${base}/ack`, fenced); return "Acknowledged."; }),
        act("Nack", async () => {
          const again = Number(priority.value) || 0;
          await api("POST", `${base}/nack`, { priority: again === msg.priority ? 0 : again,
                                               ...fenced });
          return "Given back to the queue.";
        }),
        act("Touch", async () => {
          await api("POST", `${base}/touch`, fenced);
          return "Ack deadline extended.";
        }),
        act("Explain", async () => explainText(await api("GET", `${base}/explain`))),
        act("Reject", async () => {
          await api("POST", `${base}/reject`, { error: "rejected in the admin UI", ...fenced });
          return "Dead-lettered.";
        }),
        act("Delete", async () => { await api("DELETE", base); return "Deleted."; })),
      h("div", { class: "row priority-row" },
        h("label", { class: "inline" }, "Priority", priority),
        act("Set priority", async () => {
          const out = await api("PUT", `${base}/priority`, { priority: Number(priority.value) || 0 });
          return `Priority is now ${out.priority}.`;
        }),
        h("span", { class: "note", text: "a nack gives the message back with this priority " +
                                         "(0: its own)" })),
      result));
  }

  stop = poller(refresh, 1000);
  return () => stop();
}

// -- the cluster --------------------------------------------------------------------------------

function clusterView(root) {
  const summary = h("p", { id: "leader-summary", class: "note" });
  const body = h("tbody");
  root.append(h("h1", { text: "Cluster" }), summary,
    h("div", { class: "panel table-wrap" }, h("table", { id: "servers" },
      h("thead", {}, h("tr", {}, heads(["Server", "Role", "Health", "Lag", "Suffrage",
                                         "Raft address", "HTTP", "gRPC"], ["Lag"]))), body)));

  function healthBadge(s) {
    if (s.connected === true) return h("span", { class: "badge ok", text: "reachable" });
    if (s.connected === false) return h("span", { class: "badge bad", text: "unreachable" });
    return h("span", { class: "badge", text: "unknown" });
  }

  async function refresh() {
    let servers;
    try {
      servers = (await api("GET", "/API/v1/cluster/servers")).servers || [];
    } catch (e) {
      summary.textContent = `Cannot list the servers: ${e.message}`;
      return;
    }
    const leader = servers.find((s) => s.is_leader);
    summary.textContent = leader
      ? `${plural(servers.length, "server")}; leader ${leader.id} (${leader.addr}).`
      : `${plural(servers.length, "server")}; no leader right now.`;
    body.replaceChildren(...servers.map((s) => h("tr", { "data-server": s.id },
      h("td", { class: "mono", text: s.id }),
      h("td", {}, h("span", { class: `badge ${s.is_leader ? "leader" : ""}`,
                              text: s.is_leader ? "leader" : "follower" })),
      h("td", {}, healthBadge(s)),
      h("td", { class: "num", text: s.lag === null || s.lag === undefined ? "–" : s.lag }),
      h("td", {}, h("span", { class: "badge", text: s.suffrage })),
      h("td", { class: "mono", text: s.addr }),
      h("td", { class: "mono", text: s.http_addr || "–" }),
      h("td", { class: "mono", text: s.grpc_addr || "–" }))));
  }
  return poller(refresh, 2000);
}

// -- routing ------------------------------------------------------------------------------------

const routes = [
  [/^\/$/, (root) => queuesView(root), "queues"],
  [/^\/queues\/(.+)$/, (root, m) => queueView(root, decodeURIComponent(m[1])), "queues"],
  [/^\/(servers|cluster)$/, (root) => clusterView(root), "servers"],
];
let stopView = null;

function render() {
  if (stopView) stopView();
  stopView = null;
  const root = document.getElementById("view");
  root.replaceChildren();
  for (const [pattern, view, nav] of routes) {
    const m = location.pathname.match(pattern);
    if (!m) continue;
    document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === nav));
    stopView = view(root, m);
    return;
  }
  root.append(h("h1", { text: "Not found" }), h("p", {}, h("a", { href: "/", "data-link": true, text: "Back to the queues" })));
}

function navigate(path) {
  history.pushState({}, "", path);
  render();
}

document.addEventListener("click", (ev) => {
  const link = ev.target.closest("a[data-link]");
  if (!link || ev.metaKey || ev.ctrlKey || ev.shiftKey) return;
  ev.preventDefault();
  navigate(link.getAttribute("href"));
});
window.addEventListener("popstate", render);
document.getElementById("theme").addEventListener("click", () => {
  const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
  document.documentElement.dataset.theme = next;
  localStorage.setItem("doq-theme", next);
});
document.getElementById("key-button").addEventListener("click", () => {
  apiKey.ask(apiKey.get() ? "Replace or forget the key this tab sends."
                          : "The key this tab sends with every request.");
});
apiKey.label();
health.start();
showNode();
render();
