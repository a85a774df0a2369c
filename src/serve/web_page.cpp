// The HTML, CSS and JavaScript of serve's web page (see web_page.h). It talks to the server
// only through the public API: GET /v1/model, POST /v1/translate.
#include "serve/web_page.h"

namespace tfm {

const char* web_page_html() {
  return R"PAGE(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>transformer serve</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 70em; padding: 0 1em;
         color: #1d2330; background: #fafbfc; }
  h1 { font-size: 1.4em; margin-bottom: 0.2em; }
  #model { color: #5a6272; font-size: 0.9em; margin-bottom: 1em; }
  textarea { width: 100%; box-sizing: border-box; font-size: 1.05em; padding: 0.5em;
             border: 1px solid #b8c0cc; border-radius: 4px; }
  .controls { display: flex; flex-wrap: wrap; gap: 1em; align-items: center; margin: 0.6em 0; }
  .controls label { font-size: 0.9em; }
  .controls input { width: 4.5em; }
  button { font-size: 1em; padding: 0.35em 1.2em; border-radius: 4px; border: 1px solid #2f5fb3;
           background: #2f6fd6; color: white; cursor: pointer; }
  button:disabled { background: #8aa6d8; }
  #status { color: #5a6272; font-size: 0.9em; }
  #status.error { color: #b3261e; }
  .sentence { border: 1px solid #d7dce3; border-radius: 6px; background: white; padding: 0.8em;
              margin: 0.8em 0; }
  .translation { font-size: 1.15em; margin-bottom: 0.4em; }
  table.nbest { border-collapse: collapse; font-size: 0.9em; margin: 0.4em 0; }
  table.nbest td, table.nbest th { border-bottom: 1px solid #e3e7ec; padding: 0.2em 0.8em;
                                   text-align: left; }
  table.nbest td.score { font-variant-numeric: tabular-nums; text-align: right; }
  .heatmaps { display: flex; flex-wrap: wrap; gap: 1em; margin-top: 0.6em; }
  .heatmaps figure { margin: 0; }
  .heatmaps figcaption { font-size: 0.85em; color: #5a6272; text-align: center; }
</style>
</head>
<body>
<h1>transformer serve</h1>
<div id="model">loading the model's description…</div>
<textarea id="source" rows="4" placeholder="Type or paste text; one sentence per line"></textarea>
<div class="controls">
  <button id="translate">Translate</button>
  <label>beam <input id="beam" type="number" min="1" value="4"></label>
  <label>α <input id="alpha" type="number" min="0" max="10" step="0.1" value="0.6"></label>
  <label>n-best <input id="nbest" type="number" min="1" value="4"></label>
  <label>attention of layer <select id="layer"></select></label>
  <span id="status"></span>
</div>
<div id="output"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let model = null;

function element(tag, attributes, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attributes || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

// One head's attention: rows are target tokens, columns source tokens, darker is more weight.
function heatmap(weights, source, target, title) {
  const cell = 20, font = "12px sans-serif";
  const probe = document.createElement("canvas").getContext("2d");
  probe.font = font;
  const left = 8 + Math.max(0, ...target.map((t) => probe.measureText(t).width));
  const top = 8 + Math.max(0, ...source.map((s) => probe.measureText(s).width));
  const canvas = element("canvas", {class: "heatmap"});
  const ratio = window.devicePixelRatio || 1;
  const width = left + cell * source.length + 4, height = top + cell * target.length + 4;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.font = font;
  g.fillStyle = "#1d2330";
  g.textBaseline = "middle";
  target.forEach((t, i) => {
    g.textAlign = "right";
    g.fillText(t, left - 4, top + cell * i + cell / 2);
  });
  source.forEach((s, j) => {
    g.save();
    g.translate(left + cell * j + cell / 2, top - 4);
    g.rotate(-Math.PI / 2);
    g.textAlign = "left";
    g.fillText(s, 0, 0);
    g.restore();
  });
  weights.forEach((row, i) => row.forEach((w, j) => {
    const shade = Math.round(255 * (1 - Math.min(1, Math.max(0, w))));
    g.fillStyle = `rgb(${shade}, ${Math.round(shade * 0.9 + 20)}, 255)`;
    g.fillRect(left + cell * j, top + cell * i, cell - 1, cell - 1);
  }));
  const figure = element("figure");
  figure.append(canvas, element("figcaption", {}, title));
  return figure;
}

function showSentence(result, index) {
  const box = element("div", {class: "sentence", id: "sentence-" + index});
  box.append(element("div", {class: "translation"}, result.text));
  if (result.nbest && result.nbest.length) {
    const table = element("table", {class: "nbest"});
    const head = element("tr");
    head.append(element("th", {}, "#"), element("th", {}, "hypothesis"),
                element("th", {}, "log p"));
    table.append(head);
    result.nbest.forEach((h, k) => {
      const row = element("tr");
      row.append(element("td", {}, String(k + 1)), element("td", {}, h.text),
                 element("td", {class: "score"}, h.score.toFixed(4)));
      table.append(row);
    });
    box.append(table);
  }
  if (result.attention) {
    const a = result.attention;
    const maps = element("div", {class: "heatmaps"});
    a.heads.forEach((weights, h) =>
      maps.append(heatmap(weights, a.source, a.target, `layer ${a.layer}, head ${h + 1}`)));
    box.append(maps);
  }
  return box;
}

async function translate() {
  const lines = $("source").value.split("\n").map((l) => l.trim()).filter((l) => l.length);
  if (!lines.length) { setStatus("Type a sentence first.", true); return; }
  const beam = Number($("beam").value), nbest = Math.min(Number($("nbest").value), beam);
  const body = {text: lines, beam, nbest, alpha: Number($("alpha").value), attention: true};
  if ($("layer").value !== "") body.attention_layer = Number($("layer").value);
  $("translate").disabled = true;
  setStatus("translating…");
  const started = performance.now();
  try {
    const response = await fetch("/v1/translate", {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || response.statusText);
    const output = $("output");
    output.replaceChildren(...answer.translations.map(showSentence));
    setStatus(`${lines.length} sentence(s) in ${Math.round(performance.now() - started)} ms`);
  } catch (e) {
    setStatus("error: " + e.message, true);
  } finally {
    $("translate").disabled = false;
  }
}

async function start() {
  try {
    model = await (await fetch("/v1/model")).json();
    const c = model.config;
    $("model").textContent = `${model.model}: ${c.encoder_layers}+${c.decoder_layers} layers, ` +
      `d_model ${c.d_model}, ${c.heads} heads, ${model.parameters.toLocaleString()} parameters`;
    $("beam").value = model.defaults.beam;
    $("alpha").value = model.defaults.alpha;
    $("beam").max = $("nbest").max = model.limits.max_beam;
    for (let l = 0; l < c.decoder_layers; ++l)
      $("layer").append(element("option", {value: String(l)}, String(l)));
    $("layer").value = String(c.decoder_layers - 1);
  } catch (e) {
    setStatus("cannot read /v1/model: " + e.message, true);
  }
  $("translate").addEventListener("click", translate);
  $("source").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translate();
  });
  const text = new URLSearchParams(location.search).get("text");
  if (text) { $("source").value = text; translate(); }
}
start();
</script>
</body>
</html>
)PAGE";
}

}  // namespace tfm
