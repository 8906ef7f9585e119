// The console's run-time schedules (client.schedules): their rows beside the code schedules,
// with run now, pause/resume, edit and remove, and the form that creates or edits one. Every
// change is an action (api/schedules/*: token, same-origin, audit log). Uses app.js's helpers
// (el, act, ago, msIn), called only after both scripts ran.
"use strict";

function scheduleButton(action, s, label, confirmText) {
  return el("button", { type: "button", class: "act", "data-action": "schedule-" + action,
    "data-name": s.name, onclick: () => act("api/schedules/" + action, { name: s.name },
      confirmText) }, label);
}

function scheduleRow(s, now) {
  return el("tr", { "data-schedule": s.name, class: s.paused ? "paused" : "" },
    el("td", {}, s.name),
    el("td", {}, s.task),
    el("td", {}, s.schedule),
    el("td", { title: s.next_tick || "" }, msIn(s.next_tick_ms, now)),
    el("td", { title: s.last_tick || "" },
      s.last_tick_ms === null || s.last_tick_ms === undefined ? "never" : ago(s.last_tick_ms, now)),
    el("td", {}, s.catch_up),
    el("td", {}, s.overlap),
    el("td", { class: "num" }, s.overlaps_skipped),
    el("td", { class: "state" }, s.paused ? "paused" : "running"),
    el("td", { class: "actions" },
      scheduleButton("trigger", s, "Run now"),
      s.paused ? scheduleButton("resume", s, "Resume") : scheduleButton("pause", s, "Pause"),
      el("button", { type: "button", class: "act", "data-action": "schedule-edit",
        "data-name": s.name, onclick: () => editSchedule(s) }, "Edit"),
      scheduleButton("remove", s, "Remove", "Remove schedule " + s.name + "? It never ticks again.")));
}

// Fill the form with a schedule's definition (its fields are set as values, never as markup).
function editSchedule(s) {
  const f = document.getElementById("schedule-form");
  f.elements.name.value = s.name;
  f.elements.task.value = s.task;
  f.elements.cron.value = s.cron || "";
  f.elements.every.value = s.every_s === null || s.every_s === undefined ? "" : String(s.every_s);
  f.elements.tz.value = s.tz || "UTC";
  f.elements.args.value = JSON.stringify(s.args || []);
  f.elements.kwargs.value = JSON.stringify(s.kwargs || {});
  f.elements.catch_up.value = s.catch_up;
  f.elements.catch_up_limit.value = String(s.catch_up_limit);
  f.elements.overlap.value = s.overlap;
  f.scrollIntoView();
}

async function saveSchedule(ev) {
  ev.preventDefault();
  const f = ev.target, v = (n) => f.elements[n].value.trim();
  let args, kwargs;
  try {
    args = JSON.parse(v("args") || "[]");
    kwargs = JSON.parse(v("kwargs") || "{}");
  } catch (e) {
    toast("arguments: not JSON (" + e.message + ")", false);
    return;
  }
  const body = { name: v("name"), task: v("task"), args, kwargs, tz: v("tz") || "UTC",
    catch_up: v("catch_up"), catch_up_limit: Number(v("catch_up_limit")), overlap: v("overlap") };
  if (v("cron")) body.cron = v("cron");
  if (v("every")) body.every = Number(v("every"));
  await act("api/schedules/upsert", body);
}

document.getElementById("schedule-form").addEventListener("submit", saveSchedule);
