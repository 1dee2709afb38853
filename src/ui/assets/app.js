// The dashboard's shell: the key form, the live event connection and the page router.
import { keys, request, readEvents, HttpError } from '/ui/api.js';
import { h, fill } from '/ui/dom.js';
import * as models from '/ui/models.js';
import * as activity from '/ui/activity.js';
import * as perf from '/ui/performance.js';
import * as logs from '/ui/logs.js';
import * as playground from '/ui/playground.js';
import * as events from '/ui/events.js';

const PAGES = { models, activity, performance: perf, logs, playground, events };
const main = document.getElementById('main');
const nav = document.getElementById('nav');
const conn = document.getElementById('conn');

/**
 * One `/api/events` connection shared by every page. fetch() rather than EventSource, because
 * EventSource cannot send the key header. Reconnects with a growing pause; keeps the last few
 * hundred events so the events page has a history.
 */
class Hub {
  constructor() { this.listeners = new Map(); this.latest = new Map(); this.recent = []; this.abort = null; }

  on(type, fn) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(fn);
    if (type !== '*' && this.latest.has(type)) fn(this.latest.get(type));
    return () => this.listeners.get(type).delete(fn);
  }

  emit(type, data) {
    this.latest.set(type, data);
    const entry = { at: new Date(), type, data };
    this.recent.push(entry);
    if (this.recent.length > 500) this.recent.shift();
    for (const fn of this.listeners.get(type) || []) fn(data);
    for (const fn of this.listeners.get('*') || []) fn(entry);
  }

  async start() {
    this.abort = new AbortController();
    const { signal } = this.abort;
    let pause = 500;
    while (!signal.aborted) {
      try {
        const resp = await request('GET', '/api/events', { signal, accept: 'text/event-stream' });
        conn.textContent = '● live';
        pause = 500;
        await readEvents(resp, ({ data }) => {
          const msg = JSON.parse(data);
          this.emit(msg.type, JSON.parse(msg.data));
        });
      } catch (err) {
        if (signal.aborted || (err instanceof HttpError && err.status === 401)) return;
      }
      conn.textContent = '○ reconnecting…';
      await new Promise((r) => setTimeout(r, pause));
      pause = Math.min(pause * 2, 10000);
    }
  }

  stop() { this.abort?.abort(); conn.textContent = ''; }
}

let hub = null;
let unmount = null;

function route() {
  const parts = location.pathname.replace(/^\/ui\/?/, '').split('/').filter(Boolean).map(decodeURIComponent);
  const name = parts[0] || 'models';
  return { name, rest: parts.slice(1), page: PAGES[name] };
}

function render() {
  if (unmount) unmount();
  unmount = null;
  const { name, rest, page } = route();
  for (const a of nav.querySelectorAll('a')) {
    if (a.dataset.page === name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!page) {
    fill(main, h('h1', {}, 'Page not found'), h('a', { href: '/ui/' }, 'Back to the models'));
    return;
  }
  document.title = `corral · ${name}`;
  unmount = page.mount(main, { hub, rest, navigate }) || null;
}

export function navigate(path) {
  history.pushState(null, '', path);
  render();
  main.focus({ preventScroll: true });
}

document.addEventListener('click', (e) => {
  const a = e.target.closest('a[href^="/ui/"]');
  if (!a || a.target || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
  e.preventDefault();
  navigate(a.getAttribute('href'));
});
window.addEventListener('popstate', render);
// A browser keeps at most six connections to a host, and a left page's streams would otherwise
// hold theirs open: ending them as the page goes keeps a few reloads from starving the next page.
window.addEventListener('pagehide', stopApp);
window.addEventListener('pageshow', (e) => { if (e.persisted) location.reload(); });
window.addEventListener('corral:unauthorized', () => {
  // also when keys were added by a reload after this page loaded
  if (!hub) return;
  keys.forget();
  showKeyForm('The key was refused. Enter it again.');
});

function stopApp() {
  if (unmount) unmount();
  unmount = null;
  hub?.stop();
  hub = null;
  nav.hidden = true;
}

function startApp() {
  nav.hidden = false;
  hub = new Hub();
  hub.start();
  render();
}

/** With keys configured nothing but this form shows until a key with the admin scope is given. */
function showKeyForm(message = '') {
  stopApp();
  const input = h('input', { type: 'password', id: 'api-key', autocomplete: 'current-password', required: true });
  const status = h('p', { class: 'status error', role: 'alert' }, message);
  const form = h('form', { class: 'panel keyform', 'aria-label': 'API key', onsubmit: (e) => { e.preventDefault(); tryKey(input.value.trim(), status); } },
    h('h1', {}, 'corral'),
    h('label', { for: 'api-key' }, 'API key (admin scope)'),
    input,
    h('button', { class: 'primary', type: 'submit' }, 'Open the dashboard'),
    status);
  fill(main, form);
  input.focus();
}

async function tryKey(key, status) {
  if (!key) return;
  keys.set(key);
  try {
    await request('GET', '/api/version');
    fill(status);
    startApp();
  } catch (err) {
    keys.forget();
    fill(status, err.status === 403 ? 'That key lacks the admin scope.' : 'That key is not accepted.');
  }
}

if (keys.required() && !keys.get()) showKeyForm();
else startApp();
