#include "viz_html.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "qkv/error.h"

namespace qkv::cli {

namespace {

using nlohmann::json;

// The page around the data. Plain DOM, canvas and SVG; the data sits in a JSON script tag.
constexpr const char* kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>qkv · attention patterns</title>
<style>
  :root { --ink: #1d2330; --muted: #5c6578; --line: #d5dae3; --masked: #eceff4; --accent: #1f4fa8; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); background: #fafbfc; }
  header, main { max-width: 1200px; margin: 0 auto; padding: 16px 24px; }
  h1 { font-size: 22px; margin: 8px 0 4px; }
  h2 { font-size: 17px; margin: 20px 0 8px; }
  p { margin: 4px 0; color: var(--muted); }
  .layer { display: flex; align-items: center; gap: 10px; margin: 6px 0; flex-wrap: wrap; }
  .layer-label { width: 64px; color: var(--muted); font-size: 12px; }
  .head { display: flex; flex-direction: column; align-items: center; cursor: pointer; border: 2px solid transparent; border-radius: 4px; padding: 2px; background: none; font: inherit; color: inherit; }
  .head:hover, .head:focus { border-color: var(--accent); outline: none; }
  .head.selected { border-color: var(--accent); background: #e8eefb; }
  .head canvas { background: var(--masked); border: 1px solid var(--line); image-rendering: pixelated; }
  .head span { font-size: 11px; color: var(--muted); }
  #detail { border-top: 1px solid var(--line); margin-top: 16px; }
  #detail[hidden] { display: none; }
  .views { display: flex; gap: 28px; flex-wrap: wrap; align-items: flex-start; }
  #big { background: var(--masked); border: 1px solid var(--line); cursor: crosshair; }
  #tooltip { position: fixed; pointer-events: none; background: var(--ink); color: #fff; padding: 4px 8px; border-radius: 4px; font-size: 13px; white-space: nowrap; }
  #tooltip[hidden] { display: none; }
  #lines text { font-size: 12px; fill: var(--ink); cursor: default; }
  #lines line { stroke: var(--accent); }
  #lines.focused line { stroke-opacity: 0.04; }
  #lines.focused line.on { stroke-opacity: 0.9; }
  #lines text.on { font-weight: bold; fill: var(--accent); }
  button.close { font: inherit; padding: 2px 10px; margin-left: 12px; }
  table.steps { border-collapse: collapse; margin: 6px 0 14px; font-variant-numeric: tabular-nums; }
  table.steps th, table.steps td { border: 1px solid var(--line); padding: 3px 9px; text-align: right; }
  table.steps th { background: #f0f3f8; font-weight: 600; }
  table.steps td.masked { color: #a0a7b4; }
  .legend { font-size: 12px; color: var(--muted); }
  code { background: #eef1f6; padding: 0 4px; border-radius: 3px; }
</style>
</head>
<body>
<header>
  <h1 id="title"></h1>
  <p id="description"></p>
  <p class="legend">Each square is one head. Rows are queries (the token that looks), columns are keys
  (the tokens it may look at); darker means more weight (shade ∝ √weight, so small weights show).
  <span id="mask-note">The grey triangle is masked: a token cannot see the future.</span> Click a head to open it.</p>
</header>
<main>
  <section id="grid" aria-label="every layer and head"></section>
  <section id="detail" hidden>
    <h2><span id="detail-title"></span><button class="close" id="close" type="button">close</button></h2>
    <p class="legend">Hover a cell for its query, key and weight. Right: the same head as lines from each
    query (left) to the keys it attends to (right), thicker for more weight; hover a query to follow it.</p>
    <div class="views">
      <canvas id="big"></canvas>
      <svg id="lines" xmlns="http://www.w3.org/2000/svg"></svg>
    </div>
  </section>
  <section id="example" hidden></section>
</main>
<div id="tooltip" hidden></div>
<script id="qkv-data" type="application/json">/*DATA*/</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("qkv-data").textContent);
const T = D.tokens.length;

// Weight of query i on key j in (layer, head); null where masked.
function weight(layer, head, i, j) {
  const row = D.weights[layer * D.heads + head];
  if (D.causal) return j > i ? null : row[i * (i + 1) / 2 + j] / D.scale;
  return row[i * T + j] / D.scale;
}
function shade(w) {
  const t = Math.sqrt(Math.max(0, Math.min(1, w)));
  const mix = (a, b) => Math.round(a + (b - a) * t);
  return "rgb(" + mix(255, 18) + "," + mix(255, 52) + "," + mix(255, 128) + ")";
}
function paint(ctx, layer, head, x0, y0, cell) {
  for (let i = 0; i < T; i++)
    for (let j = 0; j < T; j++) {
      const w = weight(layer, head, i, j);
      if (w === null) continue;  // masked: left empty
      ctx.fillStyle = shade(w);
      ctx.fillRect(x0 + j * cell, y0 + i * cell, cell, cell);
    }
}

document.getElementById("title").textContent = D.title;
document.getElementById("description").textContent = D.description;
if (!D.causal) document.getElementById("mask-note").textContent = "No mask: every token sees every other.";

// The grid: one row per layer, one small heatmap per head.
const grid = document.getElementById("grid");
const small = Math.max(1, Math.floor(96 / T));
for (let l = 0; l < D.layers; l++) {
  const row = document.createElement("div");
  row.className = "layer";
  const label = document.createElement("div");
  label.className = "layer-label";
  label.textContent = "layer " + l;
  row.appendChild(label);
  for (let h = 0; h < D.heads; h++) {
    const cell = document.createElement("button");
    cell.type = "button";
    cell.className = "head";
    cell.dataset.layer = l;
    cell.dataset.head = h;
    cell.title = "layer " + l + ", head " + h;
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = T * small;
    paint(canvas.getContext("2d"), l, h, 0, 0, small);
    const name = document.createElement("span");
    name.textContent = "head " + h;
    cell.append(canvas, name);
    cell.addEventListener("click", () => openHead(l, h));
    row.appendChild(cell);
  }
  grid.appendChild(row);
}

// One head, large.
const big = document.getElementById("big");
const tip = document.getElementById("tooltip");
const view = { layer: -1, head: -1, cell: 0, x0: 0, y0: 0 };
function openHead(layer, head, scroll = true) {
  view.layer = layer;
  view.head = head;
  document.querySelectorAll(".head").forEach(e =>
    e.classList.toggle("selected", +e.dataset.layer === layer && +e.dataset.head === head));
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-title").textContent = "layer " + layer + ", head " + head;
  const ctx = big.getContext("2d");
  ctx.font = "12px system-ui, sans-serif";
  let labelWidth = 0;
  for (const t of D.tokens) labelWidth = Math.max(labelWidth, ctx.measureText(t).width);
  labelWidth = Math.min(140, Math.ceil(labelWidth) + 8);
  view.cell = Math.max(8, Math.min(44, Math.floor(640 / T)));
  view.x0 = view.y0 = labelWidth;
  big.width = big.height = labelWidth + T * view.cell + 2;
  Object.assign(big.dataset, { x0: view.x0, y0: view.y0, cell: view.cell });  // where the cells are
  ctx.font = "12px system-ui, sans-serif";
  ctx.fillStyle = "#fafbfc";
  ctx.fillRect(0, 0, big.width, big.height);
  ctx.fillStyle = getComputedStyle(document.documentElement).getPropertyValue("--masked");
  ctx.fillRect(view.x0, view.y0, T * view.cell, T * view.cell);
  paint(ctx, layer, head, view.x0, view.y0, view.cell);
  ctx.fillStyle = "#1d2330";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  ctx.font = Math.max(7, Math.min(12, view.cell - 1)) + "px system-ui, sans-serif";  // fits a row
  for (let i = 0; i < T; i++)
    ctx.fillText(D.tokens[i], view.x0 - 4, view.y0 + (i + 0.5) * view.cell, labelWidth - 6);
  ctx.textAlign = "left";
  for (let j = 0; j < T; j++) {
    ctx.save();
    ctx.translate(view.x0 + (j + 0.5) * view.cell, view.y0 - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText(D.tokens[j], 0, 0, labelWidth - 6);
    ctx.restore();
  }
  drawLines(layer, head);
  if (scroll) document.getElementById("detail").scrollIntoView({ block: "nearest" });
}
big.addEventListener("mousemove", e => {
  const r = big.getBoundingClientRect();
  const j = Math.floor((e.clientX - r.left - view.x0) / view.cell);
  const i = Math.floor((e.clientY - r.top - view.y0) / view.cell);
  if (view.layer < 0 || i < 0 || j < 0 || i >= T || j >= T) { tip.hidden = true; return; }
  const w = weight(view.layer, view.head, i, j);
  tip.textContent = "query “" + D.tokens[i] + "” → key “" + D.tokens[j] + "”: " +
      (w === null ? "masked (the future)" : w.toFixed(3));
  Object.assign(tip.dataset, { query: i, key: j, weight: w === null ? "" : w.toFixed(3) });
  tip.style.left = (e.clientX + 14) + "px";
  tip.style.top = (e.clientY + 14) + "px";
  tip.hidden = false;
});
big.addEventListener("mouseleave", () => { tip.hidden = true; });
document.getElementById("close").addEventListener("click", () => {
  document.getElementById("detail").hidden = true;
  document.querySelectorAll(".head.selected").forEach(e => e.classList.remove("selected"));
});
document.addEventListener("keydown", e => { if (e.key === "Escape") document.getElementById("close").click(); });

// The articles' picture: queries left, keys right, a line per weight.
function drawLines(layer, head) {
  const svg = document.getElementById("lines");
  const NS = "http://www.w3.org/2000/svg";
  const step = Math.max(14, Math.min(24, Math.floor(640 / T)));
  const left = 150, right = 430;
  svg.setAttribute("width", right + 150);
  svg.setAttribute("height", T * step + 30);
  svg.replaceChildren();
  svg.classList.remove("focused");
  const y = i => 20 + i * step;
  const lines = [];
  for (let i = 0; i < T; i++)
    for (let j = 0; j < T; j++) {
      const w = weight(layer, head, i, j);
      if (w === null || w < 0.02) continue;
      const line = document.createElementNS(NS, "line");
      line.setAttribute("x1", left + 6);
      line.setAttribute("y1", y(i));
      line.setAttribute("x2", right - 6);
      line.setAttribute("y2", y(j));
      line.setAttribute("stroke-width", (0.4 + 7 * w).toFixed(2));
      line.setAttribute("stroke-opacity", (0.12 + 0.88 * w).toFixed(2));
      line.dataset.query = i;
      line.dataset.key = j;
      lines.push(line);
      svg.appendChild(line);
    }
  const text = (x, yy, anchor, s) => {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", x);
    t.setAttribute("y", yy + 4);
    t.setAttribute("text-anchor", anchor);
    t.textContent = s;
    svg.appendChild(t);
    return t;
  };
  text(left, 8, "end", "queries").setAttribute("font-weight", "bold");
  text(right, 8, "start", "keys").setAttribute("font-weight", "bold");
  for (let i = 0; i < T; i++) {
    const q = text(left, y(i), "end", D.tokens[i]);
    text(right, y(i), "start", D.tokens[i]);
    q.addEventListener("mouseenter", () => {
      svg.classList.add("focused");
      q.classList.add("on");
      for (const l of lines) l.classList.toggle("on", +l.dataset.query === i);
    });
    q.addEventListener("mouseleave", () => { svg.classList.remove("focused"); q.classList.remove("on"); });
  }
}

if (D.open) openHead(D.open[0], D.open[1], false);  // shown below the grid, page not scrolled

// The worked example: every number of every step.
if (D.example) {
  const E = D.example, sec = document.getElementById("example");
  sec.hidden = false;
  const f = x => x === null ? "−∞" : (+x).toFixed(3);
  let html = "<h2>The worked example, step by step</h2><p>Scale 1/√d_k = 1/√" + E.d_k + " = " +
      f(E.scale) + ". For each query: raw scores k·q, scaled scores, e^score, their sum Z, the " +
      "weights e^score / Z (they sum to one), and the output Σ weight · v.</p>";
  for (const q of E.queries) {
    html += "<h3>query “" + esc(q.token) + "”</h3><table class='steps'><tr><th>key</th><th>k·q</th>" +
        "<th>÷√d_k</th><th>e^x</th><th>weight</th><th>v</th></tr>";
    q.raw_scores.forEach((raw, j) => {
      const m = q.masked[j];
      html += "<tr><th>" + esc(E.key_tokens[j]) + "</th><td>" + f(raw) + "</td><td" +
          (m ? " class='masked'>−∞ (masked)" : ">" + f(q.scaled_scores[j])) + "</td><td>" +
          f(q.exp[j]) + "</td><td>" + f(q.weights[j]) + "</td><td>[" + E.v[j].map(f).join(", ") +
          "]</td></tr>";
    });
    html += "<tr><th>Z</th><td colspan='2'></td><td>" + f(q.z) + "</td><td>" +
        f(q.weights.reduce((a, b) => a + b, 0)) + "</td><th>output [" + q.output.map(f).join(", ") +
        "]</th></tr></table>";
  }
  for (const n of E.notes) html += "<p>Note: " + esc(n) + "</p>";
  html += "<p>" + esc(E.convention) + "</p>";
  sec.innerHTML = html;
}
function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
</script>
</body>
</html>
)HTML";

}  // namespace

std::string attention_html(const AttentionMaps& m) {
  check(!m.weights.empty(), "viz: no attention weights to show");
  const int64_t T = static_cast<int64_t>(m.tokens.size());
  const int64_t H = m.weights[0].size(1);
  json weights = json::array();
  for (const Tensor& w : m.weights) {
    check(w.ndim() == 4 && w.size(0) == 1 && w.size(1) == H && w.size(2) == T && w.size(3) == T,
          "viz: weights of one layer must be [1, ", H, ", ", T, ", ", T, "]");
    for (int64_t h = 0; h < H; ++h) {
      std::vector<int> row;  // thousandths: the 3 decimals the page shows
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < (m.causal ? i + 1 : T); ++j)
          row.push_back(static_cast<int>(std::lround(1000.0 * w.view()(0, h, i, j))));
      weights.push_back(std::move(row));
    }
  }
  json data = {{"title", m.title},
               {"description", m.description},
               {"tokens", m.tokens},
               {"layers", m.weights.size()},
               {"heads", H},
               {"causal", m.causal},
               {"scale", 1000},
               {"weights", std::move(weights)},
               {"example", m.example_json.empty() ? json(nullptr) : json::parse(m.example_json)},
               {"open", m.open_layer >= 0 ? json{m.open_layer, m.open_head} : json(nullptr)}};
  // Invalid UTF-8 in a token becomes U+FFFD; "</" is escaped so no token can end the script.
  std::string text = data.dump(-1, ' ', false, json::error_handler_t::replace);
  for (size_t at = 0; (at = text.find("</", at)) != std::string::npos; at += 3) text.replace(at, 2, "<\\/");
  std::string page = kPage;
  const std::string marker = "/*DATA*/";
  page.replace(page.find(marker), marker.size(), text);
  return page;
}

}  // namespace qkv::cli
