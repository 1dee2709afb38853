// Performance: the last hour of `/api/performance` as small line charts drawn in inline SVG (no
// chart library): per model requests/s, time to first token, output tokens/s and queue depth; the
// machine's CPU, RAM and GPUs. The one page that polls: every `performance.every` seconds.
import { getJSON } from '/ui/api.js';
import { h, fill, time } from '/ui/dom.js';

// SVG's namespace, from the page's own (no address of another origin is written in the assets).
const SVG = document.documentElement.namespaceURI.replace('1999/xhtml', '2000/svg');
const W = 600, H = 140;
const WINDOWS = [[300, 'last 5 minutes'], [900, 'last 15 minutes'], [3600, 'last hour']];

const MODEL_CHARTS = [
  ['requests_per_second', 'Requests per second', (v) => v.toFixed(2)],
  ['ttft_p50_ms', 'Time to first token, median (ms)', (v) => v.toFixed(0)],
  ['tokens_per_second', 'Output tokens per second', (v) => v.toFixed(1)],
  ['queue_depth', 'Queue depth', (v) => v.toFixed(0)],
];

function svg(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

/**
 * One chart: `series` is [{name, points: [[ms, value]]}] over [from, to]. The figure is focusable
 * and its label reads the latest values, so the numbers reach a keyboard and a screen reader too.
 */
function chart(title, series, { from, to, format, max }) {
  const top = Math.max(max || 0, ...series.flatMap((s) => s.points.map(([, v]) => v)), 1e-9);
  const x = (t) => ((t - from) / Math.max(1, to - from)) * W;
  const y = (v) => H - (v / top) * (H - 4) - 2;
  const plot = svg('svg', { viewBox: `0 0 ${W} ${H}`, 'aria-hidden': 'true', focusable: 'false' });
  plot.append(svg('path', { class: 'axis', d: `M0 ${H - 0.5}H${W}` }));
  series.forEach((s, i) => {
    if (!s.points.length) return;
    let d = s.points.map(([t, v], j) => `${j ? 'L' : 'M'}${x(t).toFixed(1)} ${y(v).toFixed(1)}`).join('');
    if (s.points.length === 1) d += 'h2';
    plot.append(svg('path', { class: `line s${i % 6}`, d }));
  });
  const latest = series.map((s) => {
    const last = s.points[s.points.length - 1];
    return `${s.name}: ${last ? format(last[1]) : '–'}`;
  });
  return h('figure', { class: 'chart', tabindex: '0', 'aria-label': `${title}. Latest: ${latest.join(', ')}` },
    h('figcaption', {}, h('span', {}, title), h('span', { class: 'muted small' }, `max ${format(top)}`)),
    plot,
    h('div', { class: 'span muted small' }, h('span', {}, `−${Math.round((to - from) / 60000)} min`), h('span', {}, 'now')),
    h('ul', { class: 'keys small' }, series.map((s, i) => h('li', { class: `s${i % 6}` }, latest[i]))));
}

const ms = (iso) => new Date(iso).getTime();

function modelCharts(models, range) {
  const names = Object.keys(models);
  if (!names.length) return h('p', { class: 'empty' }, 'No model requests in this window.');
  return h('div', { class: 'charts' }, MODEL_CHARTS.map(([field, title, format]) => chart(title,
    names.map((name) => ({ name, points: models[name].filter((p) => p[field] !== null).map((p) => [ms(p.timestamp), p[field]]) })),
    { ...range, format })));
}

function systemCharts(sys, gpus, range) {
  const pts = (list, f) => list.map((p) => [ms(p.timestamp), f(p)]);
  const total = sys.length ? sys[sys.length - 1].mem_total_mb : 0;
  const out = [
    chart('CPU busy (%)', [{ name: 'all cores', points: pts(sys, (p) => p.cpu_util_pct ?? 0) }],
      { ...range, format: (v) => v.toFixed(0), max: 100 }),
    chart('RAM used (MiB)', [{ name: 'used', points: pts(sys, (p) => p.mem_used_mb) }],
      { ...range, format: (v) => v.toFixed(0), max: total }),
  ];
  const ids = [...new Set(gpus.map((g) => g.id))];
  if (ids.length) {
    const per = (f) => ids.map((id) => ({ name: `GPU ${id}`, points: pts(gpus.filter((g) => g.id === id), f) }));
    out.push(chart('GPU busy (%)', per((g) => g.gpu_util_pct), { ...range, format: (v) => v.toFixed(0), max: 100 }));
    const most = Math.max(...gpus.map((g) => g.mem_total_mb));
    out.push(chart('GPU memory used (MiB)', per((g) => g.mem_used_mb), { ...range, format: (v) => v.toFixed(0), max: most }));
  }
  return h('div', { class: 'charts' }, out);
}

export function mount(main) {
  let span = 900, paused = false, timer = null, gone = false;
  const status = h('p', { class: 'muted small', role: 'status', id: 'perf-status' }, 'Loading…');
  const models = h('div', { id: 'perf-models' });
  const system = h('div', { id: 'perf-system' });
  const windowSel = h('select', { id: 'perf-window', onchange: () => { span = Number(windowSel.value); load(); } },
    WINDOWS.map(([s, label]) => h('option', { value: s, selected: s === span }, label)));
  const pause = h('button', { id: 'perf-pause', 'aria-pressed': 'false', onclick: () => {
    paused = !paused;
    pause.setAttribute('aria-pressed', String(paused));
    fill(pause, paused ? 'Resume' : 'Pause');
    if (!paused) load();
  } }, 'Pause');

  async function load() {
    clearTimeout(timer);
    let every = 5;
    try {
      const after = new Date(Date.now() - span * 1000).toISOString();
      const perf = await getJSON(`/api/performance?after=${encodeURIComponent(after)}`);
      if (gone) return;
      every = perf.every_seconds || every;
      const range = { from: Date.now() - span * 1000, to: Date.now() };
      // a redraw replaces the charts: the one a keyboard user is on keeps the focus
      const focused = [...main.querySelectorAll('figure.chart')].indexOf(document.activeElement);
      fill(models, modelCharts(perf.models, range));
      fill(system, systemCharts(perf.sys_stats, perf.gpu_stats, range));
      if (focused >= 0) main.querySelectorAll('figure.chart')[focused]?.focus();
      fill(status, `Updated ${time(new Date().toISOString())}, every ${every} s.`);
    } catch (err) {
      if (gone) return;
      fill(status, err.status === 503 ? 'Performance sampling is off (performance.disabled).' : err.message);
    }
    if (!paused && !gone) timer = setTimeout(load, every * 1000);
  }

  fill(main,
    h('div', { class: 'toolbar' }, h('h1', { class: 'grow' }, 'Performance'),
      h('label', { for: 'perf-window' }, 'Show'), windowSel, pause),
    status,
    h('section', { class: 'panel', 'aria-label': 'Models' }, h('h2', {}, 'Models'), models),
    h('section', { class: 'panel', 'aria-label': 'System' }, h('h2', {}, 'System'), system));
  load();
  return () => { gone = true; clearTimeout(timer); };
}
