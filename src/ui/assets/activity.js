// Activity: the request log (`/api/metrics/activity`), filtered by model, API key and status,
// sorted by any column, a page at a time; new rows appear as the event stream announces them.
import { getJSON } from '/ui/api.js';
import { h, fill, time, throttle } from '/ui/dom.js';

const COLUMNS = [
  ['id', 'ID', (r) => r.id, true],
  ['time', 'Time', (r) => time(r.timestamp)],
  ['model', 'Model', (r) => r.model],
  ['key', 'Key', (r) => r.key || '–'],
  ['req_path', 'Path', (r) => r.req_path],
  ['resp_status_code', 'Status', (r) => r.resp_status_code, true],
  ['prompt', 'Prompt tokens', (r) => r.tokens.input_tokens, true],
  ['generated', 'Generated', (r) => r.tokens.output_tokens, true],
  ['prompt_speed', 'Prompt tok/s', (r) => speed(r.tokens.prompt_per_second), true],
  ['gen_speed', 'Gen tok/s', (r) => speed(r.tokens.tokens_per_second), true],
  ['duration', 'Duration ms', (r) => r.duration_ms, true],
];

const speed = (v) => (typeof v !== 'number' || v < 0 ? '–' : v.toFixed(1));

/** A table of activity rows; `sort` ({by, order, onSort}) makes the headers sort buttons, and
 * `onCapture(id)`, when given, a button on each row whose request and response were captured. */
export function activityTable(rows, sort, onCapture) {
  if (!rows.length) return h('p', { class: 'empty' }, 'No requests yet.');
  // the key column only where keys are configured (rows then carry the key's name)
  const columns = COLUMNS.filter(([key]) => key !== 'key' || rows.some((r) => r.key));
  const head = columns.map(([key, label, , num]) => {
    const current = sort && sort.by === key;
    const ariaSort = current ? (sort.order === 'asc' ? 'ascending' : 'descending') : null;
    const content = sort
      ? h('button', { onclick: () => sort.onSort(key) }, label, current ? (sort.order === 'asc' ? ' ▲' : ' ▼') : '')
      : label;
    return h('th', { scope: 'col', class: num ? 'num' : null, 'aria-sort': ariaSort }, content);
  });
  return h('table', { class: 'activity' },
    h('thead', {}, h('tr', {}, head, h('th', { scope: 'col' }, 'Error'), onCapture ? h('th', { scope: 'col' }, 'Capture') : null)),
    h('tbody', {}, rows.map((r) => h('tr', { 'data-id': r.id, class: r.resp_status_code >= 400 ? 'failed' : null },
      columns.map(([key, , value, num]) => h('td', { class: num ? 'num' : null, 'data-col': key }, String(value(r)))),
      h('td', { class: 'small' }, r.error_msg || ''),
      onCapture ? h('td', {}, r.has_capture
        ? h('button', { 'data-capture': r.id, 'aria-label': `Show the capture of request ${r.id}`, onclick: () => onCapture(r.id) }, 'Show')
        : '') : null))));
}

/** Base64 bodies as text (bytes that are not UTF-8 shown as replacement characters). */
function decoded(b64) {
  if (!b64) return '';
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return new TextDecoder().decode(bytes);
}

/** One capture: the request and response headers and bodies, as text, never as HTML. */
function captureView(c) {
  const headers = (map) => Object.entries(map || {}).map(([k, v]) => `${k}: ${v}`).join('\n');
  const part = (title, hdrs, body, cut) => h('section', {},
    h('h3', {}, title, cut ? h('span', { class: 'small muted' }, ' (cut at the capture budget)') : null),
    h('pre', { class: 'headers' }, headers(hdrs)),
    h('pre', { class: 'body' }, decoded(body)));
  return h('div', { class: 'panel', id: 'capture', 'data-capture-id': c.id },
    h('h2', {}, `Capture of request ${c.id}`, h('span', { class: 'small muted' }, ` ${c.req_path || ''}`)),
    part('Request', c.req_headers, c.req_body, c.req_body_truncated),
    part('Response', c.resp_headers, c.resp_body, c.resp_body_truncated));
}

export function mount(main, { hub }) {
  const q = { model: '', key: '', status: '', limit: 50, page: 1, by: 'id', order: 'desc' };
  const model = h('select', { id: 'activity-model', onchange: () => { q.model = model.value; q.page = 1; load.now(); } });
  const key = h('select', { id: 'activity-key', hidden: true, onchange: () => { q.key = key.value; q.page = 1; load.now(); } });
  const keyLabel = h('label', { for: 'activity-key', hidden: true }, 'Key');
  const status = h('select', { id: 'activity-status', onchange: () => { q.status = status.value; draw(); } },
    [['', 'any status'], ['2', '2xx'], ['4', '4xx'], ['5', '5xx']].map(([v, l]) => h('option', { value: v }, l)));
  const limit = h('select', { id: 'activity-limit', onchange: () => { q.limit = Number(limit.value); q.page = 1; load.now(); } },
    [25, 50, 100, 500].map((n) => h('option', { value: n, selected: n === q.limit }, `${n} a page`)));
  const live = h('input', { type: 'checkbox', checked: true, id: 'activity-live' });
  const table = h('div');
  const pager = h('div', { class: 'toolbar' });
  const capture = h('div');
  const showCapture = async (id) => {
    try {
      fill(capture, captureView(await getJSON(`/api/captures/${id}`)));
    } catch (err) {
      fill(capture, h('p', { class: 'status error' }, `capture ${id}: ${err.message}`));
    }
  };
  let page = { data: [], total: 0, total_pages: 0 };

  /** The key filter offers every key the log has seen (`keys` of the answer), by name. */
  const drawKeys = (keys) => {
    fill(key, h('option', { value: '' }, 'all keys'), (keys || []).map((k) => h('option', { value: k }, k)));
    key.value = q.key;
    key.hidden = keyLabel.hidden = !keys;
  };
  const draw = () => {
    drawKeys(page.keys);
    const rows = page.data.filter((r) => !q.status || String(r.resp_status_code).startsWith(q.status));
    fill(table, activityTable(rows, { by: q.by, order: q.order, onSort: (key) => {
      q.order = q.by === key && q.order === 'desc' ? 'asc' : 'desc';
      q.by = key;
      load.now();
    } }, showCapture));
    fill(pager,
      h('button', { disabled: q.page <= 1, onclick: () => { q.page--; load.now(); } }, '← Newer'),
      h('span', { class: 'muted' }, `page ${q.page} of ${Math.max(1, page.total_pages)} · ${page.total} requests${q.status ? ' (status filter applies to this page)' : ''}`),
      h('button', { disabled: q.page >= page.total_pages, onclick: () => { q.page++; load.now(); } }, 'Older →'));
  };
  const load = throttle(async () => {
    const params = new URLSearchParams({ limit: q.limit, page: q.page, sort: q.by, order: q.order });
    if (q.model) params.append('model', q.model);
    if (q.key) params.append('key', q.key);
    try {
      page = await getJSON(`/api/metrics/activity?${params}`);
      draw();
    } catch (err) {
      fill(table, h('p', { class: 'status error' }, err.message));
    }
  }, 1000);
  const offModels = hub.on('modelStatus', (list) => {
    const current = model.value;
    fill(model, h('option', { value: '' }, 'all models'), list.filter((m) => !m.peerID).map((m) => h('option', { value: m.id }, m.id)));
    model.value = current;
  });
  const offActivity = hub.on('activity', () => { if (live.checked) load(); });
  fill(main,
    h('div', { class: 'toolbar' }, h('h1', { class: 'grow' }, 'Activity'),
      h('label', { for: 'activity-model' }, 'Model'), model,
      keyLabel, key,
      h('label', { for: 'activity-status' }, 'Status'), status, limit,
      h('label', {}, live, ' Live')),
    h('section', { class: 'panel' }, table, pager), capture);
  load.now();
  return () => { offModels(); offActivity(); load.cancel(); };
}
