"""The report's HTML (Jinja2 templates kept in Python, so the package needs no data files).

Every page works from disk (``file://``): no fetch, no server; the index's rows are embedded
as JSON and rendered, filtered, sorted and paginated by a few lines of plain JavaScript.
"""

from __future__ import annotations

import jinja2

CSS = """
:root { --ok:#1a7f37; --bad:#cf222e; --muted:#57606a; --line:#d0d7de; --bg:#f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color:#1f2328; }
header { background:#24292f; color:#fff; padding:10px 18px; }
header a { color:#9ecbff; }
header h1 { font-size:17px; margin:0; }
main { padding: 14px 18px; }
table { border-collapse: collapse; }
th, td { border-bottom:1px solid var(--line); padding:4px 8px; text-align:left; vertical-align:top; }
th { background: var(--bg); position: sticky; top: 0; }
td.num, th.num { text-align:right; font-variant-numeric: tabular-nums; }
.status-ok, .status-truncated { color: var(--ok); }
.status-error, .status-retried { color: var(--bad); font-weight:600; }
.status-cancelled, .status-skipped, .status-surplus { color: var(--muted); }
.r1 { color: var(--ok); font-weight:600; } .r0 { color: var(--bad); font-weight:600; }
.facts { display:grid; grid-template-columns: max-content 1fr; gap:2px 14px; margin: 8px 0 14px; }
.facts dt { color: var(--muted); } .facts dd { margin:0; }
.step { border:1px solid var(--line); border-radius:6px; margin: 0 0 18px; padding:10px; display:flex; gap:14px; flex-wrap:wrap; }
.step h3 { margin:0 0 6px; font-size:15px; }
.shot { position:relative; width: min(100%, 900px); line-height:0; border:1px solid var(--line); }
.shot img { width:100%; height:auto; display:block; }
.shot svg { position:absolute; left:0; top:0; width:100%; height:100%; pointer-events:none; }
.side { flex: 1 1 340px; min-width: 300px; }
pre { white-space: pre-wrap; word-break: break-word; background: var(--bg); padding:6px 8px; margin:4px 0; border-radius:4px; font-size:12.5px; line-height:1.35; }
.parse-error { background:#ffebe9; border:1px solid var(--bad); color: var(--bad); padding:4px 8px; border-radius:4px; font-weight:600; }
.muted { color: var(--muted); }
.controls { margin: 6px 0 10px; display:flex; gap:12px; align-items:center; flex-wrap:wrap; }
.attempts { display:flex; gap:12px; flex-wrap:wrap; }
.attempt { border:1px solid var(--line); border-radius:6px; padding:8px; width: 300px; }
.attempt img { width: 100%; height:auto; border:1px solid var(--line); display:block; margin: 4px 0; }
.badge { display:inline-block; padding:0 6px; border-radius:8px; background: var(--bg); border:1px solid var(--line); font-size:12px; }
"""

BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{% block title %}{% endblock %}</title>
<style>{{ css }}</style></head>
<body><header>{% block header %}{% endblock %}</header>
<main>{% block main %}{% endblock %}</main>
{% block script %}{% endblock %}
</body></html>
"""

INDEX = """{% extends "base" %}
{% block title %}rollouts · {{ run.version }}{% endblock %}
{% block header %}<h1>Rollouts of policy version {{ run.version }}</h1>
<div>model {{ run.model }} · task set {{ run.task_set }} · {{ run.records }} records ·
{{ run.groups }} groups · success rate {{ run.success_rate }} · run directory <code>{{ run.run_dir }}</code></div>{% endblock %}
{% block main %}
<div class="controls">
 <label>task <select id="f-task"><option value="">all tasks</option>{% for t in tasks %}<option>{{ t }}</option>{% endfor %}</select></label>
 <label>status <select id="f-status"><option value="">all statuses</option>{% for s in statuses %}<option>{{ s }}</option>{% endfor %}</select></label>
 <label>sort <select id="sort"><option value="">as collected</option><option value="reward-desc">reward, high first</option><option value="reward-asc">reward, low first</option></select></label>
 <span id="count" class="muted"></span>
 <button id="prev">‹ prev</button><span id="page"></span><button id="next">next ›</button>
</div>
<table id="rollouts"><thead><tr>
<th>task</th><th>group</th><th class="num">attempt</th><th class="num">exec</th><th>status</th>
<th class="num">reward</th><th class="num">advantage</th><th class="num">steps</th><th class="num" title="the attempt's own time: reset + steps + grading (queue time excluded)">attempt time [s]</th><th>desktop</th>
</tr></thead><tbody></tbody></table>
<script id="rows" type="application/json">{{ rows_json|safe }}</script>
{% endblock %}
{% block script %}<script>
"use strict";
const ROWS = JSON.parse(document.getElementById("rows").textContent);
const PAGE = {{ page_size }};
const cols = ["task","group","attempt","execution","status","reward","advantage","steps","seconds","desktop"];
let page = 0;
const q = new URLSearchParams(location.search);
for (const [id, key] of [["f-task","task"],["f-status","status"],["sort","sort"]]) {
  if (q.get(key)) document.getElementById(id).value = q.get(key);
}
function fmt(v, digits) { return v === null || v === undefined ? "" : (typeof v === "number" ? v.toFixed(digits) : String(v)); }
function render() {
  const task = document.getElementById("f-task").value, status = document.getElementById("f-status").value;
  const sort = document.getElementById("sort").value;
  let rows = ROWS.filter(r => (!task || r.task === task) && (!status || r.status === status));
  if (sort) {
    const sign = sort === "reward-desc" ? -1 : 1;
    rows = rows.slice().sort((a, b) => sign * ((a.reward ?? -Infinity) - (b.reward ?? -Infinity)));
  }
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  page = Math.min(page, pages - 1);
  const tbody = document.querySelector("#rollouts tbody");
  tbody.textContent = "";
  for (const r of rows.slice(page * PAGE, (page + 1) * PAGE)) {
    const tr = document.createElement("tr");
    tr.dataset.rollout = r.id;
    const cells = [
      ["a", r.task, r.page], ["a", r.group, r.group_page], ["n", r.attempt], ["n", r.execution],
      ["s", r.status], ["n", fmt(r.reward, 2)], ["n", fmt(r.advantage, 3)], ["n", r.steps],
      ["n", fmt(r.seconds, 1)], ["t", r.desktop ?? ""]];
    for (const [kind, value, href] of cells) {
      const td = document.createElement("td");
      if (kind === "a") { const a = document.createElement("a"); a.href = href; a.textContent = value; td.append(a); }
      else td.textContent = value;
      if (kind === "n") td.className = "num";
      if (kind === "s") td.className = "status-" + value;
      tr.append(td);
    }
    if (r.reward !== null) tr.children[5].className += r.reward > 0 ? " r1" : " r0";
    tbody.append(tr);
  }
  document.getElementById("count").textContent = rows.length + " of " + ROWS.length + " rollouts";
  document.getElementById("page").textContent = " page " + (page + 1) + " / " + pages + " ";
  document.getElementById("prev").disabled = page === 0;
  document.getElementById("next").disabled = page >= pages - 1;
}
for (const id of ["f-task","f-status","sort"]) document.getElementById(id).addEventListener("change", () => { page = 0; render(); });
document.getElementById("prev").addEventListener("click", () => { page--; render(); });
document.getElementById("next").addEventListener("click", () => { page++; render(); });
render();
</script>{% endblock %}
"""

ROLLOUT = """{% extends "base" %}
{% block title %}{{ r.task_id }} · attempt {{ r.attempt }} · {{ run.version }}{% endblock %}
{% block header %}<h1>{{ r.task_id }} · attempt {{ r.attempt }}{% if r.execution %} (execution {{ r.execution }}){% endif %}
 · <span class="status-{{ r.status }}">{{ r.status }}</span> · reward {{ fmt(r.reward, 2) }}</h1>
<div><a href="{{ index }}">all rollouts</a> · <a href="{{ group_page }}">group {{ r.group_id }}</a> · policy {{ run.version }}</div>{% endblock %}
{% block main %}
{% if instruction %}<p><b>Instruction:</b> {{ instruction }}</p>{% endif %}
<dl class="facts">
<dt>rollout</dt><dd><code>{{ r.rollout_id }}</code> on {{ r.desktop or "?" }}</dd>
<dt>status / outcome</dt><dd><span class="status-{{ r.status }}">{{ r.status }}</span> / {{ r.outcome or "–" }}</dd>
<dt>evaluator</dt><dd>{% if evaluator %}<code>{{ evaluator }}</code> → {% endif %}reward <b class="{{ 'r1' if (r.reward or 0) > 0 else 'r0' }}">{{ fmt(r.reward, 3) }}</b>, advantage {{ fmt(advantage, 3) }}
{% if r.eval_error %}<div class="parse-error">evaluator error: {{ r.eval_error }}</div>{% endif %}
{% for n in r.eval_notes or [] %}<div class="eval-note">evaluator note: {{ n }}</div>{% endfor %}</dd>
{% if r.error %}<dt>error</dt><dd class="parse-error">{{ r.error.kind }} / {{ r.error.type }} in {{ r.error.phase }}: {{ r.error.message }}</dd>{% endif %}
<dt>reset</dt><dd>{% if r.reset %}{{ r.reset.kind }}, ready after {{ fmt(r.reset.ready_s, 2) }} s, waited {{ fmt(r.reset.wait_s, 2) }} s{% if r.reset.timed_out %} <span class="setup-failure">(the ready wait hit its cap: the screen may not have been ready)</span>{% endif %}{% if r.reset.keyboard_restored %}; keyboard restored ({{ r.reset.keyboard_restored }}){% endif %}
{% for w in r.reset.unexpected_windows or [] %}<div class="setup-failure">unexpected window {{ w.wm_class }} "{{ w.title }}" found at {{ w.when }}: {{ w.outcome }}</div>{% endfor %}{% else %}–{% endif %}</dd>
{% macro failures(found) %}{% if found %}<table><tr><th>step</th><th>type</th><th>exit</th><th>error</th></tr>
{% for f in found %}<tr class="setup-failure"><td>{{ f.step }}</td><td>{{ f.type }}</td><td>{{ f.exit_status }}</td><td><pre>{{ f.error }}</pre></td></tr>{% endfor %}</table>{% else %}none{% endif %}{% endmacro %}
<dt>setup failures</dt><dd>{{ failures(r.reset.setup_failures if r.reset else None) }}</dd>
<dt>postconfig failures</dt><dd>{{ failures(r.postconfig_failures) }}{% if grader_log %} · <a href="{{ grader_log }}">grader's log</a>{% endif %}</dd>
<dt>time</dt><dd>{{ fmt(r.timing.attempt_s, 2) }} s attempt ({{ fmt(r.timing.total_s, 2) }} s from enqueue, queue included): {% for p, v in phases %}{{ p }} {{ fmt(v, 2) }}{% if not loop.last %} · {% endif %}{% endfor %}</dd>
<dt>tokens</dt><dd>{{ tokens.prompt }} prompt ({{ tokens.cached }} cached) · {{ tokens.completion }} completion · {{ tokens.ids }} token ids · {{ tokens.logprobs }} logprobs</dd>
</dl>
{% for s in steps %}
<section class="step" id="step-{{ s.step }}">
 <div class="shot" data-screen="{{ s.screen[0] }}x{{ s.screen[1] }}">
  {% if s.image %}<img src="{{ s.image }}" alt="step {{ s.step }} screenshot" width="{{ s.image_size[0] }}" height="{{ s.image_size[1] }}"{% if loop.index > 2 %} loading="lazy"{% endif %}>
  <svg viewBox="0 0 {{ s.screen[0] }} {{ s.screen[1] }}" preserveAspectRatio="none" xmlns="http://www.w3.org/2000/svg">
  {% for m in s.marks %}
   {% if m.kind == "click" %}<g class="mark mark-click" data-action="{{ m.index }}" data-x="{{ m.x }}" data-y="{{ m.y }}">
    <circle cx="{{ m.x }}" cy="{{ m.y }}" r="{{ s.unit * 14 }}" fill="rgba(255,0,80,.25)" stroke="#ff0050" stroke-width="{{ s.unit * 3 }}"/>
    <circle cx="{{ m.x }}" cy="{{ m.y }}" r="{{ s.unit * 3 }}" fill="#ff0050"/>
    <text x="{{ m.x + s.unit * 18 }}" y="{{ m.y - s.unit * 12 }}" font-size="{{ s.unit * 20 }}" fill="#ff0050" stroke="#fff" stroke-width="{{ s.unit * 4 }}" paint-order="stroke" font-family="sans-serif" font-weight="bold">{{ m.index + 1 }}. {{ m.label }}</text></g>
   {% elif m.kind == "drag" %}<g class="mark mark-drag" data-action="{{ m.index }}" data-x="{{ m.x }}" data-y="{{ m.y }}">
    {% if m.x0 is not none %}<line x1="{{ m.x0 }}" y1="{{ m.y0 }}" x2="{{ m.x }}" y2="{{ m.y }}" stroke="#0969da" stroke-width="{{ s.unit * 4 }}" stroke-dasharray="{{ s.unit * 10 }} {{ s.unit * 6 }}"/>{% endif %}
    <circle cx="{{ m.x }}" cy="{{ m.y }}" r="{{ s.unit * 10 }}" fill="none" stroke="#0969da" stroke-width="{{ s.unit * 4 }}"/>
    <text x="{{ m.x + s.unit * 14 }}" y="{{ m.y - s.unit * 10 }}" font-size="{{ s.unit * 20 }}" fill="#0969da" stroke="#fff" stroke-width="{{ s.unit * 4 }}" paint-order="stroke" font-family="sans-serif" font-weight="bold">{{ m.index + 1 }}. drag</text></g>
   {% elif m.kind in ("scroll", "move") and m.x is not none %}<g class="mark mark-{{ m.kind }}" data-action="{{ m.index }}" data-x="{{ m.x }}" data-y="{{ m.y }}">
    <circle cx="{{ m.x }}" cy="{{ m.y }}" r="{{ s.unit * 8 }}" fill="none" stroke="#8250df" stroke-width="{{ s.unit * 3 }}"/>
    {% if m.kind == "scroll" %}<path d="M {{ m.x }} {{ m.y + (-1 if m.extra.up else 1) * s.unit * 50 }} l {{ -s.unit * 10 }} {{ (1 if m.extra.up else -1) * s.unit * 14 }} m {{ s.unit * 10 }} {{ (-1 if m.extra.up else 1) * s.unit * 14 }} l {{ s.unit * 10 }} {{ (1 if m.extra.up else -1) * s.unit * 14 }} M {{ m.x }} {{ m.y }} L {{ m.x }} {{ m.y + (-1 if m.extra.up else 1) * s.unit * 50 }}" stroke="#8250df" stroke-width="{{ s.unit * 4 }}" fill="none"/>{% endif %}
    <text x="{{ m.x + s.unit * 14 }}" y="{{ m.y }}" font-size="{{ s.unit * 20 }}" fill="#8250df" stroke="#fff" stroke-width="{{ s.unit * 4 }}" paint-order="stroke" font-family="sans-serif" font-weight="bold">{{ m.index + 1 }}. {{ m.label }}</text></g>
   {% endif %}
  {% endfor %}
  {% for m in s.labels %}<g class="mark mark-label" data-action="{{ m.index }}">
   <rect x="{{ s.unit * 8 }}" y="{{ s.screen[1] - s.unit * (34 * (s.labels|length - loop.index0)) - s.unit * 4 }}" width="{{ s.unit * (24 + 11.5 * (m.label|length + 4)) }}" height="{{ s.unit * 30 }}" rx="{{ s.unit * 5 }}" fill="rgba(255,214,0,.92)" stroke="#000" stroke-width="{{ s.unit }}"/>
   <text x="{{ s.unit * 18 }}" y="{{ s.screen[1] - s.unit * (34 * (s.labels|length - loop.index0)) + s.unit * 18 }}" font-size="{{ s.unit * 19 }}" font-family="monospace" fill="#000">{{ m.index + 1 }}. {{ m.label }}</text></g>
  {% endfor %}
  </svg>{% else %}<p class="muted">(no screenshot)</p>{% endif %}
 </div>
 <div class="side">
  <h3>step {{ s.step }}</h3>
  {% if s.parse_error %}<div class="parse-error">parse error: {{ s.parse_error }}</div>{% endif %}
  {% if s.reasoning %}<div class="muted">reasoning</div><pre class="reasoning">{{ s.reasoning }}</pre>{% endif %}
  <div class="muted">response</div><pre class="response">{{ s.content }}</pre>
  {% if s.action_text %}<div class="muted">action</div><pre class="action-text">{{ s.action_text }}</pre>{% endif %}
  <table class="actions"><tr><th>#</th><th>action</th><th class="num">screen</th><th class="num">act [s]</th><th class="num">wait [s]</th><th class="num">ready [s]</th></tr>
  {% for a in s.actions %}<tr><td>{{ loop.index }}</td><td>{{ a.what }}</td><td class="num">{{ a.screen }}</td><td class="num">{{ fmt(a.act_s, 3) }}</td><td class="num">{{ fmt(a.wait_s, 3) }}</td><td class="num">{{ fmt(a.ready_s, 3) }}</td></tr>{% endfor %}
  </table>
  <p class="muted">model call {{ fmt(s.model_s, 3) }} s ({{ s.attempts }} attempt{{ "s" if s.attempts != 1 }}) · screenshot {{ fmt(s.obs_s, 3) }} s ·
  tokens: {{ s.prompt_tokens }} prompt, {{ s.cached_tokens if s.cached_tokens is not none else "?" }} cached, {{ s.completion_tokens }} completion ·
  {{ s.n_ids }} token ids · {{ s.n_logprobs }} logprobs{% if s.mean_logprob is not none %} (mean {{ fmt(s.mean_logprob, 3) }}){% endif %} · finish {{ s.finish or "?" }}</p>
 </div>
</section>
{% endfor %}
{% endblock %}
{% block script %}<script>
"use strict";
// Where each mark landed on the laid-out screenshot, as fractions of the image box
// (data-placed="fx,fy"): what a reader sees, and what the report's test checks.
function place() {
  for (const shot of document.querySelectorAll(".shot")) {
    const img = shot.querySelector("img");
    if (!img || !img.complete || !img.naturalWidth) continue;
    const box = img.getBoundingClientRect();
    for (const g of shot.querySelectorAll(".mark-click, .mark-drag, .mark-scroll, .mark-move")) {
      const c = g.querySelector("circle").getBoundingClientRect();
      const fx = (c.left + c.width / 2 - box.left) / box.width, fy = (c.top + c.height / 2 - box.top) / box.height;
      g.setAttribute("data-placed", fx.toFixed(4) + "," + fy.toFixed(4));
    }
  }
}
window.addEventListener("load", place);
for (const img of document.querySelectorAll(".shot img")) img.addEventListener("load", place);
</script>{% endblock %}
"""

GROUP = """{% extends "base" %}
{% block title %}group {{ group }} · {{ run.version }}{% endblock %}
{% block header %}<h1>GRPO group {{ group }} · {{ task }}</h1>
<div><a href="{{ index }}">all rollouts</a> · policy {{ run.version }} · {{ attempts|length }} executions ·
reward mean {{ fmt(mean, 3) }}{% if flat %} · <b>no reward variance: no learning signal</b>{% endif %}</div>{% endblock %}
{% block main %}
{% if instruction %}<p><b>Instruction:</b> {{ instruction }}</p>{% endif %}
<div class="attempts">
{% for a in attempts %}
 <div class="attempt" data-rollout="{{ a.id }}">
  <div><a href="{{ a.page }}"><b>attempt {{ a.attempt }}</b>{% if a.execution %} (exec {{ a.execution }}){% endif %}</a>
   <span class="badge status-{{ a.status }}">{{ a.status }}</span></div>
  <div>reward <b class="{{ 'r1' if (a.reward or 0) > 0 else 'r0' }}">{{ fmt(a.reward, 2) }}</b> · advantage {{ fmt(a.advantage, 3) }} · {{ a.steps }} steps · {{ fmt(a.seconds, 1) }} s attempt time</div>
  {% if a.first %}<div class="muted">first screen</div><a href="{{ a.page }}"><img class="first" src="{{ a.first }}" alt="first screenshot" loading="lazy"></a>{% endif %}
  {% if a.last %}<div class="muted">last screen</div><a href="{{ a.page }}#step-{{ a.last_step }}"><img class="last" src="{{ a.last }}" alt="last screenshot" loading="lazy"></a>{% endif %}
  {% if a.last_action %}<div class="muted">last action</div><pre>{{ a.last_action }}</pre>{% endif %}
 </div>
{% endfor %}
</div>
{% endblock %}
"""


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, int | float):
        return f"{value:.{digits}f}"
    return str(value)


def environment() -> jinja2.Environment:
    """The templates (``base``, ``index``, ``rollout``, ``group``), autoescaped."""
    env = jinja2.Environment(
        loader=jinja2.DictLoader(
            {"base": BASE, "index": INDEX, "rollout": ROLLOUT, "group": GROUP}
        ),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals.update(css=CSS, fmt=_fmt)
    return env
