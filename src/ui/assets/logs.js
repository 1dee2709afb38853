// Logs: corral's own output and each engine's, live, with pause, search and follow.
import { request, readText } from '/ui/api.js';
import { h, fill } from '/ui/dom.js';

/** Characters of log kept in the page; older text is dropped as new text comes. */
const KEEP = 200000;

/**
 * One live log (`/logs/stream/<source>`): the history, then every new write. While paused, text
 * is still received but the view stays still; search shows only the lines that match.
 */
export class LogView {
  constructor(source, { short = false } = {}) {
    this.source = source;
    this.text = '';
    this.paused = false;
    this.follow = h('input', { type: 'checkbox', checked: true, id: `follow-${source}` });
    this.search = h('input', { type: 'search', placeholder: 'Search', 'aria-label': 'Search the log', oninput: () => this.draw() });
    this.pause = h('button', { 'aria-pressed': 'false', onclick: () => this.togglePause() }, 'Pause');
    this.out = h('pre', { class: short ? 'log short' : 'log', tabindex: '0', 'aria-label': `log of ${source}`, 'data-log': source });
    this.status = h('span', { class: 'small muted', role: 'status' });
    this.element = h('div', {},
      h('div', { class: 'toolbar' }, this.search, this.pause,
        h('label', {}, this.follow, ' Follow'),
        h('button', { onclick: () => { this.text = ''; this.draw(); } }, 'Clear'),
        this.status),
      this.out);
    this.pending = false;
  }

  async start() {
    this.abort = new AbortController();
    // a config reload ends the stream (its keys and masks may have changed): it is opened again,
    // and its history then stands for the text so far
    while (!this.abort.signal.aborted) {
      try {
        const resp = await request('GET', `/logs/stream/${encodeURIComponent(this.source)}`, { signal: this.abort.signal, accept: 'text/plain' });
        fill(this.status, 'live');
        let fresh = true;
        await readText(resp, (t) => {
          if (fresh) { this.text = ''; fresh = false; }
          this.add(t);
        });
        fill(this.status, 'reconnecting…');
      } catch (err) {
        if (!this.abort.signal.aborted) fill(this.status, `not available: ${err.message}`);
        return;
      }
      await new Promise((done) => setTimeout(done, 1000));
    }
  }

  stop() { this.abort?.abort(); }

  add(t) {
    this.text += t;
    if (this.text.length > KEEP) this.text = this.text.slice(this.text.length - KEEP);
    if (!this.paused && !this.pending) {
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.draw(); });
    }
  }

  togglePause() {
    this.paused = !this.paused;
    this.pause.setAttribute('aria-pressed', String(this.paused));
    fill(this.pause, this.paused ? 'Resume' : 'Pause');
    if (!this.paused) this.draw();
  }

  draw() {
    const term = this.search.value.trim().toLowerCase();
    if (!term) {
      this.out.textContent = this.text;
    } else {
      const lines = this.text.split('\n').filter((l) => l.toLowerCase().includes(term));
      fill(this.out, lines.map((l) => [highlight(l, term), '\n']));
    }
    if (this.follow.checked) this.out.scrollTop = this.out.scrollHeight;
  }
}

function highlight(line, term) {
  const parts = [];
  const lower = line.toLowerCase();
  let at = 0, hit;
  while ((hit = lower.indexOf(term, at)) >= 0) {
    parts.push(line.slice(at, hit), h('mark', {}, line.slice(hit, hit + term.length)));
    at = hit + term.length;
  }
  parts.push(line.slice(at));
  return parts;
}

export function mount(main, { hub, rest }) {
  const source = rest[0] || 'proxy';
  const picker = h('select', { id: 'log-source', 'aria-label': 'Log source', onchange: () => {
    history.replaceState(null, '', `/ui/logs/${encodeURIComponent(picker.value)}`);
    view.stop();
    view = new LogView(picker.value);
    fill(holder, view.element);
    view.start();
  } });
  const options = (ids) => {
    const known = [['proxy', 'corral'], ['upstream', 'all engines'], ...ids.map((id) => [id, id])];
    if (!known.some(([v]) => v === source)) known.push([source, source]);
    const current = picker.value || source;
    fill(picker, known.map(([v, label]) => h('option', { value: v }, label)));
    picker.value = current;
  };
  options([]);
  const off = hub.on('modelStatus', (list) => options(list.filter((m) => !m.peerID).map((m) => m.id)));
  let view = new LogView(source);
  const holder = h('div', {}, view.element);
  fill(main, h('div', { class: 'toolbar' }, h('h1', { class: 'grow' }, 'Logs'), h('label', { for: 'log-source' }, 'Source '), picker),
    h('section', { class: 'panel' }, holder));
  view.start();
  return () => { off(); view.stop(); };
}
