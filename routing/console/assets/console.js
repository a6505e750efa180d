// Triage console: a client of the public JSON API (the routes of the
// grpc-gateway) only. No framework, no build step.
"use strict";

// ROUTES are every API route the console calls, written as the OpenAPI
// document names them (a test checks each against it).
const ROUTES = {
  listTopics: "GET /v1/namespaces/{namespace}/topics",
  topicStats: "GET /v1/namespaces/{namespace}/topics/{topic}/stats",
  getItem: "GET /v1/namespaces/{namespace}/items/{id}",
  listItems: "GET /v1/namespaces/{namespace}/topics/{topic}/items",
  updateItem: "PATCH /v1/namespaces/{namespace}/items/{id}",
  deleteItem: "DELETE /v1/namespaces/{namespace}/items/{id}",
  throughput: "GET /v1/namespaces/{namespace}/throughput",
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

// SERIES are the throughput chart's lines: the field of
// GetThroughput's answer and its label.
const SERIES = [["enqueued", "enqueued"], ["delivered", "delivered"], ["acked", "acked"], ["dead_lettered", "dead-lettered"]];

// niceMax rounds a peak up to 1, 2 or 5 times a power of ten, the top of
// the chart's scale.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 5, 10].map((m) => m * p).find((m) => v <= m);
}

// rateText formats items per second.
function rateText(v) {
  if (v === 0) return "0";
  return v >= 100 ? String(Math.round(v)) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}

// throughputChart draws GetThroughput's series as lines over the last
// hour, one point per interval, with a legend of each line's latest and
// peak rate. Each line carries its peak in data-peak (for tests and
// tools).
function throughputChart(t) {
  const width = 760, left = 52, plotW = width - left - 12, plotH = 110, top = 8, height = top + plotH + 60;
  const series = SERIES.map(([key, label]) => ({ key, label, values: (t[key] || []).map(Number) }));
  const n = Math.max(2, ...series.map((s) => s.values.length));
  const max = niceMax(Math.max(0, ...series.flatMap((s) => s.values)));
  const x = (i) => left + (i / (n - 1)) * plotW;
  const y = (v) => top + plotH - (v / max) * plotH;
  const svg = svgEl("svg", { width, height, viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": "Items per second over the last hour" });
  for (const v of [0, max / 2, max]) {
    svg.appendChild(svgEl("line", { x1: left, x2: left + plotW, y1: y(v), y2: y(v), class: "grid" }));
    svg.appendChild(svgEl("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, rateText(v) + "/s"));
  }
  const minutes = (n * durationSeconds(t.interval)) / 60;
  [0, 0.25, 0.5, 0.75, 1].forEach((f) => {
    const label = f === 1 ? "now" : "-" + Math.round(minutes * (1 - f)) + " min";
    svg.appendChild(svgEl("text", { x: left + f * plotW, y: top + plotH + 16, "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle" }, label));
  });
  series.forEach((s, k) => {
    const peak = Math.max(0, ...s.values);
    const line = svgEl("polyline", { points: s.values.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1)).join(" "),
      class: "tp tp-" + s.key, "data-series": s.key, "data-peak": String(peak) });
    line.appendChild(svgEl("title", {}, s.label + ": peak " + rateText(peak) + "/s"));
    svg.appendChild(line);
    const lx = left + (k % 2) * 300, ly = top + plotH + 38 + Math.floor(k / 2) * 16;
    svg.appendChild(svgEl("rect", { x: lx, y: ly - 9, width: 14, height: 4, class: "tp-key tp-" + s.key }));
    const now = s.values.length ? s.values[s.values.length - 1] : 0;
    svg.appendChild(svgEl("text", { x: lx + 18, y: ly }, s.label + " " + rateText(now) + "/s (peak " + rateText(peak) + ")"));
  });
  return svg;
}

// ---- views ----

// Pager keeps the page tokens of a paged list, so that Previous goes
// back without the API paging backwards. key names the list the tokens
// belong to: a different list starts again at its first page.
class Pager {
  constructor() { this.reset(""); }
  reset(key) { this.key = key; this.tokens = [""]; this.at = 0; this.next = ""; }
  use(key) { if (key !== this.key) this.reset(key); return this.tokens[this.at]; }
  forward() {
    if (!this.next) return false;
    this.tokens.length = this.at + 1;
    this.tokens.push(this.next);
    this.at++;
    return true;
  }
  back() { if (this.at === 0) return false; this.at--; return true; }
  show(prefix, text) {
    $(prefix + "-prev").disabled = this.at === 0;
    $(prefix + "-next").disabled = !this.next;
    $(prefix + "-page").textContent = "page " + (this.at + 1) + (text ? ", " + text : "");
  }
}

const itemsPager = new Pager();
const dlPager = new Pager();

// loadThroughput draws the namespace's throughput, or says why it
// cannot.
async function loadThroughput(namespace) {
  const box = $("throughput-chart");
  try {
    const t = await call("throughput", { namespace });
    clear(box);
    box.appendChild(throughputChart(t));
  } catch (err) {
    clear(box);
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = "Throughput unavailable: " + err.message;
    box.appendChild(p);
  }
}

async function loadTopics() {
  const { namespace, region } = settings();
  document.querySelectorAll(".ns").forEach((e) => { e.textContent = namespace; });
  const [list] = await Promise.all([call("listTopics", { namespace }, { region, page_size: 1000 }), loadThroughput(namespace)]);
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
    const browse = document.createElement("button");
    browse.type = "button";
    browse.className = "browse";
    browse.textContent = "Browse";
    browse.addEventListener("click", () => browseTopic(s.topic));
    cell(tr, browse);
    tbody.appendChild(tr);
  }
  if (!stats.length) {
    const tr = document.createElement("tr");
    cell(tr, "No topics hold items in " + namespace + ".").colSpan = 10;
    tbody.appendChild(tr);
  }
  $("topics-at").textContent = "as of " + new Date().toLocaleTimeString();
}

// setPaused pauses or resumes a topic's deliveries, then shows the
// page again.
async function setPaused(topic, paused) {
  const { namespace } = settings();
  if (paused && !confirm("Pause deliveries of " + topic + "? Dequeues get nothing of it until it is resumed; enqueues go on.")) return;
  await call(paused ? "pauseTopic" : "resumeTopic", { namespace, topic }, null, {});
  await loaders[current]();
}

// browseTopic shows a topic's ready items from the first page.
function browseTopic(topic) {
  $("items-topic").value = topic;
  $("items-state").value = "ready";
  $("items-min").value = "";
  $("items-max").value = "";
  location.hash = "#items";
  if (current === "items") run("items");
}

// itemsQuery is the item list's form: the topic and what to list of it.
function itemsQuery() {
  return { topic: $("items-topic").value.trim(), state: $("items-state").value, min: $("items-min").value.trim(),
    max: $("items-max").value.trim(), size: $("items-size").value };
}

// loadItems lists a page of a topic's items in the state and priority
// range asked, with the topic's pause state.
async function loadItems() {
  const { namespace, region } = settings();
  const f = itemsQuery();
  if (!f.topic) return;
  const token = itemsPager.use(JSON.stringify([namespace, region, f]));
  const [res, stats] = await Promise.all([
    call("listItems", { namespace, topic: f.topic }, { region, state: f.state, min_priority: f.min, max_priority: f.max, page_size: f.size, page_token: token }),
    call("topicStats", { namespace, topic: f.topic }, { region }),
  ]);
  $("items-title").textContent = f.topic;
  $("items-paused").hidden = !stats.paused;
  const toggle = $("items-toggle");
  toggle.hidden = false;
  toggle.className = stats.paused ? "resume" : "pause";
  toggle.textContent = stats.paused ? "Resume" : "Pause";
  toggle.dataset.topic = f.topic;
  toggle.dataset.paused = stats.paused ? "true" : "";
  itemsPager.next = res.next_page_token || "";
  const tbody = $("items-table").tBodies[0];
  clear(tbody);
  const items = res.items || [];
  items.forEach((it) => tbody.appendChild(itemRow(it)));
  if (!items.length) {
    const tr = document.createElement("tr");
    cell(tr, "No " + f.state + " items of " + f.topic + (f.min || f.max ? " in that priority range" : "") + ".").colSpan = 8;
    tbody.appendChild(tr);
  }
  itemsPager.show("items", items.length + " " + f.state + " item(s)");
}

// itemRow is one item of the list with its actions: change its
// priority, delete it.
function itemRow(it) {
  const tr = document.createElement("tr");
  tr.dataset.id = it.id;
  const link = document.createElement("a");
  link.href = "#item";
  link.textContent = it.id;
  link.addEventListener("click", () => { $("item-id").value = it.id; });
  cell(tr, link, "id");
  cell(tr, String(num(it.priority)), "num");
  cell(tr, String(num(it.attempts)), "num");
  cell(tr, it.state === "LEASED" ? "leased until " + when(it.lease_expires_at) : when(it.deliver_after));
  cell(tr, when(it.enqueued_at));
  cell(tr, it.last_error || "");
  cell(tr, payload(it.payload) + (it.payload_truncated ? "…" : ""), "payload");
  const actions = document.createElement("span");
  actions.className = "actions";
  const prio = document.createElement("input");
  prio.type = "number";
  prio.className = "prio-input";
  prio.value = String(num(it.priority));
  prio.setAttribute("aria-label", "New priority of " + it.id);
  const set = document.createElement("button");
  set.type = "button";
  set.className = "set-priority";
  set.textContent = "Set priority";
  set.addEventListener("click", () => setPriority(it.id, prio.value).catch(showError));
  const del = document.createElement("button");
  del.type = "button";
  del.className = "danger delete-item";
  del.textContent = "Delete";
  del.addEventListener("click", () => deleteItem(it.id).catch(showError));
  actions.append(prio, set, del);
  cell(tr, actions);
  return tr;
}

// setPriority changes an item's priority (UpdateItem, recorded as the
// console's change) and lists the page again.
async function setPriority(id, value) {
  const { namespace } = settings();
  const priority = Number(value);
  if (value.trim() === "" || !Number.isInteger(priority)) { $("items-status").textContent = "A priority is a whole number."; return; }
  await call("updateItem", { namespace, id }, null, { priority, updated_by: "console" });
  await loadItems();
  $("items-status").textContent = "Priority of " + id + " set to " + priority + ".";
}

// deleteItem deletes an item for good, whatever its state, and lists the
// page again.
async function deleteItem(id) {
  const { namespace } = settings();
  if (!confirm("Delete item " + id + " for good?")) return;
  await call("deleteItem", { namespace, id });
  await loadItems();
  $("items-status").textContent = "Deleted " + id + ".";
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

// loadDeadLetters lists a page of a topic's dead letters, oldest first,
// each with its own redrive and delete.
async function loadDeadLetters() {
  const { namespace, region } = settings();
  const topic = $("dl-topic").value.trim();
  if (!topic) return;
  const token = dlPager.use(JSON.stringify([namespace, region, topic]));
  const res = await call("listDeadLetters", { namespace, topic }, { region, page_size: 100, page_token: token });
  dlPager.next = res.next_page_token || "";
  const tbody = $("dl-table").tBodies[0];
  clear(tbody);
  const letters = res.dead_letters || [];
  for (const d of letters) {
    const tr = document.createElement("tr");
    tr.dataset.id = d.id;
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
    const again = document.createElement("button");
    again.type = "button";
    again.className = "redrive-one";
    again.textContent = "Redrive";
    again.addEventListener("click", () => redrive(false, [d.id]).catch(showError));
    const del = document.createElement("button");
    del.type = "button";
    del.className = "danger delete-one";
    del.textContent = "Delete";
    del.addEventListener("click", () => deleteDeadLetters(false, [d.id]).catch(showError));
    const actions = document.createElement("span");
    actions.className = "actions";
    actions.append(again, del);
    cell(tr, actions);
    tbody.appendChild(tr);
  }
  $("dl-all").checked = false;
  for (const b of ["dl-redrive-selected", "dl-redrive-all", "dl-delete-selected", "dl-delete-all"]) $(b).disabled = letters.length === 0 && dlPager.at === 0;
  $("dl-status").textContent = letters.length + " dead letter(s)" + (dlPager.next ? ", more on the next page" : "");
  dlPager.show("dl");
}

// pickedLetters are the IDs of the dead letters ticked on the page.
function pickedLetters() {
  return [...document.querySelectorAll(".dl-pick:checked")].map((b) => b.value);
}

// redrive puts dead letters back in their topic: ids (the ticked ones
// when not given), or with all every one of the topic's.
async function redrive(all, ids) {
  const { namespace, region } = settings();
  const topic = $("dl-topic").value.trim();
  ids = all ? [] : ids || pickedLetters();
  if (!all && ids.length === 0) { $("dl-status").textContent = "Select dead letters first."; return; }
  if (!confirm(all ? "Redrive every dead letter of " + topic + "?" : "Redrive " + ids.length + " dead letter(s)?")) return;
  const res = await call("redrive", { namespace, topic }, null, { region, ids });
  if (all) dlPager.reset(dlPager.key);
  await loadDeadLetters();
  $("dl-status").textContent = "Redriven: " + num(res.redriven) + ". " + $("dl-status").textContent;
}

// deleteDeadLetters deletes dead letters for good: ids (the ticked ones
// when not given), or with all every one of the topic's.
async function deleteDeadLetters(all, ids) {
  const { namespace, region } = settings();
  const topic = $("dl-topic").value.trim();
  ids = all ? [] : ids || pickedLetters();
  if (!all && ids.length === 0) { $("dl-status").textContent = "Select dead letters first."; return; }
  if (!confirm(all ? "Delete every dead letter of " + topic + " for good?" : "Delete " + ids.length + " dead letter(s) for good?")) return;
  const body = all ? { region, all: true } : { region, ids };
  const res = await call("deleteDeadLetters", { namespace, topic }, null, body);
  if (all) dlPager.reset(dlPager.key);
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

const loaders = { topics: loadTopics, items: loadItems, item: loadItem, deadletters: loadDeadLetters, shards: loadShards, drills: loadDrills };
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
  $("dl-form").addEventListener("submit", (e) => { e.preventDefault(); dlPager.reset(""); run("deadletters"); });
  $("dl-prev").addEventListener("click", () => { if (dlPager.back()) run("deadletters"); });
  $("dl-next").addEventListener("click", () => { if (dlPager.forward()) run("deadletters"); });
  $("items-form").addEventListener("submit", (e) => { e.preventDefault(); itemsPager.reset(""); $("items-status").textContent = ""; run("items"); });
  $("items-prev").addEventListener("click", () => { if (itemsPager.back()) run("items"); });
  $("items-next").addEventListener("click", () => { if (itemsPager.forward()) run("items"); });
  $("items-toggle").addEventListener("click", (e) => setPaused(e.target.dataset.topic, !e.target.dataset.paused).catch(showError));
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
