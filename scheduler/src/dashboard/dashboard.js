// Chime's web dashboard: a hash-routed page over the JSON API. The token lives in this tab's
// sessionStorage and goes out as `Authorization: Bearer`; no cookie carries authority, so there
// is no CSRF surface. Every user-supplied string reaches the DOM through textContent (el() and
// table()), never parsed as markup.
"use strict";

const TOKEN_KEY = "chime.token";
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "dead", "skipped"]);
let me = null;
let timer = null;
let flash = null; // a notice to show on the page the next hash change opens
let rendering = 0; // counts route() calls; only the latest one's page is shown

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function time(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function show(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function notice(message, isError) {
  const box = document.getElementById("notice");
  box.textContent = message;
  box.className = isError ? "error" : "";
  box.hidden = !message;
}

async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY) };
  const init = { method, headers, credentials: "omit", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const data = response.status === 204 ? null : await response.json();
  if (response.status === 401) {
    logout("Your token was refused; paste a valid one.");
    throw new Error("unauthenticated");
  }
  if (!response.ok) {
    const error = new Error(data && data.error ? data.error.message : "HTTP " + response.status);
    error.status = response.status;
    throw error;
  }
  return data;
}

function mayOperate() {
  return me && (me.role === "operator" || me.role === "admin");
}

function actionButton(label, cls, action) {
  const allowed = mayOperate();
  return el("button", {
    type: "button",
    class: cls,
    disabled: !allowed,
    title: allowed ? null : "needs the operator role",
    onclick: async (event) => {
      event.target.disabled = true;
      try {
        notice(await action(), false);
      } catch (e) {
        notice(e.message, true);
      }
      route();
    },
  }, label);
}

function table(columns, rows, rowAttrs) {
  return el("table", {},
    el("thead", {}, el("tr", {}, columns.map(([label]) => el("th", {}, label)))),
    el("tbody", {}, rows.map((row) => el("tr", rowAttrs ? rowAttrs(row) : {},
      columns.map(([, cell]) => {
        const value = cell(row);
        return el("td", {}, value instanceof Node || Array.isArray(value) ? value : show(value));
      })))));
}

function runLink(id) {
  return id === null || id === undefined ? "—" : el("a", { href: "#/runs/" + id }, "#" + id);
}

function stateCell(state) {
  return el("span", { class: "state state-" + state }, state);
}

// ---- pages ----------------------------------------------------------------------------------

async function overview(page) {
  const windows = ["5m", "1h", "24h"];
  const [views, queues, timeline] = await Promise.all([
    Promise.all(windows.map((w) => api("GET", "/api/overview?window=" + w))),
    api("GET", "/api/queues"),
    api("GET", "/api/overview/timeline?window=1h&bucket=1m"),
  ]);
  const hour = views[1];
  const states = [...new Set(views.flatMap((v) => Object.keys(v.runs_by_state)))].sort();
  const leader = hour.leader || {};
  page.append(
    el("h1", {}, "Overview"),
    el("div", { class: "cards" },
      card("failure rate (1h)", hour.failure_rate === null ? "—" : (hour.failure_rate * 100).toFixed(1) + "%", "failure-rate"),
      card("jobs", hour.jobs, "jobs-count"),
      card("paused jobs", hour.paused_jobs),
      card("workers online", hour.workers_online, "workers-online"),
      card("leader", leader.active ? leader.holder + " (term " + leader.term + ")" : "none", "leader")),
    el("h2", {}, "Runs by state"),
    table([["state", (s) => stateCell(s)]].concat(windows.map((w, i) =>
      ["last " + w, (s) => views[i].runs_by_state[s] ?? 0])), states),
    el("h2", {}, "Runs created per minute, last hour, by state now"),
    timelineChart(timeline),
    el("h2", {}, "Queues"),
    queueTable(queues.queues));
  // The overview keeps itself current; it has no state to lose, and it stops when another
  // page opens (refreshIn checks the hash, and route() clears the timer).
  refreshIn(5000);
}

// ---- the runs-over-time chart: SVG built here, no library ------------------------------------

// The SVG namespace: an identifier, not an address; nothing is fetched from it.
const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function clock(iso) {
  return new Date(iso).toISOString().slice(11, 16);
}

// A stacked bar per bucket (oldest left), one segment per state in the API's order, each with
// its count in data-count and a tooltip; a legend of the states that occur.
function timelineChart(t) {
  const [width, height, top, bottom, left] = [720, 170, 12, 22, 36];
  const n = t.buckets.length;
  const max = Math.max(1, ...t.buckets.map((b) => b.total));
  const slot = (width - left) / n;
  const y = (count) => height - bottom - count * (height - bottom - top) / max;
  const chart = svg("svg", { id: "timeline", class: "chart", width, height,
    viewBox: "0 0 " + width + " " + height, role: "img",
    "aria-label": "runs created per minute over the last hour, stacked by state" },
  svg("line", { class: "axis", x1: left, x2: width, y1: y(0), y2: y(0) }),
  svg("text", { class: "tick", x: left - 4, y: y(max) + 4, "text-anchor": "end" }, max),
  svg("text", { class: "tick", x: left - 4, y: y(0), "text-anchor": "end" }, 0),
  svg("text", { class: "tick", x: left, y: height - 6 }, clock(t.from)),
  svg("text", { class: "tick", x: width, y: height - 6, "text-anchor": "end" }, clock(t.to)));
  const seen = new Set();
  t.buckets.forEach((b, i) => {
    let below = 0;
    for (const state of t.states) {
      const count = b.counts[state] || 0;
      if (!count) continue;
      seen.add(state);
      chart.append(svg("rect", { class: "bar bar-" + state, "data-state": state,
        "data-count": count, "data-start": b.start,
        x: (left + i * slot + 0.5).toFixed(1), width: Math.max(1, slot - 1).toFixed(1),
        y: y(below + count).toFixed(1), height: (y(below) - y(below + count)).toFixed(1) },
      svg("title", {}, clock(b.start) + " " + state + ": " + count)));
      below += count;
    }
  });
  const legend = el("ul", { class: "legend" }, t.states.filter((s) => seen.has(s)).map((s) =>
    el("li", {}, el("span", { class: "swatch bar-" + s }), " " + s)));
  return el("figure", { class: "chart" }, chart,
    seen.size ? legend : el("p", { class: "muted" }, "No runs in the last hour."));
}

function card(label, value, id) {
  return el("div", { class: "card", id }, el("div", { class: "value" }, show(value)),
    el("div", { class: "label" }, label));
}

function queueTable(queues) {
  return table([
    ["group", (q) => q.group], ["queue", (q) => q.queue], ["depth", (q) => q.depth],
    ["consumers", (q) => q.consumers], ["parking lot", (q) => q.parking_depth],
  ], queues);
}

async function jobs(page) {
  const { jobs } = await api("GET", "/api/jobs");
  const last = await Promise.all(jobs.map((j) =>
    api("GET", "/api/runs?limit=1&job=" + encodeURIComponent(j.name)).then((p) => p.runs[0])));
  const lastRun = new Map(jobs.map((j, i) => [j.name, last[i]]));
  const path = (j, action) => "/api/jobs/" + encodeURIComponent(j.name) + "/" + action;
  page.append(el("h1", {}, "Jobs"), table([
    ["name", (j) => el("a", { href: "#/jobs/" + encodeURIComponent(j.name) }, j.name)],
    ["group", (j) => j.group], ["schedule", (j) => el("code", {}, j.schedule)],
    ["next fire", (j) => time(j.next_fire)], ["paused", (j) => (j.paused ? "paused" : "no")],
    ["last run", (j) => { const r = lastRun.get(j.name); return r ? [runLink(r.id), " ", stateCell(r.state)] : "—"; }],
    ["actions", (j) => [
      actionButton("Trigger", "trigger", async () => {
        const t = await api("POST", path(j, "trigger"));
        return "Triggered " + t.job + ": run #" + t.run_id;
      }),
      j.paused
        ? actionButton("Resume", "resume", async () => { await api("POST", path(j, "resume")); return "Resumed " + j.name; })
        : actionButton("Pause", "pause", async () => { await api("POST", path(j, "pause")); return "Paused " + j.name; }),
    ]],
  ], jobs, (j) => ({ "data-job": j.name })));
}

// One job: its definition, the next fire times, and (admins, jobs created through the API) a
// schedule editor. While the operator types, the API previews the schedule (debounced): the
// next five fire times, or the same problem `chime check` names (field, value, fix). Save
// stays disabled while the schedule is invalid, and a submit previews first, so an invalid
// schedule is never sent.
const SCHEDULE_KINDS = [["schedule", "cron"], ["every", "every"], ["at", "at"], ["manual", "manual only"]];

async function job(page, name) {
  const j = await api("GET", "/api/jobs/" + encodeURIComponent(name));
  const editable = me.role === "admin" && j.source === "api";
  const spec = j.spec;
  const current = spec.schedule ? "schedule" : spec.every ? "every" : spec.at ? "at" : "manual";
  const kind = el("select", { id: "schedule-kind", name: "kind", disabled: !editable },
    SCHEDULE_KINDS.map(([value, label]) => el("option", { value, selected: value === current }, label)));
  const input = el("input", { id: "schedule", name: "schedule", size: 30, disabled: !editable,
    value: spec.schedule || spec.every || spec.at || "" });
  const zone = el("input", { id: "timezone", name: "timezone", size: 18, disabled: !editable,
    value: spec.timezone || "UTC" });
  const save = el("button", { type: "submit", disabled: !editable }, "Save");
  const error = el("p", { id: "edit-error", class: "error" });
  const preview = el("ol", { id: "preview", class: "muted" });
  const fields = () => {
    const body = { schedule: null, every: null, at: null, timezone: zone.value.trim() || null };
    if (kind.value !== "manual") body[kind.value] = input.value.trim();
    return body;
  };
  // Shows the preview of the current fields; resolves to them when they are valid.
  let asked = 0;
  const check = async () => {
    const mine = ++asked;
    const body = fields();
    let result;
    try {
      result = { ok: true, preview: await api("POST", "/api/schedules/preview", body) };
    } catch (e) {
      result = { ok: false, message: e.message };
    }
    if (mine !== asked) return null; // a newer preview is on its way
    save.disabled = !result.ok;
    error.textContent = result.ok ? "" : result.message;
    preview.replaceChildren(...(result.ok
      ? (result.preview.upcoming_local.length
        ? result.preview.upcoming_local.map((t) => el("li", {}, t))
        : [el("li", {}, "none: " + result.preview.none_because)])
      : []));
    preview.setAttribute("data-state", result.ok ? "valid" : "invalid");
    return result.ok ? body : null;
  };
  let debounce = null;
  const changed = () => {
    input.disabled = kind.value === "manual";
    preview.setAttribute("data-state", "pending");
    clearTimeout(debounce);
    debounce = setTimeout(check, 300);
  };
  for (const field of [kind, input, zone]) field.addEventListener("input", changed);
  const form = el("form", { id: "edit-schedule", class: "filters", onsubmit: async (event) => {
    event.preventDefault();
    clearTimeout(debounce);
    const body = await check();
    if (!body) return;
    try {
      await api("PATCH", "/api/jobs/" + encodeURIComponent(name), body);
      notice("Changed the schedule of " + name, false);
      route();
    } catch (e) {
      error.textContent = e.message;
    }
  } }, el("label", { for: "schedule-kind" }, "schedule "), kind, " ", input,
  el("label", { for: "timezone" }, " time zone "), zone, save);
  page.append(...[
    el("h1", {}, "Job " + j.name),
    el("table", { class: "fields" }, [
      ["group", j.group], ["schedule", j.schedule], ["paused", j.paused ? "paused" : "no"],
      ["source", j.source], ["definition", j.spec],
    ].map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, show(v))))),
    el("h2", {}, "Next fire times"),
    el("ol", { id: "upcoming" }, j.upcoming.map((t) => el("li", {}, time(t)))),
    el("h2", {}, "Edit schedule"),
    editable ? null : el("p", { class: "muted" }, j.source === "api"
      ? "Changing a job needs the admin role."
      : "This job is declared in a job file: change the file and reload (SIGHUP)."),
    form, error,
    editable ? el("p", { class: "muted" }, "Next five fire times of the schedule above, in its time zone:") : null,
    editable ? preview : null,
  ].filter((node) => node !== null));
  if (editable) {
    input.disabled = kind.value === "manual";
    check();
  }
}

const RUN_STATES = ["pending", "queued", "running", "retrying", "succeeded", "failed", "dead",
  "cancelled", "skipped"];

// Runs, newest first, filtered by job, state and group, paged by keyset: "Older" passes the
// page's `next_before` as `before`. The `trail` parameter remembers the `before` of every page
// on the way (`top` for the first), so "Newer" goes back exactly one page.
async function runs(page, query) {
  const params = new URLSearchParams(query);
  const api_params = new URLSearchParams();
  for (const key of ["job", "state", "group", "before", "limit"]) {
    if (params.get(key)) api_params.set(key, params.get(key));
  }
  if (!api_params.get("limit")) api_params.set("limit", "50");
  const data = await api("GET", "/api/runs?" + api_params);
  const input = (name) => el("input", { name, placeholder: name, value: params.get(name) || "" });
  let edited = false;
  const state = el("select", { name: "state" }, el("option", { value: "" }, "any state"),
    RUN_STATES.map((s) => el("option", { value: s, selected: params.get("state") === s }, s)));
  const form = el("form", { id: "run-filters", class: "filters", onsubmit: (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) next.set(k, v);
    location.hash = "#/runs?" + next;
  }, oninput: () => { edited = true; } }, input("job"), state, input("group"),
  params.get("limit") ? el("input", { type: "hidden", name: "limit", value: params.get("limit") }) : null,
  el("button", { type: "submit" }, "Filter"));
  const trail = params.get("trail") ? params.get("trail").split(",") : [];
  const older = new URLSearchParams(params);
  older.set("before", data.next_before);
  older.set("trail", trail.concat([params.get("before") || "top"]).join(","));
  let newer = null;
  if (params.get("before")) {
    newer = new URLSearchParams(params);
    const back = trail.pop() || "top";
    if (back === "top") newer.delete("before");
    else newer.set("before", back);
    if (trail.length) newer.set("trail", trail.join(","));
    else newer.delete("trail");
  }
  page.append(el("h1", {}, "Runs"), form, table([
    ["id", (r) => runLink(r.id)], ["job", (r) => r.job], ["group", (r) => r.group],
    ["state", (r) => stateCell(r.state)], ["trigger", (r) => r.trigger], ["attempt", (r) => r.attempt],
    ["scheduled", (r) => time(r.scheduled_at)], ["finished", (r) => time(r.finished_at)],
    ["error", (r) => r.error],
  ], data.runs, (r) => ({ "data-run-id": r.id, "data-state": r.state, "data-job": r.job })),
  el("p", { class: "pager" },
    newer ? el("a", { id: "newer", href: "#/runs?" + newer }, "← Newer") : null, " ",
    data.next_before ? el("a", { id: "older", href: "#/runs?" + older }, "Older →") : null));
  refreshIn(3000, () => edited || form.contains(document.activeElement));
}

async function run(page, id) {
  const r = await api("GET", "/api/runs/" + encodeURIComponent(id));
  const fields = [
    ["job", r.job], ["group", r.group], ["trigger", r.trigger], ["requested by", r.requested_by],
    ["attempt", r.attempt], ["worker", r.worker_id], ["params", r.params], ["reason", r.reason],
    ["error", r.error], ["scheduled", time(r.scheduled_at)], ["created", time(r.created_at)],
    ["published", time(r.published_at)], ["started", time(r.started_at)],
    ["finished", time(r.finished_at)], ["next attempt", time(r.next_attempt_at)],
  ];
  const live = !TERMINAL.has(r.state);
  const logs = logBox(r);
  page.append(...[
    el("h1", {}, "Run #" + r.id + " ", el("span", { id: "run-state", class: "state state-" + r.state }, r.state)),
    live ? actionButton("Cancel", "cancel", async () => {
      const c = await api("POST", "/api/runs/" + r.id + "/cancel");
      return "Cancel: " + c.outcome;
    }) : null,
    el("table", { class: "fields" }, fields.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, show(v))))),
    el("h2", {}, "Attempts"),
    table([["attempt", (a) => a.attempt], ["worker", (a) => a.worker_id], ["state", (a) => stateCell(a.state)],
      ["started", (a) => time(a.started_at)], ["finished", (a) => time(a.finished_at)],
      ["duration", (a) => (a.duration_ms === null ? "—" : a.duration_ms + " ms")], ["error", (a) => a.error]],
    r.attempts),
    el("h2", {}, "Log", live ? el("span", { class: "muted" }, " (live)") : null),
    logs.box,
  ].filter((node) => node !== null));
  page.shown = logs.shown;
  if (live) refreshIn(1000);
}

// The run's log box. While the run is live its page renders again every second: the lines
// already shown move over to the new box and only the lines after them (the API returns them
// oldest first, and a run's lines are only ever appended) are added, so a reader's selection and
// scroll position survive; the box follows new lines unless the reader scrolled up.
function logBox(r) {
  const old = document.getElementById("logs");
  const same = old && old.dataset.runId === String(r.id);
  const shown = same ? Number(old.dataset.lines) : 0;
  const box = el("pre", { id: "logs", class: "logs", "data-run-id": r.id, "data-lines": r.logs.length });
  if (same) box.append(...old.childNodes);
  box.append(...r.logs.slice(shown).map((l) =>
    el("span", { class: "line" }, time(l.at) + " [" + l.attempt + "] " + l.level + " " + l.message + "\n")));
  const follow = !same || old.scrollTop + old.clientHeight >= old.scrollHeight - 4;
  const top = same ? old.scrollTop : 0;
  return { box, shown: () => { box.scrollTop = follow ? box.scrollHeight : top; } };
}

async function workers(page) {
  const { workers } = await api("GET", "/api/workers");
  page.append(el("h1", {}, "Workers"), generic(workers));
}

async function queues(page) {
  const { queues } = await api("GET", "/api/queues");
  page.append(el("h1", {}, "Queues"), queueTable(queues));
}

// The parking lots: every parked message, each replayable on its own; and, for one group (the
// `group` in the hash, else the first with parked messages), "Replay all" (operators) and
// "Purge" (admins; runs stay as they are). Both take a second click on a button that names
// what will happen, so nothing bulk happens by a stray click.
async function deadLetters(page, query) {
  const { dead_letters } = await api("GET", "/api/dead-letters");
  const groups = [...new Set(dead_letters.map((d) => d.group))].sort();
  const wanted = new URLSearchParams(query).get("group");
  const group = groups.includes(wanted) ? wanted : groups[0];
  page.append(el("h1", {}, "Dead letters"));
  if (group !== undefined) page.append(bulkActions(group, groups, dead_letters.filter((d) => d.group === group).length));
  else page.append(el("p", { id: "dl-none", class: "muted" }, "No parked messages."));
  page.append(table([
    ["group", (d) => d.group], ["run", (d) => runLink(d.run_id)],
    ["message", (d) => (d.run_id === null ? "—" : el("a", { class: "inspect", href: "#/dead-letters/" + d.run_id }, "Inspect"))],
    ["job", (d) => d.job],
    ["attempt", (d) => d.attempt], ["reason", (d) => d.reason], ["error", (d) => d.error],
    ["parked", (d) => time(d.parked_at)], ["by", (d) => d.parked_by], ["run state", (d) => d.run_state],
    ["", (d) => (d.run_id === null ? null : actionButton("Replay", "replay", async () => {
      const x = await api("POST", "/api/dead-letters/" + d.run_id + "/replay");
      return "Replayed run #" + x.run_id + " as attempt " + x.attempt;
    }))],
  ], dead_letters, (d) => ({ "data-run-id": d.run_id, "data-group": d.group })));
}

// The group picker and the two bulk buttons of the dead-letters page; `count` is how many of
// the listed messages are in `group`.
function bulkActions(group, groups, count) {
  const query = "?group=" + encodeURIComponent(group);
  const picker = el("select", { id: "dl-group", name: "group", onchange: () => {
    location.hash = "#/dead-letters?group=" + encodeURIComponent(picker.value);
  } }, groups.map((g) => el("option", { value: g, selected: g === group }, g)));
  const confirm = el("span", { id: "dl-confirm" });
  // A first click offers the confirmation; its click does `action` and shows the result.
  const step = (id, question, action) => {
    const ask = el("button", { type: "button", id: "confirm-" + id, class: "danger", onclick: async (event) => {
      event.target.disabled = true;
      try {
        notice(await action(), false);
      } catch (e) {
        notice(e.message, true);
      }
      route();
    } }, question);
    const back = el("button", { type: "button", id: "cancel-" + id, onclick: () => confirm.replaceChildren() }, "Cancel");
    return () => confirm.replaceChildren(ask, back);
  };
  const operator = mayOperate();
  const admin = me && me.role === "admin";
  const replayAll = el("button", { type: "button", id: "replay-all", disabled: !operator,
    title: operator ? null : "needs the operator role",
    onclick: step("replay-all", "Confirm replay of " + count + " messages in " + group, async () => {
      const r = await api("POST", "/api/dead-letters/replay" + query);
      const kept = r.kept.map((k) => (k.run_id === null ? "a message" : "run #" + k.run_id) + ": " + k.note);
      return "Replayed " + r.replayed.length + " runs of " + group +
        (r.replayed.length ? " (" + r.replayed.map((id) => "#" + id).join(", ") + ")" : "") +
        (kept.length ? "; kept " + kept.join("; ") : "");
    }) }, "Replay all");
  const purge = el("button", { type: "button", id: "purge", disabled: !admin,
    title: admin ? null : "needs the admin role",
    onclick: step("purge", "Confirm purge of " + count + " messages in " + group, async () => {
      const r = await api("POST", "/api/dead-letters/purge" + query);
      return r.purged.map((p) => "Purged " + p.purged + " messages from " + p.queue).join("; ") +
        " (the runs stay as they are)";
    }) }, "Purge");
  return el("div", { id: "dl-bulk", class: "filters" },
    el("label", { for: "dl-group" }, "group "), picker, replayAll, purge, confirm);
}

// One parked message in full: what the list shows, every header, and the trigger it carries
// (pretty-printed, as text), as the leader drained it into the database: reading it asks the
// broker nothing. Replaying opens the run.
async function deadLetter(page, id) {
  let d;
  try {
    d = await api("GET", "/api/dead-letters/" + encodeURIComponent(id));
  } catch (e) {
    if (e.status !== 404) throw e;
    page.append(el("h1", {}, "Dead letter of run #" + id),
      el("p", { id: "dl-gone", class: "muted" }, e.message),
      el("p", {}, el("a", { href: "#/dead-letters" }, "All dead letters")));
    return;
  }
  const m = d.message;
  const allowed = mayOperate();
  const replay = el("button", { type: "button", class: "replay", disabled: !allowed,
    title: allowed ? null : "needs the operator role", onclick: async (event) => {
      event.target.disabled = true;
      try {
        const x = await api("POST", "/api/dead-letters/" + d.run_id + "/replay");
        flash = "Replayed run #" + x.run_id + " as attempt " + x.attempt;
        location.hash = "#/runs/" + x.run_id;
      } catch (e) {
        notice(e.message, true);
        event.target.disabled = false;
      }
    } }, "Replay");
  const fields = [
    ["run", runLink(d.run_id)], ["run state", d.run_state ? stateCell(d.run_state) : "—"],
    ["job", d.job], ["group", d.group], ["queue", d.queue + " (position " + d.position + ")"],
    ["attempt", d.attempt], ["reason", d.reason], ["error", d.error], ["parked", time(d.parked_at)],
    ["parked by", d.parked_by], ["message id", m.message_id], ["content type", m.content_type],
  ];
  const headers = Object.keys(m.headers).sort().map((name) => [name, m.headers[name]]);
  page.append(
    el("h1", {}, "Dead letter of run #" + d.run_id),
    replay,
    el("table", { class: "fields" }, fields.map(([k, v]) =>
      el("tr", {}, el("th", {}, k), el("td", {}, v instanceof Node ? v : show(v))))),
    el("h2", {}, "Headers"),
    table([["header", ([name]) => el("code", {}, name)],
      ["value", ([, value]) => el("code", {}, show(value))]], headers,
    ([name]) => ({ "data-header": name, id: null })),
    el("h2", {}, m.body_is_json ? "Trigger" : "Body (not JSON)"),
    el("pre", { id: "dl-body", class: "payload" },
      m.body_is_json ? JSON.stringify(m.body, null, 2) : m.body));
}

async function audit(page, query) {
  const params = new URLSearchParams(query);
  const data = await api("GET", "/api/audit?" + params);
  const older = new URLSearchParams(params);
  older.set("before", data.next_before);
  page.append(el("h1", {}, "Audit log"), generic(data.entries),
    el("p", {}, data.next_before ? el("a", { href: "#/audit?" + older }, "Older →") : null));
}

// A table of every field of the rows, for shapes the page has no opinion about.
function generic(rows) {
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  return table(keys.map((k) => [k.replace(/_/g, " "), (r) => (/_at$|^at$|heartbeat/.test(k) && r[k] ? time(r[k]) : r[k])]), rows);
}

// ---- routing --------------------------------------------------------------------------------

// Renders the page again after `ms`, unless another page was opened; while `busy()` says so
// (the operator is editing a form on it), it waits another `ms`.
function refreshIn(ms, busy) {
  clearTimeout(timer);
  const hash = location.hash;
  timer = setTimeout(() => {
    if (location.hash !== hash) return;
    if (busy && busy()) refreshIn(ms, busy);
    else route();
  }, ms);
}

async function route() {
  clearTimeout(timer);
  const mine = ++rendering;
  if (!sessionStorage.getItem(TOKEN_KEY)) return logout("");
  const [path, query] = (location.hash.slice(1) || "/overview").split("?");
  const parts = path.split("/").filter(Boolean);
  const pages = { overview, jobs, runs, workers, queues, "dead-letters": deadLetters, audit };
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("current", a.getAttribute("href") === "#/" + parts[0]);
  }
  const page = el("section", { id: "page", "data-page": parts.join("/") });
  try {
    if (parts[0] === "runs" && parts[1]) await run(page, parts[1]);
    else if (parts[0] === "jobs" && parts[1]) await job(page, decodeURIComponent(parts[1]));
    else if (parts[0] === "dead-letters" && parts[1]) await deadLetter(page, parts[1]);
    else if (pages[parts[0]]) await pages[parts[0]](page, query || "");
    else page.append(el("h1", {}, "No such page"));
  } catch (e) {
    if (e.message === "unauthenticated") return;
    page.append(el("p", { class: "error" }, e.message));
  }
  // A page opened later (a click while this one loaded) wins, whichever finishes first.
  if (mine !== rendering) return;
  page.setAttribute("data-loaded", "true");
  document.getElementById("page").replaceWith(page);
  if (page.shown) page.shown();
}

async function login(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    me = await api("GET", "/api/me");
  } catch (e) {
    document.getElementById("login-error").textContent = e.message;
    return;
  }
  document.getElementById("whoami").textContent = me.actor + " (" + me.role + ")";
  document.getElementById("login").hidden = true;
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  document.getElementById("page").hidden = false;
  await route();
}

function logout(message) {
  clearTimeout(timer);
  sessionStorage.removeItem(TOKEN_KEY);
  me = null;
  document.getElementById("whoami").textContent = "";
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("page").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("token");
    const token = input.value.trim();
    input.value = "";
    login(token);
  });
  document.getElementById("logout").addEventListener("click", () => logout(""));
  window.addEventListener("hashchange", () => { notice(flash || "", false); flash = null; if (me) route(); });
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) login(saved);
  else logout("");
});
