// The page of attnkit serve: run a model on a text (streamed where it can be), then look at
// its attention, head by head, as lines between tokens and as a heat map. No library.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { models: {}, view: null };

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
      onText(chunk.choices[0].text, chunk.choices[0].finish_reason);
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

async function run() {
  const model = $("model").value;
  const shape = state.models[model];
  const text = $("text").value;
  const o = options();
  const out = $("result");
  out.textContent = "";
  out.className = "";
  delete out.dataset.done;
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
      });
    }
    // the attention of what is shown: the output, as it came (an encoder has none)
    await lookInside(model, text, shape === "encoder" ? null : out.textContent);
    out.dataset.done = "yes";
    status("done");
  } catch (error) {
    out.textContent = error.message;
    out.className = "error";
    status("failed", true);
  } finally {
    $("go").disabled = false;
  }
}

async function lookInside(model, text, output) {
  state.view = await (await post("/v1/attention", { model, text, output })).json();
  const kinds = Object.keys(state.view.attention);
  fill($("kind"), kinds.map((k) => [k, { encoder: "encoder self-attention", decoder: "decoder self-attention", cross: "cross-attention" }[k]]));
  kindChanged();
  $("inside").hidden = false;
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

// The (queries, keys) tokens of an attention: self-attention reads its own side.
function axes(kind) {
  const t = state.view.tokens;
  if (kind === "encoder") return [t.keys, t.keys];
  if (kind === "decoder") return [t.queries, t.queries];
  return [t.queries, t.keys];
}

function matrix() {
  const layer = state.view.attention[$("kind").value][Number($("layer").value)];
  const head = $("head").value;
  if (head !== "mean") return layer[Number(head)];
  return layer[0].map((row, q) => row.map((_, k) => layer.reduce((s, h) => s + h[q][k], 0) / layer.length));
}

function draw() {
  const [queries, keys] = axes($("kind").value);
  const weights = matrix();
  drawLines(queries, keys, weights);
  drawHeat(queries, keys, weights);
}

function drawLines(queries, keys, weights) {
  const svg = $("lines");
  const ns = "http://www.w3.org/2000/svg";
  const gap = 20, left = 130, right = 330;
  svg.setAttribute("width", right + 130);
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
  const label = (text, x, y, anchor, side, index) => {
    const node = document.createElementNS(ns, "text");
    node.textContent = text;
    Object.entries({ x, y, "text-anchor": anchor }).forEach(([a, v]) => node.setAttribute(a, v));
    node.addEventListener("mouseenter", () => {
      node.classList.add("on");
      lines.forEach((l) => { l.style.visibility = l.dataset[side] === String(index) ? "visible" : "hidden"; });
    });
    node.addEventListener("mouseleave", () => {
      node.classList.remove("on");
      lines.forEach((l) => { l.style.visibility = "visible"; });
    });
    svg.appendChild(node);
  };
  queries.forEach((t, q) => label(t, left, 19 + q * gap, "end", "q", q));
  keys.forEach((t, k) => label(t, right, 19 + k * gap, "start", "k", k));
}

function drawHeat(queries, keys, weights) {
  const canvas = $("heat");
  const cell = 22, margin = 90;
  canvas.width = margin + cell * keys.length + 10;
  canvas.height = margin + cell * queries.length + 10;
  const g = canvas.getContext("2d");
  g.font = "12px system-ui, sans-serif";
  g.clearRect(0, 0, canvas.width, canvas.height);
  const top = weights.reduce((m, row) => row.reduce((a, w) => Math.max(a, w), m), 1e-9);
  weights.forEach((row, q) => row.forEach((w, k) => {
    const v = w / top;  // white to dark blue
    g.fillStyle = `rgb(${Math.round(255 - 226 * v)}, ${Math.round(255 - 202 * v)}, ${Math.round(255 - 168 * v)})`;
    g.fillRect(margin + k * cell, margin + q * cell, cell - 1, cell - 1);
  }));
  g.fillStyle = "#1d232a";
  g.textAlign = "right";
  queries.forEach((t, q) => g.fillText(t, margin - 4, margin + q * cell + 15));
  keys.forEach((t, k) => {
    g.save();
    g.translate(margin + k * cell + 15, margin - 4);
    g.rotate(-Math.PI / 2);
    g.textAlign = "left";
    g.fillText(t, 0, 0);
    g.restore();
  });
}

async function loadModels() {
  const response = await fetch("/v1/models", { headers: headers(false) });
  if (response.status === 401) {
    status("this server needs its API key: type it in the key box", true);
    return;
  }
  const reply = await response.json();
  state.models = {};
  reply.data.forEach((m) => { state.models[m.id] = m.shape; });
  fill($("model"), reply.data.map((m) => [m.id, m.id]));
  shapeShown();
  status(`${reply.data.length} model(s)`);
}

function shapeShown() {
  $("shape").textContent = state.models[$("model").value] || "";
}

$("model").addEventListener("change", shapeShown);
$("key").addEventListener("change", () => loadModels().catch((e) => status(e.message, true)));
$("go").addEventListener("click", run);
$("kind").addEventListener("change", kindChanged);
$("layer").addEventListener("change", draw);
$("head").addEventListener("change", draw);
loadModels().catch((error) => status(error.message, true));
