// Herd's live dashboard: a snapshot on load, then server-sent events (a sample a second, events
// as they happen). Hand-written SVG charts; no framework, nothing loaded from elsewhere.
"use strict";

const WINDOW_MS = 15 * 60 * 1000;
const COLORS = ["#2357a6", "#d9822b", "#1f7a3f", "#8e44ad", "#b3261e", "#16a2b8", "#6c757d", "#c0a000"];
const state = { points: [], events: [], status: null, live: false };

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c === null || c === undefined ? "" : c);
  return e;
}

function token() {
  const m = document.cookie.match(/(?:^|;\s*)herd_token=([^;]*)/);
  return m ? decodeURIComponent(m[1]) : null;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function num(n) {
  if (!isFinite(n)) return "–";
  const a = Math.abs(n);
  if (a >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (n / 1e3).toFixed(1) + "k";
  if (a >= 10 || Number.isInteger(n)) return n.toFixed(0);
  return n.toFixed(2);
}

function secs(s) {
  if (s === null || s === undefined) return "–";
  return s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(1) + " s";
}

// --- topology -------------------------------------------------------------------------------

function groupsOf(status) {
  if (!status) return [];
  return [status, ...(status.groups || [])];
}

function renderTopology() {
  const root = $("topology");
  const status = state.status;
  const last = state.points[state.points.length - 1] || {};
  root.replaceChildren();
  if (!status) return;
  $("endpoint").textContent = status.endpoint || "";
  $("commit").textContent = "commit mode " + status.commit_mode + " · " + status.sync_standbys;
  const select = $("commit-mode");
  if (document.activeElement !== select) select.value = status.commit_mode;
  for (const g of groupsOf(status)) {
    const head = el("tr", {}, ...["node", "role", "state", "LSN", "sync", "replay lag", "read pool", "pool in use / idle", ""].map((h) => el("th", {}, h)));
    const rows = g.nodes.map((n) => nodeRow(n, last));
    const table = el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
    const title = groupsOf(status).length > 1 ? "Shard group " + g.group : "Nodes";
    const note = g.ha_note ? el("p", { class: "muted" }, "Last HA event: " + g.ha_note) : "";
    root.append(el("div", { class: "group", "data-group": String(g.group || 0) },
      el("h2", {}, title, " ", el("span", { class: "muted" }, g.synchronous_standby_names ? "synchronous_standby_names = " + g.synchronous_standby_names : "")),
      el("div", { class: "scroll" }, table), note, archiving(g.archiving)));
  }
}

// The primary's WAL archiving (backups configured): a line, and its warning in red.
function archiving(a) {
  if (!a) return "";
  const last = a.last_archived_wal
    ? "last archived " + a.last_archived_wal + " " + secs(a.last_archived_age_seconds) + " ago"
    : "nothing archived yet";
  const text = "WAL archiving: " + last + " · " + num(a.pending) + " waiting · " + num(a.failed_count) + " failed";
  return el("p", { class: a.warning ? "archive-behind" : "muted", "data-archiving": a.warning ? "behind" : "ok" },
    a.warning ? text + " — " + a.warning : text);
}

function nodeRow(n, last) {
  const lsn = n.current_lsn || n.replayed_lsn || n.received_lsn || "–";
  const lag = n.lag ? bytes(n.lag.replay_bytes) + " · " + secs(n.lag.replay_seconds) : "–";
  const pool = last.read_pool && n.name in last.read_pool ? (last.read_pool[n.name] ? "yes" : "no") : (n.role === "primary" ? "" : "–");
  const inUse = last.pool_in_use && last.pool_in_use[n.name] !== undefined ? num(last.pool_in_use[n.name]) : "0";
  const idle = last.pool_idle && last.pool_idle[n.name] !== undefined ? num(last.pool_idle[n.name]) : "0";
  let action = "";
  if (n.role === "replica" && n.state === "streaming") {
    action = el("button", { "data-switchover": n.name, title: "planned switchover to " + n.name }, "Switch over");
    action.addEventListener("click", () => switchover(n.name));
  }
  return el("tr", { "data-node": n.name, "data-role": n.role, "data-state": n.state },
    el("td", {}, n.name),
    el("td", { class: "role role-" + n.role }, n.role),
    el("td", { class: "state-" + n.state }, n.state.replace("_", " ")),
    el("td", {}, lsn),
    el("td", {}, n.sync_state || ""),
    el("td", {}, lag),
    el("td", {}, pool),
    el("td", {}, inUse + " / " + idle),
    el("td", {}, action));
}

// --- charts ---------------------------------------------------------------------------------

// series: [{name, values: [[t, v], …]}]
function lineChart(svg, series, format, opts) {
  const w = svg.clientWidth || 340;
  const h = svg.clientHeight || 170;
  const pad = { l: 48, r: 8, t: 8, b: 16 };
  svg.setAttribute("viewBox", "0 0 " + w + " " + h);
  svg.replaceChildren();
  const now = Date.now();
  // Up to 15 minutes, but no wider than the data (at least 2 minutes): a fresh page is readable.
  const first = state.points.length ? state.points[0].t : now;
  const t0 = Math.max(now - WINDOW_MS, Math.min(first, now - 120 * 1000));
  let max = (opts && opts.max) || 0;
  for (const s of series) for (const [, v] of s.values) if (isFinite(v) && v > max) max = v;
  if (max <= 0) max = 1;
  const x = (t) => pad.l + ((t - t0) / (now - t0)) * (w - pad.l - pad.r);
  const y = (v) => h - pad.b - (v / max) * (h - pad.t - pad.b);
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  add("line", { x1: pad.l, y1: y(0), x2: w - pad.r, y2: y(0), stroke: "#d9dde1" });
  add("line", { x1: pad.l, y1: y(max), x2: w - pad.r, y2: y(max), stroke: "#eef0f2" });
  add("text", { x: pad.l - 4, y: y(max) + 4, "text-anchor": "end" }, format(max));
  add("text", { x: pad.l - 4, y: y(0) + 3, "text-anchor": "end" }, format(0));
  add("text", { x: pad.l, y: h - pad.b + 12 }, "-" + Math.round((now - t0) / 60000) + " min");
  add("text", { x: w - pad.r, y: h - pad.b + 12, "text-anchor": "end" }, "now");
  let drawn = 0;
  let lastT = 0;
  series.forEach((s, i) => {
    const shown = s.values.filter(([t, v]) => t >= t0 && isFinite(v));
    drawn = Math.max(drawn, shown.length);
    if (shown.length) lastT = Math.max(lastT, shown[shown.length - 1][0]);
    // One path per series; a gap of more than 3 s (a node that was primary meanwhile, a
    // restart) lifts the pen instead of drawing a line across it.
    let d = "";
    let prev = null;
    for (const [t, v] of shown) {
      d += (prev === null || t - prev > 3000 ? "M" : "L") + x(t).toFixed(1) + "," + y(v).toFixed(1);
      prev = t;
    }
    if (d) {
      add("path", { d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.5, "data-series": s.name });
    }
  });
  // The legend is HTML under the chart, so it wraps however many series there are.
  let legend = svg.nextElementSibling;
  if (!legend || !legend.classList.contains("legend")) {
    legend = el("div", { class: "legend" });
    svg.after(legend);
  }
  legend.replaceChildren(...series.map((s, i) => el("span", {},
    el("i", { style: "background:" + COLORS[i % COLORS.length] }), s.name)));
  // Read by the browser test (and handy when inspecting the page): how much is drawn, how recent.
  svg.setAttribute("data-points", String(drawn));
  svg.setAttribute("data-last-t", String(lastT));
}

function keysOf(field) {
  const keys = new Set();
  for (const p of state.points) for (const k of Object.keys(p[field] || {})) keys.add(k);
  return [...keys].sort();
}

function seriesOf(field) {
  return keysOf(field).map((k) => ({
    name: k,
    values: state.points.filter((p) => p[field] && k in p[field]).map((p) => [p.t, p[field][k]]),
  }));
}

// The share of the primary's active backends in each wait event over the last 10 samples (one
// sample a second sees few backends; a window steadies the picture). The events a commit waits
// in get their own line, as in `herd bench commit-waits`; the rest are summed as "other".
const MAIN_WAITS = ["IPC:SyncRep", "IO:WALSync", "LWLock:WALWrite", "CPU"];

function waitShares() {
  const sampled = state.points.filter((p) => p.commit_waits);
  const windowed = sampled.map((p, i) => {
    const sums = {};
    let all = 0;
    for (const q of sampled.slice(Math.max(0, i - 9), i + 1)) {
      for (const [k, n] of Object.entries(q.commit_waits.by_event)) {
        const key = MAIN_WAITS.includes(k) ? k : "other";
        sums[key] = (sums[key] || 0) + n;
        all += n;
      }
    }
    return [p.t, sums, all];
  });
  const present = new Set();
  for (const [, sums] of windowed) for (const k of Object.keys(sums)) present.add(k);
  return [...MAIN_WAITS, "other"].filter((k) => present.has(k)).map((k) => ({
    name: k,
    values: windowed.map(([t, sums, all]) => [t, all ? (100 * (sums[k] || 0)) / all : 0]),
  }));
}

function renderCharts() {
  lineChart($("lag-chart"), seriesOf("lag_bytes"), bytes);
  lineChart($("lag-seconds-chart"), seriesOf("lag_seconds"), secs);
  lineChart($("tps-chart"), seriesOf("node_tps"), num);
  lineChart($("ryw-chart"), [
    { name: "waits", values: state.points.map((p) => [p.t, p.ryw_waits]) },
    { name: "fallbacks", values: state.points.map((p) => [p.t, p.ryw_fallbacks]) },
  ], num);
  lineChart($("pool-chart"), seriesOf("pool_in_use"), num);
  lineChart($("pool-wait-chart"), seriesOf("pool_waits"), num);
  lineChart($("waits-chart"), waitShares(), (v) => v.toFixed(0) + " %", { max: 100 });
  const last = state.points[state.points.length - 1];
  const routed = $("routed");
  routed.replaceChildren(el("tr", {}, el("th", {}, "node"), el("th", {}, "reason"), el("th", {}, "per second")));
  if (last) {
    // Reasons with no traffic this second are left out.
    for (const [k, v] of Object.entries(last.routed).filter(([, v]) => v > 0)) {
      const [node, reason] = k.split(" ");
      routed.append(el("tr", {}, el("td", {}, node), el("td", {}, reason), el("td", {}, num(v))));
    }
  }
}

// --- events ---------------------------------------------------------------------------------

function renderEvents() {
  const list = $("events");
  list.replaceChildren();
  // By time: a read-pool departure is reported a few seconds late (see sample.rs).
  const shown = state.events.slice(-100).sort((a, b) => b.unix_ms - a.unix_ms);
  list.hidden = shown.length === 0;
  $("no-events").hidden = shown.length > 0;
  for (const e of shown) {
    const when = new Date(e.unix_ms);
    // A failure's sentence may carry a server log's last lines: its first line is shown, the
    // whole text on hover.
    const firstLine = e.text.split("\n")[0];
    list.append(el("li", { "data-kind": e.kind, class: e.ok ? "" : "failed", title: e.text },
      el("time", { datetime: when.toISOString() }, when.toLocaleTimeString()),
      el("span", { class: "kind" }, e.kind.replace(/_/g, " ")),
      e.group ? "group " + e.group + " · " : "",
      firstLine.length > 240 ? firstLine.slice(0, 240) + "…" : firstLine));
  }
}

function render() {
  renderTopology();
  renderCharts();
  renderEvents();
}

// --- actions --------------------------------------------------------------------------------

async function post(path, what) {
  if (!window.confirm(what + "?")) {
    renderTopology(); // puts the commit mode selector back to the mode in effect
    return;
  }
  const result = $("action-result");
  result.textContent = what + "…";
  const headers = {};
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  try {
    const r = await fetch(path, { method: "POST", headers });
    result.textContent = (r.ok ? "" : "refused: ") + (await r.text());
  } catch (err) {
    result.textContent = "request failed: " + err;
  }
}

function switchover(node) {
  // The supervisor finds the node's shard group from its name.
  post("/switchover?to=" + encodeURIComponent(node), "Switch the primary over to " + node);
}

$("apply-commit").addEventListener("click", () => {
  const mode = $("commit-mode").value;
  post("/config?key=commit-mode&value=" + encodeURIComponent(mode), "Set the commit mode to " + mode);
});

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  document.cookie = "herd_token=" + encodeURIComponent($("token").value) + "; path=/; SameSite=Strict";
  location.reload();
});

// --- live updates ---------------------------------------------------------------------------

function setLive(on) {
  state.live = on;
  const c = $("conn");
  c.textContent = on ? "live" : "reconnecting…";
  c.className = "pill " + (on ? "on" : "off");
}

function trim() {
  const t0 = Date.now() - WINDOW_MS;
  while (state.points.length && state.points[0].t < t0) state.points.shift();
}

function connect() {
  const es = new EventSource("/events/stream");
  es.addEventListener("snapshot", (m) => {
    const s = JSON.parse(m.data);
    state.points = s.points;
    state.events = s.events;
    state.status = s.status;
    setLive(true);
    render();
  });
  es.addEventListener("sample", (m) => {
    const s = JSON.parse(m.data);
    state.points.push(s.point);
    state.status = s.status;
    trim();
    setLive(true);
    render();
  });
  es.addEventListener("event", (m) => {
    state.events.push(JSON.parse(m.data));
    if (state.events.length > 200) state.events.shift();
    renderEvents();
  });
  // The browser reconnects by itself; the next snapshot replaces what was missed.
  es.onerror = () => setLive(false);
}

// The bench reports change rarely: read once when the page opens.
async function loadBench() {
  const r = await fetch("/bench");
  if (!r.ok) return;
  const reports = await r.json();
  if (reports.length === 0) return;
  const root = $("bench-reports");
  for (const rep of reports) {
    const when = new Date(rep.modified_ms).toLocaleString();
    const box = el("div", { class: "report", "data-report": rep.name },
      el("h3", {}, (rep.name || "results") + " ", el("span", { class: "muted" }, when)));
    for (const c of rep.charts) {
      box.append(el("img", { src: "/bench/file?path=" + encodeURIComponent(c), alt: c, loading: "lazy" }));
    }
    const details = el("details", {}, el("summary", {}, "report.md"), el("pre", {}, rep.markdown));
    box.append(details);
    root.append(box);
  }
  $("bench").hidden = false;
}

async function start() {
  // Only asks whether a token is needed; the stream sends the snapshot itself.
  const r = await fetch("/status", { method: "HEAD" });
  if (r.status === 401) {
    $("login").hidden = false;
    $("main").hidden = true;
    $("conn").textContent = "token needed";
    return;
  }
  connect();
  loadBench().catch(() => {});
}

window.addEventListener("resize", () => renderCharts());
start().catch((err) => { $("conn").textContent = "cannot reach Herd: " + err; });
