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
  async function detail(i) {
    if (!details[i]) details[i] = await (inflating[i] = inflating[i] || inflate(`tgc-kernel-${i}`));
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
  const nodeEls = [];
  // dagre's layout, in a Web Worker where the browser allows one (the page stays usable while a large graph is laid
  // out), else here; returns {graph: {width, height}, nodes: [{x, y, width, height}], edges: [{v, w, points}]}
  function layoutGraph(sizes, edges) {
      const g = new dagre.graphlib.Graph();
      g.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 26, marginx: 8, marginy: 8 });
      g.setDefaultEdgeLabel(() => ({}));
      sizes.forEach((s, i) => g.setNode(String(i), s));
      for (const [a, b] of edges) g.setEdge(String(a), String(b));
      dagre.layout(g);
      return { graph: { width: g.graph().width, height: g.graph().height }, nodes: sizes.map((s, i) => g.node(String(i))),
               edges: g.edges().map((e) => ({ v: Number(e.v), w: Number(e.w), points: g.edge(e).points })) };
  }
  function layout(sizes, edges) {
    const here = () => layoutGraph(sizes, edges);
    let worker;
    try {
      const src = $("dagre-src").textContent + "\n" + layoutGraph.toString() + "\nonmessage = (e) => postMessage(layoutGraph(e.data.sizes, e.data.edges));";
      worker = new Worker(URL.createObjectURL(new Blob([src], { type: "text/javascript" })));
    } catch (e) {
      return Promise.resolve(here());
    }
    return new Promise((resolve) => {
      worker.onmessage = (e) => { worker.terminate(); document.body.dataset.layout = "worker"; resolve(e.data); };
      worker.onerror = (e) => {  // (e.g. dagre's recursion past a worker's smaller stack): lay it out here
        e.preventDefault(); worker.terminate(); document.body.dataset.layoutError = String(e.message); resolve(here());
      };
      worker.postMessage({ sizes, edges });
    });
  }

  async function graph() {
    const G = D.graph || { nodes: [], edges: [] };
    const box = $("graph");
    if (!G.nodes.length) { box.appendChild(el("p", { class: "muted" }, "no tensor graph")); return; }
    if (G.view === "kernels") {
      $("graph-title").textContent = `Kernel graph (the tensor graph's ${G.tensor_nodes} nodes, one box per kernel)`;
    }
    const sizes = G.nodes.map((n) => {
      n.text = (n.output ? n.output + " = " : "") + n.label;
      n.sub = n.shape.length ? `[${n.shape.join(",")}]` : "";
      return { width: Math.max(n.text.length, n.sub.length) * 6.4 + 14, height: 30 };
    });
    const wait = el("p", { class: "muted", id: "graph-wait" }, `laying out ${G.nodes.length} nodes ...`);
    box.appendChild(wait);
    const g = await layout(sizes, G.edges);
    wait.remove();
    const gi = g.graph;
    const svg = el("svg:svg", { width: gi.width, height: gi.height, viewBox: `0 0 ${gi.width} ${gi.height}` });
    for (const e of g.edges) {
      const pts = e.points.map((p) => `${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
      svg.appendChild(el("svg:polyline", { class: "edge", points: pts, "marker-end": "url(#arrow)" }));
    }
    const defs = el("svg:defs");
    const m = el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" });
    m.appendChild(el("svg:path", { d: "M0,0 L10,5 L0,10 z", fill: "#90a4ae" }));
    defs.appendChild(m); svg.appendChild(defs);
    G.nodes.forEach((n, i) => {
      const p = g.nodes[i];
      const cls = "node" + (n.input ? " input" : "") + (n.output ? " output" : "");
      const grp = el("svg:g", { class: cls, transform: `translate(${p.x - p.width / 2},${p.y - p.height / 2})`, "data-node": n.id });
      const k = n.kernels.length ? n.kernels[0] : -1;
      grp.appendChild(el("svg:rect", { width: p.width, height: p.height, rx: 4, fill: n.input ? "#eceff1" : color(k) }));
      grp.appendChild(el("svg:text", { x: 7, y: 13 }, n.text));
      grp.appendChild(el("svg:text", { x: 7, y: 25, fill: "#555" }, n.sub));
      const where = n.line ? `${D.file}:${n.line}` : n.input ? "input" : "";
      const title = `${n.op} ${n.dtype} ${n.sub}\n${where}` +
        (n.kernels.length ? `\nkernel${n.kernels.length > 1 ? "s" : ""}: ${n.kernels.map((i) => K[i] ? K[i].name : i).join(", ")}` : "");
      grp.appendChild(el("svg:title", {}, title));
      grp.addEventListener("click", () => {
        if (n.kernels.length) selectKernel(n.kernels[0]);
        if (n.line) selectLine(n.line, false);
        markNodes((m) => m === n);
      });
      nodeEls.push([n, grp]);
      svg.appendChild(grp);
    });
    box.appendChild(svg);
    if (selKernel >= 0) {
      const first = markNodes((m) => m.kernels.includes(selKernel));
      if (first) reveal($("graph-box"), first);
    }
    document.body.dataset.graph = "1";
  }
  function markNodes(pred) {
    let first = null;
    for (const [n, g] of nodeEls) {
      const on = pred(n);
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
      row.addEventListener("click", () => selectLine(i + 1, true));
      box.appendChild(row);
    });
  }
  function selectLine(line, fromSource) {
    for (const r of document.querySelectorAll("#source div.sel")) r.classList.remove("sel");
    const row = $(`line-${line}`);
    if (row) { row.classList.add("sel"); reveal($("source"), row); }
    if (fromSource) {
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
