"use strict";
// PowerGuard console: renders the state snapshots the server pushes (server-sent events).
let snap = null;
let skew = 0;  // server clock - browser clock, seconds

const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
const fmt = (v, unit = "", digits = 0) => (v === null || v === undefined ? "–" : `${Number(v).toFixed(digits)}${unit}`);
const when = (ts) => new Date(ts * 1000).toLocaleTimeString();
function rows(tableId, items, cells) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren(...items.map((it) => el("tr", { "data-name": it.name || it.saga || "" }, ...cells(it).map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))))));
}

function runtimeBar(u) {
  const max = Math.max(u.runtime_s || 0, (snap.reserve_s || 0) + (snap.budget_s || 0), 1);
  const bar = el("div", { class: "bar", title: `runtime ${fmt(u.runtime_s, " s")}, reserve ${fmt(snap.reserve_s, " s")}` });
  const pct = (v) => `${Math.min(100, (100 * (v || 0)) / max)}%`;
  const part = (cls, v) => { const s = el("span", { class: cls }); s.style.width = pct(v); bar.append(s); };
  part("runtime", u.runtime_s);
  if (snap.reserve_s) part("reserve", snap.reserve_s);
  if (snap.budget_s) part("budget", (snap.reserve_s || 0) + snap.budget_s);
  return el("td", {}, bar, el("small", {}, ` ${fmt(u.runtime_s, " s")} left`));
}

function renderSaga(s) {
  const box = $("saga");
  if (!s) { box.replaceChildren(el("p", { class: "quiet", id: "no-saga" }, "No open outage.")); return; }
  const [got, want] = s.acks.split("/").map(Number);
  const perJob = Object.entries(s.jobs || {}).map(([job, f]) => {
    const missing = (s.missing || {})[job] || [];
    return el("tr", { "data-job": job }, el("td", {}, job), el("td", {}, f.final_checkpoint || f.checkpoint_step || "–"),
      el("td", { class: missing.length ? "missing" : "" }, missing.length ? `missing ranks ${missing.join(", ")}` : "all acked"));
  });
  box.replaceChildren(
    s.drill ? el("p", { class: "badge warn drill", id: "drill-banner" }, "DRILL — a rehearsal: every power and job command is dry-run, nothing is powered off") : "",
    el("p", {}, s.drill ? "drill saga " : "saga ", el("code", {}, s.saga), " — state ", el("span", { class: "state", id: "saga-state" }, s.state),
      s.reason ? ` (${s.reason})` : "", " — on battery: ", (s.ups_on_battery || []).join(", ") || "–"),
    el("p", {}, "acks ", el("strong", { id: "acks" }, `${got}/${want}`), " — nodes at risk: ", (s.nodes_at_risk || []).join(", ") || "–",
      s.stop_reason ? ` — shutdown trigger: ${s.stop_reason}` : ""),
    el("p", {}, "checkpoint deadline in ", el("span", { id: "countdown" }, "–")),
    el("table", { class: "acks" }, el("thead", {}, el("tr", {}, el("th", {}, "job"), el("th", {}, "checkpoint"), el("th", {}, "ranks"))), el("tbody", {}, ...perJob)),
    ...Object.entries(s.ups_off || {}).map(([ups, what]) => el("p", { class: "ups-off", "data-ups": ups }, `last step: UPS ${ups} ${what}`)),
    s.restore ? el("p", { id: "restore" }, `restore: ${s.restore.ready}/${s.restore.asked} nodes ready` + (s.restore.in_ramp ? `, ${s.restore.in_ramp} waiting in the power-on ramp (${s.restore.ramp})` : "")) : "",
  );
  tick();
}

function tick() {
  $("clock").textContent = new Date().toLocaleTimeString();
  const c = $("countdown");
  if (!c || !snap || !snap.saga) return;
  const d = snap.saga.deadline_ts;
  if (d === null || d === undefined) { c.textContent = "–"; return; }
  const left = Math.max(0, d - (Date.now() / 1000 + skew));
  c.textContent = `${left.toFixed(1)} s`;
}

// per UPS of an outage: observed over predicted runtime (below 1: an optimistic estimate, an aged battery)
function batteryCell(battery) {
  const parts = Object.entries(battery || {}).filter(([, b]) => b.ratio !== null && b.ratio !== undefined)
    .map(([ups, b]) => `${ups} ${b.ratio.toFixed(2)}× (${fmt(b.observed_s, " s")} of ${fmt(b.predicted_s, " s")}${b.load_pct != null ? ` at ${b.load_pct} %` : ""})`);
  return el("span", { class: parts.some((p) => parseFloat(p.split(" ")[1]) < 0.8) ? "badge warn" : "" }, parts.join("; ") || "–");
}

function render() {
  const conn = $("conn");
  conn.textContent = snap.bus_connected ? "bus connected" : "bus disconnected";
  conn.className = "badge " + (snap.bus_connected ? "ok" : "bad");
  renderSaga(snap.saga);
  rows("ups", snap.ups, (u) => [
    u.name,
    el("span", {},
      el("span", { class: "badge " + (u.comm_lost ? "warn" : u.on_battery ? "bad" : "ok"), "data-state": u.comm_lost ? "comm_lost" : u.on_battery ? "on_battery" : "on_line" },
        u.comm_lost ? "COMM LOST" : u.on_battery ? "ON BATTERY" : "on line"),
      // a drill's synthetic reading, beside the UPS's own (which it never replaces)
      u.drill ? el("span", { class: "badge warn drill", "data-drill": "1" }, ` DRILL: on battery, ${fmt(u.drill.runtime_s, " s")} runtime`) : ""),
    fmt(u.charge_pct, " %"), runtimeBar(u), fmt(u.load_pct, " %"), u.source || "–", fmt(u.reading_age_s, " s", 1),
  ]);
  rows("nodes", snap.nodes, (n) => [
    n.name, el("span", { class: "node-state", "data-state": n.state || "", "data-drill": n.drill ? "1" : "" }, (n.state || "–") + (n.drill ? " (drill)" : "")), n.detail || "", (n.jobs || []).join(", "),
    n.last_action ? `${n.last_action}${n.last_error ? " FAILED: " + n.last_error : ""}` : "",
  ]);
  rows("jobs", snap.jobs, (j) => [
    j.name, `${j.ranks}/${j.world_size ?? "?"}`, j.paused_step !== undefined ? `${fmt(j.step)} (paused)` : fmt(j.step),
    j.last_checkpoint ? `step ${j.last_checkpoint.step}, ${j.last_checkpoint.durability}, ${fmt(j.last_checkpoint.age_s, " s")} ago` : "–",
    (j.nodes || []).join(", "),
  ]);
  $("timeline").replaceChildren(...snap.timeline.slice().reverse().map((t) => el("li", { class: (t.bad ? "bad " : "") + (t.drill ? "drill" : "") }, `${when(t.at)} ${t.drill ? "[drill] " : ""}${t.text}`)));
  document.body.classList.toggle("drill", !!snap.drill);
  rows("past", snap.past, (r) => {
    const trace = r.trace_id ? (snap.trace_url ? el("a", { href: snap.trace_url.replace("{trace_id}", r.trace_id) }, r.trace_id.slice(0, 12)) : r.trace_id.slice(0, 12)) : "–";
    return [when(r.started), r.drill ? `${r.saga} (drill)` : r.saga, el("span", { class: "past-state" }, r.state), r.lost_steps ?? "–", fmt(r.rto_s, " s", 1), (r.nodes_at_risk || []).length,
      batteryCell(r.battery), trace, el("a", { href: `api/sagas/${encodeURIComponent(r.saga)}/timeline.svg` }, "timeline")];
  });
}

function connect() {
  const source = new EventSource("api/events");
  source.onmessage = (m) => {
    snap = JSON.parse(m.data);
    skew = snap.now - Date.now() / 1000;
    render();
  };
  source.onerror = () => {
    const conn = $("conn");
    conn.textContent = "console unreachable: retrying";
    conn.className = "badge bad";
  };
}
setInterval(tick, 200);
connect();
