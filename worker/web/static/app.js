// The worker console: polls the JSON API and renders it. Everything shown is set as text
// (textContent, never innerHTML): names, reasons and payloads come from Redis and are hostile.
"use strict";

const REFRESH_MS = 2000;
const DEAD_PAGE = 50;
const store = window.sessionStorage;
const state = {
  token: store.getItem("worker.token") || "",
  operator: store.getItem("worker.operator") || "",
  view: "cluster",
  overview: null,
  deadPage: 1,
  dead: null,
  selected: new Set(),
  detail: null,
  timer: null,
  busy: false,
  jobs: { state: "failed", queue: "", task: "", search: "", items: [], cursor: null, pages: 0,
    at: 0, now: 0, detail: null, detailAt: 0 },
  tasks: null,
  tasksAt: 0,
};
const JOBS_EVERY_MS = 5000;   // a list is refetched at most this often
const TASKS_EVERY_MS = 10000;

// -- helpers ------------------------------------------------------------------------------------
const $ = (id) => document.getElementById(id);

// Controls, format characters (bidirectional overrides and isolates, zero-width ones) and line
// separators, shown as visible escapes (\x0a, \u202e): text as text is not enough, a right-to-
// left override still reorders what surrounds it and a line break still breaks a dialog.
// A job id is shown with every one escaped (idText); other text keeps its tabs and line
// breaks (visible), as the command line does.
const CONTROL = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu;
const CONTROL_BUT_LINES = /(?![\t\n])[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu;

function escaped(c) {
  const n = c.codePointAt(0);
  return n < 0x100 ? "\\x" + n.toString(16).padStart(2, "0")
    : "\\u" + n.toString(16).padStart(4, "0");
}

function idText(s) {
  return String(s).replace(CONTROL, escaped);
}

function visible(s) {
  return String(s).replace(CONTROL_BUT_LINES, escaped);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k === "onclick") node.addEventListener("click", v);
    else if (k === "title") node.title = visible(v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(visible(c)));
  }
  return node;
}

function fill(tableId, rows, empty) {
  const body = $(tableId).tBodies[0];
  const cols = $(tableId).tHead.rows[0].cells.length;
  body.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" },
    el("td", { colspan: cols }, empty || "none"))]));
}

function ago(ms, now) {
  if (ms === null || ms === undefined) return "–";
  return duration((now - ms) / 1000) + " ago";
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.max(0, s);
  if (s < 60) return (s < 10 ? s.toFixed(1) : Math.round(s)) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + Math.round(s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.round((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d " + Math.round((s % 86400) / 3600) + "h";
}

function isoAgo(iso, now) {
  return iso ? ago(Date.parse(iso), now) : "–";
}

// Ages and countdowns are computed against the server's "now" sent with the data (now_ms), never
// the browser's clock: one clock for the whole page.
function msIn(at, now) {
  if (at === null || at === undefined) return "–";
  const s = (at - now) / 1000;
  return s >= 0 ? "in " + duration(s) : duration(-s) + " ago";
}

function clock(ms) {
  const d = new Date(ms);  // an out-of-range time (a hostile record) is Invalid Date
  return ms && !isNaN(d) ? d.toISOString().replace("T", " ").slice(0, 19) + "Z" : "–";
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  if (n < 1024) return n + " B";
  if (n < 1048576) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1048576).toFixed(1) + " MiB";
}

function toast(text, ok) {
  const t = $("toast");
  t.textContent = idText(text);  // an answer names job ids
  t.className = ok ? "ok" : "bad";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
}

// -- the API ------------------------------------------------------------------------------------
class AuthError extends Error {}

async function call(path, body) {
  const headers = { "Accept": "application/json" };
  if (state.token) headers["Authorization"] = "Bearer " + state.token;
  if (state.operator) headers["X-Worker-Operator"] = state.operator;
  const init = { headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (resp.status === 401) throw new AuthError((data && data.error) || "token needed");
  if (!resp.ok) throw new Error((data && data.error) || resp.status + " " + resp.statusText);
  return data;
}

async function act(path, body, confirmText) {
  if (confirmText && !window.confirm(idText(confirmText))) return null;
  if (!state.token) {
    showLogin("Actions need the console's token.");
    return null;
  }
  try {
    const out = await call(path, body);
    toast(out.message, out.ok);
    await refresh();
    return out;
  } catch (e) {
    if (e instanceof AuthError) showLogin(e.message);
    else toast(e.message, false);
    return null;
  }
}

// -- sign-in ------------------------------------------------------------------------------------
function showLogin(why) {
  $("login-why").textContent = why || "This console needs its token (WORKER_WEB_TOKEN).";
  if (!$("login").hidden) return;  // already shown (a poll refused again): leave what is typed
  $("login").hidden = false;
  $("operator").value = state.operator;
  $("token").focus();
}

function setupLogin() {
  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    state.token = $("token").value.trim();
    state.operator = $("operator").value.trim();
    store.setItem("worker.token", state.token);
    store.setItem("worker.operator", state.operator);
    $("token").value = "";
    try {
      await call("api/overview");
      $("login").hidden = true;
      $("login-error").textContent = "";
      await refresh();
    } catch (e) {
      $("login-error").textContent = e.message;
    }
  });
  $("signout").addEventListener("click", () => {
    state.token = "";
    store.removeItem("worker.token");
    showLogin("Signed out.");
  });
}

// -- refresh ------------------------------------------------------------------------------------
async function refresh() {
  if (state.busy) return;
  state.busy = true;
  clearTimeout(state.timer);
  try {
    const data = await call("api/overview");
    state.overview = data;
    render(data);
    if (state.view === "dead") await loadDead();
    if (state.view === "jobs") await refreshJobs();
    if (state.view === "queues") await loadTasks(false);
    $("main").hidden = false;
    $("signout").hidden = !state.token;
    $("updated").textContent = "updated " + clock(data.now_ms).slice(11);
    $("updated").className = "";
  } catch (e) {
    if (e instanceof AuthError) {
      showLogin(e.message);
    } else {
      $("updated").textContent = "not updated: " + visible(e.message);
      $("updated").className = "error";
    }
  } finally {
    state.busy = false;
    state.timer = setTimeout(refresh, REFRESH_MS);
  }
}

function render(d) {
  const c = d.cluster, now = d.now_ms;
  $("prefix").textContent = "prefix " + c.prefix;
  $("redis-url").textContent = d.redis_url;
  $("banners").replaceChildren(...d.banners.map((b) =>
    el("div", { class: "banner " + b.level }, b.text)));
  renderCluster(d, now);
  renderSchedules(d, now);
  renderQueues(c, now);
  renderActivity(d, now);
}

function renderCluster(d, now) {
  const c = d.cluster, ld = c.leader;
  $("leader-name").textContent = ld.held ? visible(ld.instance || "?") : "none";
  $("leader-detail").textContent = ld.held
    ? "epoch " + ld.epoch + " · lease age " + duration(ld.lease_age_s) +
      " · ttl " + (ld.ttl_remaining_s === null ? "none" : ld.ttl_remaining_s + "s")
    : "no process holds the lock";
  $("card-leader").className = "card " + (ld.held ? "good" : "bad");
  $("handoff").disabled = !ld.held;
  const live = c.instances.filter((i) => i.alive);
  $("instances-count").textContent = live.length;
  $("apps").textContent = visible(Object.entries(c.apps).map(([a, n]) => a + " (" + n + ")")
    .join(", ")) ||
    "no live instances";
  const queued = c.queues.reduce((s, q) => s + q.depth, 0);
  $("queued").textContent = queued;
  $("queued-detail").textContent = c.queues.reduce((s, q) => s + q.due, 0) + " due now";
  $("dead-count").textContent = c.dead_letters;
  $("dead-badge").textContent = c.dead_letters ? c.dead_letters : "";
  $("doctor-verdict").textContent = d.doctor.ok ? "passing" : "failing";
  $("doctor-detail").textContent = d.doctor.ok ? "every check passes"
    : d.doctor.failed.join(", ");
  $("doctor-verdict").parentElement.className = "card " + (d.doctor.ok ? "good" : "bad");

  fill("instances", c.instances.map((i) => {
    const health = Object.entries(i.health || {});
    const bad = health.filter(([, h]) => h !== "ok");
    return el("tr", { "data-instance": i.name || i.id, class: i.alive ? "" : "stale" },
      el("td", {}, i.name || i.id),
      el("td", {}, i.app || "–"),
      el("td", {}, i.role || "–"),
      el("td", {}, i.version || "–"),
      el("td", { class: "leader-flag" }, i.is_leader ? "leader · epoch " + i.epoch : ""),
      el("td", {}, i.is_leader ? duration(i.lease_age_s) : "–"),
      el("td", { class: "num" }, i.in_flight === undefined ? "–" : i.in_flight),
      el("td", {}, duration(i.heartbeat_age_s) + " ago" + (i.alive ? "" : " · STALE")),
      el("td", { class: bad.length ? "warn" : "",
        title: health.map(([n, h]) => n + ": " + h).join("\n") },
      health.length ? (bad.length ? bad.map(([n, h]) => n + " " + h).join(", ")
        : health.length + " ok") : "–"));
  }), "no instance has registered");

  $("doctor").replaceChildren(...d.doctor.checks.map((ch) =>
    el("li", { class: ch.status, "data-check": ch.name },
      el("span", { class: "mark" }, { ok: "✓", warn: "!", fail: "✗" }[ch.status]),
      el("b", {}, ch.name), " ", ch.summary)));
}

function pauseButtons(kind, name, paused) {
  return paused
    ? el("button", { type: "button", class: "act", "data-action": "resume", "data-name": name,
      onclick: () => act("api/resume", { kind, name }) }, "Resume")
    : el("button", { type: "button", class: "act", "data-action": "pause", "data-name": name,
      onclick: () => act("api/pause", { kind, name }) }, "Pause");
}

function renderSchedules(d, now) {
  renderDuties(d.duties || []);
  fill("runtime-schedules", (d.cluster.schedules || []).map((s) => scheduleRow(s, now)),
    "no run-time schedules (client.schedules)");
}

// Each duty kind's table, as the kind describes it (the overview's "duties"): its columns,
// then a state column and the buttons the kind allows. The page names no kind: a table is
// made the first time its kind shows up, and refilled on every refresh.
function dutyTable(t) {
  let table = $(t.id);
  if (table) return table;
  const extra = t.pausable ? ["state", ""] : (t.triggerable ? [""] : []);
  table = el("table", { id: t.id, "data-kind": t.kind },
    el("thead", {}, el("tr", {}, ...t.headers.concat(extra).map((h) => el("th", {}, h)))),
    el("tbody", {}));
  $("duty-tables").append(el("h2", {}, t.title), table);
  return table;
}

function dutyRow(t, r) {
  const cells = r.cells.map((c) => el("td", { class: c.class, title: c.title || null }, c.text));
  if (t.pausable) cells.push(el("td", { class: "state" }, r.paused ? "paused" : "running"));
  if (t.pausable || t.triggerable) {
    cells.push(el("td", { class: "actions" },
      t.triggerable ? el("button", { type: "button", class: "act", "data-action": "trigger",
        "data-name": r.name, onclick: () => act("api/" + t.kind + "/trigger", { name: r.name }) },
      "Run now") : null,
      t.pausable ? pauseButtons(t.kind, r.name, r.paused) : null));
  }
  return el("tr", { ["data-" + t.kind]: r.name, class: r.paused ? "paused" : "" }, ...cells);
}

function renderDuties(tables) {
  for (const t of tables) {
    dutyTable(t);
    fill(t.id, t.rows.map((r) => dutyRow(t, r)), t.empty);
  }
}

const SVG = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// Jobs per minute over the last hour: stacked bars (done, failed), a y axis in jobs/min and a
// time axis in minutes ago (the points' times are the server's minutes, the newest last).
function chart(points) {
  const w = 360, h = 110, left = 34, right = 6, top = 14, bottom = 20;
  const pw = w - left - right, ph = h - top - bottom;
  const n = points.length || 1, bw = pw / n;
  const peak = Math.max(1, ...points.map((p) => p[1] + p[2]));
  const svg = svgEl("svg", { viewBox: "0 0 " + w + " " + h, width: w, height: h, class: "chart",
    role: "img", "aria-label": "jobs per minute over the last hour" });
  svg.append(svgEl("text", { x: 2, y: 10, class: "unit" }, "jobs/min"));
  for (const [v, y] of [[peak, top], [0, top + ph]]) {
    svg.append(svgEl("text", { x: left - 4, y: y + 4, class: "tick y" }, String(v)));
    svg.append(svgEl("line", { x1: left, x2: left + pw, y1: y, y2: y, class: "grid" }));
  }
  for (const ago of [60, 45, 30, 15, 0]) {
    const x = left + pw - (ago / n) * pw;
    svg.append(svgEl("line", { x1: x, x2: x, y1: top + ph, y2: top + ph + 3, class: "axis" }));
    svg.append(svgEl("text", { x: x, y: h - 4, class: ago ? "tick x" : "tick y" },
      ago ? "-" + ago : "now"));
  }
  svg.append(svgEl("text", { x: left + pw, y: 10, class: "legend" }, "min ago · ■ done ■ failed"));
  points.forEach((p, i) => {
    const done = (p[1] / peak) * ph, failed = (p[2] / peak) * ph;
    for (const [cls, y, hh] of [["done", top + ph - done, done],
      ["failed", top + ph - done - failed, failed]]) {
      if (hh <= 0) continue;
      const r = svgEl("rect", { x: (left + i * bw).toFixed(2), y: y.toFixed(2),
        width: Math.max(1, bw - 1).toFixed(2), height: Math.max(0.5, hh).toFixed(2), class: cls });
      r.append(svgEl("title", {}, clock(p[0]).slice(11, 16) + "Z: " + p[1] + " done, " + p[2] +
        " failed"));
      svg.append(r);
    }
  });
  return svg;
}

// Each queue's backlog now: due (waiting to be claimed) and later (scheduled), in jobs.
function backlogChart(queues) {
  const row = 22, left = 110, w = 520, pw = w - left - 60;
  const h = queues.length * row + 24;
  const peak = Math.max(1, ...queues.map((q) => q.depth));
  const svg = svgEl("svg", { viewBox: "0 0 " + w + " " + h, width: w, height: h,
    class: "chart backlog", role: "img", "aria-label": "backlog per queue, jobs" });
  queues.forEach((q, i) => {
    const y = i * row + 4, due = (q.due / peak) * pw, later = ((q.depth - q.due) / peak) * pw;
    svg.append(svgEl("text", { x: left - 6, y: y + 13, class: "tick y" }, q.queue));
    svg.append(svgEl("rect", { x: left, y: y, width: Math.max(due, 0), height: row - 8,
      class: "due" }));
    svg.append(svgEl("rect", { x: left + due, y: y, width: Math.max(later, 0), height: row - 8,
      class: "later" }));
    svg.append(svgEl("text", { x: left + due + later + 4, y: y + 13, class: "tick" },
      q.depth + " (" + q.due + " due)"));
  });
  const axis = queues.length * row + 4;
  svg.append(svgEl("line", { x1: left, x2: left + pw, y1: axis, y2: axis, class: "axis" }));
  svg.append(svgEl("text", { x: left, y: axis + 14, class: "tick" }, "0"));
  svg.append(svgEl("text", { x: left + pw, y: axis + 14, class: "tick y" }, peak + " jobs"));
  svg.append(svgEl("text", { x: 2, y: axis + 14, class: "legend-left" }, "■ due ■ scheduled"));
  return svg;
}

// a fair queue's flow keys: how many are active, the backlog of the next ones served
function flowsLine(f) {
  const shown = Object.entries(f.backlog).map(([k, n]) => (k || "(none)") + ": " + n);
  return "flow keys: " + f.active + " active" + (shown.length ? " — " + shown.join(", ") : "");
}

function renderQueues(c, now) {
  fill("queues", c.queues.map((q) => el("tr", { "data-queue": q.queue,
    class: q.paused ? "paused" : "" },
    el("td", {}, q.queue, q.flows ? el("div", { class: "flows" }, flowsLine(q.flows)) : null),
    el("td", { class: "num depth" }, q.depth),
    el("td", { class: "num" }, q.due),
    el("td", { class: q.oldest_due_age_s > 60 ? "warn" : "" },
      q.oldest_due_age_s === null ? "–" : duration(q.oldest_due_age_s)),
    el("td", { class: "num done" }, q.done_last_hour),
    el("td", { class: "num failed" + (q.failed_last_hour ? " bad" : "") }, q.failed_last_hour),
    el("td", {}, chart(q.throughput)),
    el("td", { class: "state" + (q.paused ? " bad" : "") }, q.paused ? "paused" : "running"),
    el("td", { class: "actions" }, pauseButtons("queue", q.queue, q.paused)))), "no queues");
  $("backlog-chart").replaceChildren(backlogChart(c.queues));
  const shards = c.shards || [];  // only with WORKER_QUEUE_SHARDS > 1
  $("shards-box").hidden = !shards.length;
  fill("shards", shards.map((s) => el("tr", { "data-shard": String(s.shard) },
    el("td", { class: "num" }, s.shard),
    el("td", {}, s.prefix),
    el("td", { class: "num" }, s.slot),
    el("td", {}, s.node === null ? "–" : s.node),
    el("td", { class: "num depth" }, s.depth),
    el("td", { class: "num" }, s.due),
    el("td", { class: s.oldest_due_age_s > 60 ? "warn" : "" },
      s.oldest_due_age_s === null ? "–" : duration(s.oldest_due_age_s)))), "one shard");
}

function runTime(msv, over) {
  if (over) return "> 5 min";
  if (msv === null || msv === undefined) return "–";
  return msv < 1000 ? "≤ " + msv + " ms" : "≤ " + duration(msv / 1000);
}

async function loadTasks(force) {
  if (!force && Date.now() - state.tasksAt < TASKS_EVERY_MS) return;
  state.tasksAt = Date.now();  // a poll budget, not a time shown: the browser's clock is fine
  const d = await call("api/tasks");
  state.tasks = d;
  fill("tasks", d.tasks.map((t) => el("tr", { "data-task": t.task },
    el("td", {}, t.task),
    el("td", { class: "num done" }, t.done),
    el("td", { class: "num failed" + (t.failed ? " bad" : "") }, t.failed),
    el("td", { class: "num" }, t.failure_ratio === null ? "–"
      : (100 * t.failure_ratio).toFixed(1) + " %"),
    el("td", { class: "num" }, t.per_min + " · " + t.per_min_5m),
    el("td", { class: "num" }, t.mean_ms === null ? "–" : t.mean_ms.toFixed(1) + " ms"),
    el("td", { class: "num p50" }, runTime(t.p50_ms, t.p50_over)),
    el("td", { class: "num p95" }, runTime(t.p95_ms, t.p95_over)),
    el("td", {}, chart(t.throughput)))), "no tasks");
}

function renderActivity(d, now) {
  fill("history", d.history.map((h) => el("tr", { "data-epoch": h.epoch },
    el("td", { class: "num" }, h.epoch),
    el("td", {}, h.instance || "–"),
    el("td", { title: clock(h.at_ms) }, ago(h.at_ms, now)),
    el("td", {}, h.reason))), "no leadership change recorded");
  fill("audit", d.audit.map((a) => el("tr", { class: a.ok ? "" : "refused" },
    el("td", { title: clock(a.at_ms) }, ago(a.at_ms, now)),
    el("td", {}, a.who + (a.remote ? " (" + a.remote + ")" : "")),
    el("td", {}, a.via),
    el("td", {}, a.action),
    el("td", {}, a.target),
    el("td", {}, a.message))), "no actions yet");
}

// -- dead letters -------------------------------------------------------------------------------
async function loadDead() {
  const d = await call("api/dead?page=" + state.deadPage + "&size=" + DEAD_PAGE);
  state.dead = d;
  state.deadPage = d.page;
  const now = d.now_ms;
  $("page-info").textContent = "page " + d.page + " of " + d.pages + " · " + d.total + " total";
  $("prev").disabled = d.page <= 1;
  $("next").disabled = d.page >= d.pages;
  fill("dead", d.items.map((r) => el("tr", { "data-job": r.job_id,
    class: state.detail === r.job_id ? "chosen" : "" },
  el("td", {}, el("input", { type: "checkbox", class: "pick", "data-job": r.job_id,
    "aria-label": "select " + idText(r.job_id), checked: state.selected.has(r.job_id) }),),
  el("td", { class: "job" }, el("a", { href: "#dead", "data-open": r.job_id,
    onclick: (ev) => { ev.preventDefault(); openDetail(r.job_id); } }, idText(r.job_id))),
  el("td", {}, r.task || "?"),
  el("td", { class: "reason" }, r.reason),
  el("td", { class: "num" }, r.tries === null || r.tries === undefined ? "–" : r.tries),
  el("td", { class: "num" }, bytes(r.size) + (r.truncated ? " (cut)" : "")),
  el("td", {}, r.queue || "default"),
  el("td", { title: clock(r.at_ms) }, ago(r.at_ms, now)))), "no dead letters");
  for (const box of document.querySelectorAll("#dead input.pick")) {
    box.addEventListener("change", () => {
      if (box.checked) state.selected.add(box.dataset.job);
      else state.selected.delete(box.dataset.job);
      updateSelection();
    });
  }
  updateSelection();
}

function updateSelection() {
  const n = state.selected.size;
  $("requeue-selected").disabled = n === 0;
  $("purge-selected").disabled = n === 0;
  $("requeue-selected").textContent = "Re-queue selected" + (n ? " (" + n + ")" : "");
  $("purge-selected").textContent = "Purge selected" + (n ? " (" + n + ")" : "");
}

async function openDetail(jobId) {
  try {
    const r = await call("api/dead/" + encodeURIComponent(jobId));
    state.detail = jobId;
    $("dead-detail").hidden = false;
    $("detail-title").textContent = idText(r.job_id);
    const fields = [["task", r.task || "?"], ["reason", r.reason], ["kind", r.kind],
      ["queue", r.queue], ["tries", r.tries], ["size", bytes(r.size)],
      ["sha256", r.sha256], ["instance", r.instance], ["set aside", clock(r.at_ms)]];
    $("detail-fields").replaceChildren(...fields.flatMap(([k, v]) =>
      [el("dt", {}, k), el("dd", {}, v === null || v === undefined ? "–" : v)]));
    $("detail-format").textContent = "(" + r.preview.format +
      (r.preview.truncated || r.truncated ? ", cut short" : "") + ")";
    $("detail-payload").textContent = visible(r.preview.text || "(empty)");
  } catch (e) {
    toast(e.message, false);
  }
}

function setupDead() {
  const selected = () => Array.from(state.selected);
  const done = (out) => { if (out) { state.selected.clear(); updateSelection(); } };
  $("requeue-selected").addEventListener("click", async () =>
    done(await act("api/dead/requeue", { ids: selected() })));
  $("purge-selected").addEventListener("click", async () =>
    done(await act("api/dead/purge", { ids: selected() },
      "Purge " + state.selected.size + " dead letters? They cannot be re-queued afterwards.")));
  $("requeue-all").addEventListener("click", async () =>
    done(await act("api/dead/requeue", { all: true }, "Re-queue every dead letter?")));
  $("purge-all").addEventListener("click", async () =>
    done(await act("api/dead/purge", { all: true },
      "Purge every dead letter? They cannot be re-queued afterwards.")));
  $("detail-requeue").addEventListener("click", async () => {
    if (await act("api/dead/requeue", { ids: [state.detail] })) closeDetail();
  });
  $("detail-purge").addEventListener("click", async () => {
    if (await act("api/dead/purge", { ids: [state.detail] }, "Purge " + state.detail + "?"))
      closeDetail();
  });
  $("detail-close").addEventListener("click", closeDetail);
  $("prev").addEventListener("click", () => { state.deadPage -= 1; loadDead(); });
  $("next").addEventListener("click", () => { state.deadPage += 1; loadDead(); });
  $("select-page").addEventListener("change", (ev) => {
    for (const box of document.querySelectorAll("#dead input.pick")) {
      box.checked = ev.target.checked;
      if (box.checked) state.selected.add(box.dataset.job);
      else state.selected.delete(box.dataset.job);
    }
    updateSelection();
  });
}

function closeDetail() {
  state.detail = null;
  $("dead-detail").hidden = true;
}

// -- jobs ---------------------------------------------------------------------------------------
function jobsQuery(cursor) {
  const j = state.jobs, q = new URLSearchParams({ state: j.state, limit: "50" });
  if (j.queue) q.set("queue", j.queue);
  if (j.task) q.set("task", j.task);
  if (j.search) q.set("search", j.search);
  if (cursor) q.set("cursor", cursor);
  return "api/jobs?" + q.toString();
}

function options(select, values, chosen) {
  const have = Array.from(select.options).map((o) => o.value).slice(1);
  if (have.join("\u0000") === values.join("\u0000")) return;
  select.replaceChildren(el("option", { value: "" }, "all"),
    ...values.map((v) => el("option", { value: v, selected: v === chosen }, v)));
}

// The first page again (live refresh, at most every JOBS_EVERY_MS), or the next one ("more").
async function loadJobs(more) {
  const j = state.jobs;
  if (!more && j.pages > 1) return;  // the operator paged on: keep what they read
  const d = await call(jobsQuery(more ? j.cursor : null));
  j.at = Date.now();
  j.now = d.now_ms;
  j.items = more ? j.items.concat(d.items) : d.items;
  j.pages = more ? j.pages + 1 : 1;
  j.cursor = d.next_cursor;
  options($("job-queue"), d.queues, j.queue);
  options($("job-task"), d.tasks, j.task);
  for (const b of document.querySelectorAll("#job-states button")) {
    b.classList.toggle("on", b.dataset.state === j.state);
  }
  $("jobs-more").hidden = !j.cursor;
  $("jobs-info").textContent = j.items.length + " " + j.state + " shown" +
    (j.cursor ? " · more available" : "");
  fill("jobs", j.items.map((r) => el("tr", { "data-job": r.job_id,
    class: (j.detail === r.job_id ? "chosen " : "") + "state-" + r.state },
  el("td", { class: "job" }, el("a", { href: "#jobs", "data-open-job": r.job_id,
    onclick: (ev) => { ev.preventDefault(); openJob(r.job_id); } }, idText(r.job_id))),
  el("td", {}, r.task || "?"),
  el("td", {}, r.queue || "–"),
  el("td", { class: "state" }, r.state),
  el("td", { class: "num" }, r.tries === null ? "–" : r.tries),
  el("td", { title: clock(r.finished_ms || r.started_ms || r.due_ms || r.enqueued_ms) },
    whenOf(r, d.now_ms)),
  el("td", { class: "num" }, r.progress === null ? "–" : Math.round(100 * r.progress) + " %"),
  el("td", { class: "args" }, r.args || ""))), "no " + j.state + " jobs");
}

function whenOf(r, now) {
  if (r.finished_ms) return "ended " + ago(r.finished_ms, now);
  if (r.started_ms) return "started " + ago(r.started_ms, now);
  if (r.due_ms) return r.due_ms > now ? "due " + msIn(r.due_ms, now) : "due " + ago(r.due_ms, now);
  return r.enqueued_ms ? "enqueued " + ago(r.enqueued_ms, now) : "–";
}

function shown(id, text) {
  $(id).hidden = !text;
  $(id + "-title").hidden = !text;
  $(id).textContent = visible(text || "");
}

async function openJob(jobId) {
  try {
    const r = await call("api/jobs/" + encodeURIComponent(jobId));
    const now = r.now_ms;
    state.jobs.detail = jobId;
    state.jobs.detailAt = Date.now();
    $("job-detail").hidden = false;
    $("job-title").textContent = idText(r.job_id);
    const fields = [["task", r.task || "?"], ["queue", r.queue], ["state", r.state],
      ["tries", r.tries], ["instance", r.instance],
      ["enqueued", r.enqueued_ms ? clock(r.enqueued_ms) + " (" + ago(r.enqueued_ms, now) + ")" : null],
      ["due", r.due_ms ? clock(r.due_ms) : null],
      ["started", r.started_ms ? clock(r.started_ms) : null],
      ["finished", r.finished_ms ? clock(r.finished_ms) + " (" + ago(r.finished_ms, now) + ")"
        : null],
      ["args", r.args], ["kwargs", r.kwargs], ["cancel asked", r.abort_requested ? "yes" : null],
      ["undecodable", r.undecodable]];
    $("job-fields").replaceChildren(...fields.filter(([, v]) => v !== null && v !== undefined)
      .flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k }, v)]));
    const bar = $("job-progress");
    bar.hidden = r.progress === null || r.progress === undefined;
    if (!bar.hidden) {
      bar.querySelector(".bar").style.width = Math.round(100 * r.progress) + "%";
      bar.querySelector(".label").textContent = Math.round(100 * r.progress) + " %" +
        (r.progress_message ? " · " + visible(r.progress_message) : "");
    }
    const e = r.error;
    shown("job-error", e ? (e.type || "error") + ": " + (e.message || "") +
      (e.traceback ? "\n\n" + e.traceback : "") : "");
    shown("job-result", r.result);
    $("job-retry").disabled = !["failed", "timeout", "cancelled", "dead", "expired"].includes(r.state);
    $("job-cancel").disabled = !["queued", "scheduled", "running"].includes(r.state);
    for (const row of document.querySelectorAll("#jobs tbody tr[data-job]")) {
      row.classList.toggle("chosen", row.dataset.job === jobId);
    }
  } catch (e) {
    toast(e.message, false);
  }
}

function closeJob() {
  state.jobs.detail = null;
  $("job-detail").hidden = true;
}

async function refreshJobs() {
  const j = state.jobs;
  if (Date.now() - j.at >= JOBS_EVERY_MS) await loadJobs(false);
  if (j.detail && Date.now() - j.detailAt >= REFRESH_MS) await openJob(j.detail);
}

function setupJobs() {
  const j = state.jobs;
  const again = () => { j.pages = 0; j.cursor = null; loadJobs(false).catch((e) => toast(e.message, false)); };
  for (const b of document.querySelectorAll("#job-states button")) {
    b.addEventListener("click", () => { j.state = b.dataset.state; again(); });
  }
  $("jobs-filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    j.queue = $("job-queue").value;
    j.task = $("job-task").value;
    j.search = $("job-search").value.trim();
    again();
  });
  $("job-queue").addEventListener("change", () => { j.queue = $("job-queue").value; again(); });
  $("job-task").addEventListener("change", () => { j.task = $("job-task").value; again(); });
  $("jobs-more").addEventListener("click", () => loadJobs(true).catch((e) => toast(e.message, false)));
  $("job-close").addEventListener("click", closeJob);
  $("job-retry").addEventListener("click", async () => {
    if (await act("api/jobs/retry", { id: j.detail }, "Run " + j.detail + " again?")) {
      again();
      await openJob(j.detail);
    }
  });
  $("job-cancel").addEventListener("click", async () => {
    if (await act("api/jobs/cancel", { id: j.detail }, "Cancel " + j.detail + "?")) {
      again();
      await openJob(j.detail);
    }
  });
}

// -- views --------------------------------------------------------------------------------------
function show(view) {
  const known = ["cluster", "schedules", "queues", "jobs", "workflows", "dead", "activity"];
  state.view = known.includes(view) ? view : "cluster";
  for (const s of document.querySelectorAll(".view")) s.hidden = s.dataset.view !== state.view;
  for (const a of document.querySelectorAll("#tabs a")) {
    a.classList.toggle("on", a.dataset.tab === state.view);
  }
  if (state.view === "dead" && state.overview) loadDead().catch((e) => toast(e.message, false));
  if (state.view === "jobs" && state.overview) {
    state.jobs.at = 0;
    refreshJobs().catch((e) => toast(e.message, false));
  }
  if (state.view === "queues" && state.overview) loadTasks(true).catch((e) => toast(e.message, false));
}

document.addEventListener("DOMContentLoaded", () => {
  setupLogin();
  setupDead();
  setupJobs();
  $("handoff").addEventListener("click", () => act("api/leader/handoff", {},
    "Ask the leader to hand its lease over to a standby?"));
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  show(location.hash.slice(1));
  refresh();
});
