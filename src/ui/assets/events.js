// Events: what `/api/events` sends, live: model states, log lines, requests in flight, activity.
import { h, fill } from '/ui/dom.js';

const KEEP = 300;
const TYPES = ['modelStatus', 'logData', 'inflight', 'activity', 'profileChanged', 'uiConfig'];

function summary(type, data) {
  if (type === 'modelStatus') return data.map((m) => `${m.id}: ${m.state}`).join(', ');
  if (type === 'logData') return `[${data.source}] ${data.data.trimEnd().split('\n').slice(-3).join(' ⏎ ')}`;
  const text = JSON.stringify(data);
  return text.length > 300 ? `${text.slice(0, 300)}…` : text;
}

export function mount(main, { hub }) {
  const shown = new Set(TYPES.filter((t) => t !== 'logData'));
  let paused = false;
  const list = h('tbody', { id: 'event-list' });
  const row = (e) => h('tr', { 'data-type': e.type },
    h('td', { class: 'small muted' }, e.at.toLocaleTimeString()),
    h('td', {}, h('span', { class: 'badge' }, e.type)),
    h('td', { class: 'small' }, summary(e.type, e.data)));
  const redraw = () => fill(list, hub.recent.filter((e) => shown.has(e.type)).slice(-KEEP).reverse().map(row));
  const filters = TYPES.map((t) => h('label', {},
    h('input', { type: 'checkbox', checked: shown.has(t), onchange: (ev) => { if (ev.target.checked) shown.add(t); else shown.delete(t); redraw(); } }),
    ` ${t} `));
  const pause = h('button', { 'aria-pressed': 'false', onclick: () => {
    paused = !paused;
    pause.setAttribute('aria-pressed', String(paused));
    fill(pause, paused ? 'Resume' : 'Pause');
    if (!paused) redraw();
  } }, 'Pause');
  const off = hub.on('*', (e) => {
    if (paused || !shown.has(e.type)) return;
    list.prepend(row(e));
    while (list.children.length > KEEP) list.lastChild.remove();
  });
  fill(main,
    h('div', { class: 'toolbar' }, h('h1', { class: 'grow' }, 'Events'), filters, pause),
    h('section', { class: 'panel' }, h('table', {},
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Time'), h('th', { scope: 'col' }, 'Type'), h('th', { scope: 'col' }, 'What'))),
      list)));
  redraw();
  return off;
}
