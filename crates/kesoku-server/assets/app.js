// Kesoku web console. Plain JavaScript, no build step, nothing loaded from elsewhere.
//
// Data comes from the HTTP API (/v1/...). One EventSource on /v1/events keeps everything live:
// the open session's trajectory, the session list's status and the health panel. Every piece of
// message text is put in the page with textContent, never as HTML.
//
// Token: when the API answers 401, a dialog asks for the token; it is kept in sessionStorage
// (this tab only), sent as `Authorization: Bearer` on API calls and as `?access_token=` on the
// event stream (EventSource cannot set headers; only that route accepts the query form).
'use strict';

const TOKEN_KEY = 'kesoku.token';
const SENDER = 'console';

const state = {
  route: { name: 'sessions', id: null },
  source: null,          // the EventSource
  lastRev: null,         // newest event revision seen
  recent: [],            // recent events, to replay over a history read that raced them
  session: null,         // the open session (view)
  messages: new Map(),   // id -> message, for the open session
  openDetails: new Set(),// ids of <details> the user opened
  timers: {},
};

// ---------- small helpers ----------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function debounce(name, ms, fn) {
  clearTimeout(state.timers[name]);
  state.timers[name] = setTimeout(fn, ms);
}

function fmtTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return isNaN(d) ? '' : d.toLocaleTimeString();
}

function fmtDateTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return isNaN(d) ? '' : d.toLocaleString();
}

function fmtAgo(iso) {
  if (!iso) return '';
  const s = Math.max(0, Math.round((Date.now() - new Date(iso).getTime()) / 1000));
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 86400) return Math.round(s / 3600) + ' h ago';
  return Math.round(s / 86400) + ' d ago';
}

function fmtMs(ms) {
  if (ms === null || ms === undefined || isNaN(ms)) return '—';
  if (ms < 1000) return ms + ' ms';
  return (ms / 1000).toFixed(1) + ' s';
}

function between(a, b) {
  if (!a || !b) return null;
  return new Date(b).getTime() - new Date(a).getTime();
}

function badge(value, label) {
  const dot = (value === 'running' || value === 'processing') ? el('span', { class: 'dot' }) : null;
  return el('span', { class: 'badge ' + value }, dot, label || value);
}

function notice(text, kind) {
  return el('div', { class: 'notice ' + (kind || '') , role: 'status', text });
}

// ---------- API ----------

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

async function api(path, options) {
  const opts = Object.assign({ method: 'GET' }, options || {});
  const headers = Object.assign({}, opts.headers || {});
  const t = token();
  if (t) headers['Authorization'] = 'Bearer ' + t;
  if (opts.json !== undefined) {
    headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(opts.json);
  }
  const response = await fetch(path, { method: opts.method, headers, body: opts.body });
  if (response.status === 401) {
    askToken();
    throw new ApiError(401, 'unauthorized', 'a token is needed');
  }
  const type = response.headers.get('Content-Type') || '';
  const body = type.startsWith('application/json') ? await response.json() : await response.text();
  if (!response.ok) {
    const error = (body && body.error) || {};
    throw new ApiError(response.status, error.code || 'error', error.message || ('HTTP ' + response.status));
  }
  return body;
}

function askToken() {
  const dialog = document.getElementById('login');
  if (!dialog.open) dialog.showModal();
}

function setupLogin() {
  document.getElementById('login-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const value = document.getElementById('login-token').value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    document.getElementById('login').close();
    connectEvents(true);
    render();
    refreshHealth();
  });
}

// ---------- live events ----------

function setLive(on) {
  const live = document.getElementById('live');
  live.className = 'live ' + (on ? 'on' : 'off');
  live.textContent = on ? 'live' : 'offline';
}

function connectEvents(force) {
  if (state.source && !force) return;
  if (state.source) state.source.close();
  const params = new URLSearchParams();
  if (state.lastRev !== null) params.set('after', String(state.lastRev));
  const t = token();
  if (t) params.set('access_token', t);
  const query = params.toString();
  const source = new EventSource('/v1/events' + (query ? '?' + query : ''));
  state.source = source;
  source.onopen = () => setLive(true);
  source.onmessage = (event) => {
    let data;
    try { data = JSON.parse(event.data); } catch (_) { return; }
    onEvent(data);
  };
  source.onerror = () => {
    setLive(false);
    if (source.readyState === EventSource.CLOSED) {
      // The browser gave up (for example a 401): try again ourselves, resuming after lastRev.
      state.source = null;
      debounce('reconnect', 3000, () => connectEvents(false));
    }
  };
}

function onEvent(data) {
  if (typeof data.rev === 'number') state.lastRev = Math.max(state.lastRev || 0, data.rev);
  state.recent.push(data);
  if (state.recent.length > 1000) state.recent.splice(0, state.recent.length - 1000);
  const message = data.message;
  if (state.route.name === 'session' && state.session && message.session_id === state.session.id) {
    applyMessage(message);
    debounce('trajectory', 30, renderTrajectory);
    if (!message.parent_id) debounce('session-head', 200, refreshSessionHead);
  }
  if (!message.parent_id || message.status === 'processing') {
    if (state.route.name === 'sessions') debounce('sessions', 300, loadSessions);
    if (state.route.name === 'activations') debounce('activations', 800, loadActivations);
    debounce('health', 400, refreshHealth);
  }
}

// ---------- routing ----------

function parseRoute() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [name, ...rest] = hash.split('/');
  if (name === 'session' && rest.length) return { name: 'session', id: decodeURIComponent(rest.join('/')) };
  if (name === 'activations') return { name: 'activations', id: null };
  return { name: 'sessions', id: null };
}

function render() {
  state.route = parseRoute();
  for (const link of document.querySelectorAll('[data-nav]')) {
    const current = link.dataset.nav === state.route.name || (state.route.name === 'session' && link.dataset.nav === 'sessions');
    link.classList.toggle('current', current);
  }
  const view = document.getElementById('view');
  view.replaceChildren();
  if (state.route.name === 'session') renderSession(view, state.route.id);
  else if (state.route.name === 'activations') renderActivations(view);
  else renderSessions(view);
}

// ---------- sessions view ----------

function renderSessions(view) {
  state.session = null;
  const channel = el('input', { id: 'new-channel', value: 'web', 'aria-label': 'channel' });
  const text = el('textarea', { id: 'new-text', placeholder: 'Message the agent…', rows: 2, 'aria-label': 'message' });
  const send = el('button', { class: 'primary', id: 'new-send', type: 'button', text: 'Send' });
  const status = el('div');
  send.addEventListener('click', async () => {
    if (!text.value.trim()) return;
    send.disabled = true;
    try {
      const posted = await api('/v1/messages', { method: 'POST', json: { channel_id: channel.value.trim() || 'web', sender: SENDER, content: text.value } });
      location.hash = '#/session/' + encodeURIComponent(posted.session_id);
    } catch (error) {
      status.replaceChildren(notice(error.message, 'error'));
    } finally { send.disabled = false; }
  });
  view.append(
    el('h1', { text: 'Sessions' }),
    el('div', { class: 'card' },
      el('div', { class: 'newmsg' },
        el('label', {}, el('div', { class: 'muted', text: 'Channel' }), channel),
        el('label', {}, el('div', { class: 'muted', text: 'New message (chatbot api)' }), text),
        send),
      status,
      el('div', { id: 'sessions-table' }, el('div', { class: 'empty', text: 'loading…' }))));
  loadSessions();
}

async function loadSessions() {
  const holder = document.getElementById('sessions-table');
  if (!holder) return;
  let data;
  try { data = await api('/v1/sessions?limit=100'); }
  catch (error) { holder.replaceChildren(notice(error.message, 'error')); return; }
  if (!data.sessions.length) {
    holder.replaceChildren(el('div', { class: 'empty', text: 'No sessions yet. Send a message to start one.' }));
    return;
  }
  const rows = data.sessions.map((s) => el('tr', {
    class: 'clickable session-row', 'data-session': s.id,
    onclick: () => { location.hash = '#/session/' + encodeURIComponent(s.id); },
  },
  el('td', {}, el('a', { href: '#/session/' + encodeURIComponent(s.id), text: s.title || s.id })),
  el('td', { text: s.chatbot_id }),
  el('td', { text: s.channel_id }),
  el('td', {}, badge(s.activity), ' ', s.active ? badge('active') : null),
  el('td', { class: 'muted', title: fmtDateTime(s.updated_at), text: fmtAgo(s.updated_at) })));
  holder.replaceChildren(el('table', {},
    el('thead', {}, el('tr', {}, ['Session', 'Chatbot', 'Channel', 'Status', 'Updated'].map((h) => el('th', { text: h })))),
    el('tbody', {}, rows)));
}

// ---------- session view ----------

function renderSession(view, id) {
  state.session = { id };
  state.messages = new Map();
  state.openDetails = new Set();
  const head = el('div', { id: 'session-head' }, el('h1', { text: id }));
  const toolbar = el('div', { class: 'toolbar' },
    el('button', { id: 'btn-stop', class: 'danger', type: 'button', text: '■ Stop', onclick: () => control('stop') }),
    el('button', { id: 'btn-compact', type: 'button', text: '🗜 Compact', onclick: () => control('compact') }),
    el('button', { id: 'btn-clear', type: 'button', text: '✚ New session', onclick: () => control('clear') }),
    el('button', { id: 'btn-state', type: 'button', text: '🔍 Why stuck?', onclick: () => showState() }),
    el('button', { id: 'btn-export', type: 'button', text: '⬇ Export HTML', onclick: () => exportHtml() }));
  const info = el('div', { id: 'session-info' });
  const trajectory = el('div', { id: 'trajectory', class: 'trajectory' }, el('div', { class: 'empty', text: 'loading…' }));
  const text = el('textarea', { id: 'composer-text', placeholder: 'Message…', rows: 2, 'aria-label': 'message' });
  const send = el('button', { id: 'composer-send', class: 'primary', type: 'button', text: 'Send' });
  text.addEventListener('keydown', (event) => { if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) send.click(); });
  send.addEventListener('click', async () => {
    const session = state.session;
    if (!text.value.trim() || !session || !session.channel_id) return;
    send.disabled = true;
    try {
      const posted = await api('/v1/messages', { method: 'POST', json: { chatbot_id: session.chatbot_id, channel_id: session.channel_id, sender: SENDER, content: text.value } });
      text.value = '';
      if (posted.session_id !== session.id) location.hash = '#/session/' + encodeURIComponent(posted.session_id);
    } catch (error) {
      info.replaceChildren(notice(error.message, 'error'));
    } finally { send.disabled = false; }
  });
  view.append(head, toolbar, info, trajectory, el('div', { class: 'composer card' }, text, send));
  loadSession(id);
}

async function loadSession(id) {
  try {
    const session = await api('/v1/sessions/' + encodeURIComponent(id));
    if (!state.session || state.session.id !== id) return;
    Object.assign(state.session, session);
    renderSessionHead();
    const history = await api('/v1/sessions/' + encodeURIComponent(id) + '/messages');
    if (!state.session || state.session.id !== id) return;
    for (const message of history.messages) applyMessage(message);
    // Events that raced the read: replay those newer than the read's revision.
    for (const event of state.recent) {
      if (event.rev > history.rev && event.message.session_id === id) applyMessage(event.message);
    }
    renderTrajectory();
  } catch (error) {
    const trajectory = document.getElementById('trajectory');
    if (trajectory) trajectory.replaceChildren(notice(error.message, 'error'));
  }
}

async function refreshSessionHead() {
  if (!state.session) return;
  try {
    const session = await api('/v1/sessions/' + encodeURIComponent(state.session.id));
    if (state.session && state.session.id === session.id) { Object.assign(state.session, session); renderSessionHead(); }
  } catch (_) { /* shown elsewhere */ }
}

function renderSessionHead() {
  const head = document.getElementById('session-head');
  const s = state.session;
  if (!head || !s) return;
  head.replaceChildren(
    el('h1', { text: s.title || s.id }),
    el('div', { class: 'muted' }, s.chatbot_id + ' · ' + s.channel_id + ' · started ' + fmtDateTime(s.created_at) + ' ',
      badge(s.activity || 'idle'), ' ', s.active ? badge('active') : badge('inactive', 'not active')));
}

async function control(action) {
  const s = state.session;
  const info = document.getElementById('session-info');
  if (!s) return;
  try {
    const result = await api('/v1/sessions/' + encodeURIComponent(s.id) + '/' + action, { method: 'POST' });
    if (action === 'clear') { location.hash = '#/session/' + encodeURIComponent(result.id); return; }
    const text = action === 'stop'
      ? 'Stop requested; ' + result.interrupted + ' waiting message(s) interrupted.'
      : 'Compaction requested.';
    info.replaceChildren(notice(text));
  } catch (error) { info.replaceChildren(notice(error.message, 'error')); }
}

async function showState() {
  const s = state.session;
  const info = document.getElementById('session-info');
  if (!s) return;
  try {
    const st = await api('/v1/sessions/' + encodeURIComponent(s.id) + '/state');
    const rows = [
      ['Summary', st.summary],
      ['Activity', st.activity],
      ['Worker', st.worker ? (st.worker.claimed_by || '?') + ' holds ' + st.worker.message_id + (st.worker.held_for_s !== undefined ? ' for ' + st.worker.held_for_s + ' s' : '') : '—'],
      ['Running turn', st.running_turn ? st.running_turn.lane + ' · ' + st.running_turn.activation_id + ' since ' + fmtTime(st.running_turn.since) : '—'],
      ['Last event', st.last_event ? st.last_event.type + ' (' + st.last_event.role + ', ' + st.last_event.status + ') at ' + fmtTime(st.last_event.updated_at) : '—'],
      ['Waiting', st.waiting.length ? st.waiting.map((w) => w.message_id).join(', ') : 'none'],
      ['Queue', 'interactive ' + st.queue.interactive + ' · responsive ' + st.queue.responsive + ' · background ' + st.queue.background],
      ['Limits (interactive)', st.limits.interactive.runtime_s + ' s · ' + st.limits.interactive.model_calls + ' model calls · ' + st.limits.interactive.tool_calls + ' tool calls'],
      ['Unfinished activations', String(st.unfinished_activations.length)],
    ];
    info.replaceChildren(el('div', { class: 'card state' }, el('h2', { text: 'Why is it stuck?' }),
      el('dl', {}, rows.map(([k, v]) => [el('dt', { text: k }), el('dd', { text: v })]))));
  } catch (error) { info.replaceChildren(notice(error.message, 'error')); }
}

async function exportHtml() {
  const s = state.session;
  if (!s) return;
  const headers = {};
  if (token()) headers['Authorization'] = 'Bearer ' + token();
  const response = await fetch('/v1/sessions/' + encodeURIComponent(s.id) + '/export', { headers });
  if (!response.ok) { document.getElementById('session-info').replaceChildren(notice('export failed: HTTP ' + response.status, 'error')); return; }
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const link = el('a', { href: url, download: 'kesoku-' + s.id.replace(/[^A-Za-z0-9_-]/g, '_') + '.html' });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function applyMessage(message) {
  const known = state.messages.get(message.id);
  if (known && known.updated_at && message.updated_at && new Date(known.updated_at) > new Date(message.updated_at)) return;
  state.messages.set(message.id, message);
}

// Phased order (spec 5.1): turns in the order of their roots; inside a turn, step by step:
// thoughts, tool calls, tool results, text, then injected user/system text.
function phase(m) {
  if (!m.parent_id) return 0;
  switch (m.type) {
    case 'thought': return 1;
    case 'tool_call': return 2;
    case 'tool_result': return 3;
    default: return (m.role === 'assistant' || m.role === 'tool') ? 4 : 5;
  }
}

function rootOf(m, byId) {
  let current = m;
  for (let i = 0; i < 64 && current.parent_id && byId.has(current.parent_id); i++) current = byId.get(current.parent_id);
  return current;
}

function written(m) { return (m.created_at || '') + '\u0000' + m.id; }

function phasedOrder(list) {
  const byId = new Map(list.map((m) => [m.id, m]));
  const keyed = list.map((m) => ({ m, root: written(rootOf(m, byId)), step: m.step || 0, phase: phase(m), own: written(m) }));
  keyed.sort((a, b) => (a.root < b.root ? -1 : a.root > b.root ? 1 : 0) || a.step - b.step || a.phase - b.phase || (a.own < b.own ? -1 : a.own > b.own ? 1 : 0));
  return keyed.map((k) => k.m);
}

function foldable(id, cls, summary, ...content) {
  const details = el('details', { class: cls, 'data-id': id }, el('summary', {}, summary), ...content);
  if (state.openDetails.has(id)) details.open = true;
  details.addEventListener('toggle', () => {
    if (details.open) state.openDetails.add(id); else state.openDetails.delete(id);
  });
  return details;
}

function toolIcon(call, result) {
  if (result) return result.metadata && result.metadata.tool_error ? '❌' : '✅';
  return call.status === 'interrupted' ? '⛔' : '⏳';
}

const ROOT_LABEL = { pending_agent: 'waiting', processing: 'thinking…', processed: 'done', interrupted: 'interrupted', error: 'error' };

function renderTextMessage(m) {
  const notification = m.role === 'assistant' && m.sender === 'Notification';
  const cls = m.role === 'user' ? 'user' : notification ? 'notification' : m.role === 'system' ? 'system' : 'assistant';
  const who = el('div', { class: 'who' }, el('span', { text: m.sender }), el('span', { class: 'time', text: fmtTime(m.created_at) }),
    !m.parent_id && ROOT_LABEL[m.status] ? badge(m.status, ROOT_LABEL[m.status]) : null);
  const parts = [who, el('div', { class: 'text', text: m.content })];
  const attachments = (m.metadata && m.metadata.attachments) || [];
  if (attachments.length) parts.push(el('div', { class: 'attachments', text: '📎 ' + attachments.map((a) => a.filename).join(', ') }));
  const metrics = m.metadata && m.metadata.turn_metrics;
  if (metrics) {
    parts.push(el('div', { class: 'metrics', text: '⏱ ' + Number(metrics.turn_time).toFixed(1) + ' s · 🛠️ ' + metrics.turn_tool_calls
      + ' tool call(s) · ' + metrics.turn_tokens + ' tokens this turn · context ' + metrics.context_tokens + ' tokens · turn ' + metrics.session_turns }));
  }
  return el('div', { class: 'msg ' + cls, 'data-id': m.id, 'data-status': m.status }, parts);
}

function renderTrajectory() {
  const holder = document.getElementById('trajectory');
  if (!holder) return;
  const nearBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  const list = phasedOrder([...state.messages.values()]);
  if (!list.length) { holder.replaceChildren(el('div', { class: 'empty', text: 'No messages yet.' })); return; }
  const results = new Map();
  const calls = new Set();
  for (const m of list) {
    if (m.type === 'tool_result' && m.parent_id) results.set(m.parent_id, m);
    if (m.type === 'tool_call') calls.add(m.id);
  }
  const turns = [];
  let turn = null;
  for (const m of list) {
    if (!m.parent_id || !turn) { turn = el('section', { class: 'turn' }); turns.push(turn); }
    if (m.type === 'tool_result') {
      if (m.parent_id && calls.has(m.parent_id)) continue;
      turn.append(foldable(m.id, 'tool', [el('span', { class: 'icon', text: '📄' }), 'Result of ' + ((m.metadata && m.metadata.tool_name) || m.sender)],
        el('div', { class: 'pre', text: m.content })));
    } else if (m.type === 'tool_call') {
      const result = results.get(m.id);
      const name = (m.metadata && m.metadata.tool_name) || 'tool';
      const content = [el('div', { class: 'pre', text: m.content })];
      if (result) {
        if (result.metadata && result.metadata.tool_error) content.push(el('div', { class: 'tool-error', text: result.metadata.tool_error }));
        content.push(el('div', { class: 'pre tool-result', text: result.content }));
      }
      const icon = toolIcon(m, result);
      turn.append(foldable(m.id, 'tool', [el('span', { class: 'icon', text: icon }), '🛠️ ' + name], content));
    } else if (m.type === 'thought') {
      turn.append(foldable(m.id, 'thought', [el('span', { class: 'icon', text: '💭' }), 'Thought'], el('div', { class: 'pre', text: m.content })));
    } else {
      turn.append(renderTextMessage(m));
    }
  }
  holder.replaceChildren(...turns);
  if (nearBottom) window.scrollTo(0, document.body.scrollHeight);
}

// ---------- activations view ----------

function renderActivations(view) {
  state.session = null;
  const params = new URLSearchParams(location.hash.split('?')[1] || '');
  const session = el('input', { id: 'filter-session', placeholder: 'session id', value: params.get('session_id') || '' });
  const failed = el('input', { id: 'filter-failed', type: 'checkbox' });
  failed.checked = params.get('failed') === 'true';
  const limit = el('select', { id: 'filter-limit' }, ['50', '100', '500'].map((n) => el('option', { value: n, text: n })));
  const apply = () => loadActivations();
  session.addEventListener('change', apply);
  failed.addEventListener('change', apply);
  limit.addEventListener('change', apply);
  view.append(
    el('h1', { text: 'Activations' }),
    el('div', { class: 'card' },
      el('div', { class: 'filters' },
        el('label', {}, 'Session ', session),
        el('label', {}, failed, ' only unsuccessful'),
        el('label', {}, 'Show ', limit),
        el('button', { type: 'button', text: 'Refresh', onclick: apply })),
      el('div', { id: 'activations-table' }, el('div', { class: 'empty', text: 'loading…' }))));
  loadActivations();
}

async function loadActivations() {
  const holder = document.getElementById('activations-table');
  if (!holder) return;
  const params = new URLSearchParams();
  const session = document.getElementById('filter-session').value.trim();
  if (session) params.set('session_id', session);
  if (document.getElementById('filter-failed').checked) params.set('failed', 'true');
  params.set('limit', document.getElementById('filter-limit').value);
  let data;
  try { data = await api('/v1/activations?' + params.toString()); }
  catch (error) { holder.replaceChildren(notice(error.message, 'error')); return; }
  if (!data.activations.length) { holder.replaceChildren(el('div', { class: 'empty', text: 'No activations match.' })); return; }
  const rows = data.activations.map((a) => el('tr', { class: 'activation-row' },
    el('td', { class: 'muted nowrap', title: fmtDateTime(a.enqueued_at), text: fmtTime(a.enqueued_at) }),
    el('td', {}, badge(a.lane)),
    el('td', { text: a.kind }),
    el('td', {}, el('a', { href: '#/session/' + encodeURIComponent(a.session_id), class: 'mono', title: a.session_id, text: a.session_id.slice(0, 14) + '…' })),
    el('td', { text: a.triggered_by }),
    el('td', {}, a.outcome ? badge(a.outcome) : badge(a.started_at ? 'running' : 'waiting', a.started_at ? 'running' : 'queued'),
      a.error ? el('div', { class: 'tool-error activation-error', text: a.error }) : null),
    el('td', { class: 'num', text: fmtMs(between(a.enqueued_at, a.started_at)) }),
    el('td', { class: 'num', text: fmtMs(between(a.started_at, a.finished_at)) }),
    el('td', { class: 'num', text: a.usage.model_calls + ' / ' + a.usage.tool_calls }),
    el('td', { class: 'num', text: a.usage.input_tokens + ' / ' + a.usage.output_tokens })));
  holder.replaceChildren(el('table', {},
    el('thead', {}, el('tr', {}, ['Enqueued', 'Lane', 'Kind', 'Session', 'Triggered by', 'Outcome', 'Wait', 'Run', 'Calls (model/tool)', 'Tokens (in/out)'].map((h) => el('th', { text: h })))),
    el('tbody', {}, rows)));
}

// ---------- health panel ----------

async function refreshHealth() {
  const body = document.getElementById('health-body');
  let ready = 'ready';
  try { await api('/readyz'); } catch (error) { ready = error.status === 503 ? 'not ready' : 'unknown'; }
  let runtime;
  try { runtime = await api('/v1/runtime'); }
  catch (error) { body.replaceChildren(notice(error.message, 'error')); return; }
  const row = (label, value) => el('div', { class: 'health-row' }, el('span', { class: 'muted', text: label }), el('span', { text: String(value) }));
  const running = runtime.running.map((t) => el('div', { class: 'health-row' },
    el('a', { href: '#/session/' + encodeURIComponent(t.session_id), class: 'mono', text: t.session_id.slice(0, 14) + '…' }),
    el('span', { class: 'muted', text: t.worker + ' · ' + fmtAgo(t.since) })));
  body.replaceChildren(
    row('store', ready),
    row('revision', runtime.rev),
    el('div', { class: 'health-section', id: 'health-lanes' }, el('h3', { text: 'Queue depth' }),
      row('interactive', runtime.queue.interactive), row('responsive', runtime.queue.responsive), row('background', runtime.queue.background)),
    el('div', { class: 'health-section' }, el('h3', { text: 'Active workers (' + runtime.running.length + ')' }),
      running.length ? running : el('div', { class: 'muted', text: 'none' })),
    el('div', { class: 'health-section' }, el('h3', { text: 'Limits' }),
      ['interactive', 'responsive', 'background'].map((lane) => row(lane,
        runtime.limits[lane].runtime_s + ' s · ' + runtime.limits[lane].model_calls + ' / ' + runtime.limits[lane].tool_calls))));
}

// ---------- start ----------

window.addEventListener('hashchange', render);
document.addEventListener('DOMContentLoaded', () => {
  setupLogin();
  render();
  // Start the stream at the current revision, so nothing written after the page loaded is missed.
  api('/v1/runtime')
    .then((runtime) => { if (state.lastRev === null) state.lastRev = runtime.rev; })
    .catch(() => {})
    .finally(() => connectEvents(false));
  refreshHealth();
  setInterval(refreshHealth, 5000);
});
