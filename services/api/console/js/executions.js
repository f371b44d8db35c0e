// #/executions: the newest executions, polled every two seconds, with
// status and playbook filters and a search by id.

import { h, replace, note } from './dom.js';
import { get } from './api.js';
import { elapsed, when } from './format.js';

const POLL_MS = 2000;
const PAGE = 100;
export const STATUSES = ['RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED'];

// A status as a coloured badge.
export function badge(status) {
  const s = String(status || '').toUpperCase();
  return h('span', { class: `badge badge-${s.toLowerCase()}`, dataset: { status: s }, text: s });
}

// The status shown: PAUSED or QUEUED for a running execution held back
// (the API keeps RUNNING with `is_paused` / `is_queued`), else its status.
export function shownStatus(e) {
  if (!e || e.status !== 'RUNNING') return (e && e.status) || '';
  if (e.is_paused) return 'PAUSED';
  return e.is_queued ? 'QUEUED' : 'RUNNING';
}

function row(e) {
  const link = `#/executions/${encodeURIComponent(e.execution_id)}`;
  const status = shownStatus(e);
  return h('tr', { class: 'execution-row', dataset: { executionId: e.execution_id, status } },
    h('td', { class: 'mono' }, h('a', { href: link, text: e.execution_id })),
    h('td', {},
      h('div', { text: e.playbook || '—' }),
      e.path ? h('div', { class: 'dim mono', text: e.catalog_id || e.path }) : null),
    h('td', {}, badge(status), e.error ? h('div', { class: 'dim clip', title: e.error, text: e.error }) : null),
    h('td', { text: when(e.started_at) }),
    h('td', { class: 'duration', dataset: { start: e.started_at, end: e.completed_at || '' },
      text: elapsed(e.started_at, e.completed_at) }));
}

// Draw the page into `main`; returns the function that stops its polling.
export function executionsPage(main, params, ctx) {
  const state = {
    status: (params.get('status') || '').toUpperCase(),
    playbook: params.get('playbook') || '',
    offset: Math.max(0, Number(params.get('offset')) || 0),
  };
  const statusSelect = h('select', { id: 'filter-status' },
    h('option', { value: '', text: 'any status' }),
    STATUSES.map((s) => h('option', { value: s, text: s, selected: s === state.status })));
  const playbookInput = h('input', { id: 'filter-playbook', type: 'search', value: state.playbook,
    placeholder: 'playbook name or path' });
  const idInput = h('input', { id: 'search-id', type: 'search', placeholder: 'execution id',
    spellcheck: 'false', autocomplete: 'off' });
  const searchForm = h('form', { id: 'search-form', class: 'inline' }, idInput,
    h('button', { type: 'submit', text: 'Open' }));
  const tbody = h('tbody', { id: 'executions-body' });
  const message = h('div', { id: 'executions-message' });
  const updated = h('span', { class: 'dim', id: 'executions-updated' });
  const newer = h('button', { type: 'button', class: 'quiet', text: '← newer' });
  const older = h('button', { type: 'button', class: 'quiet', text: 'older →' });
  replace(main, h('section', { class: 'card', id: 'executions-page' },
    h('div', { class: 'head' }, h('h1', { text: 'Executions' }), updated),
    h('div', { class: 'toolbar' }, searchForm,
      h('label', {}, 'Status ', statusSelect), h('label', {}, 'Playbook ', playbookInput)),
    message,
    h('table', { class: 'grid', id: 'executions' },
      h('thead', {}, h('tr', {}, ['Execution', 'Playbook', 'Status', 'Started', 'Duration']
        .map((t) => h('th', { text: t })))),
      tbody),
    h('div', { class: 'pager' }, newer, older)));

  let rows = [];
  let timer = null;
  let stopped = false;

  function remember() {
    const q = new URLSearchParams();
    if (state.status) q.set('status', state.status);
    if (state.playbook) q.set('playbook', state.playbook);
    if (state.offset) q.set('offset', String(state.offset));
    const hash = `#/executions${q.toString() ? `?${q}` : ''}`;
    if (window.location.hash !== hash) history.replaceState(null, '', hash);
  }

  function draw() {
    replace(tbody, rows.map(row));
    if (!rows.length) {
      replace(tbody, h('tr', {}, h('td', { colspan: 5, class: 'dim', text: state.playbook || state.status
        ? 'No execution matches the filters.' : 'No executions.' })));
    }
    newer.disabled = state.offset === 0;
    older.disabled = rows.length < PAGE;
  }

  async function poll() {
    if (stopped) return;
    const q = new URLSearchParams({ limit: String(PAGE), offset: String(state.offset) });
    if (state.status) q.set('status', state.status);
    if (state.playbook.trim()) q.set('playbook', state.playbook.trim());
    try {
      rows = await get(`/api/executions?${q}`);
      replace(message);
      replace(updated, `updated ${new Date().toLocaleTimeString()}`);
      draw();
    } catch (e) {
      replace(message, note('error', `Could not list executions: ${e.message}`));
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }

  function refresh() {
    clearTimeout(timer);
    remember();
    poll();
  }

  statusSelect.addEventListener('change', () => { state.status = statusSelect.value; state.offset = 0; refresh(); });
  // The list is filtered by the API (every execution, not one page); a
  // pause in typing sends the query.
  let typing = null;
  playbookInput.addEventListener('input', () => {
    state.playbook = playbookInput.value;
    state.offset = 0;
    clearTimeout(typing);
    typing = setTimeout(refresh, 250);
  });
  newer.addEventListener('click', () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); });
  older.addEventListener('click', () => { state.offset += PAGE; refresh(); });
  searchForm.addEventListener('submit', (e) => {
    e.preventDefault();
    const id = idInput.value.trim();
    if (id) ctx.go(`#/executions/${encodeURIComponent(id)}`);
  });
  const ticker = setInterval(() => {
    for (const td of tbody.querySelectorAll('td.duration')) {
      if (!td.dataset.end) td.textContent = elapsed(td.dataset.start, null);
    }
  }, 1000);
  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
    clearTimeout(typing);
    clearInterval(ticker);
  };
}
