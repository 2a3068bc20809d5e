"""The dashboard's one page: HTML with inline CSS and JS, no build step and no external URL.

The script polls the JSON routes every 2 s (skills every 10 s and on search), builds tables with
textContent (nothing from a server is parsed as HTML) and places the charts, inline SVG the
dashboard draws with gpuyantra/report/live.py and escapes itself. The admin token, typed once,
stays in this tab's sessionStorage and goes out as `Authorization: Bearer`.
"""

from __future__ import annotations

from gpuyantra.report import CSS as REPORT_CSS

CSS = (
    REPORT_CSS
    + """
body{max-width:1300px}header{display:flex;justify-content:space-between;align-items:center;gap:1em;flex-wrap:wrap}
#sources li{list-style:none;margin:2px 0}#sources{padding:0}.ok::before{content:"\\25CF ";color:#1a7f37}
.bad::before{content:"\\25CF ";color:#c00}.bad{color:#a00}.charts{display:flex;flex-wrap:wrap;gap:1em}
.running{color:#1a7f37;font-weight:bold}.failed,.terminated,.timed_out{color:#a00}button{cursor:pointer}
#banner{display:none;background:#fee;border:1px solid #c00;padding:0.5em}#action{min-height:1.2em}
form input{margin-right:0.5em}"""
)

SCRIPT = r"""
"use strict";
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("gpuyantra-admin-token") || "";

function authHeaders(extra) {
  const h = Object.assign({}, extra || {});
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}

async function call(path, options) {
  options = options || {};
  const r = await fetch(path, Object.assign({cache: "no-store"}, options, {headers: authHeaders(options.headers)}));
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    const detail = body && typeof body.detail === "string" ? body.detail : "HTTP " + r.status;
    const err = new Error(detail); err.status = r.status; throw err;
  }
  return body;
}

function text(v, digits) {
  if (v === null || v === undefined || v === "") return "\u2013";
  if (typeof v === "number" && digits !== undefined) return v.toFixed(digits);
  return String(v);
}

function elapsed(s) {
  if (s === null || s === undefined) return "\u2013";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + sec + "s";
}

function targetText(t) {
  const iteration = t.iteration ? " (iteration " + t.iteration + ")" : "";
  const best = t.best_reward !== null && t.best_reward !== undefined ? ", best " + reward(t.best_reward) : "";
  return t.target + ": " + text(t.stage) + iteration + best;
}

function reward(r) { return r === null || r === undefined ? "\u2013" : (r > 0 ? "+" : "") + r; }

function fill(tableId, rows, columns, key) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren();
  for (const row of rows) {
    const tr = body.insertRow();
    if (key) tr.dataset.key = key(row);
    for (const col of columns) {
      const td = tr.insertCell();
      const v = col(row, td);
      if (v instanceof Node) td.appendChild(v); else td.textContent = v;
    }
  }
  $(tableId).style.display = rows.length ? "" : "none";
}

function showStatus(name, label, st) {
  let li = $("src-" + name);
  if (!li) { li = document.createElement("li"); li.id = "src-" + name; $("sources").appendChild(li); }
  li.className = st && st.ok ? "ok" : "bad";
  li.textContent = label + ": " + (st ? st.message : "no answer");
}

function banner(message) {
  $("banner").style.display = message ? "block" : "none";
  $("banner").textContent = message || "";
}

async function refreshCampaigns() {
  const data = await call("/api/campaigns");
  showStatus("temporal", "Temporal", data.status);
  fill("campaigns", data.campaigns, [
    (c) => c.id,
    (c, td) => { td.className = c.status; return c.status; },
    (c) => text(c.model),
    (c) => text(c.stage || c.progress_error) + (c.waiting ? " (" + c.waiting + ")" : ""),
    (c) => c.targets.map(targetText).join("; ") || "\u2013",
    (c) => reward(c.best_reward),
    (c) => text(c.deployed),
    (c) => elapsed(c.elapsed_s),
    (c) => c.started.replace("T", " "),
    (c) => reportLink(c),
  ], (c) => c.id);
  $("campaigns-empty").style.display = data.campaigns.length ? "none" : "";
}

async function refreshMetrics() {
  const data = await call("/api/metrics");
  showStatus("metrics", "Server metrics", data.status);
  $("chart-tokens").innerHTML = data.charts.tokens;
  $("chart-latency").innerHTML = data.charts.latency;
  const l = data.latest;
  $("latest").textContent = l ? "now: " + text(l.tokens_per_s, 1) + " tokens/s, " + text(l.active) + " active, "
    + text(l.waiting) + " waiting request(s)" : "no sample yet";
}

async function refreshKernels() {
  const data = await call("/api/kernels");
  showStatus("kernels", "Kernels", data.status);
  fill("kernels", data.active, [
    (k) => k.swap_id, (k) => k.op, (k) => text(k.module_class), (k) => text(k.modules), (k) => text(k.binding),
    (k) => text(k.calls), (k) => text(k.fallbacks),
    (k) => k.committed_at ? new Date(k.committed_at * 1000).toLocaleString() : "\u2013",
    (k) => rollbackButton(k),
  ], (k) => k.swap_id);
  $("kernels-empty").style.display = data.active.length ? "none" : "";
}

async function refreshSkills() {
  const q = new URLSearchParams({op: $("skill-op").value, hardware: $("skill-hw").value, q: $("skill-text").value});
  const data = await call("/api/skills?" + q.toString());
  showStatus("skills", "Skill library", data.status);
  fill("skills", data.skills, [
    (s) => s.op, (s) => s.hardware, (s) => text(s.module_class), (s) => s.fingerprint, (s) => text(s.reward),
    (s) => text(s.speedup_vs_eager, 2), (s) => text(s.pulls), (s) => text(s.mean_reward, 2),
    (s) => s.unpulled ? "\u221e (unpulled)" : text(s.ucb, 3), (s) => text(s.author), (s) => s.id.slice(0, 8),
  ]);
}

function reportLink(c) {
  if (c.status !== "completed") return "\u2013";
  const a = document.createElement("a");
  a.href = "/api/campaigns/" + encodeURIComponent(c.id) + "/report";
  a.textContent = "report";
  a.onclick = (ev) => { ev.preventDefault(); openReport(a.href, c.id); };
  return a;
}

// The report is fetched (so the token goes along where reading needs it) and shown in a new tab,
// opened on the click itself so no pop-up blocker stops it.
async function openReport(href, id) {
  const tab = window.open("", "_blank");
  if (!tab) { $("report-state").textContent = "The browser blocked the new tab: allow pop-ups for this page."; return; }
  tab.opener = null;
  try {
    const r = await fetch(href, {cache: "no-store", headers: authHeaders()});
    if (!r.ok) {
      let body = null;
      try { body = await r.json(); } catch (e) { body = null; }
      throw new Error(body && typeof body.detail === "string" ? body.detail : "HTTP " + r.status);
    }
    const url = URL.createObjectURL(new Blob([await r.text()], {type: "text/html"}));
    tab.location.href = url;
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    $("report-state").textContent = "Opened the report of " + id + " in a new tab.";
  } catch (e) {
    tab.close();
    $("report-state").textContent = "No report for " + id + ": " + e.message;
  }
}

function rollbackButton(k) {
  const b = document.createElement("button");
  b.textContent = "Roll back";
  b.onclick = () => rollback(k.swap_id, k.op);
  return b;
}

async function rollback(swapId, op) {
  if (!confirm("Roll back " + op + " (" + swapId + ")?")) return;
  if (!token) { $("action").textContent = "Type the admin token first."; $("token").focus(); return; }
  try {
    const answer = await call("/api/kernels/rollback", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({swap_id: swapId})});
    $("action").textContent = "Rolled back " + answer.rolled_back.map((r) => r.swap_id + " (" + r.op + ")").join(", ");
  } catch (e) {
    $("action").textContent = "Rollback refused: " + e.message;
  }
  guarded(refreshKernels)();
}

function guarded(step) {
  return async () => {
    try { await step(); banner(""); }
    catch (e) {
      if (e.status === 401 || e.status === 403) banner("Reading needs the admin token: " + e.message);
      else banner("The dashboard did not answer: " + e.message);
    }
  };
}

function tick() { for (const step of [refreshCampaigns, refreshMetrics, refreshKernels]) guarded(step)(); }

$("token-form").onsubmit = (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("gpuyantra-admin-token", token);
  $("token").value = "";
  $("token-state").textContent = token ? "token set for this tab" : "no token";
  tick(); guarded(refreshSkills)();
};
$("skill-form").onsubmit = (ev) => { ev.preventDefault(); guarded(refreshSkills)(); };
$("token-state").textContent = token ? "token set for this tab" : "no token";
tick(); guarded(refreshSkills)();
setInterval(tick, 2000);
setInterval(guarded(refreshSkills), 10000);
"""


def _table(table_id: str, headers: list[str]) -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    return f'<table id="{table_id}" style="display:none"><thead><tr>{head}</tr></thead><tbody></tbody></table>'


CAMPAIGNS_TABLE = _table(
    "campaigns", ["id", "status", "model", "stage", "targets", "best reward", "deployed", "elapsed", "started", ""]
)

SKILLS_TABLE = _table(
    "skills",
    [
        "op",
        "hardware",
        "module class",
        "fingerprint",
        "reward",
        "x eager",
        "pulls",
        "mean reward",
        "UCB1",
        "author",
        "id",
    ],
)

PAGE = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpuyantra dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{CSS}</style></head><body>
<header><h1>gpuyantra dashboard</h1>
<form id="token-form"><label>Admin token <input id="token" type="password" autocomplete="off"></label>
<button>Use</button> <span id="token-state" class="note"></span></form></header>
<div id="banner" role="alert"></div>
<ul id="sources"></ul>
<h2>Campaigns</h2>
<p id="campaigns-empty" class="note">No campaigns listed.</p>
{CAMPAIGNS_TABLE}
<p id="report-state" class="note"></p>
<h2>Served model</h2>
<p id="latest" class="note"></p>
<div class="charts"><div id="chart-tokens"></div><div id="chart-latency"></div></div>
<h2>Kernels swapped in</h2>
<p id="kernels-empty" class="note">None.</p>
{_table("kernels", ["swap id", "op", "module class", "modules", "binding", "calls", "fallbacks", "committed", ""])}
<p id="action" class="note"></p>
<h2>Skill library</h2>
<form id="skill-form"><input id="skill-op" placeholder="op"><input id="skill-hw" placeholder="hardware">
<input id="skill-text" placeholder="fingerprint text (e.g. memory-bound)" size="32"><button>Search</button></form>
{SKILLS_TABLE}
<script>{SCRIPT}</script>
</body></html>
"""
