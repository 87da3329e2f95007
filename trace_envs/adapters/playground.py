"""The web playground of ``trace serve --ui``: try an env by hand in a browser.

``GET /ui`` is one self-contained page (no external scripts or styles, so it works offline). A person
picks an env id and a seed, reads the conversation, calls a tool from a form built from the tool's JSON
schema (strings, numbers, integers, booleans and enums as inputs; arrays and objects as JSON), or writes
to the customer, and sees the reward and its breakdown when the episode ends. The page is an ordinary
client of the server's WebSocket API (``/ws``, one session per episode), so it exercises exactly what a
trainer sees. With a token, open ``/ui?token=...``: the page passes it on to its requests.
"""

from __future__ import annotations

from fastapi.responses import HTMLResponse

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>TRACE playground</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
header{background:#1d3557;color:#fff;padding:10px 16px;display:flex;gap:12px;align-items:center;flex-wrap:wrap}
header h1{font-size:17px;margin:0 12px 0 0}
header select,header input,header button{font:inherit;padding:4px 6px}
main{display:grid;grid-template-columns:minmax(0,3fr) minmax(260px,2fr);gap:14px;padding:14px}
section{background:#fff;border:1px solid #d8dde3;border-radius:6px;padding:10px 12px}
h2{font-size:15px;margin:2px 0 8px}
#conversation{max-height:78vh;overflow:auto}
.msg{border-left:4px solid #999;margin:6px 0;padding:4px 8px;white-space:pre-wrap;word-break:break-word}
.msg .role{font-weight:600;font-size:12px;text-transform:uppercase;color:#555;display:block}
.system{border-color:#adb5bd;background:#f8f9fa;max-height:9em;overflow:auto}
.user{border-color:#2a9d8f;background:#eef8f6}.assistant{border-color:#457b9d;background:#eef4f9}
.tool{border-color:#e9c46a;background:#fdf8ea;font-family:ui-monospace,monospace;font-size:12px}
.call{font-family:ui-monospace,monospace;font-size:12px;color:#1d3557}
label{display:block;margin:6px 0 2px;font-weight:600}
label small{font-weight:400;color:#666}
input[type=text],input[type=number],textarea,select.field{width:100%;box-sizing:border-box;font:inherit;padding:4px}
textarea{min-height:4em}
button{cursor:pointer}
.err{color:#b00020;white-space:pre-wrap}
#result table{border-collapse:collapse;width:100%}#result td{border-top:1px solid #eee;padding:3px 4px;vertical-align:top}
.big{font-size:20px;font-weight:700}
</style></head><body>
<header><h1>TRACE playground</h1>
<label style="margin:0;color:#fff">env <select id="env"></select></label>
<label style="margin:0;color:#fff">seed <input id="seed" type="number" value="0" style="width:6em"></label>
<button id="start">Start episode</button><span id="status"></span></header>
<main>
<section><h2>Conversation</h2><div id="conversation"><p>Pick an env and a seed, then start an episode.</p></div></section>
<div>
<section id="toolbox"><h2>Call a tool</h2><select id="tool" class="field"></select><p id="tooldesc"></p>
<form id="toolform"></form><button id="call" disabled>Call tool</button></section>
<section style="margin-top:14px"><h2>Write to the customer</h2><textarea id="reply"></textarea>
<button id="send" disabled>Send message</button></section>
<section id="result" style="margin-top:14px"><h2>Result</h2><div id="outcome">The episode is running or has not started.</div></section>
<p id="error" class="err"></p>
</div></main>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token");
const $ = (id) => document.getElementById(id);
let ws = null, tools = [], done = false, transcript = [];

function setError(text) { $("error").textContent = text || ""; }
function el(tag, cls, text) { const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e; }

async function loadEnvs() {
  const r = await fetch("/trace/stats", {headers: token ? {Authorization: "Bearer " + token} : {}});
  if (!r.ok) { setError("cannot list the envs: HTTP " + r.status); return; }
  const stats = await r.json();
  for (const id of stats.env_ids) { const o = el("option", "", id); o.value = id; $("env").appendChild(o); }
}

function render(obs) {
  // The whole transcript comes at reset; a step sends what is new from index messages_from on.
  transcript = (obs.messages && obs.messages.length) ? obs.messages
    : transcript.slice(0, obs.messages_from || 0).concat(obs.new_messages || []);
  const box = $("conversation"); box.textContent = "";
  for (const m of transcript) {
    const d = el("div", "msg " + m.role); d.appendChild(el("span", "role", m.role + (m.name ? " · " + m.name : "")));
    if (m.content) d.appendChild(document.createTextNode(m.content));
    for (const c of (m.tool_calls || [])) {
      const args = typeof c.function.arguments === "string" ? c.function.arguments : JSON.stringify(c.function.arguments);
      d.appendChild(el("div", "call", "→ " + c.function.name + "(" + args + ")"));
    }
    box.appendChild(d);
  }
  box.scrollTop = box.scrollHeight;
  if (obs.tool_schemas && obs.tool_schemas.length) { tools = obs.tool_schemas; fillTools(); }
}

function fillTools() {
  const sel = $("tool"), keep = sel.value; sel.textContent = "";
  for (const t of tools) { const o = el("option", "", t.function.name); o.value = t.function.name; sel.appendChild(o); }
  if (keep && tools.some(t => t.function.name === keep)) sel.value = keep;
  buildForm();
}

function buildForm() {
  const form = $("toolform"); form.textContent = "";
  const t = tools.find(t => t.function.name === $("tool").value); if (!t) return;
  $("tooldesc").textContent = t.function.description || "";
  const params = t.function.parameters || {}, props = params.properties || {}, req = params.required || [];
  for (const [name, s] of Object.entries(props)) {
    const kind = Array.isArray(s.type) ? s.type.find(k => k !== "null") : s.type;
    const lab = el("label", "", name); lab.htmlFor = "arg-" + name;
    lab.appendChild(el("small", "", " " + (kind || "json") + (req.includes(name) ? ", required" : "") +
      (s.description ? " — " + s.description : "")));
    form.appendChild(lab);
    let input;
    if (s.enum) { input = el("select", "field"); input.appendChild(el("option", "", ""));
      for (const v of s.enum) { const o = el("option", "", String(v)); o.value = JSON.stringify(v); input.appendChild(o); } }
    else if (kind === "boolean") { input = el("select", "field");
      for (const v of ["", "true", "false"]) { const o = el("option", "", v); o.value = v; input.appendChild(o); } }
    else if (kind === "array" || kind === "object" || !kind) { input = el("textarea"); input.placeholder = "JSON"; }
    else { input = el("input"); input.type = (kind === "integer" || kind === "number") ? "number" : "text";
      if (kind === "number") input.step = "any"; }
    input.id = "arg-" + name; input.name = name; input.dataset.kind = s.enum ? "enum" : (kind || "json");
    form.appendChild(input);
  }
}

function readForm() {
  const args = {};
  for (const input of $("toolform").querySelectorAll("[name]")) {
    const v = input.value, kind = input.dataset.kind;
    if (v === "") continue;
    if (kind === "integer") args[input.name] = parseInt(v, 10);
    else if (kind === "number") args[input.name] = parseFloat(v);
    else if (kind === "boolean") args[input.name] = v === "true";
    else if (kind === "enum" || kind === "array" || kind === "object" || kind === "json") {
      try { args[input.name] = JSON.parse(v); } catch (e) { throw new Error(input.name + ": not valid JSON (" + e.message + ")"); } }
    else args[input.name] = v;
  }
  return args;
}

function showResult(data) {
  const obs = data.observation, box = $("outcome"); box.textContent = "";
  box.appendChild(el("div", "big", "Reward: " + Number(data.reward).toFixed(2)));
  box.appendChild(el("div", "", "success: " + obs.success + " · termination: " + obs.termination));
  const table = el("table");
  for (const [k, v] of Object.entries(obs.reward_breakdown || {})) {
    const tr = el("tr"); tr.appendChild(el("td", "", k)); tr.appendChild(el("td", "", JSON.stringify(v))); table.appendChild(tr);
  }
  box.appendChild(table);
}

function setRunning(on) { $("call").disabled = !on; $("send").disabled = !on; }

function start() {
  setError(""); done = false; transcript = []; setRunning(false); $("outcome").textContent = "The episode is running.";
  if (ws) ws.close();
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws" +
    (token ? "?token=" + encodeURIComponent(token) : "");
  ws = new WebSocket(url);
  ws.onopen = () => ws.send(JSON.stringify({type: "reset", data: {env_id: $("env").value, seed: parseInt($("seed").value || "0", 10)}}));
  ws.onmessage = (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.type === "error") { setError(msg.data.message + " (" + msg.data.code + ")"); return; }
    if (msg.type !== "observation") return;
    const data = msg.data; render(data.observation);
    $("status").textContent = data.observation.env_id + " · seed " + data.observation.seed +
      (data.done ? " · ended" : " · step " + transcript.filter(m => m.role === "assistant").length);
    if (data.done) { done = true; setRunning(false); showResult(data); } else setRunning(true);
  };
  ws.onclose = () => { if (!done) setRunning(false); };
}

function step(message) { setError(""); setRunning(false); ws.send(JSON.stringify({type: "step", data: {message}})); }

$("start").onclick = start;
$("tool").onchange = buildForm;
$("call").onclick = () => {
  let args; try { args = readForm(); } catch (e) { setError(e.message); return; }
  step({role: "assistant", content: "", tool_calls: [{type: "function", function: {name: $("tool").value, arguments: args}}]});
};
$("send").onclick = () => { const text = $("reply").value.trim(); if (!text) { setError("write a message first"); return; }
  $("reply").value = ""; step(text); };
$("toolform").onsubmit = (e) => e.preventDefault();
loadEnvs();
</script></body></html>
"""


def add_playground(app, config) -> None:
    """Serve the playground at ``GET /ui`` on ``app`` (the FastAPI app of :func:`build_app`)."""

    @app.get("/ui", response_class=HTMLResponse, include_in_schema=False)
    def playground() -> HTMLResponse:
        return HTMLResponse(PAGE)
