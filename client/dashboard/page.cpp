#include "client/dashboard/page.hpp"

#include "client/dashboard/views.hpp"

namespace loco::dashboard {

const std::string& page_html() {
  static const std::string html = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>loco dashboard</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 0 1.5em 2em; color: #222; }
header { display: flex; gap: 1.5em; align-items: baseline; border-bottom: 1px solid #ccc; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.4em; } h3 { font-size: 1em; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }
th { border-bottom: 1px solid #aaa; } tr:nth-child(even) td { background: #f4f4f4; }
.state-alive, .state-running, .state-succeeded { color: #17702a; }
.reach-reverse, .reach-relayed { color: #8a5a00; }
.state-dead, .state-failed { color: #b3261e; } .state-left, .state-cancelled { color: #777; }
.bar { display: inline-block; width: 80px; height: 8px; background: #ddd; vertical-align: middle; }
.bar > span { display: block; height: 8px; background: #3b6fb6; }
#error { color: #b3261e; } #updated { color: #777; }
.charts { display: grid; grid-template-columns: repeat(2, minmax(300px, 1fr)); gap: 1em; }
figure { margin: 0; } figcaption { font-weight: 600; }
pre#log { max-height: 18em; overflow: auto; background: #f7f7f7; padding: 0.5em; }
tr.job { cursor: pointer; } tr.selected td { background: #dde7f5; }
</style>
<script src="/static/chart.js"></script>
<script src="/static/dashboard.js" defer></script>
</head>
<body>
<header><h1>loco</h1><span>head <b id="head">…</b></span><span id="updated"></span><span id="error"></span></header>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>node</th><th>address</th><th>host</th><th>state</th><th>reach</th><th>load</th><th>resources (used/total)</th><th>actors</th><th>up</th></tr></thead><tbody></tbody></table>
<h2>Actors</h2>
<table id="actors"><thead><tr><th>actor</th><th>name</th><th>class</th><th>node</th><th>state</th><th>GPUs</th><th>restarts</th></tr></thead><tbody></tbody></table>
<h2>Jobs</h2>
<table id="jobs"><thead><tr><th>job</th><th>name</th><th>state</th><th>round</th><th>loss</th><th>workers</th><th>message</th></tr></thead><tbody></tbody></table>
<section id="job" hidden>
<h2>Job <span id="job-id"></span> <span id="job-state"></span></h2>
<p>x axis <select id="xaxis"><option value="tokens">tokens</option><option value="time">wall time (s)</option></select>
<span id="job-summary"></span></p>
<div class="charts">
<figure><figcaption>Loss (train, validation)</figcaption><canvas id="chart-loss" data-points="0"></canvas></figure>
<figure><figcaption>Utilization (inner-step time / wall time)</figcaption><canvas id="chart-util" data-points="0"></canvas></figure>
<figure><figcaption>All-reduce bytes per worker, per round</figcaption><canvas id="chart-bytes" data-points="0"></canvas></figure>
<figure><figcaption>Members per round</figcaption><canvas id="chart-members" data-points="0"></canvas></figure>
<figure><figcaption>Per step: loss and gradient norm (mean over the round's workers)</figcaption><canvas id="chart-steps" data-points="0"></canvas></figure>
<figure><figcaption>Per step: learning rate and tokens/s (all workers)</figcaption><canvas id="chart-step-rate" data-points="0"></canvas></figure>
<figure><figcaption>Per step: model FLOPs utilization, model TFLOP/s (all workers) and device memory (GPU)</figcaption><canvas id="chart-step-device" data-points="0"></canvas></figure>
</div>
<h3>Timeline</h3>
<table id="timeline"><thead><tr><th>time</th><th>round</th><th>event</th><th></th></tr></thead><tbody></tbody></table>
<h3>Log</h3>
<pre id="log"></pre>
</section>
<h2>Cluster events</h2>
<pre id="events"></pre>
</body>
</html>
)html";
  return html;
}

const std::string& page_js() {
  // The keys of the API rows' fields come from the C++ tables (field_keys), set before the
  // script as FIELDS: the script names none of them itself.
  static const std::string js = "'use strict';\nconst FIELDS = " + field_keys().dump() + ";\n" +
                                R"js(
// A field of the API's rows by its key in FIELDS: R.loss (a report's, diloco/job/job_schema.hpp's
// schema::Report), S.lr (a step's, schema::Step), D.tokens (derived by the views). A name the
// server does not list is an error on the page, not an empty chart.
function names(keys) {
  return new Proxy(Object.fromEntries(keys.map(k => [k, k])), {get(known, k) {
    if (typeof k === 'string' && !(k in known)) throw new Error('no field "' + k + '" in FIELDS');
    return known[k];
  }});
}
const R = names(FIELDS.report), S = names(FIELDS.step), D = names(FIELDS.derived);

// The token comes after #token= in the URL that `loco dashboard` prints.
const params = new URLSearchParams(location.hash.slice(1));
const token = params.get('token') || '';
let selected = params.get('job') || '';
const charts = {};
const pollMs = 2000;

async function get(path) {
  const r = await fetch(path, {headers: token ? {Authorization: 'Bearer ' + token} : {}});
  if (!r.ok) throw new Error(path + ': ' + r.status + ' ' + (await r.text()));
  return r.json();
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells, attrs) {
  const tr = document.createElement('tr');
  for (const c of cells) tr.appendChild(c instanceof Node ? wrap(c) : el('td', c));
  for (const [k, v] of Object.entries(attrs || {})) tr.setAttribute(k, v);
  return tr;
}
function wrap(node) { const td = el('td'); td.appendChild(node); return td; }

function fill(tableId, rows) {
  const body = document.querySelector('#' + tableId + ' tbody');
  body.replaceChildren(...rows);
}

function bar(share) {
  const b = el('span', null, 'bar'), f = el('span');
  f.style.width = Math.round(100 * Math.min(1, share)) + '%';
  b.appendChild(f);
  b.title = Math.round(100 * share) + ' %';
  return b;
}

function ago(ms) {
  if (!ms) return '';
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 120 ? Math.round(s) + ' s' : s < 7200 ? Math.round(s / 60) + ' min' : Math.round(s / 3600) + ' h';
}

function fmt(v, digits) { return v === null || v === undefined ? '' : Number(v).toFixed(digits); }

function renderCluster(c) {
  document.getElementById('head').textContent = c.head;
  fill('nodes', c.nodes.map(n => row([
    n.id, n.address, n.hostname, el('span', n.state + (n.reason ? ' (' + n.reason + ')' : ''), 'state-' + n.state),
    el('span', n.reachability || 'direct', 'reach-' + (n.reachability || 'direct')),
    bar(n.load),
    Object.entries(n.resources).map(([k, r]) => k + '=' + r.used + '/' + r.total).join(', '),
    n.actors, ago(n.started_unix_ms)], {'data-node': n.id, 'data-state': n.state})));
  fill('actors', c.actors.map(a => row([
    a.id, a.name || '-', a.class, a.node, el('span', a.state, 'state-' + a.state),
    a.gpus.length ? a.gpus.join(',') : '-', a.restarts + '/' + a.max_restarts], {'data-actor': a.id})));
  document.getElementById('events').textContent = c.events.join('\n');
}

function renderJobs(jobs) {
  if (!selected && jobs.length) {
    const running = jobs.filter(j => j.state === 'running');
    const pick = (running.length ? running : jobs).reduce((a, b) => a.submitted_unix_ms >= b.submitted_unix_ms ? a : b);
    selected = pick.id;
  }
  fill('jobs', jobs.map(j => {
    const tr = row([j.id, j.name, el('span', j.state, 'state-' + j.state),
      j.round !== undefined ? j.round + '/' + j.rounds : '', fmt(j[R.loss], 4), j[R.workers] ?? '', j.message],
      {'data-job': j.id, 'class': 'job' + (j.id === selected ? ' selected' : '')});
    tr.addEventListener('click', () => { selected = j.id; poll(); });
    return tr;
  }));
}

function xOf(r, job) {
  if (document.getElementById('xaxis').value === 'time')
    return r[R.job_time] ?? (r.unix_ms - job.submitted_unix_ms) / 1000;
  return r[D.tokens] ?? r[R.inner_step] ?? r.round;
}

// A y axis: its title and, where the figure has a natural range, its bounds. Chart.js would
// otherwise fit the axis to the data, and a flat line (utilization 0.9683 every round, the same
// bytes each round) would fill the chart as if it were a trend.
const percentAxis = title => ({title: title + ' (%)', min: 0, max: 100});
const fromZero = title => ({title, min: 0});
const count = title => ({title, min: 0, integer: true});
const fitted = title => ({title});

function scale(axis, extra) {
  const s = {title: {display: true, text: axis.title}};
  if (axis.min !== undefined) s.min = axis.min;
  if (axis.max !== undefined) s.max = axis.max;
  if (axis.integer) s.ticks = {precision: 0};
  return Object.assign(s, extra || {});
}

// The axes as drawn, on the canvas, for tests and for people reading the DOM.
function describe(canvas, name, axis) {
  canvas.setAttribute('data-' + name + '-title', axis.title);
  for (const k of ['min', 'max'])
    if (axis[k] !== undefined) canvas.setAttribute('data-' + name + '-' + k, axis[k]);
}

function chart(id, datasets, y, xTitleFixed, y1) {
  const canvas = document.getElementById(id);
  canvas.setAttribute('data-points', datasets[0].data.length);
  describe(canvas, 'y', y);
  if (y1) describe(canvas, 'y1', y1);
  if (typeof Chart === 'undefined') return;  // chart.js not installed: the numbers are in the tables
  const xTitle = xTitleFixed || document.getElementById('xaxis').selectedOptions[0].textContent;
  if (!charts[id]) {
    charts[id] = new Chart(canvas, {
      type: 'line',
      data: {datasets},
      options: {animation: false, parsing: false, spanGaps: true,
        scales: Object.assign({x: {type: 'linear', title: {display: true, text: xTitle}}, y: scale(y)},
                 y1 ? {y1: scale(y1, {position: 'right', grid: {drawOnChartArea: false}})} : {})}});
  } else {
    charts[id].data.datasets = datasets;
    charts[id].options.scales.x.title.text = xTitle;
    charts[id].update();
  }
}

function renderJob(job) {
  document.getElementById('job').hidden = false;
  document.getElementById('job-id').textContent = job.id + ' (' + job.name + ')';
  const st = document.getElementById('job-state');
  st.textContent = job.state; st.className = 'state-' + job.state;
  const rs = job.rounds_done;
  // A figure's points, times `unit` (100: a fraction in percent; 1e-6: bytes in MB).
  const pts = (key, unit = 1) => rs.filter(r => r[key] !== null && r[key] !== undefined).map(r => ({x: xOf(r, job), y: unit * r[key]}));
  const last = rs.length ? rs[rs.length - 1] : null;
  document.getElementById('job-summary').textContent = last ?
    'round ' + last.round + '/' + job.rounds + ', loss ' + fmt(last[R.loss], 4) +
    (last[R.tokens_per_s] ? ', ' + Math.round(last[R.tokens_per_s]) + ' tokens/s' : '') : 'no round yet';
  chart('chart-loss', [
    {label: 'train', data: pts(R.loss), borderColor: '#3b6fb6', pointRadius: 2},
    {label: 'validation', data: pts(R.val_loss), borderColor: '#d9822b', pointRadius: 3}], fitted('loss'));
  chart('chart-util', [{label: 'utilization', data: pts(R.utilization, 100), borderColor: '#17702a'}], percentAxis('utilization'));
  chart('chart-bytes', [{label: 'MB', data: pts(D.round_bytes, 1e-6), borderColor: '#7a3bb6'}], fromZero('MB per worker'));
  chart('chart-members', [{label: 'members', data: pts(R.workers), borderColor: '#444', stepped: true}], count('workers'));
  const steps = job.steps || [];
  const sp = (key, unit = 1) => steps.filter(s => s[key] !== null && s[key] !== undefined).map(s => ({x: s.step, y: unit * s[key]}));
  chart('chart-steps', [
    {label: 'loss', data: sp(S.loss), borderColor: '#3b6fb6', pointRadius: 0, borderWidth: 1},
    {label: 'grad norm', data: sp(S.grad_norm), borderColor: '#b3261e', pointRadius: 0, borderWidth: 1, yAxisID: 'y1'}],
    fitted('loss'), 'inner step', fitted('grad norm'));
  chart('chart-step-rate', [
    {label: 'learning rate', data: sp(S.lr), borderColor: '#17702a', pointRadius: 0, borderWidth: 1},
    {label: 'tokens/s', data: sp(S.tokens_per_s), borderColor: '#7a3bb6', pointRadius: 0, borderWidth: 1, yAxisID: 'y1'}],
    fromZero('learning rate'), 'inner step', fromZero('tokens/s'));
  chart('chart-step-device', [
    {label: 'MFU (%)', data: sp(S.mfu, 100), borderColor: '#b3261e', pointRadius: 0, borderWidth: 1},
    {label: 'TFLOP/s', data: sp(S.tflops), borderColor: '#3b6fb6', pointRadius: 0, borderWidth: 1, yAxisID: 'y1'},
    {label: 'memory (GB)', data: sp(S.memory_gb), borderColor: '#444', pointRadius: 0, borderWidth: 1, yAxisID: 'y1'}],
    percentAxis('MFU'), 'inner step', fromZero('TFLOP/s, GB'));
  const t0 = job.submitted_unix_ms;
  fill('timeline', job.timeline.slice(-200).reverse().map(t => row(
    [t.unix_ms ? ((t.unix_ms - t0) / 1000).toFixed(1) + ' s' : '', t.round, t.kind, t.text], {'data-kind': t.kind})));
  const log = document.getElementById('log');
  log.textContent = job.log.slice(-300).map(l => l.line).join('\n');
}

// What the page holds of the selected job: each poll asks only for what came after the last
// answer's cursor, and a whole history comes again only when the job redid rounds ("full").
let held = null;
function merge(id, ans) {
  if (!held || held.id !== id || ans.full) held = {id, rounds_done: [], steps: [], timeline: [], log: []};
  const keep = {rounds_done: 10000, steps: 20000, timeline: 5000, log: 2000};
  for (const k in keep) held[k] = held[k].concat(ans[k]).slice(-keep[k]);
  held.cursor = ans.cursor;
  return Object.assign({}, ans, {rounds_done: held.rounds_done, steps: held.steps, timeline: held.timeline, log: held.log});
}

async function poll() {
  const err = document.getElementById('error');
  try {
    const [cluster, jobs] = await Promise.all([get('/api/cluster'), get('/api/jobs')]);
    renderCluster(cluster);
    renderJobs(jobs);
    if (selected) {
      const since = held && held.id === selected ? '?since=' + encodeURIComponent(held.cursor) : '';
      renderJob(merge(selected, await get('/api/jobs/' + encodeURIComponent(selected) + since)));
    }
    err.textContent = '';
    document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
    document.body.setAttribute('data-loaded', 'yes');
  } catch (e) {
    err.textContent = String(e.message || e);
  }
}

document.getElementById('xaxis').addEventListener('change', () => {
  for (const k of Object.keys(charts)) { charts[k].destroy(); delete charts[k]; }
  poll();
});
poll();
setInterval(poll, pollMs);
)js";
  return js;
}

}  // namespace loco::dashboard
