// Chime's web dashboard: a hash-routed page over the JSON API. The token lives in this tab's
// sessionStorage and goes out as `Authorization: Bearer`; no cookie carries authority, so there
// is no CSRF surface. Every user-supplied string reaches the DOM through textContent (el() and
// table()), never parsed as markup.
"use strict";

const TOKEN_KEY = "chime.token";
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "dead", "skipped", "lost"]);
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
    error.problems = data && data.error ? data.error.problems : [];
    throw error;
  }
  return data;
}

function mayOperate() {
  return me && (me.role === "operator" || me.role === "admin");
}

// An operator's button: does `action`, shows what it answers, then renders the page again (or,
// with `after`, only the part of it the action changed).
function actionButton(label, cls, action, after) {
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
      (after || route)();
    },
  }, label);
}

function table(columns, rows, rowAttrs) {
  return el("table", {},
    el("thead", {}, el("tr", {}, columns.map(([label]) => el("th", {}, label)))),
    el("tbody", {}, rows.map((row) => tableRow(columns, row, rowAttrs ? rowAttrs(row) : {}))));
}

// One row of table(): a cell per column, a value that is no element shown as text.
function tableRow(columns, row, attrs) {
  return el("tr", attrs, columns.map(([, cell]) => {
    const value = cell(row);
    return el("td", {}, value instanceof Node || Array.isArray(value) ? value : show(value));
  }));
}

function runLink(id) {
  return id === null || id === undefined ? "—" : el("a", { href: "#/runs/" + id }, "#" + id);
}

function stateCell(state) {
  return el("span", { class: "state state-" + state }, state);
}

// ---- times in a job's own zone, durations in words -------------------------------------------

const zoneFormats = new Map();

// The Intl formatter of an IANA zone (UTC for an unknown one), cached.
function zoneFormat(zone) {
  if (!zoneFormats.has(zone)) {
    let format;
    try {
      format = new Intl.DateTimeFormat("en-GB", { timeZone: zone || "UTC", hourCycle: "h23",
        year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
        second: "2-digit", timeZoneName: "longOffset" });
    } catch (e) {
      format = zoneFormat("UTC");
    }
    zoneFormats.set(zone, format);
  }
  return zoneFormats.get(zone);
}

// `iso` as `2026-12-01 09:30:00 +08:00` in `zone` (`… UTC` in UTC).
function localText(iso, zone) {
  const parts = {};
  for (const p of zoneFormat(zone).formatToParts(new Date(iso))) parts[p.type] = p.value;
  const offset = ["GMT", "GMT+00:00", "UTC"].includes(parts.timeZoneName) ? "UTC" : parts.timeZoneName.replace("GMT", "");
  return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" +
    parts.minute + ":" + parts.second + " " + offset;
}

// A time as a person reads it: in the job's zone, the UTC instant on hover.
function zoned(iso, zone) {
  if (!iso) return "—";
  return el("time", { datetime: iso, title: time(iso), class: "nowrap" }, localText(iso, zone));
}

// Milliseconds in words: `850 ms`, `10.9 s`, `3 min 5 s`, `2 h 4 min`, `3 d 2 h`.
function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1).replace(/\.0$/, "") + " s";
  const s = Math.round(ms / 1000);
  const [d, h, m, sec] = [Math.floor(s / 86400), Math.floor(s / 3600) % 24, Math.floor(s / 60) % 60, s % 60];
  if (d) return d + " d" + (h ? " " + h + " h" : "");
  if (h) return h + " h" + (m ? " " + m + " min" : "");
  return m + " min" + (sec ? " " + sec + " s" : "");
}

// How long a run took: its latest attempt's start to its end; none while it runs.
function runMs(r) {
  return r.started_at && r.finished_at ? new Date(r.finished_at) - new Date(r.started_at) : null;
}

// Job name → time zone, for pages listing runs of many jobs.
async function jobZones() {
  const { jobs } = await api("GET", "/api/jobs");
  return new Map(jobs.map((j) => [j.name, j.timezone]));
}

function badge(text, kind) {
  return el("span", { class: "badge badge-" + kind }, text);
}

// A job's state: active, or paused and by whom (its job file or an operator), on hover.
function pauseBadge(j) {
  if (!j.paused) return badge("active", "good");
  const b = badge("paused", "warn");
  if (j.paused_by) b.title = j.paused_by === "file" ? "paused by its job file" : "paused by " + j.paused_by;
  return b;
}

// A cell text that stays on one line, cut with an ellipsis, whole on hover.
function clipped(text) {
  if (text === null || text === undefined) return "—";
  return el("span", { class: "clip", title: String(text) }, String(text));
}

function percent(rate) {
  return rate === null || rate === undefined ? "—" : (rate * 100).toFixed(1) + "%";
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
  page.refresh = [5000];
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
  const admin = me.role === "admin";
  page.append(el("h1", {}, "Jobs"),
    el("p", { class: "toolbar" }, admin
      ? el("a", { id: "new-job", class: "button", href: "#/new-job" }, "New job")
      : null),
    table([
      ["name", (j) => el("a", { class: "clip", title: j.name, href: jobHref(j.name) }, j.name)],
      ["group", (j) => (isWorkflow(j) ? el("a", { class: "workflow-link", href: workflowHref(j.name),
        title: "a workflow: its DAG and runs" }, "workflow") : clipped(j.group))],
      ["schedule", (j) => el("code", { class: "nowrap" }, j.schedule)],
      ["time zone", (j) => j.timezone],
      ["next fire", (j) => zoned(j.next_fire_local || j.next_fire, j.timezone)],
      ["state", pauseBadge],
      ["last run", (j) => { const r = lastRun.get(j.name); return r ? el("span", { class: "nowrap" }, runLink(r.id), " ", stateCell(r.state)) : "—"; }],
      ["actions", (j) => el("span", { class: "nowrap" }, jobActions(j))],
    ], jobs, (j) => ({ "data-job": j.name })));
}

function jobHref(name, sub) {
  return "#/jobs/" + encodeURIComponent(name) + (sub ? "/" + sub : "");
}

// Whether job record `j` is a workflow (a job of kind workflow: docs/workflows.md).
function isWorkflow(j) {
  return Boolean(j.spec) && j.spec.kind === "workflow";
}

// Trigger (through its dialog) and pause or resume.
function jobActions(j) {
  const path = (action) => "/api/jobs/" + encodeURIComponent(j.name) + "/" + action;
  const allowed = mayOperate();
  return [
    el("button", { type: "button", class: "trigger", disabled: !allowed,
      title: allowed ? null : "needs the operator role", onclick: () => triggerDialog(j) }, "Trigger"),
    j.paused
      ? actionButton("Resume", "resume", async () => { await api("POST", path("resume")); return "Resumed " + j.name; })
      : actionButton("Pause", "pause", async () => { await api("POST", path("pause")); return "Paused " + j.name; }),
  ];
}

// Asks before a manual run: the params for this run, pre-filled with the job's own as pretty
// JSON, checked here to be a JSON object (the API checks them again). Cancel sends nothing.
function triggerDialog(j) {
  const old = document.getElementById("trigger-dialog");
  if (old) old.remove();
  const params = el("textarea", { id: "trigger-params", rows: 10, cols: 60, spellcheck: "false" });
  params.value = JSON.stringify(j.spec.params === null || j.spec.params === undefined ? {} : j.spec.params, null, 2);
  const error = el("p", { id: "trigger-error", class: "error", role: "alert" });
  const close = () => { dialog.close(); dialog.remove(); };
  const runButton = el("button", { type: "submit", id: "trigger-run", class: "primary" }, "Run");
  const dialog = el("dialog", { id: "trigger-dialog", "aria-labelledby": "trigger-title" },
    el("form", { method: "dialog", onsubmit: async (event) => {
      event.preventDefault();
      let value;
      try {
        value = JSON.parse(params.value);
      } catch (e) {
        error.textContent = "The params are not valid JSON (" + e.message + "); write a JSON object, such as {\"date\": \"2026-12-01\"}.";
        return;
      }
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        error.textContent = "The params must be a JSON object, such as {\"date\": \"2026-12-01\"}, not " +
          (Array.isArray(value) ? "an array" : value === null ? "null" : "a " + typeof value) + ".";
        return;
      }
      runButton.disabled = true;
      try {
        const t = await api("POST", "/api/jobs/" + encodeURIComponent(j.name) + "/trigger", { params: value });
        close();
        // A job no online worker handles: the run waits for one (bounded), so say so.
        const warned = (t.warnings || []).length ? " (warning: " + t.warnings.join("; ") + ")" : "";
        notice("Triggered " + t.job + warned + ": run #" + t.run_id, false);
        route();
      } catch (e) {
        error.textContent = e.message;
        runButton.disabled = false;
      }
    } },
    el("h2", { id: "trigger-title" }, "Run " + j.name + " now?"),
    el("p", { class: "muted" }, "One run, now, also when the job is paused. Its params (a JSON object; the job's own are filled in):"),
    params, error,
    el("div", { class: "dialog-buttons" },
      el("button", { type: "button", id: "trigger-cancel", onclick: close }, "Cancel"), runButton)));
  dialog.addEventListener("cancel", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  params.focus();
}

// The retry policy in words.
function retryText(r) {
  if (!r || r.max_attempts <= 1) return "no retry (1 attempt)";
  return r.max_attempts + " attempts; backoff " + r.initial + " × " + r.multiplier + " up to " + r.max +
    (r.jitter ? ", with jitter" : "");
}

const CONCURRENCY = { allow: "allow overlapping runs", forbid: "forbid: skip a fire while a run is active",
  queue: "queue: wait for the active run", replace: "replace: cancel the active run" };
const MISFIRE = { skip: "skip missed fires", fire_once: "run the latest missed fire once",
  fire_all: "run every missed fire" };

// One job, readably: its definition, next fire times in its zone, its recent runs with their
// success rate and a duration chart, its backfills (followed live while one runs) and, for a
// job with a schedule, the form that backfills a past range; its definition versions with what
// each changed; trigger, pause, and (admins, jobs created through the API) edit, delete and
// roll back to a version. Jobs from job files are read-only here (a backfill changes no
// definition, so they are backfilled here too).
async function job(page, name) {
  const enc = encodeURIComponent(name);
  const [j, recent, report, versions, backfills] = await Promise.all([
    api("GET", "/api/jobs/" + enc),
    api("GET", "/api/runs?limit=50&job=" + enc),
    api("GET", "/api/jobs/" + enc + "/report?days=14"),
    api("GET", "/api/jobs/" + enc + "/versions"),
    api("GET", backfillsPath(name)),
  ]);
  const spec = j.spec;
  const zone = j.timezone;
  const scheduled = Boolean(spec.schedule || spec.every || spec.at); // a manual-only job has no fires
  const editable = me.role === "admin" && j.source === "api";
  const confirm = el("span", { id: "delete-confirm" });
  const del = editable ? el("button", { type: "button", id: "delete-job", class: "danger", onclick: () => {
    confirm.replaceChildren(
      el("button", { type: "button", id: "confirm-delete", class: "danger", onclick: async (event) => {
        event.target.disabled = true;
        try {
          await api("DELETE", "/api/jobs/" + enc);
          flash = "Deleted job " + name;
          location.hash = "#/jobs";
        } catch (e) {
          notice(e.message, true);
          event.target.disabled = false;
        }
      } }, "Confirm delete of " + name),
      el("button", { type: "button", id: "cancel-delete", onclick: () => confirm.replaceChildren() }, "Cancel"));
  } }, "Delete") : null;
  const finished = recent.runs.filter((r) => runMs(r) !== null);
  const durations = finished.map(runMs).sort((a, b) => a - b);
  const median = durations.length ? durations[Math.floor((durations.length - 1) / 2)] : null;
  const total14 = report.days.reduce((n, d) => n + d.total, 0);
  page.append(...[
    el("h1", {}, "Job " + j.name + " ", j.source === "api" ? badge("created through the API", "info") : badge("job file", "muted"),
      " ", pauseBadge(j)),
    el("p", { class: "toolbar" }, jobActions(j),
      isWorkflow(j) ? el("a", { id: "workflow-link", class: "button", href: workflowHref(name) }, "Workflow DAG") : null,
      el("a", { id: "report-link", class: "button", href: jobHref(name, "report") }, "Report"),
      editable ? el("a", { id: "edit-job", class: "button", href: jobHref(name, "edit") }, "Edit") : null,
      del, confirm),
    j.source === "api" ? null : el("p", { id: "read-only", class: "muted" },
      "Read-only here: declared in a job file. Change the file and reload (SIGHUP)."),
    el("div", { class: "cards" },
      card("success rate (14 days)", percent(report.success_rate), "success-rate"),
      card("runs (14 days)", total14, "runs-14d"),
      card("median duration (last " + finished.length + " runs)", duration(median), "median-duration")),
    el("h2", {}, "Definition"),
    el("table", { class: "fields", id: "definition" }, [
      ["schedule", el("code", {}, j.schedule)], ["time zone", zone],
      ["next fire", zoned(j.next_fire_local || j.next_fire, zone)],
      ["group", spec.group],
      isWorkflow(j) ? ["workflow", el("a", { href: workflowHref(name) },
        (spec.nodes || []).length + " node" + ((spec.nodes || []).length === 1 ? "" : "s") + ": its DAG and runs")] : null,
      ["description", spec.description],
      isWorkflow(j) ? null : ["retry", retryText(spec.retry)], ["timeout", spec.timeout || "none"],
      ["concurrency", CONCURRENCY[spec.concurrency] || spec.concurrency],
      ["misfire", (MISFIRE[spec.misfire] || spec.misfire) + " (grace " + spec.misfire_grace + ")"],
      ["params", el("pre", { id: "job-params-view", class: "payload" }, JSON.stringify(spec.params, null, 2))],
      ["secret params", spec.secret_params && spec.secret_params.length ? spec.secret_params.join(", ") : null],
      ["source", j.source === "api" ? "created through the API" : "job file"],
    ].filter((f) => f !== null && f[1] !== undefined).map(([k, v]) =>
      el("tr", {}, el("th", {}, k), el("td", {}, v instanceof Node ? v : show(v))))),
    el("h2", {}, "Next fire times (" + zone + ")"),
    j.upcoming.length
      ? el("ol", { id: "upcoming" }, j.upcoming.map((t, i) => el("li", {}, zoned(j.upcoming_local[i] || t, zone))))
      : el("p", { id: "upcoming", class: "muted" }, "none"),
    el("h2", {}, "Duration of recent runs"),
    durationChart(recent.runs),
    el("h2", {}, "Recent runs"),
    el("div", { id: "recent-runs" }, runTable(recent.runs.slice(0, 20), () => zone, false)),
    el("h2", { id: "backfills-title" }, "Backfills"),
    backfillList(name, backfills, zone),
    scheduled ? backfillForm(j) : el("p", { id: "backfill-manual", class: "muted" },
      "A manual-only job has no fires to backfill; trigger it instead."),
    el("h2", {}, "Versions"),
    versionTable(versions.slice().reverse(), editable ? name : null, zone),
  ].filter((node) => node !== null));
  if (backfills.backfills.some((b) => b.state === "running")) {
    page.refresh = [2000, null, () => redrawBackfills(name, zone)];
  }
}

// A job's definition versions, newest first: who applied each, when, and the fields it
// changed (secrets hidden). With `rollbackJob` (an admin, a job created through the API), each
// earlier version has a button that puts it back as a new version.
function versionTable(versions, rollbackJob, zone) {
  const value = (v) => (v === undefined || v === null ? "(not set)" : JSON.stringify(v));
  const changes = (v) => (v.version === 1 ? "created"
    : v.changes.length
      ? el("ul", { class: "changes" }, v.changes.map((c) =>
        el("li", {}, el("code", {}, c.field), ": " + value(c.before) + " → " + value(c.after))))
      : "no field changed");
  const rollback = (v) => (rollbackJob === null || v.current ? null
    : el("button", { type: "button", class: "rollback", "data-version": v.version, onclick: async (event) => {
      event.target.disabled = true;
      try {
        const back = await api("POST", "/api/jobs/" + encodeURIComponent(rollbackJob) + "/rollback", { to: v.version });
        await route(); // the same page again, with the new version on top
        notice("Rolled " + rollbackJob + " back to version " + v.version + ", now version " + back.version, false);
      } catch (e) {
        notice(e.message, true);
        event.target.disabled = false;
      }
    } }, "Roll back to this"));
  return el("div", { id: "versions" }, table([
    ["version", (v) => v.version + (v.current ? " (current)" : "")],
    ["at", (v) => zoned(v.at, zone)], ["by", (v) => v.actor], ["source", (v) => v.source],
    ["changes", changes], ["", (v) => rollback(v) || ""],
  ], versions, (v) => ({ "data-version": v.version })));
}

// ---- backfills ------------------------------------------------------------------------------

// Backfills the job page lists, newest first; `chime backfills list` shows older ones.
const BACKFILLS_SHOWN = 20;

function backfillsPath(name) {
  return "/api/backfills?limit=" + BACKFILLS_SHOWN + "&job=" + encodeURIComponent(name);
}

const BACKFILL_BADGE = { running: "info", done: "good", cancelled: "muted" };

// A job's backfills: state, range and times in the job's zone, pace, progress in words and as a
// bar of the fires handled, who asked, a link to its runs; Cancel (operators) on a running one,
// which redraws only this list.
function backfillList(name, page, zone) {
  if (!page.backfills.length) return el("p", { id: "backfills", class: "muted" }, "No backfills of this job.");
  const ended = (b) => {
    if (!b.finished_at) return "—";
    // The reason says who cancelled it (`cancelled by token:alice`) or why (its job was deleted).
    const why = b.state === "cancelled" ? b.reason || "cancelled by " + (b.cancelled_by || "—") : null;
    return el("span", { class: "stack" }, zoned(b.finished_at, zone), why ? clipped(why) : null);
  };
  const cancel = (b) => {
    const button = actionButton("Cancel", "cancel-backfill", async () => {
      const c = await api("POST", "/api/backfills/" + b.id + "/cancel");
      const asked = c.cancel_requested.length;
      return "Cancelled backfill " + c.backfill_id + " of " + c.job + ": " + c.runs_cancelled +
        " waiting run" + (c.runs_cancelled === 1 ? "" : "s") + " cancelled" +
        (asked ? ", " + asked + " running asked to stop (" + c.cancel_requested.map((id) => "#" + id).join(", ") + ")" : "");
    }, () => redrawBackfills(name, zone));
    button.setAttribute("aria-label", "Cancel backfill " + b.id);
    return button;
  };
  const progress = (b) => {
    const handled = b.fires_made + b.fires_existing;
    return el("span", { class: "stack" },
      el("progress", { class: "backfill", max: Math.max(b.fires_total, 1), value: handled,
        "aria-label": handled + " of " + b.fires_total + " fires handled" }),
      el("span", { class: "progress-text" }, b.progress));
  };
  return el("div", { id: "backfills" }, table([
    ["backfill", (b) => b.id],
    ["state", (b) => badge(b.state, BACKFILL_BADGE[b.state] || "muted")],
    ["range", (b) => el("span", { class: "stack" }, zoned(b.from, zone),
      el("span", { title: "left out" }, "to ", zoned(b.to, zone)))],
    ["pace", (b) => el("span", { class: "stack" }, el("span", { class: "nowrap" }, b.parallel + " at once"),
      el("span", { class: "nowrap" }, b.rate + " a second"))],
    ["progress", progress],
    ["runs", (b) => el("a", { class: "backfill-runs", href: "#/runs?backfill=" + b.id }, "runs")],
    ["requested", (b) => el("span", { class: "stack" }, clipped(b.requested_by), zoned(b.created_at, zone))],
    ["ended", ended],
    ["", (b) => (b.state === "running" ? cancel(b) : "")],
  ], page.backfills, (b) => ({ "data-backfill-id": b.id, "data-state": b.state })),
  page.next_before ? el("p", { class: "muted" }, "The newest " + page.backfills.length +
    " are shown; all of them: chime backfills list --job " + name + " --limit 1000") : null);
}

// Reads the job's backfills and recent runs again and redraws both in place (the form beside
// them keeps what the operator typed and previewed); goes on every 2 s while a backfill runs.
// A page rendered meanwhile (`rendering` moved on) has its own lists: these are dropped.
async function redrawBackfills(name, zone) {
  const mine = rendering;
  let page, recent;
  try {
    [page, recent] = await Promise.all([api("GET", backfillsPath(name)),
      api("GET", "/api/runs?limit=20&job=" + encodeURIComponent(name))]);
  } catch (e) {
    if (e.message === "unauthenticated" || mine !== rendering) return;
    notice(e.message, true);
    followBackfills(name, zone);
    return;
  }
  const [oldList, oldRuns] = [document.getElementById("backfills"), document.getElementById("recent-runs")];
  if (mine !== rendering || !oldList) return;
  oldList.replaceWith(backfillList(name, page, zone));
  if (oldRuns) oldRuns.replaceChildren(runTable(recent.runs, () => zone, false));
  if (page.backfills.some((b) => b.state === "running")) followBackfills(name, zone);
}

function followBackfills(name, zone) {
  refreshIn(2000, null, () => redrawBackfills(name, zone));
}

// The form that backfills a past range of a job with a schedule (POST
// /api/jobs/{name}/backfills): from and to as the API takes them (RFC 3339, or a date: its
// midnight in the job's zone), parallel and rate (empty: the API's defaults). Preview (any
// role; a dry run, nothing saved) lists the range's fires, each to make or with its run. Start
// (operators) previews too, then asks with a second button naming how many runs it will make;
// editing a field withdraws that question. The API's problems show next to their fields.
function backfillForm(j) {
  const path = "/api/jobs/" + encodeURIComponent(j.name) + "/backfills";
  const errors = new Map(); // field → its error element
  const row = (label, field, input, hint) => {
    const problem = el("span", { class: "field-error error", "data-field": field, id: input.id + "-error" });
    errors.set(field, problem);
    input.setAttribute("aria-describedby", problem.id);
    return el("tr", {}, el("th", {}, el("label", { for: input.id }, label)),
      el("td", {}, input, hint ? el("span", { class: "muted" }, " " + hint) : null, problem));
  };
  const instant = (id, name) => el("input", { id, name, size: 32, required: true, autocomplete: "off",
    spellcheck: "false", placeholder: "2026-11-01 or 2026-11-01T06:00:00Z" });
  const number = (id, name, max, value) => el("input", { id, name, type: "number", min: 1, max, value });
  const from = instant("backfill-from", "from");
  const to = instant("backfill-to", "to");
  const parallel = number("backfill-parallel", "parallel", 100, 4);
  const rate = number("backfill-rate", "rate", 1000, 10);
  const error = el("p", { id: "backfill-error", class: "error", role: "alert" });
  const preview = el("div", { id: "backfill-preview", "aria-live": "polite" });
  const confirm = el("span", { id: "backfill-confirm" });
  const allowed = mayOperate();
  const previewButton = el("button", { type: "submit", id: "backfill-preview-button" }, "Preview");
  const start = el("button", { type: "button", id: "backfill-start", class: "primary", disabled: !allowed,
    title: allowed ? null : "needs the operator role" }, "Start backfill");
  const body = () => {
    const b = { from: from.value.trim(), to: to.value.trim() };
    if (parallel.value.trim()) b.parallel = Number(parallel.value);
    if (rate.value.trim()) b.rate = Number(rate.value);
    return b;
  };
  const showProblems = (message, problems) => {
    error.textContent = message;
    for (const e of errors.values()) e.textContent = "";
    for (const p of problems || []) {
      const target = errors.get(p.field || "");
      if (target) target.textContent = " " + p.message;
    }
  };
  // Asks for the dry run of `b` and shows it; resolves to it, or to null after a mistake.
  const dryRun = async (b) => {
    showProblems("", []);
    confirm.replaceChildren();
    previewButton.disabled = true;
    try {
      const p = await api("POST", path, Object.assign({}, b, { dry_run: true }));
      preview.replaceChildren(...backfillPreview(p, j.timezone));
      return p;
    } catch (e) {
      if (e.message !== "unauthenticated") showProblems(e.message, e.problems);
      preview.replaceChildren();
      return null;
    } finally {
      previewButton.disabled = false;
    }
  };
  // Starts what was previewed (`b`, not the fields as they may be now).
  const begin = async (event, b) => {
    event.target.disabled = true;
    try {
      const started = await api("POST", path, b);
      const warned = (started.warnings || []).length ? " (warning: " + started.warnings.join("; ") + ")" : "";
      notice("Started backfill " + started.id + " of " + started.job + ": " + started.fires_total +
        " fire" + (started.fires_total === 1 ? "" : "s") + warned, false);
      confirm.replaceChildren();
      preview.replaceChildren();
      redrawBackfills(j.name, j.timezone);
    } catch (e) {
      if (e.message === "unauthenticated") return;
      showProblems(e.message, e.problems);
      confirm.replaceChildren();
    }
  };
  start.addEventListener("click", async () => {
    if (!form.reportValidity()) return;
    const b = body();
    const p = await dryRun(b);
    if (!p) return;
    const runs = p.fires_to_make === 1 ? "1 run" : p.fires_to_make + " runs";
    confirm.replaceChildren(
      el("button", { type: "button", id: "backfill-confirm-start", class: "primary",
        onclick: (event) => begin(event, b) },
      "Confirm backfill of " + (p.fires_total === 1 ? "1 fire" : p.fires_total + " fires") + ": make " + runs),
      el("button", { type: "button", id: "backfill-confirm-cancel", onclick: () => confirm.replaceChildren() }, "Cancel"));
  });
  const form = el("form", { id: "backfill-form", "aria-labelledby": "backfill-title",
    oninput: () => confirm.replaceChildren(),
    onsubmit: (event) => { event.preventDefault(); dryRun(body()); } },
  el("table", { class: "fields form" },
    row("from", "from", from, "fires at or after this: a date (its midnight in " + j.timezone + ") or an RFC 3339 instant"),
    row("to", "to", to, "and before this (a fire at it is left out); not after now"),
    row("parallel", "parallel", parallel, "runs of the backfill unfinished at once (1–100)"),
    row("rate", "rate", rate, "runs made per second, at most (1–1000)")),
  el("p", { class: "toolbar" }, previewButton, start, confirm), error);
  return el("div", { id: "backfill-section" },
    el("h2", { id: "backfill-title" }, "Backfill a past range"),
    el("p", { class: "muted" }, "Makes the fires of " + j.name + "'s schedule in the range into runs; " +
      "a fire that has a run already keeps it."),
    form, preview);
}

// A dry run's answer: the totals, and the first fires, each to make or with the run it has
// (a skipped run is run by the backfill).
function backfillPreview(p, zone) {
  const plural = (n, word) => n + " " + word + (n === 1 ? "" : "s");
  const rest = p.fires_total - p.fires.length;
  const run = (f) => {
    if (!f.run) return badge("to make", "info");
    return el("span", { class: "nowrap" }, runLink(f.run.id), " ", stateCell(f.run.state),
      el("span", { class: "muted" }, " " + f.run.trigger + (f.run.state === "skipped" ? "; to run" : "")));
  };
  return [
    el("p", { id: "backfill-totals", "data-total": p.fires_total, "data-to-make": p.fires_to_make,
      "data-existing": p.fires_existing },
    plural(p.fires_total, "fire") + " of " + p.schedule + " from ", zoned(p.from, zone), " to ",
    zoned(p.to, zone), ": " + p.fires_to_make + " to make, " + p.fires_existing +
    " with a run already; at most " + p.parallel + " at once, " + p.rate + " a second."),
    p.fires.length ? el("div", { id: "backfill-fires" }, table([
      ["fire", (f) => zoned(f.at, zone)], ["run", run],
    ], p.fires, (f) => ({ "data-at": f.at, "data-run-id": f.run ? f.run.id : null,
      "data-to-make": String(!f.run || f.run.state === "skipped") }))) : null,
    rest > 0 ? el("p", { class: "muted" }, "The first " + p.fires.length + " of " + p.fires_total + " fires are listed.") : null,
  ].filter((node) => node !== null);
}

// Runs as a table; `zoneOf(run)` names the zone its times are shown in.
function runTable(rows, zoneOf, withJob) {
  return table([
    ["id", (r) => runLink(r.id)],
    withJob ? ["job", (r) => el("a", { class: "clip", title: r.job, href: jobHref(r.job) }, r.job)] : null,
    ["state", (r) => stateCell(r.state)], ["trigger", runTrigger], ["attempt", (r) => r.attempt],
    ["scheduled", (r) => zoned(r.scheduled_at, zoneOf(r))], ["started", (r) => zoned(r.started_at, zoneOf(r))],
    ["finished", (r) => zoned(r.finished_at, zoneOf(r))],
    ["duration", (r) => el("span", { class: "nowrap" }, duration(runMs(r)))],
    ["worker", (r) => clipped(r.worker_id)],
    ["tasks", (r) => (r.progress ? el("span", { class: "nowrap progress-text" }, r.progress) : "—")],
    withJob ? ["group", (r) => clipped(r.group)] : null,
    ["error", (r) => (r.error ? el("span", { class: "clip wide", title: r.error }, r.error) : "—")],
  ].filter((c) => c !== null), rows, (r) => ({ "data-run-id": r.id, "data-state": r.state, "data-job": r.job }));
}

// How a run came to be; a backfill's run names its backfill, a link to the backfill's runs,
// and a child job's run the run whose end made it.
function runTrigger(r) {
  if (r.backfill_id !== null && r.backfill_id !== undefined) return backfillLink(r.backfill_id);
  if (r.upstream_run_id !== null && r.upstream_run_id !== undefined) {
    return el("span", { class: "nowrap" }, "after ", runLink(r.upstream_run_id));
  }
  return r.trigger;
}

function backfillLink(id) {
  return el("a", { class: "nowrap", href: "#/runs?backfill=" + id, title: "the runs of this backfill" }, "backfill " + id);
}

// The durations of the finished runs among `runs` (newest first), oldest left: a bar per
// run, coloured by its state, its id and duration in a tooltip.
function durationChart(runs) {
  const points = runs.filter((r) => runMs(r) !== null).reverse();
  if (!points.length) return el("p", { id: "duration-chart", class: "muted" }, "No finished runs yet.");
  const [width, height, top, bottom, left] = [720, 150, 12, 22, 64];
  const max = Math.max(1, ...points.map(runMs));
  const slot = (width - left) / Math.max(points.length, 10);
  const y = (ms) => height - bottom - ms * (height - bottom - top) / max;
  const chart = svg("svg", { id: "duration-chart", class: "chart", width, height,
    viewBox: "0 0 " + width + " " + height, role: "img",
    "aria-label": "duration of the job's last " + points.length + " finished runs, oldest left" },
  svg("line", { class: "axis", x1: left, x2: width, y1: y(0), y2: y(0) }),
  svg("text", { class: "tick", x: left - 4, y: y(max) + 4, "text-anchor": "end" }, duration(max)),
  svg("text", { class: "tick", x: left - 4, y: y(0), "text-anchor": "end" }, "0"),
  svg("text", { class: "tick", x: left, y: height - 6 }, "older"),
  svg("text", { class: "tick", x: left + points.length * slot, y: height - 6, "text-anchor": "end" }, "newest"));
  points.forEach((r, i) => {
    const ms = runMs(r);
    chart.append(svg("rect", { class: "bar bar-" + r.state, "data-run-id": r.id, "data-ms": ms,
      x: (left + i * slot + 1).toFixed(1), width: Math.max(1, slot - 2).toFixed(1),
      y: y(ms).toFixed(1), height: Math.max(1, y(0) - y(ms)).toFixed(1) },
    svg("title", {}, "#" + r.id + " " + r.state + ": " + duration(ms))));
  });
  return el("figure", { class: "chart" }, chart);
}

// XXL-Job's report for one job: runs per day by outcome (stacked bars) and the median and
// 95th percentile duration per day (lines), over the last `days` days in the job's zone.
async function jobReport(page, name, query) {
  const wanted = Number(new URLSearchParams(query).get("days")) || 14;
  const r = await api("GET", "/api/jobs/" + encodeURIComponent(name) + "/report?days=" + wanted);
  const other = (d) => d.total - r.outcomes.reduce((n, s) => n + (d.counts[s] || 0), 0);
  page.append(
    el("h1", {}, "Report: ", el("a", { href: jobHref(name) }, name)),
    el("p", { class: "toolbar" }, "Days in " + r.timezone + ": ",
      [7, 14, 30, 90].map((n) => el("a", { class: n === wanted ? "button current" : "button",
        href: jobHref(name, "report") + "?days=" + n }, n + " days"))),
    el("div", { class: "cards" },
      card("success rate", percent(r.success_rate), "report-success"),
      r.outcomes.map((s) => card(s, r.totals[s] || 0, "report-" + s))),
    el("h2", {}, "Runs per day by outcome"),
    reportBars(r, other),
    el("h2", {}, "Duration per day: median and 95th percentile"),
    reportLines(r),
    el("h2", {}, "By day"),
    table([["day", (d) => el("span", { class: "nowrap" }, d.day)], ["runs", (d) => d.total]]
      .concat(r.outcomes.map((s) => [s, (d) => d.counts[s] || 0]))
      .concat([["other", other], ["p50", (d) => duration(d.p50_ms)], ["p95", (d) => duration(d.p95_ms)]]),
    r.days.slice().reverse(), (d) => ({ "data-day": d.day })));
}

function dayLabel(day) {
  return day.slice(5);
}

function reportBars(r, other) {
  const [width, height, top, bottom, left] = [720, 180, 12, 22, 36];
  const n = r.days.length;
  const max = Math.max(1, ...r.days.map((d) => d.total));
  const slot = (width - left) / n;
  const y = (count) => height - bottom - count * (height - bottom - top) / max;
  const chart = svg("svg", { id: "report-chart", class: "chart", width, height,
    viewBox: "0 0 " + width + " " + height, role: "img",
    "aria-label": "runs per day by outcome, last " + n + " days, stacked" },
  svg("line", { class: "axis", x1: left, x2: width, y1: y(0), y2: y(0) }),
  svg("text", { class: "tick", x: left - 4, y: y(max) + 4, "text-anchor": "end" }, max),
  svg("text", { class: "tick", x: left - 4, y: y(0), "text-anchor": "end" }, 0));
  const labelEvery = Math.ceil(n / 14);
  r.days.forEach((d, i) => {
    let below = 0;
    for (const [state, count] of r.outcomes.map((s) => [s, d.counts[s] || 0]).concat([["other", other(d)]])) {
      if (!count) continue;
      chart.append(svg("rect", { class: "bar bar-" + state, "data-day": d.day, "data-state": state,
        "data-count": count, x: (left + i * slot + 1).toFixed(1), width: Math.max(1, slot - 2).toFixed(1),
        y: y(below + count).toFixed(1), height: (y(below) - y(below + count)).toFixed(1) },
      svg("title", {}, d.day + " " + state + ": " + count)));
      below += count;
    }
    if (i % labelEvery === 0) {
      chart.append(svg("text", { class: "tick", x: (left + (i + 0.5) * slot).toFixed(1), y: height - 6,
        "text-anchor": "middle" }, dayLabel(d.day)));
    }
  });
  const legend = el("ul", { class: "legend" }, r.outcomes.concat(["other"]).map((s) =>
    el("li", {}, el("span", { class: "swatch bar-" + s }), " " + s)));
  return el("figure", { class: "chart" }, chart, legend);
}

function reportLines(r) {
  const [width, height, top, bottom, left] = [720, 160, 12, 22, 64];
  const n = r.days.length;
  const max = Math.max(1, ...r.days.map((d) => d.p95_ms || 0));
  const slot = (width - left) / n;
  const x = (i) => (left + (i + 0.5) * slot).toFixed(1);
  const y = (ms) => (height - bottom - ms * (height - bottom - top) / max).toFixed(1);
  const chart = svg("svg", { id: "report-durations", class: "chart", width, height,
    viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": "median and 95th percentile duration per day" },
  svg("line", { class: "axis", x1: left, x2: width, y1: y(0), y2: y(0) }),
  svg("text", { class: "tick", x: left - 4, y: Number(y(max)) + 4, "text-anchor": "end" }, duration(max)),
  svg("text", { class: "tick", x: left - 4, y: y(0), "text-anchor": "end" }, "0"));
  for (const key of ["p95_ms", "p50_ms"]) {
    const line = r.days.map((d, i) => [i, d[key]]).filter(([, v]) => v !== null);
    if (line.length > 1) {
      chart.append(svg("polyline", { class: "line line-" + key, fill: "none",
        points: line.map(([i, v]) => x(i) + "," + y(v)).join(" ") }));
    }
    for (const [i, v] of line) {
      chart.append(svg("circle", { class: "dot line-" + key, cx: x(i), cy: y(v), r: 3, "data-day": r.days[i].day },
        svg("title", {}, r.days[i].day + " " + key.slice(0, 3) + ": " + duration(v))));
    }
  }
  const legend = el("ul", { class: "legend" },
    el("li", {}, el("span", { class: "swatch line-p50_ms" }), " p50 (median)"),
    el("li", {}, el("span", { class: "swatch line-p95_ms" }), " p95"));
  return el("figure", { class: "chart" }, chart, legend);
}

// Creates a job (`#/new-job`) or edits one created through the API (`#/jobs/NAME/edit`),
// admins only. While the operator types, the API previews the schedule (debounced): the next
// five fire times in the job's zone, or the same problem `chime check` names (field, value,
// fix). Save stays disabled while the schedule is invalid, and a submit previews first. The
// params must be a JSON object. The API validates the whole definition as a job file; its
// problems show next to their fields. Jobs from job files are not edited here.
const SCHEDULE_KINDS = [["schedule", "cron"], ["every", "every"], ["at", "at"], ["manual", "manual only"]];

async function jobForm(page, name) {
  const creating = name === null;
  const j = creating ? null : await api("GET", "/api/jobs/" + encodeURIComponent(name));
  const spec = creating ? { group: "", timezone: "UTC", params: {}, retry: { max_attempts: 1, initial: "1s" },
    concurrency: "allow", misfire: "fire_once" } : j.spec;
  page.append(el("h1", {}, creating ? "New job" : "Edit job " + name));
  if (!creating && j.source !== "api") {
    page.append(el("p", { id: "read-only", class: "muted" },
      "Read-only: this job is declared in a job file. Change the file and reload (SIGHUP)."));
    return;
  }
  if (me.role !== "admin") {
    page.append(el("p", { class: "muted" }, "Creating and changing jobs needs the admin role."));
    return;
  }
  const current = creating || spec.schedule ? "schedule" : spec.every ? "every" : spec.at ? "at" : "manual";
  const errors = new Map(); // field → its error element
  const row = (label, field, input, hint) => {
    const problem = el("span", { class: "field-error error", "data-field": field });
    errors.set(field, problem);
    return el("tr", {}, el("th", {}, el("label", { for: input.id }, label)),
      el("td", {}, input, hint ? el("span", { class: "muted" }, " " + hint) : null, problem));
  };
  const text = (id, value, size) => el("input", { id, name: id, size: size || 30, value: value ?? "" });
  const select = (id, options, value) => el("select", { id, name: id },
    Object.entries(options).map(([v, label]) => el("option", { value: v, selected: v === value }, label)));
  const nameInput = text("job-name", creating ? "" : name);
  if (!creating) nameInput.disabled = true;
  const group = text("job-group", spec.group);
  const description = text("job-description", spec.description, 50);
  const kind = el("select", { id: "schedule-kind", name: "kind" },
    SCHEDULE_KINDS.map(([value, label]) => el("option", { value, selected: value === current }, label)));
  const input = el("input", { id: "schedule", name: "schedule", size: 30,
    value: spec.schedule || spec.every || spec.at || "" });
  const zone = text("timezone", spec.timezone || "UTC", 18);
  const jitter = text("job-jitter", spec.jitter, 8);
  const startAt = text("job-start-at", spec.start_at, 26);
  const endAt = text("job-end-at", spec.end_at, 26);
  const maxRuns = el("input", { id: "job-max-runs", name: "max_runs", type: "number", min: 1,
    value: spec.max_runs ?? "" });
  const params = el("textarea", { id: "job-params", name: "params", rows: 6, cols: 60, spellcheck: "false" });
  params.value = JSON.stringify(spec.params ?? {}, null, 2);
  const timeout = text("job-timeout", spec.timeout, 8);
  const attempts = el("input", { id: "job-attempts", name: "attempts", type: "number", min: 1,
    value: spec.retry.max_attempts });
  const initial = text("job-retry-initial", spec.retry.initial, 8);
  const concurrency = select("job-concurrency", CONCURRENCY, spec.concurrency);
  const misfire = select("job-misfire", MISFIRE, spec.misfire);
  const save = el("button", { type: "submit", class: "primary" }, creating ? "Create" : "Save");
  const error = el("p", { id: "edit-error", class: "error" });
  const preview = el("ol", { id: "preview", class: "muted" });
  const scheduleFields = () => {
    const body = { schedule: null, every: null, at: null, timezone: zone.value.trim() || null,
      jitter: null, start_at: null, end_at: null, max_runs: null };
    if (kind.value !== "manual") {
      body[kind.value] = input.value.trim();
      body.jitter = jitter.value.trim() || null;
      body.start_at = startAt.value.trim() || null;
      body.end_at = endAt.value.trim() || null;
      body.max_runs = maxRuns.value.trim() ? Number(maxRuns.value) : null;
    }
    return body;
  };
  // Shows the preview of the schedule fields; resolves to them when they are valid.
  let asked = 0;
  const check = async () => {
    const mine = ++asked;
    const body = scheduleFields();
    let result;
    try {
      // The jitter depends on the job's name: preview with it once there is one.
      const named = nameInput.value.trim() ? Object.assign({ name: nameInput.value.trim() }, body) : body;
      result = { ok: true, preview: await api("POST", "/api/schedules/preview", named) };
    } catch (e) {
      result = { ok: false, message: e.message };
    }
    if (mine !== asked) return null; // a newer preview is on its way
    save.disabled = !result.ok;
    error.textContent = result.ok ? "" : result.message;
    preview.replaceChildren(...(result.ok
      ? (result.preview.upcoming_local.length
        ? result.preview.upcoming_local.map((t, i) => el("li", { title: time(result.preview.upcoming[i]) }, t))
        : [el("li", {}, "none: " + result.preview.none_because)])
      : []));
    preview.setAttribute("data-state", result.ok ? "valid" : "invalid");
    return result.ok ? body : null;
  };
  // A manual-only job has no schedule, so none of its timing fields.
  const lock = () => {
    for (const field of [input, jitter, startAt, endAt, maxRuns]) field.disabled = kind.value === "manual";
  };
  let debounce = null;
  const changed = () => {
    lock();
    preview.setAttribute("data-state", "pending");
    clearTimeout(debounce);
    debounce = setTimeout(check, 300);
  };
  for (const field of [kind, input, zone, jitter, startAt, endAt, maxRuns, nameInput]) {
    field.addEventListener("input", changed);
  }
  const showProblems = (problems) => {
    for (const e of errors.values()) e.textContent = "";
    for (const p of problems || []) {
      const field = (p.field || "").replace(/^(every|at)$/, "schedule");
      const target = errors.get(field) || errors.get(field.split(".")[0]);
      if (target) target.textContent = " " + p.message;
    }
  };
  const form = el("form", { id: "job-form", onsubmit: async (event) => {
    event.preventDefault();
    clearTimeout(debounce);
    showProblems([]);
    const schedule = await check();
    if (!schedule) return;
    let paramsValue;
    try {
      paramsValue = JSON.parse(params.value);
    } catch (e) {
      paramsValue = undefined;
    }
    if (paramsValue === null || typeof paramsValue !== "object" || Array.isArray(paramsValue)) {
      showProblems([{ field: "params", message: "not a JSON object; write one such as {\"date\": \"2026-12-01\"}" }]);
      error.textContent = "The params must be a JSON object.";
      return;
    }
    const body = Object.assign({}, schedule, {
      group: group.value.trim(),
      description: description.value.trim() || null,
      params: paramsValue,
      timeout: timeout.value.trim() || null,
      concurrency: concurrency.value,
      misfire: misfire.value,
      retry: Object.assign({}, spec.retry, { max_attempts: Number(attempts.value), initial: initial.value.trim() }),
    });
    if (creating) {
      body.name = nameInput.value.trim();
      for (const [k, v] of Object.entries(body)) if (v === null) delete body[k];
    }
    try {
      const saved = creating
        ? await api("POST", "/api/jobs", body)
        : await api("PATCH", "/api/jobs/" + encodeURIComponent(name), body);
      flash = (creating ? "Created job " : "Changed job ") + saved.name;
      location.hash = jobHref(saved.name);
    } catch (e) {
      error.textContent = e.message;
      showProblems(e.problems);
    }
  } },
  el("table", { class: "fields form" },
    row("name", "name", nameInput, creating ? "the handler name workers register" : "a job cannot be renamed"),
    row("group", "group", group, "the executor group (queue)"),
    row("description", "description", description),
    el("tr", {}, el("th", {}, el("label", { for: "schedule-kind" }, "schedule")),
      el("td", {}, kind, " ", input, el("label", { for: "timezone" }, " time zone "), zone,
        el("span", { class: "field-error error", "data-field": "schedule" }))),
    row("jitter", "jitter", jitter, "such as 5m: each fire moves later by up to this; empty: none"),
    row("from", "start_at", startAt, "no fire before this instant, such as 2027-01-01T00:00:00Z"),
    row("until", "end_at", endAt, "no fire after this instant"),
    row("max runs", "max_runs", maxRuns, "the schedule ends after this many fires; empty: no end"),
    row("params", "params", params, "a JSON object"),
    row("timeout", "timeout", timeout, "such as 30s; empty: none"),
    row("attempts", "retry", attempts, "1 = no retry"),
    row("first retry after", "retry.initial", initial),
    row("concurrency", "concurrency", concurrency),
    row("misfire", "misfire", misfire)),
  el("p", {}, save, el("a", { class: "button", href: creating ? "#/jobs" : jobHref(name) }, "Cancel")));
  errors.set("schedule", form.querySelector("[data-field=schedule]"));
  errors.set("timezone", errors.get("schedule"));
  errors.set("retry.max_attempts", errors.get("retry"));
  page.append(form, error,
    el("p", { class: "muted" }, "Next five fire times of the schedule above, in its time zone:"), preview);
  lock();
  check();
}

const RUN_STATES = ["pending", "queued", "running", "retrying", "succeeded", "failed", "dead",
  "cancelled", "skipped", "lost"];

// Runs, newest first, filtered by job, state and group, paged by keyset: "Older" passes the
// page's `next_before` as `before`. The `trail` parameter remembers the `before` of every page
// on the way (`top` for the first), so "Newer" goes back exactly one page. `backfill=ID` (the
// job page's links) lists one backfill's runs, under its job, state and progress.
async function runs(page, query) {
  const params = new URLSearchParams(query);
  const api_params = new URLSearchParams();
  for (const key of ["job", "state", "group", "backfill", "before", "limit"]) {
    if (params.get(key)) api_params.set(key, params.get(key));
  }
  if (!api_params.get("limit")) api_params.set("limit", "50");
  const backfillId = params.get("backfill");
  const [data, zones, backfill] = await Promise.all([api("GET", "/api/runs?" + api_params), jobZones(),
    backfillId ? api("GET", "/api/backfills/" + encodeURIComponent(backfillId)) : null]);
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
  backfillId ? el("input", { type: "hidden", name: "backfill", value: backfillId }) : null,
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
  page.append(...[el("h1", {}, backfill ? "Runs of backfill " + backfill.id : "Runs"),
    backfill ? el("p", { id: "backfill-summary", class: "toolbar", "data-state": backfill.state },
      "job ", el("a", { href: jobHref(backfill.job) }, backfill.job),
      badge(backfill.state, BACKFILL_BADGE[backfill.state] || "muted"),
      el("span", { class: "progress-text" }, backfill.progress),
      el("a", { class: "button", href: "#/runs" }, "All runs")) : null,
    form, runTable(data.runs, (r) => zones.get(r.job) || "UTC", true),
    el("p", { class: "pager" },
      newer ? el("a", { id: "newer", href: "#/runs?" + newer }, "← Newer") : null, " ",
      data.next_before ? el("a", { id: "older", href: "#/runs?" + older }, "Older →") : null),
  ].filter((node) => node !== null));
  page.refresh = [3000, () => edited || form.contains(document.activeElement)];
}

// A job's time zone and kind, read once per job while the page lives (UTC and no kind for a
// job that is gone).
const jobInfoCache = new Map();
async function jobInfo(name) {
  if (!jobInfoCache.has(name)) {
    let info = { zone: "UTC", kind: null };
    try {
      const j = await api("GET", "/api/jobs/" + encodeURIComponent(name));
      info = { zone: j.timezone || "UTC", kind: (j.spec && j.spec.kind) || "single" };
    } catch (e) {
      // Deleted jobs keep their runs; their times show in UTC.
    }
    jobInfoCache.set(name, info);
  }
  return jobInfoCache.get(name);
}

async function jobZone(name) {
  return (await jobInfo(name)).zone;
}

async function run(page, id) {
  const r = await api("GET", "/api/runs/" + encodeURIComponent(id));
  const [info, tasks] = await Promise.all([jobInfo(r.job),
    r.tasks_total > 0 ? api("GET", "/api/runs/" + r.id + "/tasks?limit=" + TASK_GRID_MAX) : null]);
  const zone = info.zone;
  const at = (iso) => zoned(iso, zone);
  const parent = r.parent;
  // A run of a workflow is a workflow run: its nodes are on its own page.
  const workflowRun = info.kind === "workflow" && !parent && r.trigger !== "workflow";
  const fields = [
    ["job", r.job], ["group", r.group], ["trigger", r.trigger], ["requested by", r.requested_by],
    workflowRun ? ["workflow run", el("a", { id: "workflow-run-link", href: workflowRunHref(r.id) },
      "its nodes and DAG")] : null,
    r.backfill_id !== null && r.backfill_id !== undefined ? ["backfill", backfillLink(r.backfill_id)] : null,
    r.upstream_run_id !== null && r.upstream_run_id !== undefined ? ["after run", runLink(r.upstream_run_id)] : null,
    r.children && r.children.length > 0 ? ["child runs", el("span", { class: "stack", id: "run-children" },
      ...r.children.map((c) => el("span", { class: "nowrap" }, runLink(c.id), " " + c.job + " ", stateCell(c.state))))] : null,
    r.job_version !== null && r.job_version !== undefined
      ? ["job version", el("a", { href: jobHref(r.job), title: "the job page lists its versions" }, "version " + r.job_version)] : null,
    parent ? ["task of", el("span", {}, runLink(parent.id), " ", stateCell(parent.state),
      parent.progress ? " " + parent.progress : "")] : null,
    parent ? ["task", r.task_key + " (" + taskPlace(r) + ")"] : null,
    ["attempt", r.attempt], ["worker", r.worker_id], ["params", r.params], ["reason", r.reason],
    ["error", r.error],
    r.output !== null && r.output !== undefined ? ["output", el("pre", { id: "run-output", class: "payload" },
      r.output_truncated ? r.output : JSON.stringify(r.output, null, 2))] : null,
    ["scheduled", at(r.scheduled_at)], ["created", at(r.created_at)],
    ["published", at(r.published_at)], ["started", at(r.started_at)],
    ["finished", at(r.finished_at)], ["next attempt", at(r.next_attempt_at)],
    ["took", duration(runMs(r))],
  ].filter((f) => f !== null);
  const live = !TERMINAL.has(r.state);
  const logs = logBox(r, zone);
  const retry = TERMINAL.has(r.state) && r.tasks_failed > 0
    ? actionButton("Retry failed tasks", "retry-failed", async () => {
      const done = await api("POST", "/api/runs/" + r.id + "/retry-failed");
      return "Rerunning " + done.rerun + " task" + (done.rerun === 1 ? "" : "s") + " of run #" + r.id;
    }) : null;
  page.append(...[
    el("h1", {}, "Run #" + r.id + " ", el("span", { id: "run-state", class: "state state-" + r.state }, r.state)),
    live ? actionButton("Cancel", "cancel", async () => {
      const c = await api("POST", "/api/runs/" + r.id + "/cancel");
      return "Cancel: " + c.outcome;
    }) : null,
    retry,
    tasks ? taskSection(r, tasks) : null,
    el("table", { class: "fields" }, fields.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v instanceof Node ? v : show(v))))),
    el("h2", {}, "Attempts"),
    table([["attempt", (a) => a.attempt], ["worker", (a) => a.worker_id], ["state", (a) => stateCell(a.state)],
      ["started", (a) => at(a.started_at)], ["finished", (a) => at(a.finished_at)],
      ["duration", (a) => duration(a.duration_ms)], ["error", (a) => a.error]],
    r.attempts),
    el("h2", {}, "Log", live ? el("span", { class: "muted" }, " (live)") : null),
    logs.box,
  ].filter((node) => node !== null));
  page.shown = logs.shown;
  if (live) page.refresh = [1000];
}

// Most tasks the run page draws in its grid (one API page); a larger run says how many more.
const TASK_GRID_MAX = 1000;

// Where a task sits in its run, in words: `shard 3/12`, `worker w-1`, `step resize`, `root`.
function taskPlace(t) {
  if (t.task_kind === "shard") return "shard " + t.shard_index + "/" + t.shard_total;
  if (t.task_kind === "broadcast") return "worker " + t.target_worker;
  if (t.task_kind === "map") return "step " + t.map_step + " (depth " + t.map_depth + ")";
  return t.task_kind || "task";
}

// A parent run's tasks: a progress bar (succeeded green, failed red, of all tasks) with the
// progress in words, and a grid with one cell per task coloured by its state; a cell's tooltip
// names the task, its worker, attempt and shard, a click opens the task's own run page. The
// run page renders again every second while the run is live, and these with it.
function taskSection(r, page) {
  const total = Math.max(r.tasks_total, 1);
  const ok = r.tasks_ended - r.tasks_failed;
  const width = (n) => (100 * n / total).toFixed(2) + "%";
  const bar = el("div", { id: "task-progress-bar", class: "progress", role: "progressbar",
    "aria-valuemin": 0, "aria-valuemax": r.tasks_total, "aria-valuenow": r.tasks_ended },
  el("div", { class: "progress-ok", "data-width": width(ok) }),
  el("div", { class: "progress-failed", "data-width": width(r.tasks_failed) }));
  // Widths through the CSSOM: the page's Content-Security-Policy forbids inline styles.
  for (const part of bar.children) part.style.width = part.dataset.width;
  const cells = page.tasks.map((t) => el("a", {
    class: "cell bar-" + t.state, href: "#/runs/" + t.id, "data-task-id": t.id, "data-state": t.state,
    title: [t.task_key, t.state, "worker " + (t.worker_id || t.target_worker || "—"),
      "attempt " + t.attempt, taskPlace(t)].join(" · "),
  }));
  const states = Object.entries(r.tasks_by_state || {}).map(([s, n]) => n + " " + s).join(", ");
  const rest = r.tasks_total - page.tasks.length;
  return el("div", { id: "tasks" },
    el("h2", {}, "Tasks"),
    el("p", {}, el("span", { id: "task-progress", class: "progress-text" }, r.progress || "no tasks"),
      states ? el("span", { class: "muted" }, " (" + states + ")") : null),
    bar,
    el("div", { id: "task-grid", class: "task-grid" }, cells),
    page.next_after ? el("p", { id: "task-more", class: "muted" },
      "The first " + page.tasks.length + " tasks are shown; " + rest + " more: chime runs show " +
      r.id + " --tasks-after " + page.next_after) : null,
    el("ul", { class: "legend" }, [...new Set(page.tasks.map((t) => t.state))].map((s) =>
      el("li", {}, el("span", { class: "swatch bar-" + s }), " " + s))));
}

// The run's log box. While the run is live its page renders again every second: the lines
// already shown move over to the new box and only the lines after them (the API returns them
// oldest first, and a run's lines are only ever appended) are added, so a reader's selection and
// scroll position survive; the box follows new lines unless the reader scrolled up.
function logBox(r, zone) {
  const old = document.getElementById("logs");
  const same = old && old.dataset.runId === String(r.id);
  const shown = same ? Number(old.dataset.lines) : 0;
  const box = el("pre", { id: "logs", class: "logs", "data-run-id": r.id, "data-lines": r.logs.length });
  if (same) box.append(...old.childNodes);
  box.append(...r.logs.slice(shown).map((l) =>
    el("span", { class: "line" }, localText(l.at, zone) + " [" + l.attempt + "] " + l.level + " " + l.message + "\n")));
  const follow = !same || old.scrollTop + old.clientHeight >= old.scrollHeight - 4;
  const top = same ? old.scrollTop : 0;
  return { box, shown: () => { box.scrollTop = follow ? box.scrollHeight : top; } };
}

// ---- workflows ------------------------------------------------------------------------------

// A workflow (docs/workflows.md) is a job of kind workflow; each fire is a workflow run, whose
// nodes' runs are ordinary runs of their jobs (with their own run pages, attempts and logs).

function workflowHref(name) {
  return "#/workflows/" + encodeURIComponent(name);
}

function workflowRunHref(id) {
  return "#/workflows/runs/" + id;
}

function workflowRunLink(id) {
  return el("a", { class: "workflow-run-link", href: workflowRunHref(id) }, "#" + id);
}

// A field table's rows from [label, value] pairs (null pairs left out).
function fieldRows(fields) {
  return fields.filter((f) => f !== null).map(([k, v]) =>
    el("tr", {}, el("th", {}, k), el("td", {}, v instanceof Node ? v : show(v))));
}

// The workflows: size, schedule, state and latest run of each, by name.
async function workflows(page) {
  const { workflows } = await api("GET", "/api/workflows");
  const last = await Promise.all(workflows.map((w) =>
    api("GET", workflowRunsPath(w.name, 1)).then((p) => p.runs[0])));
  const lastRun = new Map(workflows.map((w, i) => [w.name, last[i]]));
  page.append(el("h1", {}, "Workflows"), workflows.length
    ? table([
      ["name", (w) => el("a", { class: "clip", title: w.name, href: workflowHref(w.name) }, w.name)],
      ["nodes", (w) => w.nodes], ["layers", (w) => w.layers],
      ["schedule", (w) => el("code", { class: "nowrap" }, w.schedule)],
      ["state", pauseBadge],
      ["last run", (w) => { const r = lastRun.get(w.name); return r ? el("span", { class: "nowrap" }, workflowRunLink(r.id), " ", stateCell(r.state)) : "—"; }],
      ["description", (w) => (w.description ? el("span", { class: "clip wide", title: w.description }, w.description) : "—")],
    ], workflows, (w) => ({ "data-workflow": w.name }))
    : el("p", { id: "workflows-none", class: "muted" },
      "No workflows. A workflow is declared under [[workflows]] in a job file, or created as a job of kind workflow."));
}

// Runs of a workflow the workflow page lists, newest first.
const WORKFLOW_RUNS_SHOWN = 20;

function workflowRunsPath(name, limit) {
  return "/api/workflows/" + encodeURIComponent(name) + "/runs?limit=" + (limit || WORKFLOW_RUNS_SHOWN);
}

// One workflow: its definition, its DAG (a node opens its job), and its recent runs, each
// opening its workflow run page; the list follows new runs and their states in place.
async function workflow(page, name) {
  const enc = encodeURIComponent(name);
  const [w, j, recent] = await Promise.all([api("GET", "/api/workflows/" + enc),
    api("GET", "/api/jobs/" + enc), api("GET", workflowRunsPath(name))]);
  const zone = j.timezone;
  const spec = j.spec;
  const dag = dagView(w.nodes, null);
  page.append(
    el("h1", {}, "Workflow " + w.name + " ", pauseBadge(j)),
    el("p", { class: "toolbar" }, jobActions(j),
      el("a", { id: "workflow-job", class: "button", href: jobHref(name) }, "Job page")),
    dag.element,
    el("h2", {}, "Definition"),
    el("table", { class: "fields", id: "workflow-definition" }, fieldRows([
      ["schedule", el("code", {}, j.schedule)], ["time zone", zone],
      ["next fire", zoned(j.next_fire_local || j.next_fire, zone)],
      ["nodes", w.nodes.length + " in " + w.layers + " layer" + (w.layers === 1 ? "" : "s")],
      ["description", w.description], ["timeout", spec.timeout || "none"],
      ["concurrency", CONCURRENCY[spec.concurrency] || spec.concurrency],
      ["params", spec.params === undefined || spec.params === null ? "none"
        : el("pre", { class: "payload" }, JSON.stringify(spec.params, null, 2))],
      ["source", w.source === "api" ? "created through the API" : "job file"],
    ])),
    el("h2", {}, "Recent runs"),
    workflowRunList(recent.runs, zone));
  page.shown = dag.fit;
  page.refresh = [3000, null, () => redrawWorkflowRuns(name, zone)];
}

function workflowRunList(runs, zone) {
  const box = el("div", { id: "workflow-runs", "data-sig": JSON.stringify(runs) });
  if (!runs.length) box.append(el("p", { class: "muted" }, "No runs yet."));
  else {
    box.append(table([
      ["run", (r) => workflowRunLink(r.id)], ["state", (r) => stateCell(r.state)], ["trigger", runTrigger],
      ["scheduled", (r) => zoned(r.scheduled_at, zone)], ["started", (r) => zoned(r.started_at, zone)],
      ["finished", (r) => zoned(r.finished_at, zone)],
      ["duration", (r) => el("span", { class: "nowrap" }, duration(runMs(r)))],
      ["reason", (r) => (r.reason ? el("span", { class: "clip wide", title: r.reason }, r.reason) : "—")],
    ], runs, (r) => ({ "data-run-id": r.id, "data-state": r.state })));
  }
  return box;
}

// Reads the workflow's runs again and redraws their list in place when it changed; every 3 s
// while the page is open (new runs come from its schedule).
async function redrawWorkflowRuns(name, zone) {
  const mine = rendering;
  const again = () => refreshIn(3000, null, () => redrawWorkflowRuns(name, zone));
  let recent;
  try {
    recent = await api("GET", workflowRunsPath(name));
  } catch (e) {
    if (e.message === "unauthenticated" || mine !== rendering) return;
    notice(e.message, true);
    again();
    return;
  }
  const old = document.getElementById("workflow-runs");
  if (mine !== rendering || !old) return;
  if (old.dataset.sig !== JSON.stringify(recent.runs)) old.replaceWith(workflowRunList(recent.runs, zone));
  again();
}

// A node's state in a workflow run: its current run's, or `waiting` while it has none.
function nodeState(n) {
  return n.run ? n.run.state : "waiting";
}

// One workflow run: its state and times, Cancel (operators, while it has not ended), its DAG
// with each node coloured by its run's state (a node opens its run's page), and its nodes as a
// table with a Rerun from each (operators, once the run has ended). While the run has not
// ended the page reads it every second and updates what changed in place: the DAG is drawn
// once, only its nodes' states change.
async function workflowRun(page, id) {
  const v = await api("GET", "/api/workflows/runs/" + encodeURIComponent(id));
  const zone = await jobZone(v.workflow);
  const dag = dagView(v.nodes, v);
  page.append(workflowRunHead(v, zone), dag.element, el("h2", {}, "Details"), workflowRunFields(v, zone),
    el("h2", {}, "Nodes"), nodeTable(v, zone));
  page.shown = dag.fit;
  if (!TERMINAL.has(v.state)) page.refresh = [1000, null, () => redrawWorkflowRun(v.id, zone)];
}

async function redrawWorkflowRun(id, zone) {
  const mine = rendering;
  let v;
  try {
    v = await api("GET", "/api/workflows/runs/" + id);
  } catch (e) {
    if (e.message === "unauthenticated" || mine !== rendering) return;
    notice(e.message, true);
    refreshIn(1000, null, () => redrawWorkflowRun(id, zone));
    return;
  }
  const graph = document.getElementById("wf-dag");
  if (mine !== rendering || !graph || graph.getAttribute("data-run-id") !== String(id)) return;
  for (const fresh of [workflowRunHead(v, zone), workflowRunFields(v, zone)]) {
    const old = document.getElementById(fresh.id);
    if (old && old.dataset.sig !== fresh.dataset.sig) old.replaceWith(fresh);
  }
  if (graph.getAttribute("data-shape") === dagShape(v.nodes)) paintDag(graph, v.nodes, v);
  else document.getElementById("wf-dag-section").replaceWith(dagView(v.nodes, v).element);
  updateNodeTable(v, zone);
  if (!TERMINAL.has(v.state)) refreshIn(1000, null, () => redrawWorkflowRun(id, zone));
}

// How many of the nodes are in each state, in words: `3 of 7 nodes ended: 2 succeeded, …`.
function nodeProgress(nodes) {
  const counts = new Map();
  for (const n of nodes) counts.set(nodeState(n), (counts.get(nodeState(n)) || 0) + 1);
  const ended = nodes.filter((n) => TERMINAL.has(nodeState(n))).length;
  const parts = RUN_STATES.concat(["waiting"]).filter((s) => counts.has(s)).map((s) => counts.get(s) + " " + s);
  return ended + " of " + nodes.length + " node" + (nodes.length === 1 ? "" : "s") + " ended: " + parts.join(", ");
}

// The workflow run's heading: its state, Cancel (operators, while it has not ended), links and
// its nodes' states in words. `data-sig` says what it shows, so a poll that changed none of it
// leaves it as it is (and a button under the pointer where it is).
function workflowRunHead(v, zone) {
  const live = !TERMINAL.has(v.state);
  const progress = nodeProgress(v.nodes);
  const cancel = live && mayOperate() ? actionButton("Cancel", "cancel-workflow", async () => {
    const c = await api("POST", "/api/workflows/runs/" + v.id + "/cancel");
    return "Cancel of workflow run #" + v.id + ": " + c.outcome;
  }, () => redrawWorkflowRun(v.id, zone)) : null;
  return el("div", { id: "wf-run-head", "data-state": v.state,
    "data-sig": JSON.stringify([v.state, v.workflow, progress, mayOperate()]) },
  el("h1", {}, "Workflow run #" + v.id + " ",
    el("span", { id: "wf-run-state", class: "state state-" + v.state }, v.state)),
  el("p", { class: "toolbar" }, cancel,
    el("a", { id: "wf-workflow-link", class: "button", href: workflowHref(v.workflow) }, "Workflow " + v.workflow),
    el("a", { id: "wf-run-link", class: "button", href: "#/runs/" + v.id }, "Run page"),
    el("span", { id: "wf-progress" }, progress)));
}

// The workflow run's fields: reason, trigger, round, times and params.
function workflowRunFields(v, zone) {
  const at = (iso) => zoned(iso, zone);
  return el("table", { class: "fields", id: "wf-run-fields",
    "data-sig": JSON.stringify(Object.assign({}, v, { nodes: null })) }, fieldRows([
    ["workflow", el("a", { href: workflowHref(v.workflow) }, v.workflow)],
    ["state", stateCell(v.state)],
    ["reason", v.reason],
    ["trigger", v.trigger],
    ["round", el("span", { id: "wf-round", title: "0, one more per rerun" }, String(v.round))],
    ["scheduled", at(v.scheduled_at)], ["started", at(v.started_at)],
    ["finished", at(v.finished_at)], ["took", duration(runMs(v))],
    ["deadline", at(v.deadline_at)],
    ["cancel", v.cancel_requested ? "requested" : "not requested"],
    ["params", el("pre", { id: "wf-params", class: "payload" }, JSON.stringify(v.params, null, 2))],
  ]));
}

// The nodes as a table, one row per node (`data-node`), updated row by row.
function nodeColumns(v, zone) {
  const at = (iso) => zoned(iso, zone);
  const rerun = TERMINAL.has(v.state) && mayOperate();
  const when = (e) => e.node + (e.when === "success" ? "" : " (" + e.when + ")");
  return [
    ["node", (n) => el("span", { class: "clip", title: n.name }, n.name)],
    ["job", (n) => el("a", { class: "clip", title: n.job, href: jobHref(n.job) }, n.job)],
    ["state", (n) => stateCell(nodeState(n))],
    ["run", (n) => (n.run ? runLink(n.run.id) : "—")],
    rerun ? ["", (n) => rerunButton(v, n, zone)] : null,
    ["attempt", (n) => (n.run ? n.run.attempt : "—")],
    ["after", (n) => (n.after.length ? clipped(n.after.map(when).join(", ")) : "—")],
    ["on failure", (n) => n.on_failure],
    ["layer", (n) => n.layer],
    ["started", (n) => at(n.run && n.run.started_at)],
    ["finished", (n) => at(n.run && n.run.finished_at)],
    ["duration", (n) => el("span", { class: "nowrap" }, duration(n.run ? runMs(n.run) : null))],
    ["reason", (n) => (n.run && n.run.reason ? el("span", { class: "clip wide", title: n.run.reason }, n.run.reason) : "—")],
    ["earlier rounds", (n) => el("span", { class: "earlier-runs" }, String(n.earlier_runs))],
  ].filter((c) => c !== null);
}

function nodeRow(columns, n) {
  return tableRow(columns, n, { "data-node": n.name, "data-state": nodeState(n),
    "data-sig": JSON.stringify([n.run, n.earlier_runs]) });
}

function nodeTable(v, zone) {
  const columns = nodeColumns(v, zone);
  return el("div", { id: "wf-nodes", "data-columns": columns.length },
    el("table", {},
      el("thead", {}, el("tr", {}, columns.map(([label]) => el("th", {}, label)))),
      el("tbody", {}, v.nodes.map((n) => nodeRow(columns, n)))));
}

// Redraws the rows whose node changed (all of them when the columns did: Rerun comes with the
// run's end).
function updateNodeTable(v, zone) {
  const old = document.getElementById("wf-nodes");
  const columns = nodeColumns(v, zone);
  const rows = old ? old.querySelectorAll("tbody tr") : [];
  if (!old || old.dataset.columns !== String(columns.length) || rows.length !== v.nodes.length) {
    if (old) old.replaceWith(nodeTable(v, zone));
    return;
  }
  v.nodes.forEach((n, i) => {
    const row = rows[i];
    if (row.dataset.node !== n.name || row.dataset.sig !== JSON.stringify([n.run, n.earlier_runs])) {
      row.replaceWith(nodeRow(columns, n));
    }
  });
}

function rerunButton(v, n, zone) {
  const button = actionButton("Rerun from here", "rerun", async () => {
    const x = await api("POST", "/api/workflows/runs/" + v.id + "/rerun", { node: n.name });
    const named = x.nodes.length > 10 ? x.nodes.slice(0, 10).join(", ") + " and " + (x.nodes.length - 10) + " more"
      : x.nodes.join(", ");
    return "Rerunning workflow run #" + x.run_id + " from " + n.name + " in round " + x.round + ": " + named;
  }, () => redrawWorkflowRun(v.id, zone));
  button.setAttribute("data-node", n.name);
  button.setAttribute("aria-label", "Rerun workflow run #" + v.id + " from node " + n.name);
  return button;
}

// ---- the DAG: SVG built here, no library -----------------------------------------------------

// Node boxes and the gaps between them, in SVG units (pixels at 100%).
const DAG = { w: 160, h: 40, gapX: 70, gapY: 16, pad: 12 };

// The layered layout: a column per layer (the API's `layer`: 0 for the nodes after none, else
// the longest path from those), and in each column the nodes one under the other, each column
// centred on the tallest. Layer 0 keeps the definition's order; each next layer is ordered by
// the mean row of the nodes its nodes come after, which keeps edges short and crossings few.
// Linear in nodes and edges: a 1,000-node DAG lays out in milliseconds.
function dagLayout(nodes) {
  const index = new Map(nodes.map((n, i) => [n.name, i]));
  const layers = [];
  nodes.forEach((n, i) => {
    if (!layers[n.layer]) layers[n.layer] = [];
    layers[n.layer].push(i);
  });
  let tallest = 1;
  for (const members of layers) tallest = Math.max(tallest, members ? members.length : 0);
  const row = new Float64Array(nodes.length);
  const pos = new Array(nodes.length);
  layers.forEach((members, depth) => {
    if (depth > 0) {
      const mean = new Map(members.map((i) => {
        const ups = nodes[i].after.map((e) => index.get(e.node)).filter((u) => u !== undefined);
        return [i, ups.length ? ups.reduce((sum, u) => sum + row[u], 0) / ups.length : tallest];
      }));
      members.sort((a, b) => mean.get(a) - mean.get(b) || a - b);
    }
    const offset = (tallest - members.length) / 2;
    members.forEach((i, r) => {
      row[i] = offset + r;
      pos[i] = { x: DAG.pad + depth * (DAG.w + DAG.gapX), y: DAG.pad + (offset + r) * (DAG.h + DAG.gapY) };
    });
  });
  return { index, pos,
    width: 2 * DAG.pad + layers.length * (DAG.w + DAG.gapX) - DAG.gapX,
    height: 2 * DAG.pad + tallest * (DAG.h + DAG.gapY) - DAG.gapY };
}

// What the drawing depends on (names, layers, edges): a poll redraws the DAG only if it changed.
function dagShape(nodes) {
  return JSON.stringify(nodes.map((n) => [n.name, n.layer, n.after.map((e) => e.node + " " + e.when)]));
}

// `text` cut to `max` characters with an ellipsis (the whole of it is in the node's tooltip).
function cut(text, max) {
  return text.length > max ? text.slice(0, max - 1) + "…" : text;
}

const EDGE_WHENS = ["success", "failure", "always"];

// The DAG of `nodes` as SVG: an edge (`path.wf-edge`, dashed for `failure`, dotted for
// `always`) from each node in a node's `after` to it, and a rounded box per node
// (`a.wf-node`) with its name and job. With `v` (a workflow run) a box is coloured by its
// node's run state and opens that run's page; without, it is the definition's and opens the
// node's job. Returns the drawing with its zoom buttons and legend, and `fit`, which sizes it
// to the page's width once it is shown (no smaller than 60%, then it scrolls).
function dagView(nodes, v) {
  const layout = dagLayout(nodes);
  const { width, height } = layout;
  const graph = svg("svg", { id: "wf-dag", class: "dag", width, height, viewBox: "0 0 " + width + " " + height,
    role: "group", "data-run-id": v ? v.id : null, "data-shape": dagShape(nodes),
    "aria-label": "the DAG: " + nodes.length + " nodes, a column per layer" });
  graph.append(svg("defs", {}, ...EDGE_WHENS.map((when) =>
    svg("marker", { id: "wf-arrow-" + when, class: "wf-arrow when-" + when, viewBox: "0 0 8 8", refX: 8, refY: 4,
      markerWidth: 7, markerHeight: 7, orient: "auto" }, svg("path", { d: "M0 0L8 4L0 8z" })))));
  const edges = svg("g", { class: "wf-edges" });
  const boxes = svg("g", { class: "wf-nodes" });
  const elements = new Map();
  nodes.forEach((n, i) => {
    const to = layout.pos[i];
    for (const e of n.after) {
      const u = layout.index.get(e.node);
      if (u === undefined) continue;
      const from = layout.pos[u];
      const [x1, y1, x2, y2] = [from.x + DAG.w, from.y + DAG.h / 2, to.x - 1, to.y + DAG.h / 2];
      const c = Math.max(24, (x2 - x1) / 2);
      edges.append(svg("path", { class: "wf-edge when-" + e.when, "data-from": e.node, "data-to": n.name,
        "data-when": e.when, "marker-end": "url(#wf-arrow-" + e.when + ")",
        d: "M" + x1 + " " + y1 + "C" + (x1 + c) + " " + y1 + " " + (x2 - c) + " " + y2 + " " + x2 + " " + y2 },
      svg("title", {}, e.node + " → " + n.name + " (when = " + e.when + ")")));
    }
    const node = svg("a", { class: "wf-node", "data-node": n.name, transform: "translate(" + to.x + " " + to.y + ")" },
      svg("rect", { class: "wf-box", width: DAG.w, height: DAG.h, rx: 6, ry: 6 }),
      svg("text", { class: "wf-name", x: 8, y: 16 }, cut(n.name, 21)),
      svg("text", { class: "wf-job", x: 8, y: 31 }, cut(n.job, 24)),
      svg("title", {}, ""));
    elements.set(n.name, node);
    boxes.append(node);
  });
  graph.append(edges, boxes);
  graph.nodeElements = elements;
  const legend = el("ul", { id: "wf-legend", class: "legend" });
  graph.legend = legend;
  paintDag(graph, nodes, v);

  const box = el("div", { id: "wf-dag-box", class: "dag-box" }, graph);
  const level = el("span", { id: "wf-zoom", class: "muted" });
  const zoom = (scale) => {
    const s = Math.min(2, Math.max(0.1, scale));
    graph.setAttribute("width", Math.round(width * s));
    graph.setAttribute("height", Math.round(height * s));
    graph.setAttribute("data-scale", s.toFixed(3));
    level.textContent = Math.round(s * 100) + "%";
  };
  const scale = () => Number(graph.getAttribute("data-scale"));
  const room = () => Math.max(1, box.clientWidth - 2);
  zoom(1);
  const button = (id, label, title, onclick) => el("button", { type: "button", id, title, onclick }, label);
  const element = el("div", { id: "wf-dag-section" },
    el("p", { class: "toolbar" },
      button("wf-zoom-out", "−", "zoom out", () => zoom(scale() / 1.25)),
      button("wf-zoom-in", "+", "zoom in", () => zoom(scale() * 1.25)),
      button("wf-zoom-reset", "100%", "actual size", () => zoom(1)),
      button("wf-zoom-all", "Whole DAG", "fit the whole DAG in view", () =>
        zoom(Math.min(1, room() / width, Math.max(1, window.innerHeight * 0.75 - 2) / height))),
      level,
      el("span", { class: "muted" }, " " + nodes.length + " node" + (nodes.length === 1 ? "" : "s") +
        (v ? "; a node opens its run" : "; a node opens its job"))),
    box, legend);
  return { element, fit: () => zoom(Math.min(1, Math.max(0.6, room() / width))) };
}

// Sets each node's state (class `state-STATE`, `data-state`), link and tooltip, touching only
// the nodes that changed, and the legend of the states shown.
function paintDag(graph, nodes, v) {
  const seen = new Set();
  for (const n of nodes) {
    const node = graph.nodeElements.get(n.name);
    const state = v ? nodeState(n) : "definition";
    seen.add(state);
    const sig = JSON.stringify([state, n.run, n.earlier_runs]);
    if (!node || node.getAttribute("data-sig") === sig) continue;
    node.setAttribute("data-sig", sig);
    node.setAttribute("class", "wf-node state-" + state);
    node.setAttribute("data-state", state);
    const href = v ? (n.run ? "#/runs/" + n.run.id : null) : jobHref(n.job);
    if (href) node.setAttribute("href", href);
    else node.removeAttribute("href");
    if (n.run) node.setAttribute("data-run-id", n.run.id);
    else node.removeAttribute("data-run-id");
    node.querySelector("rect").setAttribute("class", "wf-box " + (v && n.run ? "bar-" + state : "wf-box-" + state));
    const r = n.run;
    node.querySelector("title").textContent = [n.name, "job " + n.job,
      v ? state + (r ? " (run #" + r.id + ", attempt " + r.attempt + ", round " + r.round + ")" : ": no run yet") : null,
      r && r.reason ? r.reason : null,
      n.earlier_runs ? n.earlier_runs + " earlier round" + (n.earlier_runs === 1 ? "" : "s") : null,
      n.after.length ? "after " + n.after.map((e) => e.node + (e.when === "success" ? "" : " (" + e.when + ")")).join(", ") : null,
      "on failure: " + n.on_failure,
    ].filter((line) => line !== null).join("\n");
  }
  const states = v ? RUN_STATES.concat(["waiting"]).filter((s) => seen.has(s)) : [];
  const key = JSON.stringify(states);
  if (graph.legend.getAttribute("data-key") === key) return;
  graph.legend.setAttribute("data-key", key);
  graph.legend.replaceChildren(
    ...states.map((s) => el("li", {}, el("span", { class: "swatch " + (s === "waiting" ? "swatch-waiting" : "bar-" + s) }), " " + s)),
    ...EDGE_WHENS.map((when) => el("li", {}, el("span", { class: "edge-key when-" + when }), " after, when = " + when)));
}

// Workers, online first: state as a badge, load against capacity, the jobs each handles as a
// list. Worker times are in UTC (a worker serves jobs of many zones).
async function workers(page) {
  const { workers } = await api("GET", "/api/workers");
  const rank = (w) => (w.online ? 0 : w.stopped_at ? 2 : 1);
  const sorted = workers.slice().sort((a, b) => rank(a) - rank(b) || a.group.localeCompare(b.group) || a.id.localeCompare(b.id));
  const stateOf = (w) => (w.online ? badge("online", "good") : w.stopped_at ? badge("stopped", "muted") : badge("lost", "bad"));
  const ago = (iso) => {
    const s = Math.max(0, Date.now() - new Date(iso));
    return el("span", { class: "nowrap", title: time(iso) }, duration(s) + " ago");
  };
  page.append(el("h1", {}, "Workers"),
    el("p", { class: "muted" }, workers.filter((w) => w.online).length + " of " + workers.length + " online"),
    table([
      ["worker", (w) => clipped(w.id)], ["state", stateOf], ["group", (w) => clipped(w.group)],
      ["host", (w) => clipped(w.hostname)],
      ["running", (w) => el("span", { class: "nowrap" }, w.running + " of " + w.capacity)],
      ["capacity", (w) => w.capacity],
      ["jobs", (w) => (w.jobs.length ? el("ul", { class: "jobs" }, w.jobs.map((name) =>
        el("li", {}, el("a", { href: jobHref(name) }, name)))) : "—")],
      ["last heartbeat", (w) => ago(w.heartbeat_at)],
      ["started", (w) => el("span", { class: "nowrap", title: time(w.started_at) }, time(w.started_at))],
      ["stopped", (w) => (w.stopped_at ? time(w.stopped_at) : "—")],
    ], sorted, (w) => ({ "data-worker": w.id, "data-online": String(w.online) })));
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

// Renders the page again after `ms` (or, with `render`, the part of it that `render` redraws),
// unless another page was opened or rendered since; while `busy()` says so (the operator is
// editing a form on the page), it waits another `ms`. A page function does not call it but
// sets `page.refresh` to its arguments, and route() calls it once that page is shown: a page
// that finished loading after a newer route() began (the overview, still loading when a link
// was followed) is never shown, so its timer would re-render the newer page.
function refreshIn(ms, busy, render) {
  clearTimeout(timer);
  const hash = location.hash;
  const mine = rendering;
  timer = setTimeout(() => {
    if (location.hash !== hash || mine !== rendering) return;
    if (busy && busy()) refreshIn(ms, busy, render);
    else (render || route)();
  }, ms);
}

async function route() {
  clearTimeout(timer);
  const mine = ++rendering;
  if (!sessionStorage.getItem(TOKEN_KEY)) return logout("");
  const [path, query] = (location.hash.slice(1) || "/overview").split("?");
  const parts = path.split("/").filter(Boolean);
  const pages = { overview, jobs, workflows, runs, workers, queues, "dead-letters": deadLetters, audit };
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("current", a.getAttribute("href") === "#/" + parts[0]);
  }
  const page = el("section", { id: "page", "data-page": parts.join("/") });
  try {
    if (parts[0] === "runs" && parts[1]) await run(page, parts[1]);
    else if (parts[0] === "jobs" && parts[1] && parts[2] === "edit") await jobForm(page, decodeURIComponent(parts[1]));
    else if (parts[0] === "jobs" && parts[1] && parts[2] === "report") await jobReport(page, decodeURIComponent(parts[1]), query || "");
    else if (parts[0] === "jobs" && parts[1]) await job(page, decodeURIComponent(parts[1]));
    else if (parts[0] === "new-job") await jobForm(page, null);
    else if (parts[0] === "workflows" && parts[1] === "runs" && parts[2]) await workflowRun(page, parts[2]);
    else if (parts[0] === "workflows" && parts[1]) await workflow(page, decodeURIComponent(parts[1]));
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
  if (page.refresh) refreshIn(...page.refresh);
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
  window.addEventListener("hashchange", () => {
    const dialog = document.getElementById("trigger-dialog");
    if (dialog) dialog.remove();
    notice(flash || "", false);
    flash = null;
    if (me) route();
  });
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) login(saved);
  else logout("");
});
