// The dashboard's page: reads /api/* every two seconds and draws what it gets.
// Plain DOM and SVG, no framework and no build step.
"use strict";

const REFRESH_MS = 2000;
const $ = (selector) => document.querySelector(selector);

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

const count = (n) => Number(n).toLocaleString("en");

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? `${body.error.name}: ${body.error.message}` : response.statusText);
  return body;
}

function fillRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function showOverview(o) {
  const state = $("#state");
  state.textContent = o.state;
  state.className = `badge ${o.state}`;
  $("#reasons").textContent = (o.reasons || []).join("; ");
  $("#flush-mode").textContent = o.flush_mode;
  $("#topic-count").textContent = count(o.topics);
  $("#log-confirmed").textContent = bytes(o.offsets.confirmed || 0);
  $("#behind-flush").textContent = bytes(o.behind.flush || 0);
  $("#behind-dispatch").textContent = bytes(o.behind.dispatch || 0);
  $("#disk-used").textContent = `${(o.disk_used_ratio * 100).toFixed(1)} %` + (o.disk_full ? " (full)" : "");
  $("#timers-pending").textContent = count(o.timers_pending);
  $("#halves-pending").textContent = count(o.halves_pending);
  fillRows($("#actors tbody"), o.actors.map((a) => el("tr", { class: `state-${a.state}`, "data-actor": a.name },
    el("td", {}, a.name), el("td", { class: "state" }, a.state), el("td", { class: "num" }, a.pid),
    el("td", { class: "num restarts" }, a.restarts), el("td", { class: "num" }, bytes(a.rss_bytes)),
    el("td", { class: "num" }, a.open_files))));
  fillRows($("#offsets tbody"), Object.entries(o.offsets).map(([name, value]) =>
    el("tr", { "data-offset": name }, el("td", {}, name), el("td", { class: "num" }, count(value)))));
}

function showTopics(topics) {
  const rows = [];
  for (const t of topics) {
    for (const q of t.queues) {
      rows.push(el("tr", { "data-topic": t.topic, "data-queue": q.queue_id },
        el("td", {}, q.queue_id === 0 ? t.topic : ""), el("td", { class: "num" }, q.queue_id),
        el("td", { class: "num" }, count(q.min_offset)), el("td", { class: "num max-offset" }, count(q.max_offset)),
        el("td", { class: "num" }, count(q.sent_messages)), el("td", { class: "num" }, count(q.pulled_messages))));
    }
  }
  fillRows($("#topic-table tbody"), rows);
}

function showGroups(groups) {
  const rows = [];
  for (const g of groups) {
    for (const q of g.queues) {
      const pop = g.mode === "pop";
      rows.push(el("tr", { "data-group": g.group, "data-topic": g.topic, "data-queue": q.queue_id },
        el("td", {}, g.group), el("td", {}, g.topic), el("td", {}, g.mode), el("td", { class: "num" }, q.queue_id),
        el("td", { class: "num" }, count(pop ? q.in_flight : q.committed_offset)),
        el("td", { class: "num" }, count(q.max_offset)),
        el("td", { class: "num lag" }, count(pop ? q.due : q.lag))));
    }
  }
  fillRows($("#group-table tbody"), rows);
}

function polyline(points, width, height, top, colour) {
  const path = points.map(([x, y]) => `${x.toFixed(1)},${(height - (y / top) * (height - 10)).toFixed(1)}`);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", path.join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", colour);
  line.setAttribute("stroke-width", "2");
  return line;
}

function showRates(rates) {
  const svg = $("#chart-rates");
  const series = rates.series;
  const width = 800, height = 200;
  const top = Math.max(1, ...series.map((p) => Math.max(p.sent, p.pulled)));
  const x = (i) => (series.length > 1 ? (i / (series.length - 1)) * width : 0);
  svg.replaceChildren(
    polyline(series.map((p, i) => [x(i), p.sent]), width, height, top, "#2d72d2"),
    polyline(series.map((p, i) => [x(i), p.pulled]), width, height, top, "#d9822b"));
  const last = series[series.length - 1];
  $("#rate-now").textContent = last ? `now: ${count(Math.round(last.sent))} sent/s, ` +
    `${count(Math.round(last.pulled))} pulled/s; top of chart ${count(Math.round(top))}/s` : "";
}

async function refresh() {
  try {
    const [overview, topics, groups, rates] = await Promise.all(
      ["/api/overview", "/api/topics", "/api/groups", "/api/rates"].map(getJson));
    showOverview(overview);
    showTopics(topics);
    showGroups(groups);
    showRates(rates);
    $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("#state").textContent = "UNKNOWN";
    $("#state").className = "badge UNKNOWN";
    $("#updated").textContent = `cannot reach the engine: ${error.message}`;
  }
}

function showMessage(m) {
  const properties = Object.entries(m.properties || {}).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]);
  return el("div", { class: "message", "data-msg-id": m.msg_id },
    el("div", {}, el("strong", {}, m.msg_id), ` ${m.topic} / queue ${m.queue_id} / offset ${m.queue_offset}, `,
      `stored ${new Date(m.store_timestamp).toISOString()}, ${count(m.body_bytes)} bytes`),
    el("dl", {}, el("dt", {}, "keys"), el("dd", { class: "keys" }, (m.keys || []).join(", ")),
      el("dt", {}, "tags"), el("dd", {}, m.tags ?? ""), ...properties),
    el("pre", { class: `body ${m.body_encoding}` }, m.body_preview + (m.body_truncated ? " …" : "")));
}

async function search(event) {
  event.preventDefault();
  const form = new FormData($("#search-form"));
  const query = new URLSearchParams();
  for (const name of ["topic", "key", "msg_id"]) if (form.get(name)) query.set(name, form.get(name));
  if (form.get("time")) query.set("time_ms", String(new Date(form.get("time")).getTime()));
  $("#search-error").textContent = "";
  try {
    const messages = await getJson(`/api/search?${query}`);
    $("#results").replaceChildren(...(messages.length ? messages.map(showMessage)
      : [el("p", { class: "muted" }, "no message found")]));
  } catch (error) {
    $("#results").replaceChildren();
    $("#search-error").textContent = error.message;
  }
}

$("#search-form").addEventListener("submit", search);
const initial = new URLSearchParams(location.search);  // /?topic=T&key=K searches at once
for (const name of ["topic", "key", "msg_id"]) if (initial.get(name)) $(`[name=${name}]`).value = initial.get(name);
refresh();
setInterval(refresh, REFRESH_MS);
if (initial.get("key") || initial.get("msg_id")) $("#search-form").requestSubmit();
