// corral dashboard: keeps a server-rendered page live. Every few seconds it asks the API
// (through /ui/api, which adds the login cookie's token) what the page shows, and updates
// the numbers, tables and charts in place. The formatting and derivations mirror
// views.py, which rendered the first view.
"use strict";

(function () {
  const body = document.body;
  const PAGE = body.dataset.page;
  const POLL = Number(body.dataset.poll) || 3000;
  const source = document.getElementById("page-data");
  if (!source) {
    return;
  }
  let current = JSON.parse(source.textContent);

  // -- formatting (views.py) ---------------------------------------------------------------

  function halfUp(value, digits) {
    const scale = Math.pow(10, digits);
    return Math.floor(value * scale + 0.5) / scale;
  }

  function num(value, digits) {
    if (value === null || value === undefined) return "—";
    if (!isFinite(value)) return "∞";
    const d = digits === undefined ? 2 : digits;
    const rounded = halfUp(value, d);
    if (rounded === Math.trunc(rounded)) return String(Math.trunc(rounded));
    return rounded.toFixed(d).replace(/0+$/, "").replace(/\.$/, "");
  }

  function hours(value) {
    if (value === null || value === undefined) return "—";
    return num(value, Math.abs(value) < 1 ? 3 : 2);
  }

  function pct(value) {
    return value === null || value === undefined ? "—" : `${halfUp(value, 0)}%`;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    const whole = Math.max(Math.trunc(seconds), 0);
    const days = Math.floor(whole / 86400);
    const hrs = Math.floor((whole % 86400) / 3600);
    const minutes = Math.floor((whole % 3600) / 60);
    const secs = whole % 60;
    if (days) return `${days}d ${hrs}h`;
    if (hrs) return `${hrs}h ${minutes}m`;
    if (minutes) return `${minutes}m ${secs}s`;
    return `${secs}s`;
  }

  function gib(amount) {
    return amount === null || amount === undefined ? "—" : `${num(amount / 2 ** 30)} GiB`;
  }

  function two(n) {
    return String(n).padStart(2, "0");
  }

  function clock(ts) {
    if (ts === null || ts === undefined) return "—";
    const t = new Date(ts * 1000);
    return (
      `${t.getFullYear()}-${two(t.getMonth() + 1)}-${two(t.getDate())} ` +
      `${two(t.getHours())}:${two(t.getMinutes())}:${two(t.getSeconds())}`
    );
  }

  function esc(value) {
    return String(value === null || value === undefined ? "" : value)
      .replace(/&/g, "&amp;")
      .replace(/</g, "&lt;")
      .replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;")
      .replace(/'/g, "&#39;");
  }

  // The page of workload NAME of `project`, or of PROJECT/NAME (a name is unique within
  // its project).
  function workloadUrl(name, project) {
    const cut = name.lastIndexOf("/");
    const short = cut < 0 ? name : name.slice(cut + 1);
    const where = cut < 0 ? project : name.slice(0, cut);
    const page = `/workloads/${encodeURIComponent(short)}`;
    return where ? `${page}?project=${encodeURIComponent(where)}` : page;
  }
  // Shown by its name (its key, PROJECT/NAME, as the link's title).
  const link = (name, project) =>
    `<a href="${workloadUrl(name, project)}" title="${esc(name)}">${esc(name.slice(name.lastIndexOf("/") + 1))}</a>`;
  const clamp = (v) => Math.min(Math.max(v || 0, 0), 100);

  function util(value, declared) {
    return (
      `<span class="util"><span class="util-bar"><span style="width:${clamp(value)}%"></span>` +
      `</span><span class="util-text">${pct(value)}</span>` +
      (declared ? '<span class="tag declared">declared</span>' : "") +
      "</span>"
    );
  }

  // A share that may pass 100%: the bar stops full, the text does not.
  function shareOf(value) {
    return (
      `<span class="util"><span class="util-bar"><span style="width:${Math.min(value || 0, 100)}%"></span>` +
      `</span><span class="util-text">${pct(value)}</span></span>`
    );
  }

  function statusBadge(value, testid) {
    const id = testid ? ` data-testid="${esc(testid)}"` : "";
    return `<span class="badge status-${esc(value)}"${id}>${esc(value)}</span>`;
  }

  // -- derivations (views.py) --------------------------------------------------------------

  const STATUSES = ["pending", "running", "suspended", "succeeded", "failed", "cancelled"];
  const DEVICE_STATES = ["free", "busy", "idle"];

  function deviceWorkloads(device) {
    const names = [];
    for (const item of device.workloads || []) {
      if (typeof item === "string") names.push(item);
      else if (item && (item.name || item.workload)) names.push(String(item.name || item.workload));
    }
    return names;
  }

  function deviceStates(devices) {
    const counts = { free: 0, busy: 0, idle: 0 };
    for (const device of devices) {
      if (device.state in counts) counts[device.state] += 1;
    }
    return counts;
  }

  function activity(devices, workloads) {
    const telemetry = new Map(devices.map((d) => [`${d.node}\u0000${d.device}`, d]));
    const result = new Map();
    for (const workload of workloads) {
      const values = [];
      const states = new Set();
      let declared = false;
      for (const placement of workload.placements || []) {
        const held = placement.devices;
        const share = held.length ? Math.min(placement.gpu / held.length, 1) : 1;
        for (const index of held) {
          const device = telemetry.get(`${placement.node}\u0000${index}`);
          if (!device) continue;
          states.add(device.state);
          declared = declared || device.source === "declared";
          const value = device.utilization;
          if (value === null || value === undefined) continue;
          const names = deviceWorkloads(device);
          const alone = names.length === 1 && names[0] === workload.name;
          values.push(alone && share > 0 ? Math.min(value / share, 100) : value);
        }
      }
      if (!states.size) continue;
      result.set(workload.name, {
        utilization: values.length ? values.reduce((x, y) => x + y, 0) / values.length : null,
        state: states.has("busy") ? "busy" : states.has("idle") ? "idle" : "—",
        declared,
      });
    }
    return result;
  }

  function gpusAsked(workload) {
    let gpus = 0;
    let memory = 0;
    for (const group of workload.tasks) {
      gpus += group.replicas * group.gpu;
      memory += group.replicas * group.gpu_memory;
    }
    return memory && !gpus ? gib(memory) : num(gpus);
  }

  // When a pending workload last became pending: a requeue starts its wait again.
  const pendingSince = (w) => (w.pending_since !== null && w.pending_since !== undefined ? w.pending_since : w.created_at);

  function waited(workload, now) {
    if (workload.status === "pending") return now - pendingSince(workload);
    if (workload.started_at !== null && workload.started_at !== undefined) {
      return workload.started_at - workload.created_at;
    }
    return null;
  }

  function longestWaits(pending, now, count) {
    return pending
      .slice()
      .sort((a, b) => pendingSince(a) - pendingSince(b) || (a.name < b.name ? -1 : 1))
      .slice(0, count || 8)
      .map((w) => Object.assign({}, w, { waited: now - pendingSince(w) }));
  }

  function queueTree(queues) {
    const byName = new Map(queues.map((q) => [q.name, q]));
    const children = new Map();
    for (const q of queues) {
      const parent = byName.has(q.parent) ? q.parent : null;
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(q.name);
    }
    const ordered = [];
    const walk = (parent, depth) => {
      for (const name of (children.get(parent) || []).slice().sort()) {
        ordered.push(Object.assign({}, byName.get(name), { depth }));
        walk(name, depth + 1);
      }
    };
    walk(null, 0);
    return ordered;
  }

  const gpu = (amounts) =>
    amounts === null || amounts === undefined || amounts.gpu === null ? null : amounts.gpu;

  function deviceCells(nodes, devices) {
    const telemetry = new Map((devices || []).map((d) => [`${d.node}\u0000${d.device}`, d]));
    return nodes
      .slice()
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
      .map((node) => ({
        node,
        cells: node.devices
          .slice()
          .sort((a, b) => a.index - b.index)
          .map((device) => {
            const seen = telemetry.get(`${node.name}\u0000${device.index}`);
            const holding = node.tasks.filter((t) => t.devices.includes(device.index) && t.workload);
            // Keys, PROJECT/NAME, as telemetry names the workloads on a device.
            const allocated = holding.map((t) => `${t.project}/${t.workload}`);
            // A task's share of each of its devices: below 1 on a shared device.
            const shares = new Map(holding.map((t) => [`${t.project}/${t.workload}`, t.gpu / Math.max(t.devices.length, 1)]));
            const get = (key) => (seen && seen[key] !== undefined ? seen[key] : null);
            return {
              index: device.index,
              model: device.model,
              virtual: seen && seen.virtual !== undefined ? Boolean(seen.virtual) : device.virtual,
              utilization: get("utilization"),
              memory_used: get("memory_used"),
              memory_total: get("memory_total") || device.memory,
              power: get("power"),
              temperature: get("temperature"),
              source: get("source"),
              workloads: seen ? deviceWorkloads(seen) : allocated,
              state: get("state") || (allocated.length ? "allocated" : "free"),
              shares,
            };
          }),
      }));
  }

  function usageRows(usage) {
    if (Array.isArray(usage)) return usage;
    if (usage && Array.isArray(usage.rows)) return usage.rows;
    return [];
  }

  // -- the DOM -----------------------------------------------------------------------------

  function setText(testid, text) {
    for (const el of document.querySelectorAll(`[data-testid="${testid}"]`)) {
      if (el.textContent !== text) el.textContent = text;
    }
  }

  const written = new Map();

  function setHtml(id, html) {
    const el = document.getElementById(id);
    if (el && written.get(id) !== html) {
      el.innerHTML = html;
      written.set(id, html);
    }
  }

  function rows(items, render, empty, columns) {
    if (!items.length) return `<tr class="empty"><td colspan="${columns}">${empty}</td></tr>`;
    return items.map(render).join("");
  }

  // -- the API -----------------------------------------------------------------------------

  class LoggedOut extends Error {}

  async function api(path, params) {
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== null && value !== undefined && value !== "") query.set(key, value);
    }
    const qs = query.toString();
    const response = await fetch(`/ui/api${path}${qs ? `?${qs}` : ""}`, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (response.status === 401) {
      const back = window.location.pathname + window.location.search;
      window.location.assign(`/login?next=${encodeURIComponent(back)}`);
      throw new LoggedOut("logged out");
    }
    if (!response.ok) throw new Error(`${path}: ${response.status}`);
    return response.json();
  }

  // An endpoint the server did not have at the first render is not asked again.
  const optional = (had, path, params) => (had === null ? Promise.resolve(null) : api(path, params));

  // -- charts ------------------------------------------------------------------------------

  const COLORS = {
    total: "#8a94a6",
    allocated: "#3b5bdb",
    used: "#0ca678",
    deserved: "#e8590c",
    idle: "#f59f00",
  };
  const PALETTE = ["#3b5bdb", "#0ca678", "#e8590c", "#ae3ec9", "#1098ad", "#f59f00", "#d6336c", "#5c940d", "#495057", "#7048e8"];

  function plot(el, traces, layout) {
    if (!el || !window.Plotly) return;
    const base = {
      margin: { l: 44, r: 12, t: 8, b: 32 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 12, color: "#343a40" },
      showlegend: false,
      hovermode: "x unified",
      // automargin: the margins grow to hold the tick labels (a date's second line).
      xaxis: { type: "date", gridcolor: "#eef0f3", linecolor: "#dee2e6", automargin: true },
      yaxis: { gridcolor: "#eef0f3", rangemode: "tozero", zeroline: false, automargin: true },
    };
    const merged = Object.assign({}, base, layout || {});
    merged.xaxis = Object.assign({}, base.xaxis, (layout || {}).xaxis || {});
    merged.yaxis = Object.assign({}, base.yaxis, (layout || {}).yaxis || {});
    window.Plotly.react(el, traces, merged, { displayModeBar: false, responsive: true });
  }

  const when = (t) => new Date(t * 1000);

  // The top of a queue chart: a tenth above its highest value, so that a line at the
  // highest value (a deserved quota the allocation stays under) is not on the clipped edge.
  function headroom(points) {
    let top = 0;
    for (const p of points) top = Math.max(top, p.allocated || 0, p.used || 0, p.deserved || 0);
    return (top || 1) * 1.1;
  }

  function line(points, key, name, color, extra) {
    return Object.assign(
      {
        type: "scatter",
        mode: "lines",
        name,
        x: points.map((p) => when(p.time)),
        y: points.map((p) => p[key]),
        line: { color, width: 2, shape: "hv" },
      },
      extra || {},
    );
  }

  function seriesOf(answer) {
    return answer && Array.isArray(answer.series) ? answer.series : [];
  }

  // Each point is the average over the step that starts at its time; a last point at the
  // window's end draws the latest step to its end.
  function extended(points, answer) {
    if (!points.length || !answer.until) return points;
    const last = points[points.length - 1];
    return last.time < answer.until ? points.concat([Object.assign({}, last, { time: answer.until })]) : points;
  }

  // -- pages -------------------------------------------------------------------------------

  const overview = {
    async load(d) {
      const [cluster, devices, series, running, pending] = await Promise.all([
        api("/cluster"),
        optional(d.devices, "/telemetry/devices"),
        optional(d.series, "/telemetry/cluster", { since: d.since, step: d.step }),
        api("/workloads", { status: "running" }),
        api("/workloads", { status: "pending" }),
      ]);
      return { since: d.since, step: d.step, cluster, devices, series, running, pending };
    },
    render(d) {
      const now = Date.now() / 1000;
      setText("gpus-allocated", num(d.cluster.gpus_allocated));
      setText("gpus-total", num(d.cluster.gpus));
      setText("nodes-ready", String(d.cluster.nodes_ready));
      setText("workloads-running", String(d.cluster.workloads.running));
      setText("workloads-pending", String(d.cluster.workloads.pending));
      setText("workloads-suspended", String(d.cluster.workloads.suspended));
      if (d.devices) {
        const counts = deviceStates(d.devices);
        const total = counts.free + counts.busy + counts.idle || 1;
        for (const state of DEVICE_STATES) {
          setText(`gpus-${state}`, String(counts[state]));
          const bar = document.querySelector(`#state-bar [data-state="${state}"]`);
          if (bar) bar.style.width = `${(100 * counts[state]) / total}%`;
        }
      }
      const active = activity(d.devices || [], d.running);
      const running = d.running.slice().sort((a, b) => (a.name < b.name ? -1 : 1));
      setHtml(
        "running-rows",
        rows(
          running,
          (w) => {
            const a = active.get(w.name) || {};
            const state = a.state || "—";
            return (
              `<tr data-workload="${esc(w.name)}"><td>${link(w.name, w.project)}</td>` +
              `<td>${esc(w.project)}</td><td>${esc(w.user)}</td>` +
              `<td class="n">${gpusAsked(w)}</td><td>${util(a.utilization, a.declared)}</td>` +
              `<td><span class="badge state-${esc(state)}" data-testid="workload-state-${esc(w.name)}">${esc(state)}</span></td>` +
              `<td class="n">${w.started_at ? duration(now - w.started_at) : "—"}</td></tr>`
            );
          },
          "Nothing is running.",
          7,
        ),
      );
      setHtml(
        "waits-rows",
        rows(
          longestWaits(d.pending, now),
          (w) =>
            `<tr data-workload="${esc(w.name)}"><td>${link(w.name, w.project)}</td>` +
            `<td>${esc(w.project)}</td><td class="n">${gpusAsked(w)}</td>` +
            `<td class="n" data-testid="waited-${esc(w.name)}">${duration(w.waited)}</td>` +
            `<td class="reason">${esc(w.reason || "—")}</td></tr>`,
          "Nothing is waiting.",
          5,
        ),
      );
      if (d.series) {
        const points = extended(seriesOf(d.series), d.series);
        plot(document.getElementById("chart-cluster"), [
          line(points, "gpus", "GPUs", COLORS.total, { line: { color: COLORS.total, width: 1.5, dash: "dot", shape: "hv" } }),
          line(points, "allocated", "allocated", COLORS.allocated, { fill: "tozeroy", fillcolor: "rgba(59,91,219,0.12)" }),
          line(points, "used", "used", COLORS.used, { fill: "tozeroy", fillcolor: "rgba(12,166,120,0.18)" }),
        ], { yaxis: { title: { text: "GPUs" } } });
      }
    },
  };

  // The over-quota GPU weight, and with time-decayed fair share the one the latest cycle
  // used: "2 → 0.6" (as views.weight_text).
  function weightText(q) {
    const base = q.over_quota_weight.gpu;
    const effective = q.effective_weight;
    if (effective === null || effective === undefined || Math.abs(effective - base) <= 1e-9) {
      return `${Number(base.toPrecision(3))}`;
    }
    return `${Number(base.toPrecision(3))} → ${Number(effective.toPrecision(2))}`;
  }

  const queues = {
    async load(d) {
      const [found, series] = await Promise.all([
        api("/queues"),
        optional(d.series, "/telemetry/queues", { since: d.since }),
      ]);
      return { since: d.since, queues: found, series };
    },
    render(d) {
      const tree = queueTree(d.queues);
      setHtml(
        "queue-rows",
        rows(
          tree,
          (q) => {
            const deserved = gpu(q.deserved);
            const allocated = gpu(q.allocated);
            const scale = Math.max(deserved || 0, allocated || 0, 1);
            const over = allocated && deserved !== null && allocated > deserved ? " over" : "";
            const width = Math.min((100 * (allocated || 0)) / scale, 100);
            const id = (what) => `data-testid="queue-${esc(q.name)}-${what}"`;
            return (
              `<tr data-queue="${esc(q.name)}" class="depth-${q.depth}${q.department ? " department" : ""}">` +
              `<td><span class="indent" style="padding-left:${q.depth * 1.4}em">${esc(q.name)}</span>` +
              `${q.department ? ' <span class="tag">department</span>' : ""}</td>` +
              `<td class="n" ${id("deserved")}>${num(deserved)}</td>` +
              `<td class="n" ${id("fair-share")}>${num(gpu(q.fair_share))}</td>` +
              `<td><span class="quota"><span class="quota-bar${over}"><span style="width:${width}%"></span></span>` +
              `<span ${id("allocated")}>${num(allocated)}</span></span></td>` +
              `<td class="n" ${id("pending")}>${num(q.pending_gpu)}</td>` +
              `<td class="n" ${id("limit")}>${q.limit.gpu === null ? "∞" : num(q.limit.gpu)}</td>` +
              `<td class="n">${esc(q.priority)}</td>` +
              `<td class="n" ${id("weight")}${q.weight_reason ? ` title="${esc(q.weight_reason)}"` : ""}>` +
              `${esc(weightText(q))}</td></tr>`
            );
          },
          "No queues yet. An admin creates them with <code>corral project create</code>.",
          8,
        ),
      );
      setHtml(
        "weight-reasons",
        d.queues
          .filter((q) => q.weight_reason)
          .map(
            (q) =>
              `<li data-testid="queue-${esc(q.name)}-weight-reason">${esc(q.name)}: ${esc(q.weight_reason)}</li>`,
          )
          .join(""),
      );
      if (!d.series) return;
      const holder = document.getElementById("queue-charts");
      const series = d.series.series || {};
      const names = new Set(tree.map((q) => q.name));
      for (const figure of holder.querySelectorAll("figure[data-queue]")) {
        if (!names.has(figure.dataset.queue)) figure.remove();
      }
      for (const q of tree) {
        let figure = holder.querySelector(`figure[data-queue="${q.name}"]`);
        if (!figure) {
          figure = document.createElement("figure");
          figure.className = "mini";
          figure.dataset.queue = q.name;
          figure.innerHTML = `<figcaption>${esc(q.name)}</figcaption><div class="chart small"></div>`;
          holder.appendChild(figure);
        }
        const points = extended(series[q.name] || [], d.series);
        plot(figure.querySelector(".chart"), [
          line(points, "allocated", "allocated", COLORS.allocated, { fill: "tozeroy", fillcolor: "rgba(59,91,219,0.12)" }),
          line(points, "used", "used", COLORS.used),
          line(points, "deserved", "deserved", COLORS.deserved, { line: { color: COLORS.deserved, width: 2, dash: "dash", shape: "hv" } }),
        ], { margin: { l: 32, r: 8, t: 4, b: 24 }, yaxis: { range: [0, headroom(points)] } });
      }
    },
  };

  function filters() {
    const form = document.getElementById("filters");
    const values = {};
    for (const name of ["status", "project", "user"]) values[name] = form.elements[name].value.trim();
    return values;
  }

  const workloads = {
    async load(d) {
      const wanted = filters();
      const [found, devices] = await Promise.all([
        api("/workloads", wanted),
        optional(d.devices, "/telemetry/devices"),
      ]);
      return Object.assign({}, d, { filters: wanted, workloads: found, devices });
    },
    render(d) {
      const now = Date.now() / 1000;
      const active = activity(d.devices || [], d.workloads);
      setText("workloads-count", String(d.workloads.length));
      setHtml(
        "workload-rows",
        rows(
          d.workloads,
          (w) => {
            const a = active.get(w.name) || {};
            return (
              `<tr data-workload="${esc(w.name)}" data-testid="row-${esc(w.name)}"><td>${link(w.name, w.project)}</td>` +
              `<td>${statusBadge(w.status, `status-${w.name}`)}</td>` +
              `<td>${esc(w.project)}</td><td>${esc(w.user)}</td>` +
              `<td class="n">${gpusAsked(w)}</td><td class="n">${duration(waited(w, now))}</td>` +
              `<td class="reason">${w.status === "pending" ? esc(w.reason || "—") : ""}</td>` +
              `<td>${w.status === "running" ? util(a.utilization, a.declared) : ""}</td></tr>`
            );
          },
          "No workloads match.",
          8,
        ),
      );
    },
    setup() {
      const form = document.getElementById("filters");
      let typing = null;
      const changed = () => {
        const query = new URLSearchParams();
        for (const [key, value] of Object.entries(filters())) if (value) query.set(key, value);
        const qs = query.toString();
        window.history.replaceState(null, "", `/workloads${qs ? `?${qs}` : ""}`);
        refresh();
      };
      form.addEventListener("change", changed);
      form.addEventListener("input", (event) => {
        if (event.target.name !== "user") return;
        clearTimeout(typing);
        typing = setTimeout(changed, 300);
      });
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        changed();
      });
    },
  };

  function logTask() {
    const select = document.getElementById("log-task");
    return select && select.value ? select.value : "0";
  }

  const workload = {
    async load(d) {
      const path = `/workloads/${encodeURIComponent(d.name)}`;
      const where = { project: d.project };
      const [found, events, logs, series] = await Promise.all([
        api(path, where),
        api(`${path}/events`, where),
        api(`${path}/logs`, { tail: 50, task: logTask(), ...where }),
        optional(d.series, `/telemetry${path}`, { since: d.since, ...where }),
      ]);
      const why = found.status === "pending" ? await api(`${path}/why`, where) : null;
      return Object.assign({}, d, { workload: found, events, logs, series, why });
    },
    render(d) {
      const w = d.workload;
      const badge = document.querySelector('[data-testid="workload-status"]');
      if (badge && badge.textContent !== w.status) {
        badge.textContent = w.status;
        badge.className = `badge status-${w.status}`;
      }
      const reason = document.getElementById("workload-reason");
      if (reason.textContent !== (w.reason || "")) reason.textContent = w.reason || "";
      document.getElementById("spec-started").textContent = clock(w.started_at);
      document.getElementById("spec-finished").textContent = clock(w.finished_at);
      setText("spec-attempts", `${w.attempts}${w.backoff_limit ? ` (up to ${w.backoff_limit + 1})` : ""}`);
      setHtml(
        "spec-placements",
        w.placements.length
          ? w.placements
              .map(
                (p) =>
                  `<div>task ${p.task} on ${esc(p.node)}, ` +
                  `${p.devices.length ? `GPU ${p.devices.join(", ")}` : "no GPU"}` +
                  `${p.gpu && p.gpu < 1 ? ` (${num(p.gpu)})` : ""}</div>`,
              )
              .join("")
          : "—",
      );
      const why = document.getElementById("why");
      why.hidden = !d.why;
      if (d.why) {
        let html = `<h3>Why it waits</h3><p>${esc(d.why.reason || "waiting for the next scheduling cycle")}</p>`;
        if (d.why.position) {
          html += `<p>Number ${d.why.position} in line in ${esc(w.project)}` +
            `${d.why.ahead.length ? `, after ${esc(d.why.ahead.join(", "))}` : ""}.</p>`;
        }
        if (d.why.holders.length) {
          html += "<p>Holding the GPUs it could use: " + d.why.holders
            .map((h) => `${h.workload ? link(h.workload, h.project) : "another project's workload"} (${esc(h.project)}, ${num(h.gpu)} on ${esc(h.node)})`)
            .join(", ") + ".</p>";
        }
        setHtml("why", html);
      }
      const tail = document.getElementById("log-tail");
      const text = d.logs.text || "(no output yet)";
      if (tail.textContent !== text) {
        const atBottom = tail.scrollTop + tail.clientHeight >= tail.scrollHeight - 4;
        tail.textContent = text;
        if (atBottom) tail.scrollTop = tail.scrollHeight;
      }
      const select = document.getElementById("log-task");
      const tasks = d.logs.tasks.map(String);
      if (select && Array.from(select.options, (o) => o.value).join() !== tasks.join()) {
        const chosen = select.value;
        select.innerHTML = tasks
          .map((t) => `<option value="${t}"${t === chosen ? " selected" : ""}>${t}</option>`)
          .join("");
        select.closest("label").hidden = tasks.length < 2;
      }
      setText("events-count", String(d.events.length));
      setHtml(
        "event-rows",
        rows(
          d.events.slice().reverse(),
          (e) =>
            `<tr><td class="nowrap">${clock(e.time)}</td><td><span class="tag">${esc(e.kind)}</span></td>` +
            `<td>${esc(e.cause)}</td><td>${esc(e.reason)}</td></tr>`,
          "No events.",
          4,
        ),
      );
      if (!d.series) return;
      const points = seriesOf(d.series);
      document.getElementById("util-source").hidden = !points.some((p) => p.source === "declared");
      const byDevice = new Map();
      for (const p of points) {
        const key = `${p.node} GPU ${p.device}`;
        if (!byDevice.has(key)) byDevice.set(key, []);
        byDevice.get(key).push(p);
      }
      const traces = (key, scale) =>
        Array.from(byDevice, ([name, pts], i) => ({
          type: "scatter",
          mode: "lines",
          name,
          x: pts.map((p) => when(p.time)),
          y: pts.map((p) => (p[key] === null || p[key] === undefined ? null : p[key] / scale)),
          line: { color: PALETTE[i % PALETTE.length], width: 2, shape: "hv" },
        }));
      const legend = byDevice.size > 1;
      plot(document.getElementById("chart-util"), traces("utilization", 1), {
        showlegend: legend,
        yaxis: { range: [0, 100], title: { text: "%" } },
      });
      plot(document.getElementById("chart-memory"), traces("memory_used", 2 ** 30), {
        showlegend: legend,
        yaxis: { title: { text: "GiB" } },
      });
    },
    setup() {
      const tail = document.getElementById("log-tail");
      tail.scrollTop = tail.scrollHeight;
      const select = document.getElementById("log-task");
      if (select) select.addEventListener("change", () => refresh());
    },
  };

  // A workload on a device, with its fraction of the device when it shares it.
  function shareLink(name, shares) {
    const share = shares.get(name);
    if (share === undefined || share >= 1) return link(name);
    return `<span class="share">${link(name)} <span class="fraction">${num(share)}</span></span>`;
  }

  function cellHtml(node, c) {
    const key = `${node.name}-${c.index}`;
    const id = (what) => `data-testid="device-${esc(key)}${what}"`;
    let html =
      `<div class="cell state-${esc(c.state)}" ${id("")} data-state="${esc(c.state)}" ` +
      `style="--util:${halfUp((c.utilization || 0) / 100, 3)}">` +
      `<div class="cell-head"><b>GPU ${c.index}</b>` +
      `${c.virtual ? '<span class="tag">virtual</span>' : ""}` +
      `${c.source === "declared" ? '<span class="tag declared">declared</span>' : ""}</div>` +
      `<div class="cell-model">${esc(c.model)}</div>` +
      `<div class="cell-util" ${id("-util")}>${pct(c.utilization)}</div>` +
      `<div class="cell-state" ${id("-state")}>${esc(c.state)}</div>` +
      `<div class="cell-mem">${c.memory_used !== null ? `${gib(c.memory_used)} / ` : ""}${gib(c.memory_total)}</div>`;
    if (c.power !== null || c.temperature !== null) {
      html +=
        '<div class="cell-extra">' +
        `${c.power !== null ? `${Math.round(c.power)} W` : ""}` +
        `${c.temperature !== null ? ` · ${Math.round(c.temperature)} °C` : ""}</div>`;
    }
    html +=
      `<div class="cell-work" ${id("-workloads")}>` +
      `${c.workloads.length ? c.workloads.map((w) => shareLink(w, c.shares)).join("") : '<span class="muted">nothing</span>'}</div>` +
      '<div class="cell-fill"></div></div>';
    return html;
  }

  const nodes = {
    async load(d) {
      const [found, devices] = await Promise.all([
        api("/nodes"),
        optional(d.devices, "/telemetry/devices"),
      ]);
      return { nodes: found, devices };
    },
    render(d) {
      const entries = deviceCells(d.nodes, d.devices);
      const html = entries.length
        ? entries
            .map(({ node: n, cells }) => {
              const state = `<span class="badge node-${esc(n.state)}" data-testid="node-${esc(n.name)}-state">${esc(n.state)}</span>`;
              return (
                `<section class="card node" data-node="${esc(n.name)}"><div class="card-head">` +
                `<h2>${esc(n.name)} ${state}` +
                `${n.schedulable ? "" : ' <span class="tag warn">cordoned</span>'}` +
                `${n.virtual ? ' <span class="tag">virtual</span>' : ""}</h2>` +
                `<span class="muted"><span data-testid="node-${esc(n.name)}-allocated">${num(n.allocated_gpu)}</span>` +
                ` of ${n.gpus} GPUs allocated · ${esc(n.gpu_model)} · ${num(n.cpu)} CPUs · ${gib(n.memory)}</span></div>` +
                `<div class="cells">${cells.map((c) => cellHtml(n, c)).join("")}` +
                `${cells.length ? "" : '<p class="muted">No GPUs.</p>'}</div></section>`
              );
            })
            .join("")
        : '<section class="card"><p class="muted">No nodes have registered.</p></section>';
      setHtml("node-list", html);
    },
  };

  // GPU-hours per project per step: each point is the step's average GPUs.
  function usageOverTime(answer, projects, metric) {
    const step = answer.step || 3600;
    const series = answer.series || {};
    return projects.map((project, i) => {
      const points = series[project] || [];
      return {
        type: "bar",
        name: project,
        x: points.map((p) => when(p.time + step / 2)),
        y: points.map((p) => ((p[metric] || 0) * step) / 3600),
        width: step * 1000 * 0.85,
        marker: { color: PALETTE[i % PALETTE.length] },
        hovertemplate: `${esc(project)}: %{y:.3f} GPU-hours<extra></extra>`,
      };
    });
  }

  const usage = {
    async load(d) {
      const [found, series, all] = await Promise.all([
        optional(d.usage, "/usage", { since: d.since, by: d.by, format: "json" }),
        optional(d.series, "/telemetry/queues", { since: d.since, step: d.step }),
        api("/queues"),
      ]);
      const projects = all.filter((q) => !q.department).map((q) => q.name).sort();
      const departments = all.filter((q) => q.department).map((q) => q.name).sort();
      return Object.assign({}, d, { usage: found, series, projects, departments });
    },
    render(d) {
      setHtml(
        "usage-rows",
        rows(
          usageRows(d.usage),
          (r) => {
            const share = r.gpu_hours_allocated ? (100 * r.gpu_hours_used) / r.gpu_hours_allocated : null;
            const id = (what) => `data-testid="usage-${esc(r.key)}-${what}"`;
            return (
              `<tr data-key="${esc(r.key)}"><td>${esc(r.key)}</td>` +
              `<td class="n" ${id("allocated")}>${hours(r.gpu_hours_allocated)}</td>` +
              `<td class="n" ${id("used")}>${hours(r.gpu_hours_used)}</td>` +
              `<td class="n" ${id("idle")}>${hours(r.gpu_hours_idle)}</td>` +
              `<td>${shareOf(share)}</td></tr>`
            );
          },
          d.usage === null ? "The server has no /usage yet." : "No GPU time in this window.",
          5,
        ),
      );
      if (!d.series) return;
      const metric = document.getElementById("usage-metric").value;
      // Telemetry is kept per queue: by department, the departments' series; by anything
      // else (user, workload), the projects'.
      const byDepartment = d.by === "department";
      document.getElementById("usage-chart-title").textContent =
        `GPU-hours by ${byDepartment ? "department" : "project"} over time`;
      plot(
        document.getElementById("chart-usage"),
        usageOverTime(d.series, (byDepartment ? d.departments : d.projects) || [], metric),
        { barmode: "stack", showlegend: true, legend: { orientation: "h", y: -0.15 }, hovermode: "closest", yaxis: { title: { text: "GPU-hours" } } },
      );
    },
    setup() {
      const form = document.getElementById("usage-form");
      form.addEventListener("change", () => form.submit());
      document.getElementById("usage-metric").addEventListener("change", () => usage.render(current));
    },
  };

  const PAGES = { overview, queues, workloads, workload, nodes, usage };
  const view = PAGES[PAGE];
  if (!view) return;

  // -- the live loop -----------------------------------------------------------------------

  const live = document.getElementById("live");
  const liveText = document.getElementById("live-text");
  let timer = null;
  let busy = false;
  let again = false;
  let refreshes = 0;

  function shown(ok, note) {
    if (!live) return;
    live.dataset.state = ok ? "live" : "stale";
    liveText.textContent = ok ? `live · ${clock(Date.now() / 1000).slice(11)}` : note;
  }

  async function refresh() {
    clearTimeout(timer);
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    again = false;
    try {
      if (!document.hidden) {
        current = await view.load(current);
        view.render(current);
        refreshes += 1;
        body.dataset.refreshes = String(refreshes);
        shown(true);
      }
    } catch (error) {
      if (error instanceof LoggedOut) return;
      shown(false, "stale · retrying");
    } finally {
      busy = false;
    }
    timer = setTimeout(refresh, again ? 0 : POLL);
  }

  // Render the embedded data once more: the charts are drawn, and times shown in the
  // reader's zone rather than the server's.
  view.render(current);
  if (view.setup) view.setup();
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refresh();
  });
  body.dataset.refreshes = "0";
  timer = setTimeout(refresh, POLL);
})();
