// Models: every model and pool with its state, replicas, slots, queue, memory and load progress,
// with Load / Unload; and a details view per model. Redrawn from /api/state whenever the event
// stream says something changed, never on a timer of its own.
import { getJSON, post } from '/ui/api.js';
import { h, fill, bytes, seconds, bar, throttle } from '/ui/dom.js';
import { LogView } from '/ui/logs.js';
import { activityTable } from '/ui/activity.js';

// a sleeping engine keeps its process and wakes fast: above one stopping or stopped
const RANK = { ready: 4, starting: 3, sleeping: 2, stopping: 1, stopped: 0 };

/** A model's state is its best instance's: one ready replica makes the model ready. */
function overall(instances) {
  return instances.reduce((best, i) => (RANK[i.state] > RANK[best] ? i.state : best), 'stopped');
}

export function mount(main, { hub, rest }) {
  const view = { hub, state: null, fetchedAt: 0, status: h('p', { class: 'status', role: 'status' }) };
  const body = h('div');
  fill(main, body);
  const draw = () => {
    const focused = document.activeElement?.dataset?.focus;
    if (rest[0]) drawDetails(body, view, rest[0]);
    else drawList(body, view);
    if (focused) body.querySelector(`[data-focus="${CSS.escape(focused)}"]`)?.focus();
  };
  view.refresh = throttle(async () => {
    try {
      view.state = await getJSON('/api/state');
      view.fetchedAt = performance.now();
      draw();
    } catch (err) {
      fill(view.status, err.message);
      view.status.className = 'status error';
    }
  }, 200);
  view.act = (label, path) => action(view, label, path);
  const offStatus = hub.on('modelStatus', () => view.refresh());
  const offInflight = hub.on('inflight', () => view.refresh());
  // only a load in progress needs redrawing between events: its elapsed time moves
  const ticker = setInterval(() => {
    if (view.state?.instances.some((i) => i.state === 'starting')) draw();
  }, 1000);
  const detailsCleanup = () => view.logs?.stop();
  view.refresh.now();
  return () => { offStatus(); offInflight(); clearInterval(ticker); view.refresh.cancel(); detailsCleanup(); view.offActivity?.(); };
}

/** Runs a load or unload and reports how it went; the table itself follows from the events. */
async function action(view, label, path) {
  fill(view.status, `${label}…`);
  view.status.className = 'status';
  try {
    await post(path);
    fill(view.status, `${label}: done`);
  } catch (err) {
    fill(view.status, `${label}: ${err.message}`);
    view.status.className = 'status error';
  }
  view.refresh();
}

function rows(state) {
  const byId = new Map(state.instances.map((i) => [i.id, i]));
  const queueOf = (instances) => {
    const pools = new Set(instances.map((i) => i.pool).filter(Boolean));
    return state.pools.filter((p) => pools.has(p.id)).reduce((n, p) => n + p.queue, 0);
  };
  const out = state.models.map((m) => {
    const instances = m.instances.map((id) => byId.get(id)).filter(Boolean);
    return { id: m.id, title: m.name, note: m.description, instances, queue: queueOf(instances), model: m };
  });
  const modelIds = new Set(state.models.map((m) => m.id));
  for (const p of state.pools.filter((p) => !modelIds.has(p.id))) {
    const instances = p.members.map((id) => byId.get(id)).filter(Boolean);
    out.push({ id: p.id, title: 'pool', note: p.members.join(', '), instances, queue: p.queue });
  }
  return out;
}

function drawList(body, view) {
  const { state } = view;
  if (!state) return;
  const running = state.instances.filter((i) => i.state !== 'stopped').length;
  fill(body,
    h('div', { class: 'toolbar' },
      h('h1', { class: 'grow' }, 'Models'),
      h('span', { class: 'muted' }, `${state.models.length} models, ${running} instances running`),
      h('button', { class: 'danger', 'data-focus': 'unload-all', onclick: () => view.act('Unload all', '/api/models/unload') }, 'Unload all')),
    view.status,
    state.devices.length || hostShown(state.host) ? memoryPanel(state.devices, state.host) : null,
    h('section', { class: 'panel' }, modelsTable(view, rows(state))));
}

// Host memory earns a row once it is budgeted (hostMemory) or anything is charged there.
function hostShown(host) {
  return host && (host.limit != null || host.charged > 0);
}

function memoryPanel(devices, host) {
  return h('section', { class: 'panel', 'aria-label': 'Memory' },
    h('h2', {}, 'Memory'),
    h('p', { class: 'legend small muted' }, h('span', {}, 'charged'), h('span', { class: 'measured' }, 'measured by the engines')),
    devices.map((d) => {
      const usable = d.usable || 1;
      return h('div', { class: 'device' },
        h('strong', {}, d.name),
        bar([[d.charged / usable, d.charged > usable ? 'over' : ''], [d.measured / usable, 'measured']],
          `${d.name}: ${bytes(d.charged)} charged of ${bytes(d.usable)}`),
        h('span', { class: 'small' }, `${bytes(d.charged)} charged · ${bytes(d.measured)} measured · ${bytes(d.usable)} usable of ${bytes(d.capacity)}`));
    }),
    hostShown(host) ? hostRow(host) : null);
}

// What engines keep on the CPU and level-1 sleepers' weights, against hostMemory (else the host's total).
function hostRow(host) {
  const budget = host.limit ?? host.total ?? 1;
  const of = host.limit != null ? `hostMemory ${bytes(host.limit)}` : `${bytes(host.total)} in all`;
  return h('div', { class: 'device', 'data-host': '' },
    h('strong', {}, 'host'),
    bar([[host.charged / (budget || 1), host.charged > budget ? 'over' : '']], `host: ${bytes(host.charged)} charged of ${bytes(budget)}`),
    h('span', { class: 'small' }, `${bytes(host.charged)} charged · ${bytes(host.available)} available · ${of}`));
}

function modelsTable(view, list) {
  if (!list.length) return h('p', { class: 'empty' }, 'No models are configured.');
  return h('table', {},
    h('thead', {}, h('tr', {}, ['Model', 'State', 'Context', 'Replicas', 'Queue', 'Load', ''].map((t) => h('th', { scope: 'col', class: t === 'Queue' ? 'num' : null }, t)))),
    h('tbody', {}, list.map((r) => {
      const state = overall(r.instances);
      return h('tr', { 'data-model': r.id },
        h('td', {}, r.model ? h('a', { href: `/ui/models/${encodeURIComponent(r.id)}` }, r.id) : h('strong', {}, r.id),
          (r.title || r.note) ? h('div', { class: 'small muted' }, [r.title, r.note].filter(Boolean).join(' — ')) : null),
        h('td', { class: 'state', 'data-state': state }, badge(state, r.instances), lifecycle(r.model)),
        h('td', { class: 'context' }, context(r.model?.metadata)),
        h('td', {}, r.instances.map((i) => replica(i, r.instances.length > 1))),
        h('td', { class: 'num' }, String(r.queue)),
        h('td', {}, r.instances.filter((i) => i.state === 'starting').map((i) => (i.download ? download(i) : progress(view, i)))),
        h('td', {}, buttons(view, r.id, state)));
    })));
}

/** The context one request can use and the model's capabilities, as the model list tells them. */
function context(metadata) {
  if (!metadata) return null;
  const n = metadata.context;
  return [h('span', { 'data-context': n ?? '', title: 'tokens one request can use' }, n ? `${n.toLocaleString('en')} tokens` : 'unknown'),
    metadata.capabilities.length ? h('div', { class: 'small muted', 'data-capabilities': metadata.capabilities.join(' ') }, metadata.capabilities.join(', ').replaceAll('_', ' ')) : null];
}

function badge(state, instances) {
  const open = instances.some((i) => i.circuitOpen);
  const failures = Math.max(0, ...instances.map((i) => i.failures));
  return [h('span', { class: `badge ${state}` }, state),
    open ? h('span', { class: 'badge bad', title: 'crash-looping: held out for a minute' }, 'held out') : null,
    failures ? h('div', { class: 'small muted' }, `${failures} failures in a row`) : null];
}

/** The model's lifecycle status (pending, downloading, deploying, active, degraded, sleeping,
 * inactive, error), with the reason for an error or a degraded pool. */
function lifecycle(model) {
  if (!model?.status) return null;
  const text = model.reason ? `${model.status}: ${model.reason}` : model.status;
  return h('div', { class: 'small muted', 'data-lifecycle': model.status, title: text }, text);
}

/** A download of an instance's weights: bytes of total, rate and time left. */
function download(i) {
  const d = i.download;
  const fraction = d.total ? d.bytes / d.total : 0;
  const eta = d.eta_seconds != null ? `, ${seconds(d.eta_seconds)} left` : '';
  return h('div', { class: 'small', 'data-download': i.id },
    bar([[fraction, '']], `downloading ${d.file || i.id}`),
    `${d.file ? `${d.file}: ` : ''}${bytes(d.bytes)} of ${d.total ? bytes(d.total) : '?'} (${bytes(d.bytes_per_second)}/s${eta})`);
}

function replica(i, named) {
  const busy = i.slots - i.free;
  return h('div', { class: 'replica small' },
    named ? h('span', {}, i.id) : null,
    named ? h('span', { class: `badge ${i.state}` }, i.state) : null,
    i.state === 'ready' ? h('span', { title: 'slots busy / slots' }, `${busy}/${i.slots} slots busy, ${i.free} free`) : null,
    i.memory ? h('span', { class: 'muted' }, `${bytes(i.measured ?? i.memory)}${i.measured != null ? '' : ' (estimate)'}`) : null);
}

function progress(view, i) {
  if (i.loading?.progress != null) return reported(i);
  if (i.loadElapsed == null) return h('div', { class: 'small muted' }, 'starting…');
  const elapsed = i.loadElapsed + (performance.now() - view.fetchedAt) / 1000;
  const fraction = elapsed / (i.loadDeadline || 1);
  return h('div', { class: 'small' },
    bar([[fraction, fraction > 1 ? 'over' : '']], `loading ${i.id}`),
    `${seconds(elapsed)} of ${seconds(i.loadDeadline)} deadline`);
}

/** The progress the engine itself reports from its health check, with its message. */
function reported(i) {
  const { progress: fraction, message } = i.loading;
  return h('div', { class: 'small', 'data-loading': i.id },
    bar([[fraction, '']], `loading ${i.id}`),
    `${Math.round(fraction * 100)}%${message ? `: ${message}` : ''}`);
}

function buttons(view, id, state) {
  const path = encodeURIComponent(id);
  return h('div', { class: 'toolbar' },
    h('button', { 'data-focus': `load:${id}`, 'aria-label': `Load ${id}`, disabled: state === 'ready', onclick: () => view.act(`Load ${id}`, `/api/models/load/${path}`) }, 'Load'),
    h('button', { 'data-focus': `unload:${id}`, 'aria-label': `Unload ${id}`, disabled: state === 'stopped', onclick: () => view.act(`Unload ${id}`, `/api/models/unload/${path}`) }, 'Unload'));
}

function drawDetails(body, view, id) {
  const { state } = view;
  if (!state) return;
  const model = state.models.find((m) => m.id === id);
  if (!model) {
    fill(body, h('h1', {}, `No model ${id}`), h('a', { href: '/ui/models' }, 'All models'));
    return;
  }
  const instances = state.instances.filter((i) => i.model === id);
  if (!view.detail || view.detail.id !== id) view.detail = detailsSkeleton(view, model);
  const d = view.detail;
  fill(d.head, h('h1', { class: 'grow' }, model.id), h('span', { class: `badge ${overall(instances)}` }, overall(instances)),
    buttons(view, id, overall(instances)));
  fill(d.facts,
    fact('Name', model.name), fact('Description', model.description), fact('Aliases', model.aliases.join(', ')),
    fact('TTL', model.ttl ? `${model.ttl} s` : 'none'));
  fill(d.instances, instances.map((i) => h('div', { class: 'panel' },
    h('h2', {}, i.id, ' ', h('span', { class: `badge ${i.state}` }, i.state)),
    h('dl', { class: 'facts' },
      fact('Slots', i.state === 'ready' ? `${i.slots - i.free} busy of ${i.slots}` : '–'),
      fact('Memory', `${bytes(i.memory)} charged, ${i.measured == null ? 'not measured' : `${bytes(i.measured)} measured`}${i.devices.length ? ` on ${i.devices.join(', ')}` : ''}${i.host ? `; ${bytes(i.host)} in host memory` : ''}`),
      fact('Load deadline', seconds(i.loadDeadline)),
      fact('Failures', `${i.failures}${i.circuitOpen ? ' (held out)' : ''}`)),
    i.state === 'starting' ? progress(view, i) : null,
    h('h2', {}, 'Command'), h('pre', { class: 'cmd' }, i.cmd || ''))));
  if (body.firstChild !== d.root) fill(body, d.root);
}

function fact(name, value) {
  return [h('dt', {}, name), h('dd', {}, value || '–')];
}

/** The parts of the details view that are not redrawn: the live log and the activity. */
function detailsSkeleton(view, model) {
  view.logs?.stop();
  view.offActivity?.();
  view.logs = new LogView(model.id, { short: true });
  const activity = h('div');
  const loadActivity = throttle(async () => {
    try {
      const page = await getJSON(`/api/metrics/activity?model=${encodeURIComponent(model.id)}&limit=20`);
      fill(activity, activityTable(page.data));
    } catch (err) {
      fill(activity, h('p', { class: 'status error' }, err.message));
    }
  }, 1000);
  view.offActivity = view.hub.on('activity', () => loadActivity());
  loadActivity.now();
  const parts = { id: model.id, head: h('div', { class: 'toolbar' }), facts: h('dl', { class: 'facts' }), instances: h('div') };
  parts.root = h('div', {},
    h('p', {}, h('a', { href: '/ui/models' }, '← All models')),
    parts.head, view.status,
    h('section', { class: 'panel' }, parts.facts),
    parts.instances,
    h('section', { class: 'panel' }, h('h2', {}, 'Log'), view.logs.element),
    h('section', { class: 'panel' }, h('h2', {}, 'Recent requests'), activity));
  view.logs.start();
  return parts;
}
