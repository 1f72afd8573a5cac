// The factflow console: a client of the server's protocol (docs/protocol.md) in the browser.
//
// One WebSocket to the page's own host and port; `hello` says who we are (an admin, a
// tenant, or anyone on a server without tokens: the session cookie admits the socket).
// Each page reads what it shows with read-only ops, polled at a bounded rate while the
// page is visible (a page's next poll waits for its previous one): epochs every second,
// queries and clients every 2 s, state every 3 s. A query's page follows its rows with
// `interest` like any client and leaves with `uninterest`; its tables re-render at most
// four times a second. Every table is paged, so thousands of queries or rows cost the
// DOM one page. Charts are uPlot's, the plan graph is laid out by dagre.
"use strict";

const POLL = {epochs: 1000, queries: 2000, state: 3000, clients: 2000};
const PAGE_ROWS = 50;
const RESULT_ROWS = 100;
const CHART_SECONDS = 600;
const RENDER_EVERY = 250;
const KEPT_EPOCHS = 1000;
const KEPT_DIFFS = 100;

// ------------------------------------------------------------------ small helpers
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) {
      node.append(child instanceof Node ? child : String(child));
    }
  }
  return node;
}

const fmt = {
  num: (n) => (n === null || n === undefined ? "" : Number(n).toLocaleString("en-US")),
  secs: (s) => (s === null || s === undefined ? "?" : s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(2)} s`),
  time: (t) => (t ? new Date(t * 1000).toLocaleTimeString("en-GB") : ""),
  bytes: (b) => {
    if (!b) return "0";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i += 1; }
    return `${b.toFixed(i ? 1 : 0)} ${units[i]}`;
  },
  value: (v) => (typeof v === "string" ? v : JSON.stringify(v)),
  // the first few names of a list, and how many there are
  names: (list) => (list.length > 4 ? list.slice(0, 4).join(", ") + ` … (${list.length})` : list.join(", ")),
};

function tag(text, kind) {
  return el("span", {class: `tag ${kind || text}`}, text);
}

// A paged table: columns are {title, value(row) -> node or text, num}; keeps its page.
class Table {
  constructor(columns, options = {}) {
    this.columns = columns;
    this.pageSize = options.pageSize || PAGE_ROWS;
    this.rowAttrs = options.rowAttrs || (() => ({}));
    this.detail = options.detail || null;  // row -> node shown under a clicked row
    this.key = options.key || null;
    this.open = new Set();
    this.page = 0;
    this.rows = [];
    this.node = el("div", {class: "table"});
  }

  show(rows) {
    this.rows = rows;
    const pages = Math.max(1, Math.ceil(rows.length / this.pageSize));
    this.page = Math.min(this.page, pages - 1);
    const start = this.page * this.pageSize;
    const body = el("tbody");
    for (const row of rows.slice(start, start + this.pageSize)) {
      const key = this.key ? this.key(row) : null;
      const attrs = this.rowAttrs(row);
      if (this.detail) {
        attrs.class = "clickable";
        attrs.onclick = () => { this.open.has(key) ? this.open.delete(key) : this.open.add(key); this.show(this.rows); };
      }
      body.append(el("tr", attrs, this.columns.map((c) => el("td", {class: c.num ? "num" : null}, c.value(row)))));
      if (this.detail && this.open.has(key)) {
        body.append(el("tr", {class: "detail"}, el("td", {colspan: this.columns.length}, this.detail(row))));
      }
    }
    const head = el("thead", {}, el("tr", {}, this.columns.map((c) => el("th", {class: c.num ? "num" : null}, c.title))));
    const pager = el("div", {class: "pager"},
      el("button", {onclick: () => { this.page -= 1; this.show(this.rows); }, disabled: this.page === 0}, "‹ previous"),
      el("span", {class: "muted"}, `page ${this.page + 1} of ${pages} · ${fmt.num(rows.length)} rows`),
      el("button", {onclick: () => { this.page += 1; this.show(this.rows); }, disabled: this.page >= pages - 1}, "next ›"));
    this.node.replaceChildren(el("table", {}, head, body), rows.length > this.pageSize ? pager : el("div", {class: "muted"}, rows.length ? "" : "none"));
  }
}

function filterBox(onchange) {
  return el("input", {type: "search", placeholder: "filter", oninput: (e) => onchange(e.target.value.toLowerCase())});
}

// ------------------------------------------------------------------ the connection
const conn = {ws: null, next: 1, waiting: new Map(), who: null, pushes: null};

function connect() {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`);
    conn.ws = ws;
    ws.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type) {
        if (conn.pushes) conn.pushes(message);
        return;
      }
      const waiting = conn.waiting.get(message.id);
      if (!waiting) return;
      conn.waiting.delete(message.id);
      if (message.ok) {
        if (message.result && typeof message.result.epoch === "number") showEpoch(message.result.epoch);
        waiting.resolve(message.result);
      } else {
        waiting.reject(message.error);
      }
    };
    ws.onopen = () => call("hello", {protocol: 1}).then(resolve, reject);
    ws.onclose = () => {
      for (const waiting of conn.waiting.values()) waiting.reject({category: "closed", message: "connection closed"});
      conn.waiting.clear();
      document.getElementById("status").textContent = "disconnected: reconnecting…";
      setTimeout(start, 2000);
    };
  });
}

function call(op, fields = {}) {
  return new Promise((resolve, reject) => {
    if (!conn.ws || conn.ws.readyState !== WebSocket.OPEN) {
      reject({category: "closed", message: "not connected"});
      return;
    }
    const id = conn.next++;
    conn.waiting.set(id, {resolve, reject});
    conn.ws.send(JSON.stringify({op, id, ...fields}));
  });
}

function showEpoch(epoch) {
  const who = conn.who || {};
  const as = who.role === "tenant" ? `tenant ${who.tenant}` : who.role === "admin" ? `admin ${who.tenant}` : "";
  document.getElementById("status").textContent = `epoch ${epoch} · ${who.client || ""}${as ? " · " + as : ""}`;
}

const isTenant = () => conn.who && conn.who.role === "tenant";

// ------------------------------------------------------------------ Epochs
class EpochsPage {
  constructor() {
    this.interval = POLL.epochs;
    this.reports = [];
    this.table = new Table([
      {title: "epoch", value: (r) => r.epoch, num: true},
      {title: "committed", value: (r) => fmt.time(r.time)},
      {title: "latency", value: (r) => fmt.secs(r.seconds), num: true},
      {title: "operations", value: (r) => fmt.num(r.operations), num: true},
      {title: "changes", value: (r) => fmt.num(r.changes), num: true},
      {title: "queries run / changed", value: (r) => `${r.queries} / ${r.changed}`, num: true},
      {title: "Spark jobs / on the driver", value: (r) => `${r.jobs.length} / ${r.on_driver.length}`, num: true},
      {title: "rows read", value: (r) => fmt.num(r.rows_read), num: true},
      {title: "phases", value: (r) => Object.entries(r.phases).map(([k, v]) => `${k} ${fmt.secs(v)}`).join(" · ")},
    ], {key: (r) => r.epoch, rowAttrs: (r) => ({"data-epoch": r.epoch}), detail: (r) => this.jobs(r)});
  }

  enter(root) {
    this.latency = el("div");
    this.changes = el("div");
    root.append(el("h1", {}, "Epochs"),
      el("div", {class: "charts"},
        el("div", {class: "chart"}, el("h3", {}, "Latency per epoch (last 10 minutes)"), this.latency),
        el("div", {class: "chart"}, el("h3", {}, "Changes per epoch (last 10 minutes)"), this.changes)),
      el("h2", {}, "Recent epochs ", el("span", {class: "muted"}, "(click an epoch for its Spark jobs and the statements run on the driver)")),
      this.table.node);
    const width = Math.max(320, Math.min(640, Math.floor((root.clientWidth - 60) / 2)));
    const lastMinutes = () => { const now = Date.now() / 1000; return [now - CHART_SECONDS, now]; };
    const options = (label, stroke, value) => ({
      width, height: 220, legend: {show: true},
      scales: {x: {time: true, range: lastMinutes}, y: {range: (u, min, max) => [0, Math.max(max || 0, 1e-3) * 1.1]}},
      series: [{}, {label, stroke, width: 1.5, fill: stroke + "22", points: {show: true, size: 5}, value}],
      axes: [{}, {size: 60, values: (u, ticks) => ticks.map((t) => value(u, t))}],
    });
    this.latencyChart = new uPlot(options("latency", "#2a6fdb", (u, v) => (v === null ? "" : fmt.secs(v))), [[], []], this.latency);
    this.changesChart = new uPlot(options("changes", "#1e7d45", (u, v) => (v === null ? "" : fmt.num(v))), [[], []], this.changes);
    this.table.show(this.reports);
  }

  jobs(report) {
    if (!report.jobs.length && !report.on_driver.length) return el("span", {class: "muted"}, "no Spark jobs");
    const onDriver = report.on_driver.map((r) => ({id: "on the driver", description: r.description, tasks: "",
      seconds: r.seconds, rows_read: r.rows_read, rows_shuffled: 0}));
    return el("table", {},
      el("thead", {}, el("tr", {}, ["job", "description", "tasks", "time", "rows read", "rows shuffled"].map((t) => el("th", {}, t)))),
      el("tbody", {}, report.jobs.concat(onDriver).map((j) => el("tr", {},
        el("td", {}, j.id), el("td", {class: "mono"}, j.description || ""), el("td", {class: "num"}, j.tasks),
        el("td", {class: "num"}, fmt.secs(j.seconds)), el("td", {class: "num"}, fmt.num(j.rows_read)),
        el("td", {class: "num"}, fmt.num(j.rows_shuffled))))));
  }

  async refresh() {
    const last = this.reports.length ? this.reports[0].epoch : null;
    const reply = await call("epochs", last === null ? {limit: KEPT_EPOCHS} : {since: last});
    if (reply.epochs.length) {
      this.reports = reply.epochs.slice().reverse().concat(this.reports).slice(0, KEPT_EPOCHS);
      this.table.show(this.reports);
    }
    const since = Date.now() / 1000 - CHART_SECONDS;
    const recent = this.reports.filter((r) => r.time >= since).reverse();
    const xs = recent.map((r) => r.time);
    this.latencyChart.setData([xs, recent.map((r) => r.seconds)]);
    this.changesChart.setData([xs, recent.map((r) => r.changes)]);
  }

  leave() {
    this.latencyChart.destroy();
    this.changesChart.destroy();
  }
}

// ------------------------------------------------------------------ Queries
class QueriesPage {
  constructor() {
    this.interval = POLL.queries;
    this.filter = "";
    this.queries = [];
    const link = (q) => el("a", {href: `#/query/${encodeURIComponent(q.name)}`}, q.name);
    this.table = new Table(isTenant() ? [
      {title: "name", value: link},
      {title: "interested", value: (q) => fmt.names(q.interested)},
    ] : [
      {title: "name", value: link},
      {title: "clients", value: (q) => q.clients, num: true},
      {title: "interested", value: (q) => fmt.names(q.interested)},
      {title: "rows", value: (q) => fmt.num(q.rows), num: true},
      {title: "private state", value: (q) => fmt.num(q.intermediate), num: true},
      {title: "installed", value: (q) => `epoch ${q.installed_at} · ${fmt.time(q.installed_time)}`},
      {title: "join strategy", value: (q) => q.joins.map(([conj, s]) => el("span", {}, tag(s), conj === "query" ? "" : `${conj} `))},
      {title: "last change", value: (q) => (q.last_change === null ? "" : `epoch ${q.last_change}`)},
      {title: "", value: (q) => [q.durable && tag("durable", "shared"), q.published && tag("published", "shared"), q.lifted && tag("lifted", "shared")]},
    ], {rowAttrs: (q) => ({"data-query": q.name})});
  }

  enter(root) {
    root.append(el("h1", {}, "Queries"),
      el("div", {class: "toolbar"}, filterBox((f) => { this.filter = f; this.show(); }),
        el("span", {class: "muted"}, isTenant() ? "your interests" : "every installed query (dataflow)")),
      this.table.node);
    this.table.show([]);
  }

  async refresh() {
    this.queries = (await call("queries")).queries.sort((a, b) => a.name.localeCompare(b.name));
    this.show();
  }

  show() {
    const f = this.filter;
    this.table.show(f ? this.queries.filter((q) => q.name.toLowerCase().includes(f) || (q.text || "").toLowerCase().includes(f)) : this.queries);
  }

  leave() {}
}

// ------------------------------------------------------------------ one query
function operatorLines(op) {
  const lines = [op.op + (op.strategy ? ` (${op.strategy})` : "")];
  const slot = op.slot || {};
  if (op.label) lines.push(op.label);
  if (slot.handle) lines.push(`${slot.handle} ${slot.face}`);
  if (slot.trace) lines.push(`${slot.role}: ${slot.trace}`);
  if (op.on && op.on.length) lines.push(`on ${op.on.join(", ")}`);
  if (op.pipelines) lines.push(`${op.pipelines.length} pipelines`);
  return lines.map((l) => (l.length > 44 ? l.slice(0, 43) + "…" : l));
}

function drawPlan(container, details, data) {
  const graph = new dagre.graphlib.Graph();
  graph.setGraph({rankdir: "TB", nodesep: 22, ranksep: 34, marginx: 14, marginy: 14});
  graph.setDefaultEdgeLabel(() => ({}));
  data.operators.forEach((op, i) => {
    const lines = operatorLines(op);
    graph.setNode(String(i), {lines, op, width: Math.max(...lines.map((l) => l.length)) * 6.7 + 18, height: lines.length * 14 + 10});
  });
  data.operators.forEach((op, i) => (op.inputs || []).forEach((input) => graph.setEdge(String(input), String(i))));
  dagre.layout(graph);
  const ns = "http://www.w3.org/2000/svg";
  const svg = (tagName, attrs, ...children) => {
    const node = document.createElementNS(ns, tagName);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    node.append(...children);
    return node;
  };
  const size = graph.graph();
  const width = Math.ceil(size.width);
  const height = Math.ceil(size.height);
  const root = svg("svg", {viewBox: `0 0 ${width} ${height}`, width: "100%", style: `max-width: ${width}px`,
    "data-operators": data.operators.length},
    svg("defs", {}, svg("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"},
      svg("path", {d: "M 0 0 L 10 5 L 0 10 z", fill: "#8896a8"}))));
  for (const edge of graph.edges()) {
    const points = graph.edge(edge).points;
    root.append(svg("path", {class: "edge", d: points.map((p, i) => `${i ? "L" : "M"} ${p.x} ${p.y}`).join(" ")}));
  }
  for (const id of graph.nodes()) {
    const node = graph.node(id);
    const x = node.x - node.width / 2;
    const y = node.y - node.height / 2;
    const group = svg("g", {class: `node ${node.op.op}${String(data.result) === id ? " result" : ""}`, "data-op": node.op.op});
    group.append(svg("rect", {x, y, width: node.width, height: node.height}));
    node.lines.forEach((line, i) => {
      const text = svg("text", {x: x + 9, y: y + 17 + i * 14, class: i ? "" : "op"});
      text.textContent = line;
      group.append(text);
    });
    group.addEventListener("click", () => { details.textContent = `operator ${id}\n${JSON.stringify(node.op, null, 1)}`; });
    root.append(group);
  }
  container.replaceChildren(root);
}

class QueryPage {
  constructor(name) {
    this.name = name;
    this.rows = new Map();  // JSON of a row -> [row, multiplicity]
    this.diffs = [];
    this.columns = [];
    this.dirty = false;
    this.joined = false;
    this.rowTable = new Table([], {pageSize: RESULT_ROWS});
    this.diffTable = new Table([
      {title: "epoch", value: (d) => d.epoch, num: true},
      {title: "received", value: (d) => fmt.time(d.at)},
      {title: "added", value: (d) => (d.added ? el("span", {class: "add"}, `+${fmt.num(d.added)}`) : ""), num: true},
      {title: "removed", value: (d) => (d.removed ? el("span", {class: "remove"}, `−${fmt.num(d.removed)}`) : ""), num: true},
      {title: "rows (first few)", value: (d) => el("span", {class: "mono"}, d.sample)},
    ], {rowAttrs: (d) => ({"data-diff-epoch": d.epoch})});
  }

  enter(root) {
    this.summary = el("div", {class: "muted"}, "joining…");
    this.plan = el("div", {class: "plan"});
    this.planText = el("div");
    this.opDetails = el("pre", {class: "mono operator"}, "click an operator for its data");
    root.append(el("h1", {}, "Query ", el("span", {class: "mono"}, this.name)), this.planText,
      el("div", {class: "columns"},
        el("section", {}, el("h2", {}, "Plan"), isTenant() ? el("p", {class: "muted"}, "plans are shown to admins") : [this.plan, this.opDetails]),
        el("section", {}, el("h2", {}, "Current rows"), this.summary, this.rowTable.node,
          el("h2", {}, "Diffs as they arrive"), this.diffTable.node)));
    this.timer = setInterval(() => this.render(), RENDER_EVERY);
    this.start();
  }

  async start() {
    let join = {name: this.name, granularity: RENDER_EVERY / 1000};
    if (!isTenant()) {
      let info;
      try {
        info = await call("plan", {name: this.name});
      } catch (error) {
        this.summary.replaceChildren(el("span", {class: "error"}, error.message));
        return;
      }
      this.planText.replaceChildren(el("pre", {}, info.text),
        el("div", {}, info.strategies.map(([conj, s, reason]) => el("div", {}, s ? tag(s) : "", `${conj}: ${reason}`))));
      drawPlan(this.plan, this.opDetails, info.plan);
      if (info.lifted) {
        this.summary.textContent = "the dataflow of lifted interests: each interest receives its own rows, open it by its own name";
        return;
      }
      if (!info.published) join = {...join, query: info.text, inputs: info.inputs, join: info.join};
    }
    conn.pushes = (message) => this.push(message);
    try {
      const reply = await call("interest", join);
      this.joined = true;
      this.columns = reply.columns;
      this.dirty = true;
    } catch (error) {
      this.summary.replaceChildren(el("span", {class: "error"}, error.message));
    }
  }

  push(message) {
    if (message.type !== "diff" || message.query !== this.name) return;
    let added = 0;
    let removed = 0;
    for (const [row, diff] of message.changes) {
      const key = JSON.stringify(row);
      const total = (this.rows.has(key) ? this.rows.get(key)[1] : 0) + diff;
      if (total) this.rows.set(key, [row, total]); else this.rows.delete(key);
      if (diff > 0) added += diff; else removed -= diff;
    }
    const sample = message.changes.slice(0, 3).map(([row, diff]) => `${diff > 0 ? "+" : "−"}${row.map(fmt.value).join(" ")}`).join("  ");
    this.diffs.unshift({epoch: message.epoch, at: Date.now() / 1000, added, removed, sample: sample + (message.changes.length > 3 ? "  …" : "")});
    this.diffs.length = Math.min(this.diffs.length, KEPT_DIFFS);
    this.dirty = true;
  }

  render() {
    if (!this.dirty) return;
    this.dirty = false;
    if (this.columns.length && this.rowTable.columns.length !== this.columns.length + 1) {
      this.rowTable.columns = this.columns.map((c, i) => ({title: c, value: ([row]) => fmt.value(row[i])}))
        .concat([{title: "×", value: ([, n]) => (n === 1 ? "" : n), num: true}]);
    }
    this.summary.textContent = `${fmt.num(this.rows.size)} distinct rows`;
    this.rowTable.show(Array.from(this.rows.values()));
    this.diffTable.show(this.diffs);
  }

  async leave() {
    clearInterval(this.timer);
    conn.pushes = null;
    if (this.joined) await call("uninterest", {name: this.name}).catch(() => null);
  }
}

// ------------------------------------------------------------------ State
class StatePage {
  constructor() {
    this.interval = POLL.state;
    this.filter = "";
    this.arrangements = [];
    this.table = new Table([
      {title: "arrangement", value: (a) => el("span", {class: "mono"}, a.name)},
      {title: "kind", value: (a) => `${a.kind} · ${a.role}`},
      {title: "tuples", value: (a) => fmt.num(a.tuples), num: true},
      {title: "batches (driver)", value: (a) => `${a.batches} (${a.driver_batches})`, num: true},
      {title: "memory", value: (a) => fmt.bytes(a.driver_bytes + a.spark_memory_bytes), num: true},
      {title: "disk", value: (a) => fmt.bytes(a.index_bytes + a.spark_disk_bytes), num: true},
      {title: "read by", value: (a) => [a.readers.length > 1 ? tag(`shared by ${a.readers.length}`, "shared") : "",
        a.readers.slice(0, 6).join(", ") + (a.readers.length > 6 ? " …" : "")]},
    ], {rowAttrs: (a) => ({"data-arrangement": a.name})});
  }

  enter(root) {
    this.cards = el("div", {class: "cards"});
    root.append(el("h1", {}, "State"), this.cards,
      el("div", {class: "toolbar"}, filterBox((f) => { this.filter = f; this.show(); }),
        el("span", {class: "muted"}, "shared attribute indexes, queries' private traces and shared rules, largest first")),
      this.table.node);
    this.table.show([]);
  }

  async refresh() {
    this.arrangements = (await call("state")).arrangements.sort((a, b) => b.tuples - a.tuples || a.name.localeCompare(b.name));
    const sum = (list, f) => list.reduce((s, a) => s + f(a), 0);
    const shared = this.arrangements.filter((a) => a.kind === "attribute");
    const card = (label, value) => el("div", {class: "card"}, el("div", {class: "value"}, value), el("div", {class: "label"}, label));
    this.cards.replaceChildren(
      card("arrangements", fmt.num(this.arrangements.length)),
      card("tuples in shared indexes", fmt.num(sum(shared, (a) => a.tuples))),
      card("tuples private to queries and rules", fmt.num(sum(this.arrangements, (a) => a.tuples) - sum(shared, (a) => a.tuples))),
      card("memory", fmt.bytes(sum(this.arrangements, (a) => a.driver_bytes + a.spark_memory_bytes))),
      card("disk", fmt.bytes(sum(this.arrangements, (a) => a.index_bytes + a.spark_disk_bytes))));
    this.show();
  }

  show() {
    const f = this.filter;
    this.table.show(f ? this.arrangements.filter((a) => `${a.name} ${a.owner} ${a.readers.join(" ")}`.toLowerCase().includes(f)) : this.arrangements);
  }

  leave() {}
}

// ------------------------------------------------------------------ Clients and tenants
class ClientsPage {
  constructor() {
    this.interval = POLL.clients;
    this.clients = new Table([
      {title: "client", value: (c) => c.client + (c.client === conn.who.client ? " (this console)" : "")},
      {title: "tenant", value: (c) => (c.tenant ? `${c.tenant} (${c.role})` : "")},
      {title: "address", value: (c) => c.address || ""},
      {title: "connected", value: (c) => fmt.time(c.since)},
      {title: "interests", value: (c) => fmt.names(c.queries)},
      {title: "subscriptions", value: (c) => fmt.names(c.attributes)},
      {title: "rows waiting", value: (c) => fmt.num(c.waiting_rows), num: true},
      {title: "messages waiting", value: (c) => fmt.num(c.waiting_messages), num: true},
      {title: "bytes buffered", value: (c) => fmt.bytes(c.buffered_bytes), num: true},
    ], {rowAttrs: (c) => ({"data-client": c.client})});
    this.tenants = new Table([
      {title: "tenant", value: (t) => t.name},
      {title: "role", value: (t) => t.role},
      {title: "entity", value: (t) => (t.entity === null ? "" : t.entity)},
      {title: "connections", value: (t) => t.connections, num: true},
    ]);
  }

  enter(root) {
    this.tenantSection = el("section", {}, el("h2", {}, "Tenants"), this.tenants.node);
    root.append(el("h1", {}, "Clients and tenants"), this.clients.node, this.tenantSection);
    this.clients.show([]);
  }

  async refresh() {
    const reply = await call("clients");
    this.clients.show(reply.clients);
    const tenants = Object.entries(reply.tenants).map(([name, t]) => ({name, ...t}));
    this.tenantSection.hidden = !tenants.length;
    this.tenants.show(tenants);
  }

  leave() {}
}

// ------------------------------------------------------------------ Ask
// Where an error message points in the query text: "(line L, column C)", else the first
// form, keyword or variable it quotes that the text contains (spacing aside).
function offending(text, message) {
  const at = /\(line (\d+), column (\d+)\)/.exec(message);
  if (at) {
    const lines = text.split("\n");
    const start = lines.slice(0, Number(at[1]) - 1).reduce((n, l) => n + l.length + 1, 0) + Number(at[2]) - 1;
    return [start, Math.max(formEnd(text, start), start + 1)];
  }
  const candidates = [];
  for (let i = 0; i < message.length; i++) {
    if (message[i] === "[" || message[i] === "(") {
      const end = formEnd(message, i);
      if (end > i) { candidates.push(message.slice(i, end)); i = end - 1; }
    }
  }
  for (const m of message.matchAll(/[:?][\w.\-*+!<>=/]+/g)) candidates.push(m[0]);
  for (const candidate of candidates) {
    const flexible = candidate.replace(/\s+/g, "").split("").map((c) => c.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("\\s*");
    const found = new RegExp(flexible + (/[\w]$/.test(candidate) ? "(?![\\w\\-/])" : "")).exec(text);
    if (found) return [found.index, found.index + found[0].length];
  }
  return null;
}

// The end of the bracketed form opening at `start` (start itself when none closes there).
function formEnd(text, start) {
  const pairs = {"[": "]", "(": ")", "{": "}"};
  if (!pairs[text[start]]) return start;
  const stack = [];
  for (let i = start; i < text.length; i++) {
    if (pairs[text[i]]) stack.push(pairs[text[i]]);
    else if (text[i] === stack[stack.length - 1]) { stack.pop(); if (!stack.length) return i + 1; }
  }
  return start;
}

const asked = {text: "", inputs: ""};

class AskPage {
  enter(root) {
    this.result = el("div");
    this.text = el("textarea", {spellcheck: "false", placeholder: "[:find ?n :where [?p :person/name ?n]]"});
    this.text.value = asked.text;
    this.inputs = el("input", {class: "inputs", placeholder: "inputs as JSON, e.g. [18]"});
    this.inputs.value = asked.inputs;
    this.table = new Table([], {pageSize: RESULT_ROWS});
    root.append(el("h1", {}, "Ask"),
      el("form", {class: "ask", onsubmit: (e) => { e.preventDefault(); this.ask(); }},
        el("p", {class: "muted"}, "A one-shot query as of the latest epoch (op query): nothing stays installed."),
        this.text, el("div", {class: "toolbar"}, el("label", {}, ":in values ", this.inputs), el("button", {type: "submit", id: "ask"}, "Run"))),
      this.result);
  }

  async ask() {
    asked.text = this.text.value;
    asked.inputs = this.inputs.value;
    const fields = {query: asked.text};
    try {
      if (asked.inputs.trim()) fields.inputs = JSON.parse(asked.inputs);
    } catch (error) {
      this.result.replaceChildren(el("p", {class: "error", id: "ask-error"}, `the inputs are not a JSON array: ${error.message}`));
      return;
    }
    this.result.replaceChildren(el("p", {class: "muted"}, "running…"));
    const started = performance.now();
    try {
      const reply = await call("query", fields);
      this.table.columns = reply.columns.map((c, i) => ({title: c, value: (row) => fmt.value(row[i])}));
      this.table.page = 0;
      this.table.show(reply.rows);
      this.result.replaceChildren(el("p", {id: "ask-summary"}, `${fmt.num(reply.rows.length)} rows as of epoch ${reply.epoch} in ${fmt.secs((performance.now() - started) / 1000)}`),
        this.table.node);
    } catch (error) {
      const span = offending(asked.text, error.message);
      const shown = span ? [asked.text.slice(0, span[0]), el("mark", {id: "ask-mark"}, asked.text.slice(span[0], span[1])), asked.text.slice(span[1])] : [asked.text];
      this.result.replaceChildren(el("p", {class: "error", id: "ask-error"}, `${error.category}: ${error.message}`), el("pre", {}, shown));
    }
  }

  leave() {}
}

// ------------------------------------------------------------------ routing and polling
const PAGES = {epochs: EpochsPage, queries: QueriesPage, state: StatePage, clients: ClientsPage, ask: AskPage};
let current = null;
let routing = Promise.resolve();
let polled = 0;
let polling = false;

function route() {
  routing = routing.then(async () => {
    if (current) await current.leave();
    const [, page, ...rest] = (location.hash || "").split("/");
    const main = document.getElementById("main");
    main.replaceChildren();
    const fallback = isTenant() ? "queries" : "epochs";
    if (page === "query" && rest.length) current = new QueryPage(decodeURIComponent(rest.join("/")));
    else current = new PAGES[PAGES[page] && !(isTenant() && page !== "queries") ? page : fallback]();
    for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.page === page);
    current.enter(main);
    polled = 0;
    poll();
  });
}

function poll() {
  const page = current;
  if (!page || !page.interval || polling || document.hidden || Date.now() - polled < page.interval) return;
  polling = true;
  polled = Date.now();
  page.refresh().catch((error) => {
    if (page === current && error.category !== "closed") console.warn("console:", error.message);
  }).finally(() => { polling = false; });
}

async function start() {
  try {
    conn.who = await connect();
  } catch (error) {
    document.getElementById("status").textContent = `refused: ${error.message}`;
    return;
  }
  showEpoch(conn.who.epoch);
  for (const link of document.querySelectorAll("#nav a[data-admin]")) link.hidden = isTenant();
  route();
}

window.addEventListener("hashchange", route);
setInterval(poll, 200);
start();
