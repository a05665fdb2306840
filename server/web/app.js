// HyScale's web view: polls hyscaled's JSON (server/web_ui.h) and draws the job list and, for
// the job named in the URL fragment (#job=ID), its step phases and loss as inline SVG.
// Everything from the server is set as text, never as HTML: job names come from users.
"use strict";

const POLL_MS = 2000;
const MAX_POINTS = 400;  // steps drawn per chart; longer runs are averaged into buckets
const COLORS = ["#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d", "#b6992d",
                "#f1ce63", "#499894", "#86bcb6", "#e15759", "#ff9d9a", "#79706e", "#bab0ac",
                "#d37295", "#fabfd2", "#b07aa1", "#d4a6c8", "#9d7660", "#d7b5a6", "#17becf",
                "#bcbd22", "#7f7f7f"];
const SVG_NS = "http://www.w3.org/2000/svg";
const W = 600, H = 260, PAD = {left: 48, right: 10, top: 10, bottom: 24};

// The token comes in the fragment (never sent to a server), is kept for this tab only, and is
// taken out of the address bar.
function takeToken() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has("token")) {
    sessionStorage.setItem("hyscale-token", params.get("token"));
    params.delete("token");
    history.replaceState(null, "", params.toString() ? "#" + params.toString() : location.pathname);
  }
  return sessionStorage.getItem("hyscale-token") || "";
}

const token = takeToken();
let detail = null;  // {id, after, steps, job} of the job shown

function selectedJob() {
  return new URLSearchParams(location.hash.slice(1)).get("job");
}

async function getJson(url) {
  const headers = token ? {Authorization: "Bearer " + token} : {};
  const response = await fetch(url, {headers, cache: "no-store"});
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function setStatus(text, error) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = error ? "error" : "";
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function svgEl(tag, attributes) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

function fmt(value, digits) {
  if (!value) return "-";
  return Math.abs(value) >= 1000 ? Math.round(value).toLocaleString("en-US")
                                 : Number(value).toFixed(digits);
}

function renderJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  document.getElementById("no-jobs").hidden = jobs.length > 0;
  for (const job of jobs) {
    const row = el("tr", undefined, "job-row");
    row.dataset.id = job.id;
    if (job.id === selectedJob()) row.classList.add("selected");
    row.append(el("td", job.id), el("td", job.name));
    const state = el("td");
    state.append(el("span", job.state, "state " + job.state));
    row.append(state,
               el("td", job.total_steps ? job.step + " / " + job.total_steps : String(job.step),
                  "num"),
               el("td", fmt(job.loss, 4), "num"), el("td", fmt(job.tokens_per_second, 1), "num"),
               el("td", String(job.restarts), "num"), el("td", job.reason));
    row.addEventListener("click", () => { location.hash = "job=" + encodeURIComponent(job.id); });
    body.append(row);
  }
}

// Averages consecutive steps into at most MAX_POINTS buckets.
function bucketed(steps) {
  const size = Math.max(1, Math.ceil(steps.length / MAX_POINTS));
  const out = [];
  for (let i = 0; i < steps.length; i += size) {
    const group = steps.slice(i, i + size);
    const phases = {};
    for (const s of group) {
      for (const [name, seconds] of Object.entries(s.phases)) {
        phases[name] = (phases[name] || 0) + seconds / group.length;
      }
    }
    const loss = group.reduce((sum, s) => sum + s.loss, 0) / group.length;
    out.push({step: group[group.length - 1].step, phases, loss});
  }
  return out;
}

// The phases the points have, in the trainer's step order (`order`, as the server sends it).
function phaseNames(points, order) {
  const seen = new Set();
  for (const p of points) for (const name of Object.keys(p.phases)) seen.add(name);
  const known = order.filter((name) => seen.has(name));
  const others = [...seen].filter((name) => !order.includes(name)).sort();
  return known.concat(others);
}

// Axes, labels and the mapping from data to the plot area.
function frame(svg, points, yMax) {
  svg.replaceChildren();
  const x0 = points[0].step, x1 = points[points.length - 1].step;
  const x = (step) => PAD.left + (x1 === x0 ? 0.5 : (step - x0) / (x1 - x0)) *
                                     (W - PAD.left - PAD.right);
  const y = (value) => H - PAD.bottom - (value / yMax) * (H - PAD.top - PAD.bottom);
  svg.append(svgEl("line", {x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right,
                            y2: H - PAD.bottom, stroke: "#8a93a5"}),
             svgEl("line", {x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom,
                            stroke: "#8a93a5"}));
  const label = (text, attributes) => {
    const node = svgEl("text", Object.assign({class: "axis"}, attributes));
    node.textContent = text;
    svg.append(node);
  };
  label(yMax.toPrecision(3), {x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end"});
  label("0", {x: PAD.left - 4, y: H - PAD.bottom, "text-anchor": "end"});
  label("step " + x0, {x: PAD.left, y: H - 6});
  label("step " + x1, {x: W - PAD.right, y: H - 6, "text-anchor": "end"});
  return {x, y};
}

function emptyChart(svg, text) {
  svg.replaceChildren();
  const node = svgEl("text", {class: "axis", x: W / 2, y: H / 2, "text-anchor": "middle"});
  node.textContent = text;
  svg.append(node);
}

function renderPhaseChart(points, order) {
  const svg = document.getElementById("phase-chart");
  const legend = document.getElementById("phase-legend");
  legend.replaceChildren();
  const names = phaseNames(points, order);
  if (names.length === 0) return emptyChart(svg, "no step phases reported yet");
  const totals = points.map((p) => names.reduce((sum, n) => sum + (p.phases[n] || 0), 0));
  const {x, y} = frame(svg, points, Math.max(...totals) || 1);
  const below = points.map(() => 0);
  names.forEach((name, i) => {
    const above = points.map((p, j) => below[j] + (p.phases[name] || 0));
    const top = points.map((p, j) => x(p.step) + "," + y(above[j]));
    const bottom = points.map((p, j) => x(p.step) + "," + y(below[j])).reverse();
    const area = svgEl("polygon", {points: top.concat(bottom).join(" "),
                                   fill: COLORS[i % COLORS.length], class: "phase-area"});
    area.dataset.phase = name;
    const title = svgEl("title", {});
    title.textContent = name;
    area.append(title);
    svg.append(area);
    above.forEach((value, j) => { below[j] = value; });
    const key = el("span", name);
    key.style.setProperty("--c", COLORS[i % COLORS.length]);
    legend.append(key);
  });
}

function renderLossChart(points) {
  const svg = document.getElementById("loss-chart");
  const losses = points.map((p) => p.loss);
  const {x, y} = frame(svg, points, Math.max(...losses) || 1);
  svg.append(svgEl("polyline", {points: points.map((p) => x(p.step) + "," + y(p.loss)).join(" "),
                                fill: "none", stroke: "#e15759", "stroke-width": 2,
                                class: "loss-line"}));
}

function renderDetail() {
  const job = detail.job;
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-title").textContent = "Job " + job.id + " (" + job.name + ")";
  document.getElementById("detail-meta").textContent =
      job.state + (job.reason ? ": " + job.reason : "") + " - step " + job.step +
      (job.total_steps ? " of " + job.total_steps : "") + ", " + detail.steps.length +
      " steps reported" + (job.indexer_recall ? ", indexer recall " + fmt(job.indexer_recall, 3)
                                              : "") +
      (job.rendezvous ? ", " + job.ranks + " ranks meet at " + job.rendezvous : "");
  if (detail.steps.length === 0) {
    emptyChart(document.getElementById("phase-chart"), "no steps reported yet");
    emptyChart(document.getElementById("loss-chart"), "no steps reported yet");
    document.getElementById("phase-legend").replaceChildren();
    return;
  }
  const points = bucketed(detail.steps);
  renderPhaseChart(points, detail.phaseOrder);
  renderLossChart(points);
}

// Fetches the events after the last one seen (all of them, page by page) and redraws.
async function pollDetail(id) {
  if (!detail || detail.id !== id) detail = {id, after: 0, steps: [], job: null, phaseOrder: []};
  for (;;) {
    const page = await getJson("api/v1/job?id=" + encodeURIComponent(id) + "&after=" +
                               detail.after);
    if (!detail || detail.id !== id) return;  // another job was chosen meanwhile
    detail.job = page.job;
    detail.phaseOrder = page.phase_order;
    detail.after = page.after;
    detail.steps.push(...page.steps);
    if (!page.more) break;
  }
  renderDetail();
}

async function poll() {
  try {
    const list = await getJson("api/v1/jobs");
    renderJobs(list.jobs);
    const id = selectedJob();
    if (id) {
      await pollDetail(id);
    } else {
      detail = null;
      document.getElementById("detail").hidden = true;
    }
    setStatus("updated " + new Date().toLocaleTimeString(), false);
  } catch (error) {
    // Nothing stale stays on screen (e.g. the previous job after following a bad #job=ID).
    detail = null;
    document.getElementById("detail").hidden = true;
    setStatus(error.message, true);
  }
}

// One poll at a time: a hash change during a poll asks for another one right after it.
let timer = null, polling = false, again = false;
async function loop() {
  clearTimeout(timer);
  if (polling) {
    again = true;
    return;
  }
  polling = true;
  do {
    again = false;
    await poll();
  } while (again);
  polling = false;
  timer = setTimeout(loop, POLL_MS);
}

window.addEventListener("hashchange", loop);
loop();
