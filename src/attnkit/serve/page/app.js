// The page of attnkit serve: run a model on a text (streamed where it can be), then look at
// its attention, head by head, as lines between tokens and as a heat map. No library.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { models: {}, view: null };
const KIND_NAMES = { cross: "cross-attention", encoder: "encoder self-attention", decoder: "decoder self-attention" };
const POSITIONALS = {
  sinusoidal: "the sinusoidal encoding", learned: "a learned table", rope: "RoPE (rotary)",
  xpos: "xPos (rotary with decay)", alibi: "ALiBi (a linear bias)", none: "none",
};

function status(text, error = false) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}

function headers(json) {
  const key = $("key").value;
  return Object.assign(json ? { "Content-Type": "application/json" } : {}, key ? { Authorization: `Bearer ${key}` } : {});
}

async function post(path, body) {
  const response = await fetch(path, { method: "POST", headers: headers(true), body: JSON.stringify(body) });
  if (!response.ok) {
    const problem = await response.json().catch(() => ({}));
    throw new Error(problem.error ? problem.error.message : `${path}: HTTP ${response.status}`);
  }
  return response;
}

// Server-sent events from a POST: each "data: {...}" line is a chunk; "[DONE]" ends them.
async function streamed(path, body, onText) {
  const reader = (await post(path, body)).body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const line = buffer.slice(0, end).replace(/^data: /, "");
      buffer = buffer.slice(end + 2);
      if (line === "[DONE]") return;
      const chunk = JSON.parse(line);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.choices.length) onText(chunk.choices[0].text);
    }
  }
}

function options() {
  const number = (id, fallback) => Number($(id).value) || fallback;  // an empty box: the default
  return {
    how: $("decoding").value,
    beam: number("beam", 4),
    temperature: number("temperature", 1),
    top_p: number("top_p", 1),
    max_tokens: number("max_tokens", 64),
  };
}

// What a view shows goes when what it showed does: a new model, a failed run, an empty text.
function clearView() {
  state.view = null;
  $("inside").hidden = true;
}

async function run() {
  const model = $("model").value;
  const card = state.models[model];
  const text = $("text").value;
  const out = $("result");
  out.textContent = "";
  out.className = "";
  delete out.dataset.done;
  clearView();
  if (!card) return;
  if (!text.trim()) {
    status("type a text first", true);
    return;
  }
  const shape = card.shape;
  const o = options();
  $("go").disabled = true;
  status("running…");
  try {
    if (shape === "encoder") {
      const reply = await (await post("/v1/embeddings", { model, input: text })).json();
      const v = reply.data[0].embedding;
      out.textContent = `a vector of ${v.length} numbers: [${v.slice(0, 6).map((x) => x.toFixed(3)).join(", ")}, …]`;
    } else if (shape === "encoder-decoder" && o.how === "beam") {
      const body = { model, texts: [text], beam: o.beam, max_new_tokens: o.max_tokens };
      const reply = await (await post("/v1/translate", body)).json();
      out.textContent = reply.translations[0].text;
    } else {
      const sample = o.how === "sample";
      const body = shape === "decoder"
        ? { model, prompt: text, max_tokens: o.max_tokens, temperature: sample ? o.temperature : 0, top_p: o.top_p, stream: true }
        : { model, texts: [text], sample, temperature: o.temperature, top_p: o.top_p, max_new_tokens: o.max_tokens, stream: true };
      await streamed(shape === "decoder" ? "/v1/completions" : "/v1/translate", body, (piece) => {
        out.textContent += piece;
        out.scrollTop = out.scrollHeight;  // a long output keeps its newest text in sight
      });
    }
    // the attention of what is shown: the output, as it came (an encoder has none)
    await lookInside(model, text, shape === "encoder" ? null : out.textContent);
    out.dataset.done = "yes";
    status("done");
  } catch (error) {
    clearView();
    out.textContent = error.message;
    out.className = "error";
    status("failed", true);
  } finally {
    $("go").disabled = false;
  }
}

async function lookInside(model, text, output) {
  const view = await (await post("/v1/attention", { model, text, output })).json();
  state.view = view;
  // a translation opens on what links it to its source: cross-attention first
  const kinds = Object.keys(view.attention).sort((a, b) => (a === "cross" ? -1 : b === "cross" ? 1 : 0));
  fill($("kind"), kinds.map((k) => [k, KIND_NAMES[k]]));
  const shown = view.tokens.queries.length, total = view.total.queries;
  const keys = view.tokens.keys.length, totalKeys = view.total.keys;
  const cut = [];
  if (total > shown) cut.push(`the first ${shown} of ${total} output tokens`);
  if (totalKeys > keys && view.attention.cross) cut.push(`the first ${keys} of ${totalKeys} source tokens`);
  $("view-note").textContent = cut.length ? `This view shows ${cut.join(" and ")}.` : "";
  $("inside").hidden = false;
  kindChanged();
}

function fill(select, pairs) {
  select.replaceChildren(...pairs.map(([value, label]) => new Option(label, value)));
}

function kindChanged() {
  const layers = state.view.attention[$("kind").value];
  fill($("layer"), layers.map((_, i) => [i, `layer ${i + 1}`]));
  fill($("head"), [["mean", "mean of heads"], ...layers[0].map((_, h) => [h, `head ${h + 1}`])]);
  draw();
}

// The (queries, keys) of an attention as words: self-attention reads its own side.
function axes(kind) {
  const t = state.view.labels;
  if (kind === "encoder") return [t.keys, t.keys];
  if (kind === "decoder") return [t.queries, t.queries];
  return [t.queries, t.keys];
}

function axisNames(kind) {
  const card = state.models[state.view.model] || {};
  if (kind === "cross") return ["the translation's tokens", "the source's tokens"];
  if (kind === "encoder") return card.shape === "encoder-decoder" ? ["the source", "the source"] : ["the text", "the text"];
  return ["the text and its continuation", "the tokens before each"];
}

function matrix() {
  const layer = state.view.attention[$("kind").value][Number($("layer").value)];
  const head = $("head").value;
  if (head !== "mean") return layer[Number(head)];
  return layer[0].map((row, q) => row.map((_, k) => layer.reduce((s, h) => s + h[q][k], 0) / layer.length));
}

function draw() {
  const kind = $("kind").value;
  const [queries, keys] = axes(kind);
  const weights = matrix();
  drawLines(queries, keys, weights);
  drawHeat(queries, keys, weights, axisNames(kind));
}

const short = (text) => (text.length > 14 ? `${text.slice(0, 13)}…` : text);

function drawLines(queries, keys, weights) {
  const svg = $("lines");
  const ns = "http://www.w3.org/2000/svg";
  const width = Math.max(280, Math.min(460, document.querySelector("main").clientWidth - 8));
  const gap = 20, left = Math.round(width * 0.3), right = Math.round(width * 0.7);
  svg.setAttribute("width", width);
  svg.setAttribute("height", gap * Math.max(queries.length, keys.length) + 20);
  svg.replaceChildren();
  const lines = [];
  weights.forEach((row, q) => row.forEach((w, k) => {
    if (w < 0.01) return;
    const line = document.createElementNS(ns, "line");
    Object.entries({ x1: left + 4, y1: 15 + q * gap, x2: right - 4, y2: 15 + k * gap }).forEach(([a, v]) => line.setAttribute(a, v));
    line.setAttribute("stroke-opacity", w.toFixed(3));
    line.setAttribute("stroke-width", (1 + 3 * w).toFixed(2));
    line.dataset.q = q;
    line.dataset.k = k;
    lines.push(line);
    svg.appendChild(line);
  }));
  let pinned = null;
  const only = (node, side, index) => {
    svg.querySelectorAll("text.on").forEach((t) => t.classList.remove("on"));
    if (node === null) {
      lines.forEach((l) => { l.style.visibility = "visible"; });
      return;
    }
    node.classList.add("on");
    lines.forEach((l) => { l.style.visibility = l.dataset[side] === String(index) ? "visible" : "hidden"; });
  };
  const label = (text, x, y, anchor, side, index) => {
    const node = document.createElementNS(ns, "text");
    node.textContent = short(text);
    Object.entries({ x, y, "text-anchor": anchor }).forEach(([a, v]) => node.setAttribute(a, v));
    node.addEventListener("mouseenter", () => only(node, side, index));
    node.addEventListener("mouseleave", () => only(pinned && pinned.node, pinned && pinned.side, pinned && pinned.index));
    node.addEventListener("click", () => {  // a tap keeps its lines until the next tap
      pinned = pinned && pinned.node === node ? null : { node, side, index };
      only(pinned && node, side, index);
    });
    svg.appendChild(node);
  };
  queries.forEach((t, q) => label(t, left, 19 + q * gap, "end", "q", q));
  keys.forEach((t, k) => label(t, right, 19 + k * gap, "start", "k", k));
}

function drawHeat(queries, keys, weights, [rows, columns]) {
  const canvas = $("heat");
  const g = canvas.getContext("2d");
  // cells fill the width, but never below 12 px: a label (2 px smaller) stays readable and
  // apart from its neighbours, and a wider map scrolls in its frame
  const fits = Math.floor((document.querySelector("main").clientWidth - 80) / Math.max(keys.length, 1));
  const cell = Math.max(12, Math.min(22, fits));
  const font = `${Math.min(12, cell - 2)}px system-ui, sans-serif`;
  g.font = font;
  // room for the longest label on each side, no more
  const widest = (labels) => Math.max(...labels.map((t) => g.measureText(short(t)).width), 10);
  const left = Math.ceil(widest(queries)) + 8, top = Math.ceil(widest(keys)) + 8;
  canvas.width = left + cell * keys.length + 10;
  canvas.height = top + cell * queries.length + 10;
  g.font = font;  // a resized canvas forgets its font
  g.clearRect(0, 0, canvas.width, canvas.height);
  const most = weights.reduce((m, row) => row.reduce((a, w) => Math.max(a, w), m), 1e-9);
  weights.forEach((row, q) => row.forEach((w, k) => {
    const v = w / most;  // white to navy, as the scale under the map
    g.fillStyle = `rgb(${Math.round(255 - 226 * v)}, ${Math.round(255 - 202 * v)}, ${Math.round(255 - 168 * v)})`;
    g.fillRect(left + k * cell, top + q * cell, cell - 1, cell - 1);
  }));
  g.fillStyle = "#1d232a";
  g.textAlign = "right";
  const middle = Math.min(cell, 22) * 0.7;
  queries.forEach((t, q) => g.fillText(short(t), left - 4, top + q * cell + middle));
  keys.forEach((t, k) => {
    g.save();
    g.translate(left + k * cell + middle, top - 4);
    g.rotate(-Math.PI / 2);
    g.textAlign = "left";
    g.fillText(short(t), 0, 0);
    g.restore();
  });
  $("heat-rows").textContent = `rows: queries, ${rows}`;
  $("heat-columns").textContent = `columns: keys, ${columns}`;
  $("heat-max").textContent = most.toFixed(2);
}

async function loadModels() {
  const response = await fetch("/v1/models", { headers: headers(false) });
  if (response.status === 401) {
    status("this server needs its API key: type it in the key box", true);
    return;
  }
  const reply = await response.json();
  state.models = {};
  reply.data.forEach((m) => { state.models[m.id] = m; });
  fill($("model"), reply.data.map((m) => [m.id, m.id]));
  modelChanged();
  status(`${reply.data.length} model(s)`);
}

// Only the controls that apply: an encoder has no decoding; beam search is a translation's.
function modelChanged() {
  const card = state.models[$("model").value];
  const out = $("result");
  out.textContent = "";
  out.className = "";
  clearView();
  if (!card) return;
  $("shape").textContent = card.shape;
  document.querySelectorAll("#options .generates").forEach((node) => { node.hidden = card.shape === "encoder"; });
  const beam = $("decoding").querySelector("option[value=beam]");
  beam.hidden = beam.disabled = card.shape !== "encoder-decoder";
  if (beam.disabled && $("decoding").value === "beam") $("decoding").value = "greedy";
  $("go").textContent = card.shape === "encoder" ? "Embed" : card.shape === "decoder" ? "Continue" : "Translate";
  $("positions-title").textContent = `Positions: ${POSITIONALS[card.positional] || card.positional}`;
  $("pe").src = `/positions.png?model=${encodeURIComponent(card.id)}`;
  decodingChanged();
}

function decodingChanged() {
  const card = state.models[$("model").value];
  const how = card && card.shape !== "encoder" ? $("decoding").value : "";
  document.querySelectorAll("#options .when-beam").forEach((node) => { node.hidden = how !== "beam"; });
  document.querySelectorAll("#options .when-sample").forEach((node) => { node.hidden = how !== "sample"; });
}

$("model").addEventListener("change", modelChanged);
$("decoding").addEventListener("change", decodingChanged);
$("key").addEventListener("change", () => loadModels().catch((e) => status(e.message, true)));
$("go").addEventListener("click", run);
$("kind").addEventListener("change", kindChanged);
$("layer").addEventListener("change", draw);
$("head").addEventListener("change", draw);
loadModels().catch((error) => status(error.message, true));
