// The `tgc viz` page: draws the data tgc/viz/collect.py gathered (the JSON in #tgc-data). Graph layout by the
// vendored dagre (tgc/viz/vendor/dagre.min.js); everything else is plain DOM and SVG. No network access.
"use strict";
// The data is gzip-compressed JSON in base64 (tgc/viz/page.py: a summary, and each kernel's passes and source in
// a blob of its own, inflated when the kernel is chosen), inflated by the browser's own DecompressionStream.
async function inflate(id) {
  const bin = atob(document.getElementById(id).textContent.trim());
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

(async function () {
  const D = await inflate("tgc-data");
  const details = [], inflating = [];  // kernel index -> {passes, src} once inflated; -> its promise meanwhile
  const raw = [];  // kernel index -> the promise of its inflated blob ({texts, passes, src} with [kernel, index] refs)
  const blob = (i) => raw[i] || (raw[i] = inflate(`tgc-kernel-${i}`));
  async function text(ref) { return (await blob(ref[0])).texts[ref[1]]; }
  async function resolve(i) {  // a kernel's passes and source, each listing found where the page keeps it
    const d = await blob(i);
    const passes = [];
    for (const p of d.passes || []) {
      const changed = [];
      for (let j = 0; j < p.changed.length; j += 2) for (let l = p.changed[j]; l < p.changed[j + 1]; l++) changed.push(l);
      passes.push({ name: p.name, text: await text(p.text), changed, removed: p.removed });
    }
    return { passes, src: d.src ? await text(d.src) : "" };
  }
  async function detail(i) {
    if (!details[i]) details[i] = await (inflating[i] = inflating[i] || resolve(i));
    return details[i];
  }
  const LIMIT = 3000;  // lines of a listing drawn before "show all" (a fused attention kernel has 40 000)
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const K = D.kernels || [];
  let selKernel = -1;

  function el(tag, attrs, text) {
    const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // scroll `container` (only it, never the window) so that `target` is in view
  function reveal(container, target) {
    const c = container.getBoundingClientRect(), t = target.getBoundingClientRect();
    if (t.top < c.top || t.bottom > c.bottom) container.scrollTop += t.top - c.top - c.height / 3;
    if (t.left < c.left || t.right > c.right) container.scrollLeft += t.left - c.left - c.width / 3;
  }
  function color(i) { return i < 0 ? "#ffffff" : `hsl(${(i * 137.5) % 360}, 70%, 80%)`; }
  function num(v, unit) {
    if (v === null || v === undefined) return "–";
    const a = Math.abs(v);
    const [s, p] = a >= 1e12 ? [1e12, "T"] : a >= 1e9 ? [1e9, "G"] : a >= 1e6 ? [1e6, "M"] : a >= 1e3 ? [1e3, "k"] : [1, ""];
    return (v / s).toFixed(v / s >= 100 || s === 1 ? 0 : 1) + " " + p + (unit || "");
  }
  function secs(s) {
    if (s === null || s === undefined) return "–";
    return s >= 1 ? s.toFixed(2) + " s" : s >= 1e-3 ? (s * 1e3).toFixed(2) + " ms" : (s * 1e6).toFixed(1) + " µs";
  }
  function fixed(v, d) { return v === null || v === undefined ? "–" : v.toFixed(d); }

  // ---- header
  function header() {
    $("title").textContent = `tgc viz: ${D.file}`;
    const dims = Object.entries(D.dims || {}).map(([k, v]) => `${k}=${v}`).join(" ");
    const P = D.program || {}, pk = D.peak || {};
    const facts = [`device ${D.device}`, dims ? `dims ${dims}` : "", `${K.length} kernels`,
      `program ${secs(P.time_s)}`, `${num(P.flops, "FLOP")}`, `${num(P.bytes, "B")}`,
      P.recompute !== undefined ? `recompute ×${fixed(P.recompute, 3)}` : "",
      `peak ${num(pk.gflops ? pk.gflops * 1e9 : null, "FLOP/s")}, ${num(pk.gbps ? pk.gbps * 1e9 : null, "B/s")} (${pk.source || "?"})`];
    const f = $("facts");
    for (const t of facts) if (t) f.appendChild(el("span", {}, t));
    for (const n of D.notes || []) $("notes").appendChild(el("div", { class: "note" }, n));
  }

  // ---- tensor graph
  // A graph past collect.MAX_DRAWN nodes (`collapse`) opens folded: each kernel one box (its `cluster` nodes), a
  // click opens it into its nodes (a dagre compound node around them; a click on its title folds it again). At most
  // DRAW_LIMIT nodes are drawn at once (the kernels opened longest ago fold first), so every layout stays small.
  const G = D.graph || { nodes: [], edges: [] };
  const folding = !!G.collapse && G.nodes.some((n) => n.cluster >= 0);
  const DRAW_LIMIT = 300;
  const members = new Map();  // cluster (kernel index) -> its nodes
  for (const n of G.nodes) if (n.cluster >= 0) { if (!members.has(n.cluster)) members.set(n.cluster, []); members.get(n.cluster).push(n); }
  let opened = [];  // the unfolded clusters, the most recent last
  let nodeEls = [], boxEls = [], markPred = null, drawGen = 0;
  // dagre's layout, in a Web Worker where the browser allows one (the page stays usable while a large graph is laid
  // out), else here; `groups` (lists of item indices) become compound nodes around their items; returns
  // {graph: {width, height}, nodes: [{x, y, width, height}], edges: [{v, w, points}], groups: [{x, y, width, height}]}
  function layoutGraph(sizes, edges, groups) {
      const g = new dagre.graphlib.Graph({ compound: groups.length > 0 });
      g.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 26, marginx: 8, marginy: 8 });
      g.setDefaultEdgeLabel(() => ({}));
      sizes.forEach((s, i) => g.setNode(String(i), s));
      groups.forEach((items, j) => { g.setNode("g" + j, {}); for (const i of items) g.setParent(String(i), "g" + j); });
      for (const [a, b] of edges) g.setEdge(String(a), String(b));
      dagre.layout(g);
      const box = (o) => ({ x: o.x, y: o.y, width: o.width, height: o.height });
      return { graph: { width: g.graph().width, height: g.graph().height }, nodes: sizes.map((s, i) => box(g.node(String(i)))),
               edges: g.edges().map((e) => ({ v: Number(e.v), w: Number(e.w), points: g.edge(e).points })),
               groups: groups.map((_, j) => box(g.node("g" + j))) };
  }
  function layout(sizes, edges, groups) {
    const here = () => layoutGraph(sizes, edges, groups);
    let worker;
    try {
      const src = $("dagre-src").textContent + "\n" + layoutGraph.toString() + "\nonmessage = (e) => postMessage(layoutGraph(e.data.sizes, e.data.edges, e.data.groups));";
      worker = new Worker(URL.createObjectURL(new Blob([src], { type: "text/javascript" })));
    } catch (e) {
      return Promise.resolve(here());
    }
    return new Promise((resolve) => {
      worker.onmessage = (e) => { worker.terminate(); document.body.dataset.layout = "worker"; resolve(e.data); };
      worker.onerror = (e) => {  // (e.g. dagre's recursion past a worker's smaller stack): lay it out here
        e.preventDefault(); worker.terminate(); document.body.dataset.layoutError = String(e.message); resolve(here());
      };
      worker.postMessage({ sizes, edges, groups });
    });
  }

  for (const n of G.nodes) {
    n.text = (n.output ? n.output + " = " : "") + n.label;
    n.sub = n.shape.length ? `[${n.shape.join(",")}]` : "";
  }
  const textSize = (a, b) => ({ width: Math.max(a.length, b.length) * 6.4 + 14, height: 30 });

  // what is drawn now: items (a node, or a folded kernel's box), the edges between them, the opened kernels' groups
  function drawnGraph() {
    const items = [], at = new Map(), boxAt = new Map(), open = new Set(folding ? opened : []);
    const item = (n) => {
      if (!folding || n.cluster < 0 || open.has(n.cluster)) {
        if (!at.has(n.id)) { at.set(n.id, items.length); items.push({ node: n }); }
        return at.get(n.id);
      }
      if (!boxAt.has(n.cluster)) { boxAt.set(n.cluster, items.length); items.push({ box: n.cluster }); }
      return boxAt.get(n.cluster);
    };
    for (const n of G.nodes) item(n);
    const edges = new Set();
    for (const [a, b] of G.edges) {
      const x = item(G.nodes[a]), y = item(G.nodes[b]);
      if (x !== y) edges.add(x + "," + y);
    }
    const groups = [...open].map((k) => members.get(k).map((n) => at.get(n.id)));
    return { items, edges: [...edges].map((e) => e.split(",").map(Number)), groups, groupKernels: [...open] };
  }

  function boxText(k) {
    const ms = members.get(k), lines = ms.map((n) => n.line).filter((l) => l);
    const span = lines.length ? ` · line${Math.min(...lines) === Math.max(...lines) ? " " + lines[0] : `s ${Math.min(...lines)}-${Math.max(...lines)}`}` : "";
    return [`▸ ${K[k] ? K[k].name : "kernel " + k}`, `${ms.filter((n) => !n.input).length} nodes${span}`];
  }

  function nodeTitle(n) {
    const where = n.line ? `${D.file}:${n.line}` : n.input ? "input" : "";
    return `${n.op} ${n.dtype} ${n.sub}\n${where}` + (n.onnx ? `\nONNX node: ${n.onnx}` : "") +
      (n.kernels.length ? `\nkernel${n.kernels.length > 1 ? "s" : ""}: ${n.kernels.map((i) => K[i] ? K[i].name : i).join(", ")}` : "");
  }

  async function graph() {
    const box = $("graph");
    if (!G.nodes.length) { box.appendChild(el("p", { class: "muted" }, "no tensor graph")); return; }
    if (folding) {
      $("graph-title").textContent = `Tensor graph (${G.tensor_nodes} nodes in ${members.size} kernels: a click on a kernel opens it)`;
    }
    await draw();
  }

  // lay out and draw what is open now (a later call supersedes one still laying out)
  async function draw() {
    const gen = ++drawGen;
    const box = $("graph");
    const dg = drawnGraph();
    const sizes = dg.items.map((it) => it.node ? textSize(it.node.text, it.node.sub) : textSize(...boxText(it.box)));
    const wait = el("p", { class: "muted", id: "graph-wait" }, `laying out ${dg.items.length} nodes ...`);
    box.prepend(wait);
    const g = await layout(sizes, dg.edges, dg.groups);
    wait.remove();
    if (gen !== drawGen) return;
    for (const old of box.querySelectorAll("svg")) old.remove();
    const gi = g.graph;
    const svg = el("svg:svg", { width: gi.width, height: gi.height + 12, viewBox: `0 -12 ${gi.width} ${gi.height + 12}` });
    const defs = el("svg:defs");
    const m = el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" });
    m.appendChild(el("svg:path", { d: "M0,0 L10,5 L0,10 z", fill: "#90a4ae" }));
    defs.appendChild(m); svg.appendChild(defs);
    nodeEls = []; boxEls = [];
    dg.groupKernels.forEach((k, j) => {  // an opened kernel: a frame around its nodes, its title folds it
      const p = g.groups[j];
      const grp = el("svg:g", { class: "cluster", "data-cluster": k, transform: `translate(${p.x - p.width / 2},${p.y - p.height / 2})` });
      grp.appendChild(el("svg:rect", { width: p.width, height: p.height, rx: 6, fill: color(k), "fill-opacity": 0.18, stroke: "#78909c" }));
      const title = el("svg:text", { x: 4, y: -3, class: "fold" }, `▾ ${K[k] ? K[k].name : k} (click to fold)`);
      title.addEventListener("click", () => { opened = opened.filter((c) => c !== k); draw(); });
      grp.appendChild(title);
      svg.appendChild(grp);
    });
    for (const e of g.edges) {
      const pts = e.points.map((p) => `${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
      svg.appendChild(el("svg:polyline", { class: "edge", points: pts, "marker-end": "url(#arrow)" }));
    }
    dg.items.forEach((it, i) => {
      const p = g.nodes[i];
      const at = `translate(${p.x - p.width / 2},${p.y - p.height / 2})`;
      if (it.box !== undefined) {  // a folded kernel
        const k = it.box, [t1, t2] = boxText(k);
        const grp = el("svg:g", { class: "node kbox", transform: at, "data-kbox": k });
        grp.appendChild(el("svg:rect", { width: p.width, height: p.height, rx: 4, fill: color(k) }));
        grp.appendChild(el("svg:text", { x: 7, y: 13 }, t1));
        grp.appendChild(el("svg:text", { x: 7, y: 25, fill: "#555" }, t2));
        grp.appendChild(el("svg:title", {}, `kernel ${K[k] ? K[k].name : k}: click to open its nodes`));
        grp.addEventListener("click", () => selectKernel(k));
        boxEls.push([k, grp]);
        svg.appendChild(grp);
        return;
      }
      const n = it.node;
      const cls = "node" + (n.input ? " input" : "") + (n.output ? " output" : "");
      const grp = el("svg:g", { class: cls, transform: at, "data-node": n.id });
      const k = n.kernels.length ? n.kernels[0] : -1;
      grp.appendChild(el("svg:rect", { width: p.width, height: p.height, rx: 4, fill: n.input ? "#eceff1" : color(k) }));
      grp.appendChild(el("svg:text", { x: 7, y: 13 }, n.text));
      grp.appendChild(el("svg:text", { x: 7, y: 25, fill: "#555" }, n.sub));
      grp.appendChild(el("svg:title", {}, nodeTitle(n)));
      grp.addEventListener("click", () => {
        if (n.kernels.length) selectKernel(n.kernels[0]);
        if (n.line) selectLine(n.line, false);
        markNodes((m) => m === n);
      });
      nodeEls.push([n, grp]);
      svg.appendChild(grp);
    });
    box.appendChild(svg);
    if (markPred) {
      const first = markNodes(markPred);
      if (first) reveal($("graph-box"), first);
    }
    if (!document.body.dataset.graphMs) document.body.dataset.graphMs = performance.now().toFixed(0);
    document.body.dataset.graph = "1";
    document.body.dataset.draws = String(Number(document.body.dataset.draws || 0) + 1);
  }
  // open kernels' boxes (folded graphs only), folding the ones opened longest ago past DRAW_LIMIT nodes
  function openClusters(ks) {
    if (!folding) return false;
    ks = ks.filter((k) => members.has(k));
    if (ks.every((k) => opened.includes(k))) return false;
    opened = opened.filter((k) => !ks.includes(k)).concat(ks);
    const count = () => opened.reduce((a, k) => a + members.get(k).length, 0) + members.size;
    while (opened.length > ks.length && count() > DRAW_LIMIT) opened.shift();
    draw();
    return true;
  }
  function markNodes(pred) {
    markPred = pred;
    let first = null;
    for (const [n, g] of nodeEls) {
      const on = pred(n);
      g.classList.toggle("sel", on);
      if (on && !first) first = g;
    }
    for (const [k, g] of boxEls) {
      const on = members.get(k).some(pred);
      g.classList.toggle("sel", on);
      if (on && !first) first = g;
    }
    return first;
  }

  // ---- the .tg source
  function source() {
    const box = $("source");
    if (!D.source) { box.appendChild(el("p", { class: "muted" }, "no source text")); return; }
    D.source.forEach((text, i) => {
      const row = el("div", { id: `line-${i + 1}`, "data-line": i + 1 });
      row.appendChild(el("span", { class: "ln" }, String(i + 1)));
      row.appendChild(document.createTextNode(text));
      const from = (D.onnx_nodes || {})[String(i + 1)];  // a model from ONNX: the node this line translates
      if (from) row.appendChild(el("span", { class: "onnx" }, `  ← ONNX ${from}`));
      row.addEventListener("click", () => selectLine(i + 1, true));
      box.appendChild(row);
    });
  }
  function selectLine(line, fromSource) {
    for (const r of document.querySelectorAll("#source div.sel")) r.classList.remove("sel");
    const row = $(`line-${line}`);
    if (row) { row.classList.add("sel"); reveal($("source"), row); }
    if (fromSource) {
      openClusters([...new Set(G.nodes.filter((n) => n.line === line && n.cluster >= 0).map((n) => n.cluster))].slice(-3));
      const g = markNodes((n) => n.line === line);
      if (g) reveal($("graph-box"), g);
      const k = K.findIndex((k) => k.line === line);
      if (k >= 0) selectKernel(k);
    }
  }

  // ---- kernel list
  function kernels() {
    const cols = ["#", "kernel", "device", "opts", "launch", "FLOPs", "bytes", "time", "GFLOP/s", "GB/s", "share", "recompute", "line"];
    const t = $("kernel-table");
    const hr = el("tr");
    cols.forEach((c, i) => hr.appendChild(el("th", { class: i === 1 || i === 3 ? "name" : "" }, c)));
    t.appendChild(hr);
    K.forEach((k, i) => {
      const tr = el("tr", { class: "kernel", "data-k": i });
      const name = el("td", { class: "name" });
      name.appendChild(el("span", { class: "swatch", style: `background:${color(i)}` }));
      name.appendChild(document.createTextNode(k.name));
      const launch = `${k.global_size.join("×")}` + (k.local_size ? ` / ${k.local_size.join("×")}` : "");
      const opts = el("td", { class: "name opts", title: k.opts.join(" ") }, `${k.opts_from}${k.opts.length ? ": " + k.opts.join(" ") : ""}`);
      const cells = [el("td", {}, String(i)), name, el("td", {}, k.device), opts, el("td", {}, launch),
        el("td", {}, num(k.flops)), el("td", {}, num(k.bytes, "B")), el("td", {}, secs(k.time_s)),
        el("td", {}, fixed(k.gflops, 1)), el("td", {}, fixed(k.gbps, 1)),
        el("td", {}, k.share === null || k.share === undefined ? "–" : (100 * k.share).toFixed(1) + "%"),
        el("td", {}, k.recompute === null || k.recompute === undefined ? "–" : "×" + k.recompute.toFixed(2)),
        el("td", {}, k.line ? String(k.line) : "")];
      for (const c of cells) tr.appendChild(c);
      tr.addEventListener("click", () => selectKernel(i));
      t.appendChild(tr);
    });
  }

  async function selectKernel(i) {
    if (i < 0 || i >= K.length) return;
    selKernel = i;
    for (const r of document.querySelectorAll("tr.kernel")) r.classList.toggle("sel", Number(r.dataset.k) === i);
    for (const c of document.querySelectorAll("#roofline circle")) c.classList.toggle("sel", Number(c.dataset.k) === i);
    const k = K[i];
    $("kernel-title").textContent = `${k.name} on ${k.device}` + (k.line ? ` (${D.file}:${k.line})` : "");
    // its own box, else (a kernel that only recomputes nodes drawn in other kernels' boxes) those boxes
    openClusters(members.has(i) ? [i] : [...new Set(G.nodes.filter((n) => n.kernels.includes(i) && n.cluster >= 0)
      .map((n) => n.cluster))].slice(-3));
    const g = markNodes((m) => m.kernels.includes(i));
    if (g) reveal($("graph-box"), g);
    if (k.line) selectLine(k.line, false);
    const det = await detail(i);
    if (selKernel !== i) return;  // (another kernel was chosen meanwhile)
    const slider = $("pass-slider");
    const n = det.passes.length;
    slider.max = Math.max(n - 1, 0);
    slider.disabled = n === 0;
    slider.value = n ? n - 1 : 0;
    showPass();
    listing($("kernel-src"), det.src, new Set());
    document.body.dataset.shown = String(i);
  }

  // a listing in `pre`: runs of lines in block spans, the runs in `changed` (line indices) highlighted; past
  // LIMIT lines, a button draws the rest
  function listing(pre, text, changed, all) {
    pre.textContent = "";
    const lines = text.split("\n");
    const n = all ? lines.length : Math.min(lines.length, LIMIT);
    const frag = document.createDocumentFragment();
    let start = 0;
    for (let j = 1; j <= n; j++) {
      if (j === n || changed.has(j) !== changed.has(start)) {
        frag.appendChild(el("span", changed.has(start) ? { class: "chg" } : {}, lines.slice(start, j).join("\n")));
        start = j;
      }
    }
    if (n < lines.length) {
      const more = el("button", { class: "more" }, `show all ${lines.length} lines (${lines.length - n} more)`);
      more.addEventListener("click", () => listing(pre, text, changed, true));
      frag.appendChild(more);
    }
    pre.appendChild(frag);
  }

  function showPass() {
    const det = details[selKernel];
    const pre = $("pass-text");
    if (!det) { pre.textContent = ""; return; }
    if (!det.passes.length) { pre.textContent = ""; $("pass-name").textContent = "no passes recorded"; return; }
    const s = Number($("pass-slider").value);
    const p = det.passes[s];
    $("pass-name").textContent = `${s + 1}/${det.passes.length}: after ${p.name}`;
    $("pass-diff").textContent = s === 0 ? "as scheduled" :
      `${p.changed.length} line${p.changed.length === 1 ? "" : "s"} new, ${p.removed} gone`;
    listing(pre, p.text, new Set(p.changed));
  }

  // ---- roofline (log-log: FLOP/byte against GFLOP/s, under the measured peaks)
  function roofline() {
    const box = $("roofline");
    const pk = D.peak || {};
    const pts = K.map((k, i) => ({ i, x: k.bytes ? k.flops / k.bytes : null, y: k.gflops })).filter((p) => p.x > 0 && p.y > 0);
    const W = 520, H = 300, L = 50, B = 34, R = 10, T = 10;
    const xs = pts.map((p) => p.x).concat([1 / 16, 64]);
    const ys = pts.map((p) => p.y).concat(pk.gflops ? [pk.gflops * 2] : [1]);
    const x0 = Math.log10(Math.min(...xs)) - 0.2, x1 = Math.log10(Math.max(...xs)) + 0.2;
    const y0 = Math.log10(Math.min(...ys, 0.1)) - 0.2, y1 = Math.log10(Math.max(...ys)) + 0.2;
    const sx = (v) => L + (Math.log10(v) - x0) / (x1 - x0) * (W - L - R);
    const sy = (v) => H - B - (Math.log10(v) - y0) / (y1 - y0) * (H - B - T);
    const svg = el("svg:svg", { width: W, height: H });
    svg.appendChild(el("svg:rect", { x: L, y: T, width: W - L - R, height: H - B - T, fill: "#fff", stroke: "#ccc" }));
    for (let e = Math.ceil(x0); e <= Math.floor(x1); e++) {
      svg.appendChild(el("svg:line", { x1: sx(10 ** e), x2: sx(10 ** e), y1: T, y2: H - B, stroke: "#eee" }));
      svg.appendChild(el("svg:text", { x: sx(10 ** e) - 8, y: H - B + 13 }, `1e${e}`));
    }
    for (let e = Math.ceil(y0); e <= Math.floor(y1); e++) {
      svg.appendChild(el("svg:line", { x1: L, x2: W - R, y1: sy(10 ** e), y2: sy(10 ** e), stroke: "#eee" }));
      svg.appendChild(el("svg:text", { x: 4, y: sy(10 ** e) + 3 }, `1e${e}`));
    }
    svg.appendChild(el("svg:text", { x: L + 120, y: H - 4 }, "arithmetic intensity (FLOP/byte)"));
    svg.appendChild(el("svg:text", { x: L + 4, y: T + 12 }, "GFLOP/s"));
    if (pk.gflops && pk.gbps) {
      const ridge = pk.gflops / pk.gbps;
      const a = 10 ** x0, b = 10 ** x1;
      const pts2 = [[a, Math.max(pk.gbps * a, 10 ** y0)], [Math.min(Math.max(ridge, a), b), Math.min(pk.gbps * ridge, pk.gflops)], [b, pk.gflops]];
      svg.appendChild(el("svg:polyline", { id: "roof", points: pts2.map(([x, y]) => `${sx(x)},${sy(y)}`).join(" "), fill: "none", stroke: "#c62828", "stroke-width": 2 }));
      svg.appendChild(el("svg:text", { x: W - R - 170, y: sy(pk.gflops) - 4, fill: "#c62828" }, `FMA peak ${pk.gflops.toFixed(0)} GFLOP/s`));
      svg.appendChild(el("svg:text", { x: L + 6, y: sy(Math.max(pk.gbps * a, 10 ** y0)) - 6, fill: "#c62828" }, `memory ${pk.gbps.toFixed(0)} GB/s`));
    } else {
      svg.appendChild(el("svg:text", { x: L + 8, y: T + 28, fill: "#888" }, "the device's peaks are unknown"));
    }
    for (const p of pts) {
      const c = el("svg:circle", { cx: sx(p.x), cy: sy(p.y), r: 5, fill: color(p.i), "data-k": p.i });
      c.appendChild(el("svg:title", {}, `${K[p.i].name}: ${p.x.toFixed(2)} FLOP/B, ${p.y.toFixed(1)} GFLOP/s`));
      c.addEventListener("click", () => selectKernel(p.i));
      svg.appendChild(c);
    }
    if (!pts.length) svg.appendChild(el("svg:text", { x: L + 8, y: T + 44, fill: "#888" }, "no measured kernels"));
    box.appendChild(svg);
  }

  // ---- device lists
  function multi() {
    const M = D.multi;
    if (!M) { $("multi-sec").style.display = "none"; return; }
    const t = $("multi-table");
    const hr = el("tr");
    for (const c of ["device", "launches", "kernel time", "GFLOP/s", "sent", "received"]) hr.appendChild(el("th", {}, c));
    t.appendChild(hr);
    M.devices.forEach((d, i) => {
      const row = (M.per_device || []).find((r) => r.device === d) || {};
      const tr = el("tr");
      for (const v of [d, String(M.launches[d] || 0), secs(row.median_s), fixed(row.gflops, 1),
        num(M.sent_bytes ? M.sent_bytes[i] : null, "B"), num(M.received_bytes ? M.received_bytes[i] : null, "B")]) tr.appendChild(el("td", {}, v));
      t.appendChild(tr);
    });
    $("multi-steps").textContent = `collective steps: ${M.steps.join(", ") || "none"}; collectives ${secs(M.collective_s)}; ` +
      `shard ${JSON.stringify(M.shard)}`;
  }

  header();
  source();
  kernels();
  if (folding && K.length) {  // a folded graph opens on the slowest kernel, drawn open
    let big = 0;
    K.forEach((k, i) => { if ((k.time_s || 0) > (K[big].time_s || 0)) big = i; });
    opened = members.has(big) ? [big] : [];
  }
  graph().catch((e) => console.error("tgc viz: graph: " + e));
  roofline();
  multi();
  $("pass-slider").addEventListener("input", showPass);
  $("pass-prev").addEventListener("click", () => { const s = $("pass-slider"); s.value = Math.max(0, Number(s.value) - 1); showPass(); });
  $("pass-next").addEventListener("click", () => { const s = $("pass-slider"); s.value = Math.min(Number(s.max), Number(s.value) + 1); showPass(); });
  if (K.length) {
    let big = 0;
    K.forEach((k, i) => { if ((k.time_s || 0) > (K[big].time_s || 0)) big = i; });
    await selectKernel(big);
  }
  document.body.dataset.readyMs = performance.now().toFixed(0);  // (since navigation started)
  document.body.dataset.ready = "1";
})().catch((e) => { console.error("tgc viz: " + e); document.body.dataset.ready = "error"; });
