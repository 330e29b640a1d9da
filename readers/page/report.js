"use strict";
// The page of one k15-memory report: everything below reads the data embedded above.
const D = JSON.parse(document.getElementById("k15-data").textContent);
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}
function bytes(n) {
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
const plural = (n, thing) => n.toLocaleString("en") + " " + thing + (n === 1 ? "" : thing.endsWith("s") ? "es" : "s");
const frameText = (f) => f[0] + (f[1] ? "  " + f[1] + ":" + f[2] : "");

function stackView(stack) {
  const div = el("div", { class: "stack" });
  if (stack === null || stack === undefined) { div.append(el("div", { class: "none" }, "(no call stack)")); return div; }
  D.stacks[stack].forEach((id, i) => {
    const f = D.frames[id];
    div.append(el("div", {}, "#" + i + " " + f[0] + " ", el("span", { class: "file" }, f[1] ? f[1] + ":" + f[2] : "")));
  });
  return div;
}
// The words the search box matches a stack against.
const stackWords = (stack) => stack === null || stack === undefined ? "" :
  D.stacks[stack].map((id) => frameText(D.frames[id])).join("\n").toLowerCase();

function summary() {
  const s = D.summary;
  $("program").textContent = (D.program || "merged report") + (D.pid ? " (pid " + D.pid + ")" : "") + "  " + D.format;
  const figures = [
    ["Leaked", bytes(s.leaked_bytes || 0) + " in " + plural(s.leaked_blocks || 0, "block")],
    ["Direct", plural(s.direct_blocks || 0, "block") + ", " + bytes(s.direct_bytes || 0)],
    ["Indirect", plural(s.indirect_blocks || 0, "block") + ", " + bytes(s.indirect_bytes || 0)],
    ["Reachable", plural(s.reachable_blocks || 0, "block") + ", " + bytes(s.reachable_bytes || 0)],
    ["Memory errors", String(D.errors.length)],
    ["Allocations", (s.total_allocations || 0).toLocaleString("en")],
    ["Peak", bytes(s.peak_bytes || 0)],
  ];
  if (s.frames_marked) figures.push(["Frames", s.frames_marked.toLocaleString("en")]);
  const div = el("div", { class: "figures" });
  for (const [name, value] of figures) div.append(el("div", { class: "figure", "data-figure": name }, name, el("b", {}, value)));
  $("summary").append(el("h2", {}, "Summary"), div);
  if (D.processes.length) $("summary").append(el("p", {}, "Merged from " + plural(D.processes.length, "process") + ": " + D.processes.join(", ")));
}

function siteRow(site, nested) {
  const head = site.kind[0].toUpperCase() + site.kind.slice(1) + " leak of ";
  const label = el("summary", {}, head, el("span", { class: "size" }, bytes(site.bytes)), " in " + plural(site.blocks, "block") +
    " (" + (site.with || "new") + ")" + (site.tag ? " [" + site.tag + "]" : "") + (site.at ? " at " + site.at : "") +
    " " + (site.stack !== null && D.stacks[site.stack].length ? D.frames[D.stacks[site.stack][0]][0] : ""));
  const details = el("details", {}, label);
  // A site's stack is drawn when it is opened: a thousand sites' frames would slow the page.
  const stack = el("div", {});
  details.append(stack);
  details.addEventListener("toggle", () => { if (details.open && !stack.firstChild) stack.append(stackView(site.stack)); });
  if (site.processes.length) details.append(el("div", { class: "stack" }, "in " + site.processes.join(", ")));
  const row = el("div", { class: "site " + site.kind }, details);
  row.dataset.words = stackWords(site.stack) + "\n" + (site.at || "").toLowerCase() + "\n" + (site.tag || "").toLowerCase();
  if (site.holds.length) {
    const held = site.holds.reduce((a, h) => [a[0] + h[1], a[1] + h[2]], [0, 0]);
    details.append(el("div", { class: "stack" }, "holds " + plural(held[0], "indirect block") + " (" + bytes(held[1]) + "):"));
    for (const [row_index, blocks, size] of site.holds) {
      const child = siteRow(Object.assign({}, D.sites[row_index], { blocks: blocks, bytes: size, holds: [] }), true);
      details.append(child);
    }
  }
  if (nested) row.classList.add("indirect");
  return row;
}

function leaks() {
  const heldSomewhere = new Set(D.sites.flatMap((s) => s.holds.map((h) => h[0])));
  const listed = D.sites.filter((s, i) => s.kind === "direct" || (s.kind === "indirect" && !heldSomewhere.has(i)));
  if (!listed.length) $("leaks").append(el("p", { class: "none" }, "No leaks."));
  for (const site of listed) $("leaks").append(siteRow(site, false));
  // The largest leak opened: its stack is what a reader looks at first.
  const first = $("leaks").querySelector("details");
  if (first) first.open = true;
  const reachable = D.sites.filter((s) => s.kind === "reachable");
  if (!reachable.length) $("reachable-section").style.display = "none";
  for (const site of reachable) $("reachable").append(siteRow(site, false));
}

function errors() {
  if (!D.errors.length) { $("errors").append(el("p", { class: "none" }, "No memory errors.")); return; }
  for (const e of D.errors) {
    const what = e.kind.replace(/_/g, " ") + (e.tag ? ": " + e.tag : "") + (e.size ? " (" + plural(e.size, "byte") + ")" : "");
    const details = el("details", {}, el("summary", {}, what));
    for (const [what, stack] of e.stacks) details.append(el("div", {}, what + ":"), stackView(stack));
    const row = el("div", { class: "site" }, details);
    row.dataset.words = e.stacks.map((s) => stackWords(s[1])).join("\n") + "\n" + e.kind;
    $("errors").append(row);
  }
}

// profile=1: what was live at the peak and the sites with the most allocations, each row
// opening on its stack.
function profileRow(site, text) {
  const first = site.stack !== null && D.stacks[site.stack].length ? D.frames[D.stacks[site.stack][0]][0] : "";
  const label = el("summary", {}, text + (site.tag ? " [" + site.tag + "]" : "") + (site.at ? " at " + site.at : "") + " " + first);
  const details = el("details", {}, label);
  const stack = el("div", {});
  details.append(stack);
  details.addEventListener("toggle", () => { if (details.open && !stack.firstChild) stack.append(stackView(site.stack)); });
  const row = el("div", { class: "site" }, details);
  row.dataset.words = stackWords(site.stack) + "\n" + (site.at || "").toLowerCase() + "\n" + (site.tag || "").toLowerCase();
  return row;
}

function profile() {
  const p = D.profile;
  if (!p) { $("profile-section").style.display = "none"; return; }
  if (p.peak) {
    const when = p.peak.frame ? " in frame " + p.peak.frame.toLocaleString("en") : "";
    $("peak").append(el("h3", {}, "Live at the peak (" + bytes(p.peak.bytes) + when + ")"));
    for (const s of p.peak.sites) $("peak").append(profileRow(s, bytes(s.figures[0]) + " in " + plural(s.figures[1], "block")));
  }
  $("most-calls").append(el("h3", {}, "Most allocations (temporary: freed before the thread's next allocation)"));
  for (const s of p.sites) {
    const [allocations, temporary, size] = s.figures;
    $("most-calls").append(profileRow(s, plural(allocations, "allocation") + " (" + temporary.toLocaleString("en") + " temporary) of " + bytes(size)));
  }
}

function tags() {
  if (!D.tags.length) { $("tags-section").style.display = "none"; return; }
  const table = el("table", {}, el("tr", {}, ...["Tag", "Live", "Blocks", "Peak", "Allocations", "Allocated", "Budget", ""].map((h) => el("th", {}, h))));
  for (const t of D.tags) {
    const used = t.budget_bytes ? Math.min(1, t.peak_bytes / t.budget_bytes) : 0;
    const bar = el("span", { class: "bar" }, el("i", { class: t.peak_bytes > t.budget_bytes ? "over" : "", style: "width:" + (used * 100).toFixed(1) + "%" }));
    table.append(el("tr", {}, el("td", {}, t.name), el("td", {}, bytes(t.live_bytes)), el("td", {}, String(t.live_blocks)),
      el("td", {}, bytes(t.peak_bytes)), el("td", {}, t.total_allocations.toLocaleString("en")), el("td", {}, bytes(t.total_bytes)),
      el("td", {}, t.budget_bytes ? bytes(t.budget_bytes) : "none"), el("td", {}, t.budget_bytes ? bar : "")));
  }
  $("tags").append(table);
  timeline();
}

// The largest of `values` (`floor` if none is larger). A loop, not `Math.max(...values)`: a
// timeline of a few hundred thousand frames would overflow the call stack as arguments.
const largest = (values, floor) => values.reduce((a, v) => Math.max(a, v || 0), floor);

// The timeline as series of live bytes per tag, `{name: [bytes or null per sample]}` (the
// reader turns each shape a report may hold into this one).
function timeline() {
  const series = D.timeline;
  if (!series || !Object.keys(series).length) return;
  const W = 900, H = 220, names = Object.keys(series);
  const length = largest(names.map((n) => series[n].length), 0);
  const top = largest(names.map((n) => largest(series[n], 0)), 1);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 " + W + " " + (H + 20));
  svg.setAttribute("width", W);
  names.forEach((name, i) => {
    const hue = (i * 137) % 360;
    const points = series[name].map((v, x) => (x / Math.max(1, length - 1) * W).toFixed(1) + "," + (H - (v || 0) / top * H).toFixed(1)).join(" ");
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points);
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "hsl(" + hue + ",70%,45%)");
    const title = document.createElementNS(ns, "title");
    title.textContent = name;
    line.append(title);
    svg.append(line);
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", 4 + i * 150); label.setAttribute("y", H + 16);
    label.setAttribute("fill", "hsl(" + hue + ",70%,40%)");
    label.textContent = name;
    svg.append(label);
  });
  $("timeline").append(el("h3", {}, "Live bytes per tag, by frame (peak " + bytes(top) + ")"), svg);
}

// The icicle graph: callers on top, each frame as wide as its share of the chosen figure.
const METRICS = { leaked: "Leaked bytes", peak: "Live at peak", allocations: "Allocations", temporary: "Temporary allocations" };
let metric = "leaked", focus = null;
// Frames narrower than this share of the graph (about 2 pixels) are left out: thousands of
// invisible bars would slow the page; zooming in shows them.
const MIN_WIDTH = 0.2;

function tree(name) {
  const root = { name: "all", value: 0, children: new Map(), parent: null };
  for (const [stack, value] of D.metrics[name] || []) {
    if (!value) continue;
    root.value += value;
    let node = root;
    const ids = stack === null ? [] : D.stacks[stack].slice().reverse();
    for (const id of ids) {
      const key = D.frames[id][0];
      let child = node.children.get(key);
      if (!child) { child = { name: key, frame: D.frames[id], value: 0, children: new Map(), parent: node }; node.children.set(key, child); }
      child.value += value;
      node = child;
    }
  }
  return root;
}

function flame() {
  const box = $("flame");
  box.textContent = "";
  const root = tree(metric);
  if (!root.value) { box.style.height = "auto"; box.append(el("p", { class: "none" }, "Nothing to show for " + METRICS[metric] + ".")); return; }
  let top = root;
  if (focus) { for (const name of focus) { const next = top.children.get(name); if (!next) break; top = next; } }
  const unit = metric === "leaked" || metric === "peak" ? bytes : (n) => n.toLocaleString("en");
  const query = $("search").value.trim().toLowerCase();
  const path = [];
  for (let n = top; n; n = n.parent) path.unshift(n);
  let depth = 0, maxDepth = 0;
  const place = (node, left, width, d) => {
    if (width < MIN_WIDTH) return;
    maxDepth = Math.max(maxDepth, d);
    const text = node.name + " (" + unit(node.value) + ", " + (node.value / root.value * 100).toFixed(1) + "%)";
    const div = el("div", { class: "node", title: node.frame ? frameText(node.frame) + "\n" + text : text }, text);
    div.style.left = left + "%"; div.style.width = width + "%"; div.style.top = d * 19 + "px";
    div.style.setProperty("--h", String(10 + (hash(node.name) % 40)));
    if (query && node.frame && frameText(node.frame).toLowerCase().includes(query)) div.classList.add("match");
    div.onclick = () => { focus = pathOf(node); flame(); };
    box.append(div);
    let x = left;
    const children = [...node.children.values()].sort((a, b) => b.value - a.value);
    for (const c of children) { const w = width * c.value / node.value; place(c, x, w, d + 1); x += w; }
  };
  for (const n of path.slice(0, -1)) { place(Object.assign({}, n, { children: new Map() }), 0, 100, depth++); }
  place(top, 0, 100, depth);
  box.style.height = (maxDepth + 1) * 19 + "px";
  $("flame-path").textContent = focus && focus.length ? "Zoomed: " + focus.join(" > ") + " (click a bar above to zoom out)" : "Click a frame to zoom in.";
}
const pathOf = (node) => { const names = []; for (let n = node; n.parent; n = n.parent) names.unshift(n.name); return names; };
function hash(s) { let h = 0; for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0; return Math.abs(h); }

function metricButtons() {
  for (const [name, label] of Object.entries(METRICS)) {
    if (!D.metrics[name]) continue;
    const b = el("button", { "data-metric": name }, label);
    b.onclick = () => { metric = name; focus = null; update(); };
    $("metrics").append(b);
  }
}

function update() {
  for (const b of $("metrics").children) b.classList.toggle("on", b.dataset.metric === metric);
  flame();
  const query = $("search").value.trim().toLowerCase();
  for (const row of document.querySelectorAll(".site")) row.classList.toggle("hidden", !!query && !row.dataset.words.includes(query));
}

// Each panel on its own: one that fails (data no check foresaw, a browser lacking something)
// leaves the others drawn and the page usable, and says why on the console.
for (const panel of [summary, leaks, errors, profile, tags, metricButtons, update]) {
  try { panel(); } catch (e) { console.error("k15-memory: the " + panel.name + " panel failed:", e); }
}
$("search").oninput = update;
// What the tests read: the page is drawn, and how long it took from navigation start.
document.body.dataset.renderedMs = String(Math.round(performance.now()));
