// DOQ admin UI, operator controls on a queue's page: pause / resume and purge, the
// groups with their pause buttons, a paged browse of the messages, and "why not delivered".
// Loaded before app.js, whose helpers (h, api, confirmAction, encode) these call.
"use strict";

const REASON_TEXT = {
  delayed_until: (r) => `scheduled for ${new Date(r.until).toLocaleString()}`,
  queue_paused: () => "the queue is paused",
  group_paused: (r) => `group ${r.group} is paused`,
  group_at_max_unacked: (r) => `group ${r.group} has ${r.unacked} of ${r.max} unacked`,
  queue_at_max_in_flight: (r) => `the queue has ${r.in_flight} of ${r.max} in flight`,
  group_rate_limited: (r) => `group ${r.group} is at its rate until ` +
    new Date(r.next_at).toLocaleTimeString(),
  backoff_until: (r) => `backing off until ${new Date(r.until).toLocaleString()}`,
};

// "ready, 3 ahead" / "blocked: group t is paused; ..." for an explain answer.
function explainText(out) {
  const why = out.reasons.map((r) => (REASON_TEXT[r.code] || (() => r.code))(r));
  if (out.state === "unacked") return "Delivered, waiting for its ack.";
  const ahead = `${out.ahead} deliverable message${out.ahead === 1 ? "" : "s"} ahead`;
  return out.state === "ready" ? `Ready: ${ahead}.` : `Blocked: ${why.join("; ")} (${ahead}).`;
}

// Pause / resume and purge. ``changed()`` redraws the page after an action.
function controlsPanel(path, name, changed) {
  const state = h("span", { class: "badge", id: "paused-state" });
  const toggle = h("button", { type: "button", id: "pause-toggle" });
  const unacked = h("input", { type: "checkbox", id: "purge-unacked" });
  const result = h("div", { class: "note", "data-result": "controls" });
  const say = (text, ok) => { result.className = ok ? "success" : "form-error"; result.textContent = text; };
  let paused = false;
  toggle.addEventListener("click", async () => {
    try {
      await api("POST", `${path}/${paused ? "resume" : "pause"}`);
      say(paused ? "Resumed: delivering again." : "Paused: nothing is delivered.", true);
      changed();
    } catch (e) { say(e.message, false); }
  });
  const purge = h("button", { type: "button", class: "danger", id: "purge", text: "Purge…",
    on: { click: async () => {
      const what = unacked.checked ? "every message, the unacked ones too" : "every waiting message";
      if (!(await confirmAction(`Purge ${what} of “${name}”? This cannot be undone.`, "Purge"))) return;
      try {
        const out = await api("POST", `${path}/purge`, { include_unacked: unacked.checked });
        say(`Purged ${out.purged} message${out.purged === 1 ? "" : "s"}.`, true);
        changed();
      } catch (e) { say(e.message, false); }
    } } });
  const panel = h("div", { class: "panel", id: "controls" }, h("h2", { text: "Delivery" }),
    h("div", { class: "row" }, state, toggle),
    h("p", { class: "note", text: "A paused queue still takes messages, acks and nacks; " +
      "consumers wait until it is resumed." }),
    h("div", { class: "row" }, purge,
      h("label", { class: "inline" }, unacked, "include unacked messages")),
    result);
  panel.update = (info) => {
    paused = Boolean(info.paused);
    state.textContent = paused ? "paused" : "delivering";
    state.className = paused ? "badge warn" : "badge ok";
    toggle.textContent = paused ? "Resume" : "Pause";
  };
  return panel;
}

// The groups of a fair queue, each with a pause / resume button, and a box to pause a group
// that has no messages yet.
function groupsPanel(path) {
  const body = h("tbody");
  const error = h("div", { class: "form-error" });
  const input = h("input", { name: "group", placeholder: "group, e.g. tenant-a",
                             "aria-label": "group to pause" });
  const act = async (group, pause) => {
    error.textContent = "";
    try {
      await api("POST", `${path}/groups/${encode(group)}/${pause ? "pause" : "resume"}`);
      await panel.refresh();
    } catch (e) { error.textContent = e.message; }
  };
  const form = h("form", { class: "row", novalidate: true }, input,
                 h("button", { type: "submit", class: "ghost", text: "Pause group" }));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (input.value.trim()) act(input.value.trim(), true).then(() => { input.value = ""; });
  });
  const panel = h("div", { class: "panel", id: "groups" }, h("h2", { text: "Groups" }),
    h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, h("tr", {},
      heads(["Group", "Ready", "Unacked", "Paused", ""], ["Ready", "Unacked"]))), body)),
    form, error,
    h("p", { class: "note", text: "Pausing a group pauses its sub-groups (a pauses a.b); " +
      "the other groups are served as if it were absent." }));
  panel.refresh = async () => {
    let groups;
    try { groups = (await api("GET", `${path}/groups`)).groups; } catch (e) { return; }
    body.replaceChildren(...(groups.length ? groups.map((g) => h("tr", { "data-group": g.group },
      h("td", { class: "mono", text: g.group }),
      h("td", { class: "num", text: g.ready }), h("td", { class: "num", text: g.unacked }),
      h("td", { "data-field": "paused", text: g.paused_by ? `by ${g.paused_by}`
                                                          : g.paused ? "yes" : "no" }),
      h("td", {}, g.paused_by                    // only when a parent's pause covers it
        ? h("span", { class: "badge warn", text: `paused by ${g.paused_by}` })
        : h("button", { type: "button", class: g.paused ? "" : "ghost",
                        "data-group-action": g.paused ? "resume" : "pause",
                        text: g.paused ? "Resume" : "Pause",
                        on: { click: () => act(g.group, !g.paused) } })))) :
      [h("tr", {}, h("td", { colspan: 5, class: "empty", text: "No groups with messages." }))]));
  };
  return panel;
}

// The consumers a queue knows: what each holds (its oldest lease's age) and what it did.
function consumersPanel(path) {
  const body = h("tbody");
  const panel = h("div", { class: "panel", id: "consumers" }, h("h2", { text: "Consumers" }),
    h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, h("tr", {},
      heads(["Consumer", "Holds", "Oldest lease", "Last seen", "Deliveries", "Acks", "Nacks"],
            ["Holds", "Oldest lease", "Deliveries", "Acks", "Nacks"]))), body)),
    h("p", { class: "note", text: "Consumers name themselves when they dequeue (?consumer=); " +
      "one that holds nothing is forgotten after an hour unseen." }));
  const ago = (ms) => (ms < 1000 ? `${ms} ms` : `${Math.round(ms / 1000)} s`);
  panel.refresh = async () => {
    let list;
    try { list = (await api("GET", `${path}/consumers`)).consumers; } catch (e) { return; }
    body.replaceChildren(...(list.length ? list.map((c) => h("tr", { "data-consumer": c.name },
      h("td", { class: "mono", text: c.name }),
      h("td", { class: "num", "data-field": "held", text: c.held }),
      h("td", { class: "num", text: c.held ? ago(c.oldest_lease_ms) : "–" }),
      h("td", { text: new Date(c.last_seen).toLocaleTimeString() }),
      h("td", { class: "num", text: c.deliveries }),
      h("td", { class: "num", "data-field": "acks", text: c.acks }),
      h("td", { class: "num", text: c.nacks }))) :
      [h("tr", {}, h("td", { colspan: 7, class: "empty", text: "No named consumers." }))]));
  };
  return panel;
}

// A page of messages at a time, nothing taken; a row opens the message below.
function browsePanel(path, show) {
  const stateSel = h("select", { name: "state", "aria-label": "which messages" },
    ...["all", "ready", "unacked"].map((v) => h("option", { value: v, text: v })));
  const group = h("input", { name: "group", placeholder: "any group", "aria-label": "group" });
  const body = h("tbody");
  const error = h("div", { class: "form-error" });
  const more = h("button", { type: "button", class: "ghost", id: "browse-next",
                             text: "Next page", hidden: true });
  const pageInfo = h("span", { class: "note", id: "browse-page" });
  let next = null, page = 0;
  async function load(after) {
    error.textContent = "";
    const query = new URLSearchParams({ browse: "true", state: stateSel.value, limit: "20" });
    if (group.value.trim()) query.set("group", group.value.trim());
    if (after) query.set("after", after);
    try {
      const out = await api("GET", `${path}/messages?${query}`);
      next = out.next;
      page = after ? page + 1 : 1;
      pageInfo.textContent = `page ${page}`;
      more.hidden = !next;
      body.replaceChildren(...(out.messages.length ? out.messages.map((m) => h("tr", {
        "data-browsed": m.id, class: "clickable", on: { click: () => show(m, m.state === "unacked"
          ? "delivered, waiting for an ack" : "waiting") } },
        h("td", { class: "mono", text: m.id }), h("td", { text: m.state }),
        h("td", { text: m.group || "default" }), h("td", { class: "num", text: m.priority }),
        h("td", { class: "num", text: m.deliveries || 0 }),
        h("td", { class: "mono", text: m.content.length > 40 ? `${m.content.slice(0, 40)}…` : m.content }))) :
        [h("tr", {}, h("td", { colspan: 6, class: "empty", text: "No messages." }))]));
    } catch (e) { error.textContent = e.message; }
  }
  const form = h("form", { class: "row", novalidate: true }, stateSel, group,
                 h("button", { type: "submit", text: "Browse" }), pageInfo, more);
  form.addEventListener("submit", (ev) => { ev.preventDefault(); load(null); });
  more.addEventListener("click", () => load(next));
  const panel = h("div", { class: "panel", id: "browse" }, h("h2", { text: "Browse" }),
    h("p", { class: "note", text: "Ready messages in delivery order, then the unacked ones; " +
      "nothing is taken. It reloads after each dequeue and action on a message." }), form, error,
    h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, h("tr", {},
      heads(["ID", "State", "Group", "Priority", "Deliveries", "Content"],
            ["Priority", "Deliveries"]))),
      body)));
  panel.load = load;
  panel.reload = () => load(null);
  return panel;
}

// The schedules of a queue: each stores a message at every occurrence (cron in a time zone,
// or every N seconds); the leader fires each occurrence once. Add, pause / resume, delete.
function schedulesPanel(path) {
  const body = h("tbody");
  const error = h("div", { class: "form-error", id: "schedule-error" });
  const field = (name, placeholder, label) => h("input", { name, placeholder,
                                                           "aria-label": label });
  const name = field("name", "name, e.g. nightly", "schedule name");
  const kind = h("select", { name: "kind", "aria-label": "cron or every" },
                 h("option", { value: "cron", text: "cron" }),
                 h("option", { value: "every", text: "every (seconds)" }));
  const when = field("when", "30 2 * * *  or  60", "cron expression or seconds");
  const zone = field("timezone", "time zone (UTC)", "time zone");
  const content = field("content", "message content", "message content");
  const form = h("form", { class: "row", id: "schedule-form", novalidate: true }, name, kind,
                 when, zone, content, h("button", { type: "submit", text: "Add schedule" }));
  const act = async (method, target, done) => {
    error.textContent = "";
    try {
      await api(method, target.url, target.body);
      if (done) done();
      await panel.refresh();
    } catch (e) { error.textContent = e.message; }
  };
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const schedule = { name: name.value.trim(), message: { content: content.value } };
    if (kind.value === "every") schedule.every = Number(when.value.trim());
    else {
      schedule.cron = when.value.trim();
      if (zone.value.trim()) schedule.timezone = zone.value.trim();
    }
    act("POST", { url: `${path}/schedules`, body: schedule }, () => {
      name.value = ""; when.value = ""; content.value = "";
    });
  });
  const time = (s) => (s ? new Date(s * 1000).toLocaleString() : "–");
  const panel = h("div", { class: "panel", id: "schedules" }, h("h2", { text: "Schedules" }),
    h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, h("tr", {},
      heads(["Schedule", "When", "Next", "Last fired", "Fired", "Skipped", ""],
            ["Fired", "Skipped"]))), body)),
    form, error,
    h("p", { class: "note", text: "Occurrences missed by more than the grace (60 s unless " +
      "set) follow catch_up: one (the default) fires the latest once, all fires each, none " +
      "skips them. Pausing the queue holds its schedules too." }));
  panel.refresh = async () => {
    let list;
    try { list = (await api("GET", `${path}/schedules`)).schedules; } catch (e) { return; }
    const one = (s) => `${path}/schedules/${encode(s.name)}`;
    body.replaceChildren(...(list.length ? list.map((s) => h("tr", { "data-schedule": s.name },
      h("td", { class: "mono", text: s.name }),
      h("td", { class: "mono", text: s.cron ? `${s.cron} (${s.timezone})` : `every ${s.every} s` }),
      h("td", { "data-field": "next", text: s.next_at ? time(s.next_at) : "ended" }),
      h("td", { text: time(s.last_fired) }),
      h("td", { class: "num", "data-field": "fired", text: s.fired }),
      h("td", { class: "num", text: s.skipped }),
      h("td", {},
        h("button", { type: "button", class: s.paused ? "" : "ghost",
                      "data-schedule-action": s.paused ? "resume" : "pause",
                      text: s.paused ? "Resume" : "Pause",
                      on: { click: () => act("POST", {
                        url: `${one(s)}/${s.paused ? "resume" : "pause"}` }) } }),
        h("button", { type: "button", class: "danger", "data-schedule-action": "delete",
                      text: "Delete", on: { click: async () => {
                        if (await confirmAction(`Delete schedule ${s.name}? The messages it ` +
                                                "stored stay.", "Delete"))
                          act("DELETE", { url: one(s) });
                      } } })))) :
      [h("tr", {}, h("td", { colspan: 7, class: "empty", text: "No schedules." }))]));
  };
  return panel;
}
