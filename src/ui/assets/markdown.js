// A small Markdown renderer that builds DOM nodes from text: nothing the model writes is ever
// parsed as HTML. Covers what chat answers use: fenced code, headings, lists, paragraphs,
// `code`, **bold** and *italic*. Links stay plain text.
import { h } from '/ui/dom.js';

export function render(text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (/^```/.test(line)) {
      const body = [];
      for (i++; i < lines.length && !/^```/.test(lines[i]); i++) body.push(lines[i]);
      i++;
      out.append(h('pre', {}, h('code', {}, body.join('\n'))));
    } else if (/^#{1,6} /.test(line)) {
      const level = Math.min(line.indexOf(' '), 4) + 2;
      out.append(h(`h${Math.min(level, 6)}`, {}, inline(line.replace(/^#+ /, ''))));
      i++;
    } else if (/^\s*([-*+]|\d+[.)]) /.test(line)) {
      const ordered = /^\s*\d/.test(line);
      const list = h(ordered ? 'ol' : 'ul');
      for (; i < lines.length && /^\s*([-*+]|\d+[.)]) /.test(lines[i]); i++) {
        list.append(h('li', {}, inline(lines[i].replace(/^\s*([-*+]|\d+[.)]) /, ''))));
      }
      out.append(list);
    } else if (line.trim() === '') {
      i++;
    } else {
      const para = [];
      for (; i < lines.length && lines[i].trim() !== '' && !/^(```|#{1,6} |\s*([-*+]|\d+[.)]) )/.test(lines[i]); i++) para.push(lines[i]);
      out.append(h('p', {}, inline(para.join('\n'))));
    }
  }
  return out;
}

const INLINE = /(`[^`\n]+`|\*\*[^*\n]+\*\*|\*[^*\n]+\*)/;

/** Inline spans: the text is split on the markers, and each piece becomes a text node or an element. */
function inline(text) {
  return text.split(INLINE).filter(Boolean).map((piece) => {
    if (piece.length > 2 && piece.startsWith('`') && piece.endsWith('`')) return h('code', {}, piece.slice(1, -1));
    if (piece.length > 4 && piece.startsWith('**') && piece.endsWith('**')) return h('strong', {}, piece.slice(2, -2));
    if (piece.length > 2 && piece.startsWith('*') && piece.endsWith('*')) return h('em', {}, piece.slice(1, -1));
    return piece;
  });
}
