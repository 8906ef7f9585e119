// The console's Workflows view: the newest workflows by state, one workflow's steps with their
// state, its graph (SVG up to SVG_MAX steps, always as text) and a link to each step's job.
// Uses app.js's helpers (call, act, el, fill, svgEl, idText, ago, clock, toast, openJob, state);
// everything from Redis is set as text, as there.
"use strict";

const SVG_MAX = 80;           // larger graphs are shown as text only
const flows = { state: "", at: 0, detail: null, detailAt: 0 };

async function loadWorkflows() {
  const q = "api/workflows" + (flows.state ? "?state=" + encodeURIComponent(flows.state) : "");
  const d = await call(q);
  flows.at = Date.now();
  for (const b of document.querySelectorAll("#workflow-states button")) {
    b.classList.toggle("on", b.dataset.state === flows.state);
  }
  $("workflows-info").textContent = d.items.length + " " + (flows.state || "kept") + " shown";
  fill("workflows", d.items.map((w) => el("tr", { "data-workflow": w.id,
    class: (flows.detail === w.id ? "chosen " : "") + "state-" + w.state },
  el("td", { class: "job" }, el("a", { href: "#workflows", "data-open-workflow": w.id,
    onclick: (ev) => { ev.preventDefault(); openWorkflow(w.id); } }, idText(w.id))),
  el("td", { class: "state" }, w.state),
  el("td", { title: clock(w.created_ms) }, ago(w.created_ms, d.now_ms)))),
  "no " + (flows.state || "") + " workflows");
}

function openStepJob(jobId) {
  location.hash = "jobs";
  openJob(jobId);
}

function graphSvg(steps) {
  const bw = 150, bh = 24, gx = 40, gy = 8;
  const cols = [];
  for (const s of steps) (cols[s.depth] = cols[s.depth] || []).push(s);
  const at = {};
  cols.forEach((col, x) => col.forEach((s, y) => { at[s.index] = [x * (bw + gx), y * (bh + gy)]; }));
  const w = cols.length * (bw + gx) - gx + 2;
  const h = Math.max(...cols.map((c) => c.length)) * (bh + gy) - gy + 2;
  const svg = svgEl("svg", { viewBox: "-1 -1 " + w + " " + h, width: w, height: h,
    class: "graph", role: "img", "aria-label": "the workflow's graph" });
  for (const s of steps) {
    for (const p of s.parents) {
      const [px, py] = at[p], [x, y] = at[s.index];
      svg.append(svgEl("line", { x1: px + bw, y1: py + bh / 2, x2: x, y2: y + bh / 2,
        class: "edge" }));
    }
  }
  for (const s of steps) {
    const [x, y] = at[s.index];
    const g = svgEl("g", { class: "node state-" + s.state, "data-step": s.index,
      transform: "translate(" + x + "," + y + ")" });
    g.append(svgEl("rect", { width: bw, height: bh, rx: 4 }));
    g.append(svgEl("text", { x: 6, y: 16 }, idText(s.index + " " + s.function).slice(0, 22)));
    g.append(svgEl("title", {}, idText(s.function) + ": " + s.state));
    g.addEventListener("click", () => openStepJob(s.job_id));
    svg.append(g);
  }
  return svg;
}

async function openWorkflow(wid) {
  try {
    const r = await call("api/workflows/" + encodeURIComponent(wid));
    flows.detail = wid;
    flows.detailAt = Date.now();
    $("workflow-detail").hidden = false;
    $("workflow-title").textContent = idText(r.id);
    const counts = Object.entries(r.counts).map(([k, v]) => v + " " + k).join(", ");
    const fields = [["state", r.state], ["on failure", r.on_failure],
      ["created", clock(r.created_ms) + " (" + ago(r.created_ms, r.now_ms) + ")"],
      ["steps", r.size + (counts ? " (" + counts + ")" : "")]];
    $("workflow-fields").replaceChildren(...fields.flatMap(([k, v]) =>
      [el("dt", {}, k), el("dd", { "data-field": k }, v)]));
    $("workflow-graph").replaceChildren(...(r.size <= SVG_MAX ? [graphSvg(r.steps)] : []));
    $("workflow-graph-text").textContent = visible(r.graph);
    fill("workflow-steps", r.steps.map((s) => el("tr", { "data-step": s.index,
      class: "state-" + s.state },
    el("td", { class: "num" }, s.index),
    el("td", {}, s.function),
    el("td", { class: "state" }, s.state),
    el("td", {}, s.parents.length ? s.parents.join(", ") : "–"),
    el("td", { class: "job" }, el("a", { href: "#jobs", "data-open-job": s.job_id,
      onclick: (ev) => { ev.preventDefault(); openStepJob(s.job_id); } }, idText(s.job_id))),
    el("td", { class: "args" }, s.error !== null ? s.error : s.result !== null ? s.result : ""))),
    "no steps");
    $("workflow-cancel").disabled = r.state !== "running";
    for (const row of document.querySelectorAll("#workflows tbody tr[data-workflow]")) {
      row.classList.toggle("chosen", row.dataset.workflow === wid);
    }
  } catch (e) {
    toast(e.message, false);
  }
}

async function refreshWorkflows(force) {
  if (force || Date.now() - flows.at >= JOBS_EVERY_MS) await loadWorkflows();
  if (flows.detail && Date.now() - flows.detailAt >= REFRESH_MS) await openWorkflow(flows.detail);
}

function setupWorkflows() {
  const again = () => loadWorkflows().catch((e) => toast(e.message, false));
  for (const b of document.querySelectorAll("#workflow-states button")) {
    b.addEventListener("click", () => { flows.state = b.dataset.state; again(); });
  }
  $("workflow-close").addEventListener("click", () => {
    flows.detail = null;
    $("workflow-detail").hidden = true;
  });
  $("workflow-cancel").addEventListener("click", async () => {
    if (await act("api/workflows/cancel", { id: flows.detail },
      "Cancel workflow " + flows.detail + "? No step of it starts any more.")) {
      again();
      await openWorkflow(flows.detail);
    }
  });
  const tick = () => {
    if (state.view === "workflows" && state.overview && !state.busy) {
      refreshWorkflows(false).catch((e) => toast(e.message, false));
    }
  };
  window.addEventListener("hashchange", () => { flows.at = 0; tick(); });
  setInterval(tick, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", setupWorkflows);
