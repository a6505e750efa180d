// Triage console: a client of the public JSON API (the routes of the
// grpc-gateway) only. No framework, no build step.
"use strict";

// ROUTES are every API route the console calls, written as the OpenAPI
// document names them (a test checks each against it).
const ROUTES = {
  listTopics: "GET /v1/namespaces/{namespace}/topics",
  topicStats: "GET /v1/namespaces/{namespace}/topics/{topic}/stats",
  getItem: "GET /v1/namespaces/{namespace}/items/{id}",
  listDeadLetters: "GET /v1/namespaces/{namespace}/topics/{topic}/deadletters",
  redrive: "POST /v1/namespaces/{namespace}/topics/{topic}/deadletters:redrive",
  deleteDeadLetters: "POST /v1/namespaces/{namespace}/topics/{topic}/deadletters:delete",
  pauseTopic: "POST /v1/namespaces/{namespace}/topics/{topic}:pause",
  resumeTopic: "POST /v1/namespaces/{namespace}/topics/{topic}:resume",
  shardMap: "GET /v1/shardmap",
  failovers: "GET /v1/failovers",
  listDrills: "GET /v1/drills",
};

const KEY = "triage.console.key";
const SETTINGS = "triage.console.settings";
const MAX_TOPICS = 50; // topics whose stats one refresh asks for
const SVG = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);

// ---- API ----

class APIError extends Error {
  constructor(status, body) {
    super((body && body.message) || ("HTTP " + status));
    this.status = status;
    this.code = body && body.code;
  }
}

function settings() {
  return { namespace: $("namespace").value.trim() || "default", region: $("region").value.trim() };
}

// call sends the request of route name with params: {path params},
// {query}, body. It adds the API key from sessionStorage.
async function call(name, params, query, body) {
  const [method, tmpl] = ROUTES[name].split(" ");
  const path = tmpl.replace(/\{(\w+)\}/g, (_, p) => encodeURIComponent(params[p]));
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== "" && v !== undefined && v !== null) q.set(k, v);
  }
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = "Bearer " + key;
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path + (q.toString() ? "?" + q : ""), init);
  let data = null;
  try { data = await resp.json(); } catch (_) { /* not JSON */ }
  if (!resp.ok) throw new APIError(resp.status, data);
  return data;
}

function showError(err) {
  const box = $("error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  let msg = err.message || String(err);
  if (err.status === 401) msg = "The API wants a key: " + msg;
  if (err.status === 403) msg = "This key may not do that: " + msg;
  box.textContent = msg;
  box.hidden = false;
}

// ---- formatting ----

const num = (v) => Number(v || 0);

// seconds of a protojson Duration ("1.500s").
function durationSeconds(d) {
  if (!d) return 0;
  return parseFloat(String(d).replace(/s$/, "")) || 0;
}

function age(d) {
  let s = durationSeconds(d);
  if (s <= 0) return "–";
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function when(ts) {
  if (!ts) return "–";
  const d = new Date(ts);
  return isNaN(d) ? String(ts) : d.toLocaleString();
}

// payload decodes a protojson bytes field (base64) as text when it is
// printable, else shows the base64.
function payload(b64) {
  if (!b64) return "";
  try {
    const bin = atob(b64);
    const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
    const text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    if (!/[\u0000-\u0008\u000e-\u001f]/.test(text)) return text;
  } catch (_) { /* binary */ }
  return "base64:" + b64;
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  if (text instanceof Node) td.appendChild(text);
  else td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }

function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// ---- charts (inline SVG) ----

// depthChart draws a stacked horizontal bar per topic: ready, leased,
// delayed.
function depthChart(stats) {
  const rowH = 22, labelW = 160, width = 760, barW = width - labelW - 70;
  const max = Math.max(1, ...stats.map((s) => num(s.ready) + num(s.leased) + num(s.delayed)));
  const height = rowH * stats.length + 28;
  const svg = svgEl("svg", { width, height, viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": "Depth by topic" });
  stats.forEach((s, i) => {
    const y = i * rowH;
    svg.appendChild(svgEl("text", { x: 0, y: y + 15 }, s.topic));
    let x = labelW;
    for (const part of ["ready", "leased", "delayed"]) {
      const w = (num(s[part]) / max) * barW;
      if (w > 0) {
        const r = svgEl("rect", { x, y: y + 3, width: Math.max(w, 1), height: rowH - 6, class: part });
        r.appendChild(svgEl("title", {}, part + ": " + num(s[part])));
        svg.appendChild(r);
      }
      x += w;
    }
    svg.appendChild(svgEl("text", { x: x + 6, y: y + 15 }, String(num(s.ready) + num(s.leased) + num(s.delayed))));
  });
  const ly = rowH * stats.length + 18;
  ["ready", "leased", "delayed"].forEach((part, i) => {
    svg.appendChild(svgEl("rect", { x: labelW + i * 90, y: ly - 10, width: 12, height: 12, class: part }));
    svg.appendChild(svgEl("text", { x: labelW + i * 90 + 16, y: ly }, part));
  });
  return svg;
}

// priorityChart draws ready items by priority as small vertical bars.
function priorityChart(bands) {
  const w = 18, h = 40, svg = svgEl("svg", { width: Math.max(1, bands.length) * w + 2, height: h + 14, role: "img", "aria-label": "Ready by priority" });
  const max = Math.max(1, ...bands.map((b) => num(b.ready)));
  bands.forEach((b, i) => {
    const bh = Math.max(1, (num(b.ready) / max) * h);
    const r = svgEl("rect", { x: i * w + 1, y: h - bh, width: w - 3, height: bh, class: "prio" });
    r.appendChild(svgEl("title", {}, "priority " + num(b.priority) + ": " + num(b.ready) + " ready"));
    svg.appendChild(r);
    svg.appendChild(svgEl("text", { x: i * w + 3, y: h + 12 }, String(num(b.priority))));
  });
  return svg;
}

// ---- views ----

async function loadTopics() {
  const { namespace, region } = settings();
  document.querySelectorAll(".ns").forEach((e) => { e.textContent = namespace; });
  const list = await call("listTopics", { namespace }, { region, page_size: 1000 });
  const names = (list.topics || []).map((t) => t.topic).slice(0, MAX_TOPICS);
  const stats = await Promise.all(names.map((topic) => call("topicStats", { namespace, topic }, { region })));
  const names_ = $("topic-names");
  clear(names_);
  names.forEach((n) => { const o = document.createElement("option"); o.value = n; names_.appendChild(o); });

  const chart = $("topics-chart");
  clear(chart);
  if (stats.length) chart.appendChild(depthChart(stats));
  const tbody = $("topics-table").tBodies[0];
  clear(tbody);
  for (const s of stats) {
    const tr = document.createElement("tr");
    tr.dataset.topic = s.topic;
    const name = document.createElement("span");
    name.textContent = s.topic;
    if (s.paused) {
      const badge = document.createElement("span");
      badge.className = "badge paused";
      badge.textContent = "paused";
      badge.title = "PauseTopic holds this topic's deliveries; enqueues go on";
      name.append(" ", badge);
    }
    cell(tr, name);
    cell(tr, String(num(s.ready)), "num");
    cell(tr, String(num(s.leased)), "num");
    cell(tr, String(num(s.delayed)), "num");
    cell(tr, String(num(s.total)), "num");
    cell(tr, age(s.oldest_ready_age), "num");
    const dl = document.createElement("a");
    dl.href = "#deadletters";
    dl.textContent = String(num(s.dead_letters));
    // The hash change that follows shows the dead letters page, which
    // lists this topic's.
    dl.addEventListener("click", () => { $("dl-topic").value = s.topic; });
    cell(tr, dl, "num");
    cell(tr, priorityChart(s.ready_by_priority || []));
    const toggle = document.createElement("button");
    toggle.type = "button";
    toggle.className = s.paused ? "resume" : "pause";
    toggle.textContent = s.paused ? "Resume" : "Pause";
    toggle.addEventListener("click", () => setPaused(s.topic, !s.paused).catch(showError));
    cell(tr, toggle);
    tbody.appendChild(tr);
  }
  if (!stats.length) {
    const tr = document.createElement("tr");
    cell(tr, "No topics hold items in " + namespace + ".").colSpan = 9;
    tbody.appendChild(tr);
  }
  $("topics-at").textContent = "as of " + new Date().toLocaleTimeString();
}

// setPaused pauses or resumes a topic's deliveries, then shows the
// topics again.
async function setPaused(topic, paused) {
  const { namespace } = settings();
  if (paused && !confirm("Pause deliveries of " + topic + "? Dequeues get nothing of it until it is resumed; enqueues go on.")) return;
  await call(paused ? "pauseTopic" : "resumeTopic", { namespace, topic }, null, {});
  await loadTopics();
}

async function loadItem() {
  const { namespace } = settings();
  const id = $("item-id").value.trim();
  if (!id) return;
  const item = await call("getItem", { namespace, id });
  const dl = $("item-detail");
  clear(dl);
  const rows = [
    ["ID", item.id], ["Namespace", item.namespace], ["Topic", item.topic], ["State", item.state],
    ["Priority", String(item.priority) + (item.original_priority !== item.priority ? " (was " + item.original_priority + ")" : "")],
    ["Priority changed", item.priority_changed_by ? item.priority_changed_by + " at " + when(item.priority_changed_at) : "–"],
    ["Attempts", String(item.attempts)], ["Last error", item.last_error || "–"], ["Region", item.region],
    ["Enqueued", when(item.enqueued_at)], ["Deliver after", when(item.deliver_after)], ["Updated", when(item.updated_at)],
    ["Lease expires", when(item.lease_expires_at)], ["Lease duration", item.lease_duration || "–"],
    ["Expires", when(item.expires_at)], ["Dedup key", item.dedup_key || "–"],
    ["Metadata", JSON.stringify(item.metadata || {}, null, 1)], ["Payload", payload(item.payload)],
  ];
  for (const [k, v] of rows) {
    const dt = document.createElement("dt"); dt.textContent = k; dl.appendChild(dt);
    const dd = document.createElement("dd"); dd.textContent = v; dl.appendChild(dd);
  }
}

async function loadDeadLetters() {
  const { namespace, region } = settings();
  const topic = $("dl-topic").value.trim();
  if (!topic) return;
  const res = await call("listDeadLetters", { namespace, topic }, { region, page_size: 100 });
  const tbody = $("dl-table").tBodies[0];
  clear(tbody);
  const letters = res.dead_letters || [];
  for (const d of letters) {
    const tr = document.createElement("tr");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.value = d.id;
    box.className = "dl-pick";
    cell(tr, box);
    cell(tr, d.id, "id");
    cell(tr, String(d.priority), "num");
    cell(tr, String(d.attempts), "num");
    cell(tr, d.last_error || "");
    cell(tr, when(d.enqueued_at));
    cell(tr, when(d.died_at));
    cell(tr, payload(d.payload), "payload");
    tbody.appendChild(tr);
  }
  $("dl-all").checked = false;
  for (const b of ["dl-redrive-selected", "dl-redrive-all", "dl-delete-selected", "dl-delete-all"]) $(b).disabled = letters.length === 0;
  $("dl-status").textContent = letters.length + " dead letter(s)" + (res.next_page_token ? ", more not shown" : "");
}

async function redrive(all) {
  const { namespace, region } = settings();
  const topic = $("dl-topic").value.trim();
  const ids = all ? [] : [...document.querySelectorAll(".dl-pick:checked")].map((b) => b.value);
  if (!all && ids.length === 0) { $("dl-status").textContent = "Select dead letters first."; return; }
  if (!confirm(all ? "Redrive every dead letter of " + topic + "?" : "Redrive " + ids.length + " dead letter(s)?")) return;
  const res = await call("redrive", { namespace, topic }, null, { region, ids });
  await loadDeadLetters();
  $("dl-status").textContent = "Redriven: " + num(res.redriven) + ". " + $("dl-status").textContent;
}

// deleteDeadLetters deletes the selected dead letters, or all of the
// topic's, for good.
async function deleteDeadLetters(all) {
  const { namespace, region } = settings();
  const topic = $("dl-topic").value.trim();
  const ids = all ? [] : [...document.querySelectorAll(".dl-pick:checked")].map((b) => b.value);
  if (!all && ids.length === 0) { $("dl-status").textContent = "Select dead letters first."; return; }
  if (!confirm(all ? "Delete every dead letter of " + topic + " for good?" : "Delete " + ids.length + " dead letter(s) for good?")) return;
  const body = all ? { region, all: true } : { region, ids };
  const res = await call("deleteDeadLetters", { namespace, topic }, null, body);
  await loadDeadLetters();
  $("dl-status").textContent = "Deleted: " + num(res.deleted) + ". " + $("dl-status").textContent;
}

async function loadShards() {
  const m = await call("shardMap", {});
  $("map-version").textContent = "version " + m.version;
  const tbody = $("shards-table").tBodies[0];
  clear(tbody);
  for (const s of m.shards || []) {
    const tr = document.createElement("tr");
    cell(tr, String(s.id), "num");
    cell(tr, s.home_region);
    cell(tr, s.primary);
    cell(tr, s.primary_region || s.home_region);
    cell(tr, (s.replicas || []).map((r, i) => r + " (" + ((s.replica_regions || [])[i] || "?") + ")").join(", ") || "–");
    cell(tr, String(s.epoch), "num");
    const state = s.fenced ? "fenced (failing over)" : s.draining ? "draining" : "serving";
    cell(tr, state, s.fenced ? "fenced" : "");
    cell(tr, String(s.weight || 1), "num");
    tbody.appendChild(tr);
  }
  const nsBody = $("ns-table").tBodies[0];
  clear(nsBody);
  for (const n of m.namespaces || []) {
    const tr = document.createElement("tr");
    cell(tr, n.namespace); cell(tr, n.region); cell(tr, (n.shards || []).join(", "));
    nsBody.appendChild(tr);
  }
  const fBody = $("failovers-table").tBodies[0];
  clear(fBody);
  const note = $("failovers-note");
  note.hidden = true;
  try {
    const f = await call("failovers", {}, { limit: 200 });
    $("controller").textContent = f.controller ? "(controller " + f.controller + ")" : "";
    const events = (f.events || []).slice().reverse();
    for (const e of events) {
      const tr = document.createElement("tr");
      cell(tr, when(e.at)); cell(tr, String(e.shard), "num"); cell(tr, e.step); cell(tr, e.details || "");
      fBody.appendChild(tr);
    }
    if (!events.length) { note.textContent = "No failover since the controller leader started."; note.hidden = false; }
  } catch (err) {
    note.textContent = "Failover history unavailable: " + err.message;
    note.hidden = false;
  }
}

// selectedDrill is the drill whose events the drills page shows: the one
// clicked, else the newest.
let selectedDrill = "";

function drillResult(d) {
  if (!d.done) return "running";
  return d.verdict || "done";
}

async function loadDrills() {
  const res = await call("listDrills", {});
  const drills = res.drills || [];
  if (!drills.some((d) => d.id === selectedDrill)) selectedDrill = drills.length ? drills[0].id : "";
  const tbody = $("drills-table").tBodies[0];
  clear(tbody);
  for (const d of drills) {
    const tr = document.createElement("tr");
    tr.dataset.drill = d.id;
    tr.className = "pick" + (d.id === selectedDrill ? " selected" : "");
    tr.addEventListener("click", () => { selectedDrill = d.id; run("drills"); });
    cell(tr, d.id, "id");
    cell(tr, d.scenario || "–");
    cell(tr, when(d.started_at));
    cell(tr, d.phase || "–");
    cell(tr, when(d.updated_at));
    const result = drillResult(d);
    cell(tr, result, result === "PASS" ? "pass" : d.done ? "fail" : "");
    tbody.appendChild(tr);
  }
  const note = $("drills-note");
  note.hidden = drills.length > 0;
  note.textContent = drills.length ? "" : "No drill reported in the last 24 hours (triage-bed drill reports its progress here).";
  const d = drills.find((x) => x.id === selectedDrill);
  $("drill-selected").textContent = d ? d.id : "–";
  const events = (d && d.events) || [];
  $("drill-count").textContent = d ? "(" + events.length + " event(s), " + (d.done ? drillResult(d) : d.phase || "running") + ")" : "";
  const log = $("drill-log");
  // Follow the end of the log unless the reader scrolled up.
  const follow = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  clear(log);
  for (const e of events) {
    const li = document.createElement("li");
    const at = document.createElement("time");
    at.textContent = e.at ? new Date(e.at).toLocaleTimeString() : "";
    if (e.at) at.dateTime = e.at;
    const text = document.createElement("span");
    text.textContent = e.text;
    li.appendChild(at);
    li.appendChild(text);
    log.appendChild(li);
  }
  if (follow) log.scrollTop = log.scrollHeight;
  $("drills-at").textContent = "as of " + new Date().toLocaleTimeString();
}

// ---- wiring ----

const loaders = { topics: loadTopics, item: loadItem, deadletters: loadDeadLetters, shards: loadShards, drills: loadDrills };
let current = "topics";

function run(view) {
  showError(null);
  return loaders[view]().catch(showError);
}

function show(view) {
  if (!loaders[view]) view = "topics";
  current = view;
  document.querySelectorAll("section[data-view]").forEach((s) => { s.hidden = s.dataset.view !== view; });
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === view));
  run(view);
}

function saveSettings() {
  const s = settings();
  sessionStorage.setItem(SETTINGS, JSON.stringify(s));
  const key = $("key").value.trim();
  if (key) sessionStorage.setItem(KEY, key);
  $("key").value = "";
  $("key").placeholder = sessionStorage.getItem(KEY) ? "kept in this tab" : "none";
}

document.addEventListener("DOMContentLoaded", () => {
  try {
    const s = JSON.parse(sessionStorage.getItem(SETTINGS) || "{}");
    if (s.namespace) $("namespace").value = s.namespace;
    if (s.region) $("region").value = s.region;
  } catch (_) { /* ignore */ }
  $("key").placeholder = sessionStorage.getItem(KEY) ? "kept in this tab" : "none";
  $("settings").addEventListener("submit", (e) => { e.preventDefault(); saveSettings(); run(current); });
  $("forget").addEventListener("click", () => { sessionStorage.removeItem(KEY); $("key").placeholder = "none"; });
  $("refresh-topics").addEventListener("click", () => run("topics"));
  $("refresh-shards").addEventListener("click", () => run("shards"));
  $("item-form").addEventListener("submit", (e) => { e.preventDefault(); run("item"); });
  $("dl-form").addEventListener("submit", (e) => { e.preventDefault(); run("deadletters"); });
  $("dl-all").addEventListener("change", (e) => { document.querySelectorAll(".dl-pick").forEach((b) => { b.checked = e.target.checked; }); });
  $("dl-redrive-selected").addEventListener("click", () => redrive(false).catch(showError));
  $("dl-redrive-all").addEventListener("click", () => redrive(true).catch(showError));
  $("dl-delete-selected").addEventListener("click", () => deleteDeadLetters(false).catch(showError));
  $("dl-delete-all").addEventListener("click", () => deleteDeadLetters(true).catch(showError));
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  setInterval(() => { if (current === "topics" && $("auto").checked && !document.hidden) run("topics"); }, 5000);
  // The drills page is a live log: poll every second, one request at a
  // time, keeping the page (and any error) as it is until the answer.
  let polling = false;
  setInterval(() => {
    if (current !== "drills" || document.hidden || polling) return;
    polling = true;
    loadDrills().then(() => showError(null), showError).finally(() => { polling = false; });
  }, 1000);
  show(location.hash.slice(1) || "topics");
});
