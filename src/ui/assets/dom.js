// Building the page from data without ever parsing it as HTML: text goes in as text nodes.

/** h('td', {class: 'num', onclick: fn}, 'text', childNode) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (name === 'class') el.className = value;
    else if (name === 'value') el.value = value;
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export function bytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

export function seconds(s) {
  if (s === null || s === undefined) return '–';
  if (s < 60) return `${s.toFixed(1)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

export function time(iso) {
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleTimeString();
}

/** A horizontal bar: each part is [fraction 0..1, class]. */
export function bar(parts, label) {
  return h('div', { class: 'bar', role: 'img', 'aria-label': label },
    parts.map(([fraction, cls]) => {
      const fillEl = h('div', { class: `fill ${cls}` });
      fillEl.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
      return fillEl;
    }));
}

/** Calls fn at most once per `ms`, with the latest arguments, and never twice at once. */
export function throttle(fn, ms) {
  let timer = null, running = false, again = false;
  const run = async () => {
    timer = null;
    if (running) { again = true; return; }
    running = true;
    try { await fn(); } finally {
      running = false;
      if (again) { again = false; schedule(); }
    }
  };
  const schedule = () => { if (!timer) timer = setTimeout(run, ms); };
  schedule.now = run;
  schedule.cancel = () => { clearTimeout(timer); timer = null; };
  return schedule;
}
