// tagplan dashboard: jobs, a job's plan, operators' views. Plain JavaScript over the REST
// API; the key lives in this tab's sessionStorage and travels only in a header.
"use strict";

const KEY = "tagplan.key";
const KIND_COLORS = { compute: "#3f7fd9", transfer: "#e0902f", collective: "#3aa876" };
const SVG_NS = "http://www.w3.org/2000/svg";
let timers = [];
let overview = null;
let generation = 0;

// ---- helpers --------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const ms = (s) => (s === null || s === undefined ? "OOM" : (s * 1e3).toFixed(s < 0.01 ? 3 : 1));
const gib = (b) => (b / 2 ** 30).toFixed(2);
const short = (id) => id.slice(0, 8);

function age(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message;
  box.hidden = !message;
}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(options.json);
  }
  const response = await fetch(path, { method: options.method || "GET", headers, body: options.body });
  if (!response.ok) {
    let detail = `${response.status} ${response.statusText}`;
    try {
      const problem = await response.json();
      detail = `${response.status}: ${problem.detail || problem.title || detail}`;
    } catch (_) { /* not a problem document */ }
    const error = new Error(detail);
    error.status = response.status;
    throw error;
  }
  return options.raw ? response : response.json();
}

function can(scope) {
  return overview !== null && overview.scopes.includes(scope);
}

function every(ms_, fn) {
  // polling for the current route only: an interval set by a page of an earlier route
  // (still loading when the route changed) stops itself
  const mine = generation;
  const id = setInterval(() => {
    if (mine !== generation) clearInterval(id);
    else fn();
  }, ms_);
  timers.push(id);
}

async function download(path, filename) {
  try {
    const response = await api(path, { raw: true });
    const blob = await response.blob();
    saveBlob(blob, filename);
  } catch (error) {
    showError(error.message);
  }
}

function saveBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const link = h("a", { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// ---- key and routing ------------------------------------------------------------------

async function loadOverview() {
  try {
    overview = await api("/v1/overview");
    const who = sessionStorage.getItem(KEY) ? `tenant ${overview.tenant}` : "anonymous (loopback)";
    document.getElementById("whoami").textContent = `${who} · ${overview.scopes.join(", ")}`;
    showError("");
    return true;
  } catch (error) {
    overview = null;
    document.getElementById("whoami").textContent = "";
    showError(error.status === 401 || error.status === 403
      ? `This key is not accepted (${error.message}). Enter a valid API key.`
      : error.message);
    return false;
  }
}

async function route() {
  generation += 1;
  timers.forEach(clearInterval);
  timers = [];
  // a container of this route's own: a page still loading for an earlier route fills its
  // own, detached one instead of this one
  const view = h("div");
  document.getElementById("view").replaceChildren(view);
  const hash = location.hash || "#/jobs";
  document.getElementById("nav-jobs").classList.toggle("active", hash.startsWith("#/jobs"));
  document.getElementById("nav-operate").classList.toggle("active", hash.startsWith("#/operate"));
  if (!(await loadOverview())) return;
  const job = hash.match(/^#\/jobs\/([0-9a-f-]{36})$/);
  if (job) return jobPage(view, job[1]);
  if (hash.startsWith("#/operate")) return operatorsPage(view);
  return jobsPage(view);
}

// ---- jobs -----------------------------------------------------------------------------

async function jobsPage(view) {
  const counts = h("p", { id: "job-counts", class: "muted" });
  const filter = h("select", { id: "status-filter", onchange: () => refresh() },
    ["", "queued", "running", "succeeded", "failed", "cancelled"].map((s) =>
      h("option", { value: s }, s || "every status")));
  const body = h("tbody", { id: "jobs-body" });
  const table = h("table", { id: "jobs" },
    h("thead", {}, h("tr", {},
      ["job", "graph", "status", "phase", "iterations", "best speedup", "submitted by", "age", ""]
        .map((t, i) => h("th", { class: i === 4 || i === 5 ? "num" : null }, t)))),
    body);
  view.append(h("div", { class: "card" }, h("h2", {}, "Jobs"), counts,
    h("div", { class: "inline" }, "Show ", filter), table));
  if (can("submit")) view.prepend(await submitForm());

  async function refresh() {
    try {
      const status = filter.value ? `&status=${filter.value}` : "";
      const [jobs, summary] = await Promise.all([
        api(`/v1/jobs?limit=100${status}`), api("/v1/overview"),
      ]);
      counts.textContent = Object.entries(summary.jobs).map(([k, v]) => `${k} ${v}`).join(" · ")
        + ` · queue depth ${summary.queue_depth}`;
      body.replaceChildren(...jobs.data.map(jobRow));
    } catch (error) {
      showError(error.message);
    }
  }
  await refresh();
  every(2000, refresh);
}

function jobRow(job) {
  const live = job.status === "queued" || job.status === "running";
  const cancel = live && can("submit")
    ? h("button", {
      class: "cancel", onclick: async () => {
        try { await api(`/v1/jobs/${job.id}`, { method: "DELETE" }); } catch (e) { showError(e.message); }
      },
    }, "Cancel")
    : null;
  return h("tr", { "data-job": job.id },
    h("td", {}, h("a", { href: `#/jobs/${job.id}` }, short(job.id))),
    h("td", {}, job.label || short(job.graph_id)),
    h("td", {}, h("span", { class: `badge ${job.status}` }, job.status)),
    h("td", {}, job.phase || ""),
    h("td", { class: "num" }, job.progress.iterations),
    h("td", { class: "num" }, job.progress.best_speedup ? `${job.progress.best_speedup.toFixed(2)}x` : ""),
    h("td", {}, job.submitted_by || ""),
    h("td", {}, age(job.created_at)),
    h("td", {}, cancel));
}

async function submitForm() {
  const clusters = await api("/v1/clusters/named");
  const model = h("select", { id: "submit-model" },
    overview.zoo.map((name) => h("option", { value: name }, name)));
  const cluster = h("select", { id: "submit-cluster" },
    clusters.map((c) => h("option", { value: c.example }, c.example)));
  const budget = h("input", { id: "submit-budget", type: "number", min: "1", value: "20", style: "width:5rem" });
  const form = h("form", {
    class: "inline", id: "submit-form", onsubmit: async (event) => {
      event.preventDefault();
      try {
        const job = await api("/v1/jobs", {
          method: "POST",
          json: { graph: { zoo: model.value }, cluster: cluster.value, options: { budget_s: Number(budget.value) } },
        });
        location.hash = `#/jobs/${job.id}`;
      } catch (error) {
        showError(error.message);
      }
    },
  }, "Plan ", model, " on ", cluster, " with a budget of ", budget, " s ", h("button", { type: "submit" }, "Submit"));
  return h("div", { class: "card" }, h("h2", {}, "New job"), form);
}

// ---- a job ----------------------------------------------------------------------------

async function jobPage(view, id) {
  const head = h("div", { class: "card", id: "job-head" });
  const progress = h("div", { class: "card" }, h("h2", {}, "Search progress"),
    h("div", { id: "progress-chart" }), h("p", { class: "muted", id: "progress-text" }));
  const done = h("div", { id: "job-done" });
  view.append(head, progress, done);
  let shown = false;

  async function refresh() {
    try {
      const [job, prog] = await Promise.all([api(`/v1/jobs/${id}`), api(`/v1/jobs/${id}/progress`)]);
      renderHead(head, job);
      drawProgress(document.getElementById("progress-chart"), prog);
      document.getElementById("progress-text").textContent =
        `${prog.iterations} iterations; best ${prog.best_step_time_s ? ms(prog.best_step_time_s) + " ms" : "—"}`;
      if (job.status === "succeeded" && !shown) {
        shown = true;
        await renderPlan(done, job);
      }
      if (job.status !== "queued" && job.status !== "running") {
        timers.forEach(clearInterval);
        timers = [];
      }
    } catch (error) {
      showError(error.message);
    }
  }
  await refresh();
  every(1000, refresh);
}

function renderHead(card, job) {
  const links = [];
  if (job.refined_by) links.push(h("a", { href: `#/jobs/${job.refined_by}` }, "refinement"));
  if (job.refines) links.push(h("a", { href: `#/jobs/${job.refines}` }, "refines"));
  card.replaceChildren(...[
    h("h2", {}, `Job ${short(job.id)} · ${job.label || short(job.graph_id)}`),
    h("p", {},
      h("span", { class: `badge ${job.status}`, id: "job-status" }, job.status),
      job.phase ? h("span", { class: "tag" }, job.phase) : null,
      ` batch ${job.batch_size ?? "graph's"} · budget ${job.options.budget_s} s · submitted ${age(job.created_at)} ago`,
      job.submitted_by ? ` by ${job.submitted_by}` : "", " ", ...links),
    job.error ? h("p", { class: "muted" }, job.error) : null,
  ].filter(Boolean));
}

function scale(domain, range) {
  const [d0, d1] = domain;
  const [r0, r1] = range;
  return (v) => r0 + ((v - d0) / (d1 - d0 || 1)) * (r1 - r0);
}

function drawProgress(box, prog) {
  const width = box.clientWidth || 800;
  const height = 240;
  const pad = { left: 60, right: 150, top: 14, bottom: 28 };
  const refs = Object.entries(prog.baselines || {}).filter(([, v]) => v !== null);
  if (prog.lower_bound_s) refs.push(["lower bound", prog.lower_bound_s]);
  const points = (prog.history || []).map(([t, , s]) => [t, s]);
  const values = refs.map(([, v]) => v).concat(points.map(([, s]) => s));
  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, "data-points": points.length });
  if (values.length === 0) {
    chart.append(svg("text", { x: 20, y: 30 }, "waiting for the analysis…"));
    box.replaceChildren(chart);
    return;
  }
  const tMax = Math.max(1, ...points.map(([t]) => t)) * 1.05;
  const y = scale([0, Math.max(...values) * 1.1], [height - pad.bottom, pad.top]);
  const x = scale([0, tMax], [pad.left, width - pad.right]);
  refs.sort((a, b) => b[1] - a[1]);
  let lastLabel = -Infinity;
  for (const [name, value] of refs) {
    chart.append(svg("line", { x1: pad.left, x2: width - pad.right, y1: y(value), y2: y(value),
      stroke: name === "lower bound" ? "#c9373a" : "#9aa3b5", "stroke-dasharray": "4 3" }));
    const labelY = Math.max(y(value) + 4, lastLabel + 12);  // labels never overlap
    lastLabel = labelY;
    chart.append(svg("text", { x: width - pad.right + 4, y: labelY, class: "reference" },
      `${name} ${ms(value)} ms`));
  }
  if (points.length) {
    let path = `M ${x(points[0][0])} ${y(points[0][1])}`;
    for (let i = 1; i < points.length; i++) path += ` H ${x(points[i][0])} V ${y(points[i][1])}`;
    path += ` H ${x(tMax)}`;
    chart.append(svg("path", { d: path, fill: "none", stroke: "#3f7fd9", "stroke-width": 2, id: "progress-line" }));
  }
  chart.append(svg("line", { x1: pad.left, x2: pad.left, y1: pad.top, y2: height - pad.bottom, stroke: "#888" }));
  chart.append(svg("text", { x: pad.left + 6, y: pad.top + 10 }, "step (ms)"));
  chart.append(svg("text", { x: width - pad.right - 70, y: height - 6 }, "time (s)"));
  for (let k = 0; k <= 4; k++) {
    const v = (Math.max(...values) * 1.1 * k) / 4;
    chart.append(svg("text", { x: 6, y: y(v) + 4 }, ms(v)));
    const t = (tMax * k) / 4;
    chart.append(svg("text", { x: x(t) - 8, y: height - 12 }, t.toFixed(1)));
  }
  box.replaceChildren(chart);
}

async function renderPlan(box, job) {
  const [result, layout] = await Promise.all([
    api(`/v1/jobs/${job.id}/result`), api(`/v1/clusters/${job.cluster_id}/layout`),
  ]);
  const tags = [
    h("span", { class: "tag", id: "plan-source" }, result.source === "cache"
      ? `from the cache (job ${short(result.cached_from)})` : "searched"),
    result.complete ? null : h("span", { class: "tag" }, "incomplete: answered at the deadline"),
    h("span", { class: "tag", id: "plan-prior", title: result.prior_note || null }, `prior ${result.prior}`),
  ];
  box.replaceChildren(
    h("div", { class: "row" },
      h("div", { class: "card" }, h("h2", {}, "Plan against every baseline", ...tags),
        baselineChart(result)),
      h("div", { class: "card" }, h("h2", {}, "Cluster and placement"), clusterDrawing(layout, result))),
    h("div", { class: "card" }, h("h2", {}, "Predicted step per GPU and link"),
      h("p", { class: "legend" }, ...Object.entries(KIND_COLORS).map(([k, c]) =>
        h("span", {}, h("i", { class: "swatch", style: `background:${c}` }), k)),
      h("button", { id: "timeline-reset" }, "Whole step")),
      h("div", { id: "timeline-wrap" }, h("div", { id: "timeline-names" }),
        h("canvas", { id: "timeline-canvas" }))),
    h("div", { class: "card" }, h("h2", {}, "Peak memory per GPU"), memoryBars(result, layout)),
    h("div", { class: "card" }, h("h2", {}, "Strategy"), strategyTable(result, layout)),
    h("div", { class: "card downloads", id: "downloads" }, h("h2", {}, "Downloads"),
      h("button", { id: "dl-graphdef", onclick: () => download(`/v1/jobs/${job.id}/graphdef`, `${job.id}.pb`) }, "Distributed GraphDef"),
      h("button", { id: "dl-device-map", onclick: () => download(`/v1/jobs/${job.id}/device-map`, `${job.id}.device_map.json`) }, "Device map"),
      h("button", { id: "dl-trace", onclick: () => download(`/v1/jobs/${job.id}/trace`, `${job.id}.trace.json`) }, "Chrome trace"),
      h("button", { id: "dl-strategy", onclick: () => saveBlob(new Blob([JSON.stringify(result.strategy, null, 2)], { type: "application/json" }), `${job.id}.strategy.json`) }, "Strategy JSON"),
      h("button", { id: "dl-report", onclick: () => download(`/v1/jobs/${job.id}/report`, `${job.id}.report.md`) }, "Report")));
  await timeline(job.id);
}

function baselineChart(result) {
  const rows = [["tagplan", result.step_time_s], ...Object.entries(result.baselines)];
  const fits = rows.map(([, v]) => v).filter((v) => v !== null);
  const width = 520;
  const bar = 22;
  const height = rows.length * (bar + 6) + 10;
  const x = scale([0, Math.max(...fits) * 1.05], [130, width - 90]);
  const chart = svg("svg", { class: "chart", id: "baseline-chart", viewBox: `0 0 ${width} ${height}`, style: `height:${height}px` });
  rows.forEach(([name, value], i) => {
    const top = 5 + i * (bar + 6);
    chart.append(svg("text", { x: 4, y: top + 15 }, name));
    if (value === null) {
      chart.append(svg("text", { x: 134, y: top + 15, fill: "#c9373a" }, "out of memory"));
      return;
    }
    chart.append(svg("rect", { x: 130, y: top, width: Math.max(1, x(value) - 130), height: bar,
      fill: name === "tagplan" ? "#3aa876" : "#9aa3b5", "data-name": name, "data-step-s": value }));
    chart.append(svg("text", { x: x(value) + 4, y: top + 15 },
      `${ms(value)} ms${name === "tagplan" ? "" : ` (${(value / result.step_time_s).toFixed(2)}x)`}`));
  });
  return chart;
}

function clusterDrawing(layout, result) {
  const groupsUsed = new Map();
  for (const group of result.strategy.groups || []) {
    for (const g of group.decision.device_groups) groupsUsed.set(g, (groupsUsed.get(g) || 0) + 1);
  }
  const perRow = 4;
  const boxW = 200;
  const boxH = 40 + 26 * Math.max(...layout.machines.map((_, m) => layout.groups.filter((g) => g.machine === m).length));
  const rows = Math.ceil(layout.machines.length / perRow);
  const width = perRow * (boxW + 40) + 20;
  const height = rows * (boxH + 60) + 10;
  const chart = svg("svg", { id: "cluster-drawing", viewBox: `0 0 ${width} ${height}`, style: `width:100%;height:${Math.min(height, 520)}px` });
  const centre = (m) => [20 + (m % perRow) * (boxW + 40) + boxW / 2, 10 + Math.floor(m / perRow) * (boxH + 60) + boxH / 2];
  const labelled = layout.machines.length <= 6;
  for (const link of layout.links) {
    const [a, b] = link.between.map(centre);
    chart.append(svg("line", { x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: "#c3c9d6" }));
    if (labelled) {
      chart.append(svg("text", { x: (a[0] + b[0]) / 2, y: (a[1] + b[1]) / 2 - 3, class: "link-label" },
        `${link.gbps.toFixed(0)} Gb/s`));
    }
  }
  const maxUse = Math.max(1, ...groupsUsed.values());
  layout.machines.forEach((machine, m) => {
    const left = 20 + (m % perRow) * (boxW + 40);
    const top = 10 + Math.floor(m / perRow) * (boxH + 60);
    chart.append(svg("rect", { x: left, y: top, width: boxW, height: boxH, rx: 6, fill: "#fff", stroke: "#8a93a6", class: "machine" }));
    chart.append(svg("text", { x: left + 6, y: top + 15 }, `${machine.name} (${machine.intra_gbps.toFixed(0)} Gb/s inside)`));
    layout.groups.filter((g) => g.machine === m).forEach((group, k) => {
      const used = groupsUsed.get(group.index) || 0;
      const shade = used ? 0.25 + 0.75 * (used / maxUse) : 0;
      chart.append(svg("rect", { x: left + 6, y: top + 24 + k * 26, width: boxW - 12, height: 22, rx: 3,
        fill: used ? `rgba(58,168,118,${shade})` : "#f1f2f5", stroke: "#b9c0cf", class: "device-group", "data-group": group.index }));
      chart.append(svg("text", { x: left + 12, y: top + 39 + k * 26 }, `${group.type} ×${group.gpus}`));
      chart.append(svg("text", { x: left + boxW - 12, y: top + 39 + k * 26, "text-anchor": "end" },
        `${used} groups`));
    });
  });
  return chart;
}

function memoryBars(result, layout) {
  const capacity = Object.fromEntries(layout.devices.map((d) => [d.name, d.memory_bytes]));
  const box = h("div", { id: "memory" });
  for (const [device, peak] of Object.entries(result.peak_memory_bytes)) {
    const cap = capacity[device] || peak;
    const share = Math.min(1, peak / cap);
    box.append(h("div", { class: "memory-row", "data-device": device, "data-peak-bytes": peak, "data-capacity-bytes": cap },
      h("span", {}, device),
      h("div", { class: "memory-bar" }, h("div", { class: peak > cap ? "over" : "", style: `width:${(share * 100).toFixed(1)}%` })),
      h("span", { class: "muted" }, `${gib(peak)} / ${gib(cap)} GiB`)));
  }
  return box;
}

function groupShares(weights, layout) {
  // a decision's batch weights per device, summed per device group, as percentages
  const groupOf = {};
  for (const d of layout.devices) {
    const group = layout.groups.find((g) => g.machine === d.machine && g.type === d.type);
    groupOf[d.name] = group ? group.name : d.name;
  }
  const sums = {};
  let total = 0;
  for (const [device, weight] of Object.entries(weights)) {
    sums[groupOf[device]] = (sums[groupOf[device]] || 0) + weight;
    total += weight;
  }
  return Object.entries(sums).map(([g, w]) => `${g} ${((100 * w) / total).toFixed(0)}%`).join(", ");
}

function strategyTable(result, layout) {
  const names = Object.fromEntries(layout.groups.map((g) => [g.index, g.name]));
  const sfbOps = new Set(Object.values(result.strategy.sfb || {}).flat());
  const body = h("tbody");
  (result.strategy.groups || []).forEach((group, i) => {
    const d = group.decision;
    const shares = d.batch_weights ? groupShares(d.batch_weights, layout) : "even";
    body.append(h("tr", {},
      h("td", { class: "num" }, i),
      h("td", { title: group.ops.slice(0, 12).join("\n") }, `${group.ops.length} ops (${group.ops[0]}${group.ops.length > 1 ? ", …" : ""})`),
      h("td", {}, d.option),
      h("td", {}, d.device_groups.map((g) => names[g] || g).join(", ")),
      h("td", {}, shares),
      h("td", {}, group.ops.some((op) => sfbOps.has(op)) ? "yes" : "")));
  });
  return h("table", { id: "strategy" },
    h("thead", {}, h("tr", {}, ["#", "ops", "option", "device groups", "batch shares", "SFB"].map((t) => h("th", {}, t)))),
    body);
}

// ---- timeline -------------------------------------------------------------------------

async function timeline(jobId) {
  const canvas = document.getElementById("timeline-canvas");
  const names = document.getElementById("timeline-names");
  const tooltip = document.getElementById("tooltip");
  const laneH = 16;
  let data = null;
  let drag = null;

  async function load(start, end) {
    const width = Math.max(200, canvas.clientWidth || 900);
    const query = new URLSearchParams({ bins: String(Math.round(width)) });
    if (start !== undefined) { query.set("start_s", start); query.set("end_s", end); }
    for (let attempt = 0; attempt < 30; attempt++) {
      try {
        data = await api(`/v1/jobs/${jobId}/timeline?${query}`);
        break;
      } catch (error) {
        if (error.status !== 409) throw error;  // a cached answer's trace is being written
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
    draw();
  }

  function draw() {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 900;
    const height = data.lanes.length * laneH + 20;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    canvas.style.height = `${height}px`;
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    const x = scale([data.start_s, data.end_s], [0, width]);
    names.replaceChildren(...data.lanes.map((lane) =>
      h("div", { class: `lane-name ${lane.kind}`, title: `${lane.name}: ${lane.tasks} tasks in view` }, lane.name)));
    data.lanes.forEach((lane, i) => {
      const top = i * laneH + 2;
      ctx.fillStyle = i % 2 ? "#fafbfc" : "#f3f5f8";
      ctx.fillRect(0, top - 1, width, laneH);
      for (const [s, e, kind, label] of lane.bars) {
        ctx.globalAlpha = typeof label === "number" ? 0.35 + 0.65 * label : 1;
        ctx.fillStyle = KIND_COLORS[kind] || "#888";
        ctx.fillRect(x(s), top, Math.max(1, x(e) - x(s)), laneH - 3);
      }
      ctx.globalAlpha = 1;
    });
    ctx.fillStyle = "#555";
    ctx.font = "11px sans-serif";
    ctx.fillText(`${ms(data.start_s)} ms`, 2, height - 4);
    const endLabel = `${ms(data.end_s)} ms`;
    ctx.fillText(endLabel, width - ctx.measureText(endLabel).width - 2, height - 4);
    canvas.dataset.lanes = String(data.lanes.length);
  }

  function at(event) {
    const rect = canvas.getBoundingClientRect();
    const px = event.clientX - rect.left;
    const lane = data.lanes[Math.floor((event.clientY - rect.top - 2) / laneH)];
    const t = scale([0, rect.width], [data.start_s, data.end_s])(px);
    return { px, lane, t };
  }

  canvas.addEventListener("mousemove", (event) => {
    if (!data) return;
    const { lane, t } = at(event);
    const bar = lane && lane.bars.find(([s, e]) => s <= t && t <= e);
    if (!bar) { tooltip.hidden = true; return; }
    const [s, e, kind, label] = bar;
    tooltip.textContent = typeof label === "number"
      ? `${lane.name}: ${kind} mostly, ${(label * 100).toFixed(0)}% busy, ${ms(s)}–${ms(e)} ms (zoom in for ops)`
      : `${lane.name}: ${label} (${kind}) ${ms(s)}–${ms(e)} ms`;
    tooltip.style.left = `${event.clientX + 12}px`;
    tooltip.style.top = `${event.clientY + 12}px`;
    tooltip.hidden = false;
  });
  canvas.addEventListener("mouseleave", () => { tooltip.hidden = true; });
  canvas.addEventListener("mousedown", (event) => { if (data) drag = at(event).t; });
  canvas.addEventListener("mouseup", (event) => {
    if (drag === null || !data) return;
    const end = at(event).t;
    const [a, b] = [Math.min(drag, end), Math.max(drag, end)];
    drag = null;
    if (b - a > (data.end_s - data.start_s) / 200) load(a, b).catch((e) => showError(e.message));
  });
  canvas.addEventListener("wheel", (event) => {
    if (!data) return;
    event.preventDefault();
    const { t } = at(event);
    const factor = event.deltaY < 0 ? 0.5 : 2;
    const span = Math.min(data.span_s, (data.end_s - data.start_s) * factor);
    const start = Math.max(0, Math.min(data.span_s - span, t - span / 2));
    load(start, start + span).catch((e) => showError(e.message));
  }, { passive: false });
  document.getElementById("timeline-reset").addEventListener("click", () => load().catch((e) => showError(e.message)));
  await load();
}

// ---- operators ------------------------------------------------------------------------

async function operatorsPage(view) {
  const health = h("div", { class: "card", id: "health" }, h("h2", {}, "Health"));
  view.append(health);
  const [live, ready] = await Promise.all([
    fetch("/healthz").then((r) => r.ok), fetch("/readyz").then((r) => r.json()),
  ]);
  health.append(h("p", {}, `live: ${live ? "yes" : "no"} · ready: ${ready.status}`,
    ready.problems.length ? ` (${ready.problems.join("; ")})` : "",
    ` · queue depth ${overview.queue_depth} · workers ${overview.embedded ? "in-process" : "separate"}`),
  h("p", { class: "muted" }, Object.entries(overview.jobs).map(([k, v]) => `${k} ${v}`).join(" · ")));

  view.append(strategiesCard(), await profilesCard());
  const [types, named] = await Promise.all([api("/v1/gpu-types"), api("/v1/clusters/named")]);
  view.append(h("div", { class: "row" },
    h("div", { class: "card", id: "gpu-types" }, h("h2", {}, "GPU catalog"), h("table", {},
      h("thead", {}, h("tr", {}, ["type", "FP32 TFLOP/s", "memory GiB", "memory GB/s"].map((t) => h("th", {}, t)))),
      h("tbody", {}, types.map((t) => h("tr", {}, h("td", {}, t.name), h("td", { class: "num" }, t.fp32_tflops),
        h("td", { class: "num" }, t.memory_gib), h("td", { class: "num" }, t.memory_bandwidth_gb_per_s)))))),
    h("div", { class: "card", id: "named-clusters" }, h("h2", {}, "Named clusters"), h("table", {},
      h("tbody", {}, named.map((c) => h("tr", {}, h("td", {}, c.name), h("td", { class: "muted" }, c.description))))))));
  view.append(await checkpointsCard());
}

async function checkpointsCard() {
  const card = h("div", { class: "card", id: "checkpoints" }, h("h2", {}, "GNN checkpoints"));
  const body = h("div");
  const change = (method, path) => async () => {
    try {
      await api(path, { method });
      await refresh();
    } catch (error) {
      showError(error.message);
    }
  };
  async function refresh() {
    const [checkpoints, active] = await Promise.all([api("/v1/checkpoints"), api("/v1/checkpoints/active")]);
    const using = active.prior === "shipped"
      ? `Active: none — new jobs search with the shipped checkpoint (${active.shipped}).`
      : `Active: ${active.checkpoint ? active.checkpoint.name : active.prior}, for ${age(active.activated_at)} — new jobs search with it.`;
    body.replaceChildren(
      h("p", { class: "muted", id: "active-prior" }, using, " ",
        can("operate") && active.prior !== "shipped"
          ? h("button", { id: "checkpoint-clear", onclick: change("DELETE", "/v1/checkpoints/active") }, "Use the shipped one")
          : null),
      checkpoints.length
        ? h("table", {}, h("tbody", {}, checkpoints.map((c) => h("tr", { "data-checkpoint": c.id },
          h("td", {}, c.name), h("td", { class: "muted" }, short(c.id)), h("td", {}, age(c.created_at)),
          h("td", {}, c.active ? h("span", { class: "tag" }, "active")
            : can("operate") ? h("button", { onclick: change("PUT", `/v1/checkpoints/${c.id}/active`) }, "Activate") : null)))))
        : h("p", {}, "No checkpoints uploaded."));
  }
  card.append(body);
  await refresh();
  return card;
}

function strategiesCard() {
  const graph = h("input", { id: "strategies-graph", placeholder: "graph fingerprint", size: 40 });
  const cluster = h("input", { id: "strategies-cluster", placeholder: "cluster name, id or fingerprint", size: 30 });
  const out = h("div", { id: "strategies-out" });
  const form = h("form", {
    class: "inline", onsubmit: async (event) => {
      event.preventDefault();
      try {
        const query = new URLSearchParams({ graph: graph.value.trim(), cluster: cluster.value.trim() });
        const found = await api(`/v1/strategies?${query}`);
        out.replaceChildren(found.count === 0 ? h("p", {}, "No cached strategy.") : h("table", {},
          h("thead", {}, h("tr", {}, ["job", "batch", "step (ms)", "speedup", "source", ""].map((t) => h("th", {}, t)))),
          h("tbody", {}, found.data.map((s) => h("tr", {},
            h("td", {}, h("a", { href: `#/jobs/${s.job_id}` }, short(s.job_id))), h("td", {}, s.batch_size),
            h("td", { class: "num" }, ms(s.step_time_s)),
            h("td", { class: "num" }, s.speedup_vs_best_data_parallel ? `${s.speedup_vs_best_data_parallel.toFixed(2)}x` : ""),
            h("td", {}, s.source), h("td", {}, s.stale ? "stale" : s.remapped ? "remapped" : ""))))));
      } catch (error) {
        showError(error.message);
      }
    },
  }, graph, cluster, h("button", { type: "submit" }, "Look up"));
  return h("div", { class: "card", id: "strategies" }, h("h2", {}, "Cached strategies"), form, out);
}

async function profilesCard() {
  const card = h("div", { class: "card", id: "profiles" }, h("h2", {}, "Profiles"));
  const list = h("div");
  async function refresh() {
    const profiles = await api("/v1/profiles");
    list.replaceChildren(profiles.length === 0 ? h("p", {}, "No profiles.") : h("table", {},
      h("tbody", {}, profiles.map((p) => h("tr", {}, h("td", {}, p.name || "(unnamed)"), h("td", {}, p.kind),
        h("td", { class: "muted" }, short(p.id)), h("td", {}, age(p.created_at)))))));
  }
  card.append(list);
  if (can("operate")) {
    const file = h("input", { type: "file", id: "profile-file", accept: ".json,application/json" });
    const name = h("input", { id: "profile-name", placeholder: "name" });
    card.append(h("form", {
      class: "inline", onsubmit: async (event) => {
        event.preventDefault();
        try {
          const text = await file.files[0].text();
          await api(`/v1/profiles?name=${encodeURIComponent(name.value)}`, { method: "POST", json: JSON.parse(text) });
          await refresh();
        } catch (error) {
          showError(error.message);
        }
      },
    }, "Upload ", file, name, h("button", { type: "submit" }, "Upload")));
  }
  await refresh();
  return card;
}

// ---- start ----------------------------------------------------------------------------

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("key-input");
  if (input.value.trim()) sessionStorage.setItem(KEY, input.value.trim());
  input.value = "";
  route();
});
document.getElementById("key-forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  route();
});
window.addEventListener("hashchange", route);
route();
