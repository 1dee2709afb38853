// Playground: a streamed chat with any model (reasoning shown apart from the answer, Markdown
// rendered without HTML), and an embeddings try.
import { getJSON, request, post, readEvents } from '/ui/api.js';
import { h, fill } from '/ui/dom.js';
import { render as markdown } from '/ui/markdown.js';

export function mount(main) {
  const picker = h('select', { id: 'pg-model', 'aria-label': 'Model' });
  const chat = chatPanel(picker);
  const embed = embeddingsPanel(picker);
  fill(main,
    h('div', { class: 'toolbar' }, h('h1', { class: 'grow' }, 'Playground'),
      h('label', { for: 'pg-model' }, 'Model'), picker),
    chat.element, embed);
  getJSON('/v1/models').then((list) => {
    fill(picker, list.data.map((m) => h('option', { value: m.id }, m.id)));
  }).catch((err) => fill(picker, h('option', { value: '' }, `no models: ${err.message}`)));
  return () => chat.stop();
}

function chatPanel(picker) {
  const messages = [];
  const log = h('div', { class: 'chat', 'aria-live': 'polite', id: 'pg-chat' });
  const input = h('textarea', { id: 'pg-input', rows: 3, placeholder: 'Message (Ctrl+Enter sends)', 'aria-label': 'Message',
    onkeydown: (e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send(); } } });
  const status = h('p', { class: 'status', role: 'status' });
  let abort = null;
  const sendButton = h('button', { class: 'primary', id: 'pg-send', onclick: () => send() }, 'Send');
  const stopButton = h('button', { disabled: true, onclick: () => abort?.abort() }, 'Stop');
  const clear = h('button', { onclick: () => { messages.length = 0; fill(log); } }, 'Clear');

  async function send() {
    const text = input.value.trim();
    if (!text || abort || !picker.value) return;
    input.value = '';
    messages.push({ role: 'user', content: text });
    log.append(h('div', { class: 'msg user' }, h('div', { class: 'role' }, 'you'), h('div', { class: 'content' }, text)));
    const reply = assistantMessage(picker.value);
    log.append(reply.element);
    abort = new AbortController();
    sendButton.disabled = true;
    stopButton.disabled = false;
    fill(status);
    try {
      const resp = await request('POST', '/v1/chat/completions', {
        signal: abort.signal, accept: 'text/event-stream',
        body: { model: picker.value, messages, stream: true },
      });
      await readEvents(resp, ({ data }) => {
        if (data === '[DONE]') return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || 'the stream ended with an error');
        const delta = chunk.choices?.[0]?.delta || {};
        reply.add(delta.reasoning_content || '', delta.content || '');
        log.scrollTop = log.scrollHeight;
      });
      messages.push({ role: 'assistant', content: reply.content() });
    } catch (err) {
      fill(status, abort.signal.aborted ? 'Stopped.' : err.message);
      status.className = abort.signal.aborted ? 'status' : 'status error';
    } finally {
      abort = null;
      sendButton.disabled = false;
      stopButton.disabled = true;
    }
  }

  const element = h('section', { class: 'panel', 'aria-label': 'Chat' },
    h('h2', {}, 'Chat'), log, input, h('div', { class: 'toolbar' }, sendButton, stopButton, clear), status);
  return { element, stop: () => abort?.abort() };
}

/** An answer that grows as tokens arrive: reasoning in its own fold, the answer as Markdown. */
function assistantMessage(model) {
  let reasoning = '', content = '', pending = false;
  const thinking = h('pre', {});
  const fold = h('details', { hidden: true }, h('summary', {}, 'Reasoning'), thinking);
  const body = h('div', { class: 'content', 'data-role': 'assistant' });
  const element = h('div', { class: 'msg assistant' }, h('div', { class: 'role' }, model), fold, body);
  const draw = () => {
    pending = false;
    thinking.textContent = reasoning;
    fold.hidden = !reasoning;
    fill(body, markdown(content));
  };
  return {
    element,
    add(r, c) {
      reasoning += r;
      content += c;
      if (!pending) { pending = true; requestAnimationFrame(draw); }
    },
    content: () => content,
  };
}

function embeddingsPanel(picker) {
  const input = h('textarea', { id: 'pg-embed-input', rows: 2, 'aria-label': 'Text to embed', placeholder: 'Text to embed' });
  const out = h('div', { id: 'pg-embed-out', role: 'status' });
  const run = async () => {
    fill(out, '…');
    try {
      const resp = await post('/v1/embeddings', { model: picker.value, input: input.value });
      const v = await resp.json();
      const vector = v.data?.[0]?.embedding || [];
      fill(out, h('p', {}, `${vector.length} dimensions${v.usage ? `, ${v.usage.prompt_tokens} tokens` : ''}`),
        h('pre', {}, `[${vector.slice(0, 8).map((x) => x.toFixed(4)).join(', ')}${vector.length > 8 ? ', …' : ''}]`));
    } catch (err) {
      fill(out, h('p', { class: 'status error' }, err.message));
    }
  };
  return h('section', { class: 'panel', 'aria-label': 'Embeddings' },
    h('h2', {}, 'Embeddings'), input,
    h('div', { class: 'toolbar' }, h('button', { id: 'pg-embed', onclick: run }, 'Embed')), out);
}
