// Requests to corral. The key, when the server wants one, lives in sessionStorage and travels in
// the Authorization header only, never in a URL.

const KEY = 'corral.key';

export const keys = {
  required: () => document.body.dataset.keys === 'required',
  get: () => sessionStorage.getItem(KEY) || '',
  set: (k) => sessionStorage.setItem(KEY, k),
  forget: () => sessionStorage.removeItem(KEY),
};

export function headers(extra = {}) {
  const out = { ...extra };
  const k = keys.get();
  if (k) out.Authorization = `Bearer ${k}`;
  return out;
}

export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** A fetch with the key; a non-2xx answer throws with the server's own message. */
export async function request(method, path, { body, signal, accept = 'application/json' } = {}) {
  const init = { method, signal, headers: headers({ Accept: accept }) };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  const resp = await fetch(path, init);
  if (!resp.ok) {
    const text = await resp.text();
    let message = text.trim() || resp.statusText;
    try { message = JSON.parse(text).error.message || message; } catch { /* plain text */ }
    if (resp.status === 401) window.dispatchEvent(new CustomEvent('corral:unauthorized'));
    throw new HttpError(resp.status, message);
  }
  return resp;
}

export const getJSON = async (path, opts) => (await request('GET', path, opts)).json();
export const post = (path, body, opts) => request('POST', path, { ...opts, body });

/** Calls onText with each decoded piece of a streamed body until it ends or `signal` aborts. */
export async function readText(resp, onText) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    onText(value);
  }
}

/** Splits a server-sent event stream into events: calls onEvent({event, data}) for each. */
export async function readEvents(resp, onEvent) {
  let buffer = '';
  await readText(resp, (text) => {
    buffer += text.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const ev = { event: 'message', data: [] };
      for (const line of block.split('\n')) {
        const colon = line.indexOf(':');
        if (colon <= 0) continue;
        const field = line.slice(0, colon);
        const value = line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') ev.event = value;
        else if (field === 'data') ev.data.push(value);
      }
      if (ev.data.length) onEvent({ event: ev.event, data: ev.data.join('\n') });
    }
  });
}
