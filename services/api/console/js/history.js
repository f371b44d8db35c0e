// The execution page's time travel: a scrubber over every event of the
// execution; at each position, every step's state and ctx as the events up
// to that one give them (GET /api/executions/<id>/state?at=<seq>, the
// event log folded on the server).

import { h, replace, note } from './dom.js';
import { get } from './api.js';
import { clock, json } from './format.js';
import { badge } from './executions.js';

const FETCH_DELAY_MS = 120;

// The card, and the function that (re)loads its timeline.
export function historyCard(id) {
  const el = {
    scrubber: h('input', { type: 'range', id: 'scrubber', min: '0', max: '0', value: '0', disabled: true,
      'aria-label': 'event to show the execution at' }),
    position: h('span', { id: 'scrub-position', class: 'mono dim' }),
    reload: h('button', { type: 'button', class: 'quiet', id: 'scrub-reload', text: 'latest events' }),
    status: h('span', { id: 'history-status' }),
    steps: h('tbody', { id: 'history-steps' }),
    ctx: h('pre', { id: 'history-ctx', class: 'json' }),
    message: h('div', { id: 'history-message' }),
  };
  const st = { id, el, timeline: [], wanted: null, timer: null, shown: null, inflight: null };
  el.scrubber.addEventListener('input', () => scrub(st));
  el.reload.addEventListener('click', () => load(st));
  const card = h('section', { class: 'card', id: 'history-card' },
    h('div', { class: 'head' }, h('h2', { text: 'Time travel' }), h('span', { class: 'spacer' }), el.reload),
    h('p', { class: 'dim', text: 'Every step and ctx as the events up to the chosen one give them.' }),
    h('div', { class: 'scrub' }, el.scrubber, el.position),
    el.message,
    h('div', { class: 'head' }, h('span', { text: 'Status ' }), el.status),
    h('table', { class: 'grid', id: 'history-table' },
      h('thead', {}, h('tr', {}, ['Step', 'Status', 'Last run', 'Error'].map((t) => h('th', { text: t })))),
      el.steps),
    h('h3', { text: 'ctx' }), el.ctx);
  return { card, load: () => load(st) };
}

function url(id, seq) {
  const base = `/api/executions/${encodeURIComponent(id)}/state`;
  return seq === undefined ? base : `${base}?at=${seq}`;
}

// Read the whole timeline (and the latest state); the scrubber goes to
// its end.
async function load(st) {
  try {
    const state = await get(url(st.id));
    st.timeline = state.timeline;
    const s = st.el.scrubber;
    s.max = String(Math.max(0, st.timeline.length - 1));
    s.value = s.max;
    s.disabled = st.timeline.length === 0;
    draw(st, state);
  } catch (e) {
    replace(st.el.message, note('error', `Could not read the execution's events: ${e.message}`));
  }
}

// The scrubber moved: fetch that position's state once it rests. A fetch
// still running for an earlier position is given up: each is a read of
// the whole log on the server, which reads only a few at once.
function scrub(st) {
  const entry = st.timeline[Number(st.el.scrubber.value)];
  if (!entry) return;
  describe(st, entry);
  st.wanted = entry.seq;
  clearTimeout(st.timer);
  st.timer = setTimeout(async () => {
    const seq = st.wanted;
    if (st.inflight) st.inflight.abort();
    const inflight = new AbortController();
    st.inflight = inflight;
    try {
      const state = await get(url(st.id, seq), { signal: inflight.signal });
      if (st.wanted === seq) draw(st, state);
    } catch (e) {
      if (inflight.signal.aborted) return; // a later position's fetch took over
      replace(st.el.message, note('error', `Could not read the state at seq ${seq}: ${e.message}`));
    } finally {
      if (st.inflight === inflight) st.inflight = null;
    }
  }, FETCH_DELAY_MS);
}

function describe(st, entry) {
  const i = st.timeline.indexOf(entry) + 1;
  replace(st.el.position, `event ${i} of ${st.timeline.length}: seq ${entry.seq} ${entry.event_type}` +
    `${entry.step ? ` (${entry.step})` : ''} at ${clock(entry.ts)}`);
}

function draw(st, state) {
  replace(st.el.message, state.timeline_truncated
    ? note('info', `Only the last ${state.timeline.length} events can be chosen.`) : null);
  const entry = st.timeline.find((e) => e.seq === state.at_seq);
  if (entry) describe(st, entry);
  const status = state.status || 'NOT STARTED';
  replace(st.el.status, badge(status));
  st.el.status.dataset.status = status;
  st.el.status.dataset.seq = String(state.at_seq);
  const rows = Object.entries(state.steps).map(([name, r]) =>
    h('tr', { class: 'history-step', dataset: { step: name, status: r.status } },
      h('td', { class: 'mono', text: name }),
      h('td', { text: r.status }),
      h('td', { class: 'mono dim', text: r.last_step_run_id || '' }),
      h('td', { text: r.error || '' })));
  replace(st.el.steps, rows.length ? rows : h('tr', {}, h('td', { colspan: '4', class: 'dim', text: 'no step yet' })));
  st.el.ctx.textContent = json(state.ctx).text;
}
