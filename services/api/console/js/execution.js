// #/executions/<id>: one execution, live. Its step graph and loop
// progress (polled from /api/console/executions/<id>/graph every second
// while it runs), its events (followed over Server-Sent Events) and the
// timeline, results and errors built from them, its ctx and workload
// (from /api/executions/<id>), and a Cancel button for operators.

import { h, replace, note } from './dom.js';
import { get, post, follow } from './api.js';
import { clock, duration, elapsed, isReference, isTruncated, json, when } from './format.js';
import { badge, shownStatus } from './executions.js';
import { drawGraph } from './graph.js';
import { addEvent, drawTimeline, newTimeline } from './timeline.js';
import { historyCard } from './history.js';

const GRAPH_POLL_MS = 1000;
const DETAIL_POLL_MS = 10000;
const MAX_EVENT_ROWS = 2000;
// Events kept in memory for the filter (the timeline folds every event).
const KEEP_EVENTS = 20000;
const TERMINAL = new Set(['COMPLETED', 'FAILED', 'CANCELLED']);
const REDRAW_TYPES = /^(step|loop|token|execution|next)\./;

// A JSON value in a <pre>, cut when long (with a button to show it all).
export function jsonBlock(value, cls = 'json') {
  const shown = json(value);
  const pre = h('pre', { class: cls, text: shown.text });
  if (!shown.cut) return pre;
  const more = h('button', { type: 'button', class: 'quiet', text: `show all ${shown.size} characters` });
  more.addEventListener('click', () => { pre.textContent = JSON.stringify(value, null, 2); more.remove(); });
  return h('div', {}, pre, more);
}

function skeleton(id) {
  const history = historyCard(id);
  const el = {
    history,
    status: h('span', { id: 'exec-status' }),
    cancel: h('div', { id: 'cancel-box', class: 'cancel-box' }),
    facts: h('dl', { class: 'facts', id: 'exec-facts' }),
    error: h('div', { id: 'exec-error' }),
    graph: h('div', { id: 'graph', class: 'graph-wrap' }),
    loopsCard: h('section', { class: 'card', id: 'loops-card', hidden: true }),
    loops: h('div', { id: 'loops' }),
    timeline: h('div', { id: 'timeline', class: 'timeline' }),
    steps: h('tbody', { id: 'steps-body' }),
    ctx: h('div', { id: 'ctx' }),
    workload: h('div', { id: 'workload' }),
    eventCount: h('span', { class: 'dim', id: 'event-count' }),
    eventFilter: h('input', { type: 'search', id: 'event-filter', placeholder: 'filter: type, step or task' }),
    events: h('tbody', { id: 'events-body' }),
    message: h('div', { id: 'exec-message' }),
  };
  el.loopsCard.append(h('h2', { text: 'Loops' }), el.loops);
  const page = [
    h('section', { class: 'card', id: 'execution-page', dataset: { executionId: id } },
      h('div', { class: 'head' },
        h('h1', {}, 'Execution ', h('span', { class: 'mono', id: 'exec-id', text: id })), el.status,
        h('span', { class: 'spacer' }), el.cancel),
      el.message, el.facts, el.error),
    h('section', { class: 'card' }, h('h2', { text: 'Step graph' }), el.graph, legend()),
    el.loopsCard,
    h('section', { class: 'card' }, h('h2', { text: 'Timeline' }), el.timeline),
    h('section', { class: 'card', id: 'steps-card' }, h('h2', { text: 'Steps: results and errors' }),
      h('table', { class: 'grid', id: 'steps-table' },
        h('thead', {}, h('tr', {}, ['Step', 'Status', 'Last run', 'Result or error'].map((t) => h('th', { text: t })))),
        el.steps)),
    h('section', { class: 'card' }, h('h2', { text: 'ctx' }), el.ctx,
      h('details', {}, h('summary', { text: 'workload' }), el.workload)),
    history.card,
    h('section', { class: 'card', id: 'events-card' },
      h('div', { class: 'head' }, h('h2', {}, 'Events ', el.eventCount), h('span', { class: 'spacer' }), el.eventFilter),
      h('table', { class: 'grid events', id: 'events-table' },
        h('thead', {}, h('tr', {}, ['seq', 'time', 'type', 'step', 'task', ''].map((t) => h('th', { text: t })))),
        el.events)),
  ];
  return { el, page };
}

function legend() {
  return h('div', { class: 'legend' }, ['not_run', 'running', 'done', 'failed', 'skipped'].map((st) =>
    h('span', { class: `legend-item status-${st}` }, h('span', { class: 'swatch' }), st.replace('_', ' '))));
}

function fact(name, ...value) {
  return [h('dt', { text: name }), h('dd', {}, ...value)];
}

// Draw the page into `main`; returns the function that stops it.
export function executionPage(main, id, ctx) {
  const { el, page } = skeleton(id);
  replace(main, ...page);
  const state = {
    id, ctx, el, detail: null, graph: null, tl: newTimeline(), events: [], playbook: null,
    selected: null, stopped: false, terminal: false, timers: [], loaded: new Map(), confirming: false,
  };
  state.redraw = throttle(() => drawDerived(state), 250);
  state.graphSoon = throttle(() => refreshGraph(state), 300);
  const stream = follow(`/api/executions/${encodeURIComponent(id)}/events?follow=true`, {
    onEvent: (ev) => onEvent(state, ev),
    onError: (e) => { if (e.status === 404) replace(el.message, note('error', `No execution ${id}.`)); },
    shouldResume: () => resumeStream(state),
    retryMs: 500,
  });
  el.eventFilter.addEventListener('input', () => redrawEvents(state));
  el.history.load();
  pollGraph(state);
  pollDetail(state);
  state.timers.push(setInterval(() => {
    drawFacts(state);
    if (!state.terminal) state.redraw();
  }, 1000));
  return () => {
    state.stopped = true;
    stream.stop();
    state.timers.forEach((t) => { clearTimeout(t); clearInterval(t); });
  };
}

function throttle(fn, ms) {
  let pending = null;
  return () => {
    if (pending) return;
    pending = setTimeout(() => { pending = null; fn(); }, ms);
  };
}

// Whether to reconnect to the event stream after it ended: while the
// execution runs, and after it ended until its terminal event has come
// (the header can say it ended a moment before that event is stored).
async function resumeStream(state) {
  if (state.stopped || state.sawTerminal) return false;
  if (await stillRunning(state)) return true;
  state.tailTries = (state.tailTries || 0) + 1;
  return state.tailTries <= 10;
}

async function stillRunning(state) {
  try {
    const s = await get(`/api/executions/${encodeURIComponent(state.id)}/status`);
    return !TERMINAL.has(s.status);
  } catch (_) {
    return false;
  }
}

function onEvent(state, ev) {
  state.events.push(ev);
  if (state.events.length > KEEP_EVENTS * 1.25) state.events.splice(0, state.events.length - KEEP_EVENTS);
  addEvent(state.tl, ev);
  if (ev.event_type === 'playbook.initialized' && ev.payload) state.playbook = ev.payload;
  appendEvent(state, ev);
  replace(state.el.eventCount, `(${state.events.length})`);
  if (['execution.completed', 'execution.failed', 'execution.cancelled'].includes(ev.event_type)) {
    state.terminal = true;
    state.sawTerminal = true;
    state.el.history.load();
    refreshGraph(state);
    loadDetail(state);
  } else if (REDRAW_TYPES.test(ev.event_type)) {
    state.graphSoon();
  }
  if (ev.event_type === 'execution.paused' || ev.event_type === 'execution.unpaused') loadDetail(state);
  // A queued execution leaves the line when its first step starts.
  if (state.detail && state.detail.is_queued && ev.event_type === 'step.started') loadDetail(state);
  state.redraw();
}

// Read the graph and draw what depends on it; false when the execution
// does not exist.
async function refreshGraph(state) {
  try {
    state.graph = await get(`/api/console/executions/${encodeURIComponent(state.id)}/graph`);
    drawGraphNow(state);
    drawDerived(state);
    drawFacts(state);
  } catch (e) {
    replace(state.el.graph, note('error', `Could not read the step graph: ${e.message}`));
    return e.status !== 404;
  }
  return true;
}

function pollGraph(state) {
  const tick = async () => {
    if (state.stopped) return;
    if (!(await refreshGraph(state))) return;
    if (state.graph && TERMINAL.has(state.graph.status)) {
      state.terminal = true;
      return;
    }
    state.timers.push(setTimeout(tick, GRAPH_POLL_MS));
  };
  tick();
}

// Read the execution (ctx, workload, times); false when it does not exist.
async function loadDetail(state) {
  try {
    state.detail = await get(`/api/executions/${encodeURIComponent(state.id)}`);
    replace(state.el.message);
    replace(state.el.ctx, jsonBlock(state.detail.ctx));
    replace(state.el.workload, jsonBlock(state.detail.workload ?? {}));
    drawFacts(state);
  } catch (e) {
    replace(state.el.message, note('error', e.status === 404 ? `No execution ${state.id}.` : e.message));
    return e.status !== 404;
  }
  return true;
}

function pollDetail(state) {
  const tick = async () => {
    if (state.stopped) return;
    if (!(await loadDetail(state))) return;
    if (!state.terminal && !(state.detail && TERMINAL.has(state.detail.status))) {
      state.timers.push(setTimeout(tick, DETAIL_POLL_MS));
    }
  };
  tick();
}

// The status shown: PAUSED or QUEUED for a running execution held back
// (the API keeps RUNNING with `is_paused` / `is_queued`).
function currentStatus(state) {
  const s = (state.graph && state.graph.status) || (state.detail && state.detail.status) || '';
  return s === 'RUNNING' ? shownStatus({ ...(state.detail || {}), status: s }) : s;
}

function drawFacts(state) {
  const d = state.detail;
  const status = currentStatus(state);
  if (status && state.el.status.dataset.status !== status) replace(state.el.status, badge(status));
  state.el.status.dataset.status = status;
  drawCancel(state, status);
  if (!d) return;
  const pb = state.playbook || {};
  replace(state.el.facts,
    fact('Playbook', pb.playbook || '—', pb.path ? h('span', { class: 'dim mono', text: ` ${pb.path}` }) : null),
    d.catalog_id ? fact('Catalog id', h('span', { class: 'mono', text: d.catalog_id })) : null,
    fact('Started', when(d.started_at)),
    fact('Ended', d.completed_at ? when(d.completed_at) : '—'),
    fact('Duration', h('span', { id: 'exec-duration', text: elapsed(d.started_at, d.completed_at) })),
    d.parent_execution_id ? fact('Parent', h('a', { href: `#/executions/${encodeURIComponent(d.parent_execution_id)}`,
      class: 'mono', text: d.parent_execution_id })) : null,
    fact('Events', String(Math.max(d.event_count, state.events.length))));
  const error = (TERMINAL.has(status) && d.error) || null;
  replace(state.el.error, error ? note('error', error) : null);
}

function drawCancel(state, status) {
  const box = state.el.cancel;
  // A paused execution runs still: it may be cancelled too.
  const show = state.ctx.can('operator') && ['RUNNING', 'PAUSED', 'QUEUED'].includes(status);
  if (!show) {
    if (box.childElementCount) replace(box);
    state.confirming = false;
    return;
  }
  if (box.dataset.mode === (state.confirming ? 'confirm' : 'ask') && box.childElementCount) return;
  box.dataset.mode = state.confirming ? 'confirm' : 'ask';
  if (!state.confirming) {
    replace(box, h('button', { type: 'button', id: 'cancel', class: 'danger', text: 'Cancel execution',
      onclick: () => { state.confirming = true; drawCancel(state, currentStatus(state)); } }));
    return;
  }
  replace(box, h('span', { text: 'Cancel it? ' }),
    h('button', { type: 'button', id: 'cancel-confirm', class: 'danger', text: 'Yes, cancel',
      onclick: () => cancel(state) }),
    h('button', { type: 'button', id: 'cancel-abort', class: 'quiet', text: 'No',
      onclick: () => { state.confirming = false; drawCancel(state, currentStatus(state)); } }));
}

async function cancel(state) {
  state.confirming = false;
  try {
    await post(`/api/executions/${encodeURIComponent(state.id)}/cancel`,
      { reason: `cancelled from the console by ${state.ctx.who.name}` });
    replace(state.el.message, note('ok', 'Cancellation requested.'));
  } catch (e) {
    replace(state.el.message, note('error', `Could not cancel: ${e.message}`));
  }
  drawCancel(state, currentStatus(state));
  state.graphSoon();
}

function drawGraphNow(state) {
  if (!state.graph) return;
  const key = JSON.stringify([state.graph, state.selected]);
  if (key === state.graphKey) return;
  state.graphKey = key;
  drawGraph(state.el.graph, state.graph, {
    selected: state.selected,
    onSelect: (step) => {
      state.selected = step;
      drawGraphNow(state);
      drawSteps(state);
      const row = state.el.steps.querySelector(`tr[data-step="${CSS.escape(step)}"]`);
      if (row) row.scrollIntoView({ block: 'center', behavior: 'smooth' });
    },
  });
}

function drawDerived(state) {
  drawTimeline(state.el.timeline, state.tl, Date.now());
  drawLoops(state);
  drawSteps(state);
}

// A loop step's counts: the graph's (read from the mesh), else the events'.
export function loopCounts(step, tl) {
  if (step.loop_progress) return step.loop_progress;
  const l = tl.loops.get(step.name);
  return l ? { total: l.total, done: l.done, failed: l.failed, in_flight: 0, running: l.running } : null;
}

function drawLoops(state) {
  const loops = ((state.graph && state.graph.steps) || []).filter((st) => st.loop_mode);
  state.el.loopsCard.hidden = !loops.length;
  const counts = loops.map((st) => loopCounts(st, state.tl) || { total: 0, done: 0, failed: 0, in_flight: 0 });
  const key = JSON.stringify([loops.map((st) => [st.name, st.status]), counts]);
  if (key === state.loopsKey) return;
  state.loopsKey = key;
  replace(state.el.loops, loops.map((st, i) => {
    const c = counts[i];
    const total = Math.max(c.total, 1);
    const done = h('div', { class: 'progress-done' });
    done.style.width = `${(c.done / total) * 100}%`;
    const failed = h('div', { class: 'progress-failed' });
    failed.style.width = `${(c.failed / total) * 100}%`;
    const pct = c.total ? Math.floor(((c.done + c.failed) / c.total) * 100) : 0;
    return h('div', { class: 'loop', dataset: { step: st.name, done: String(c.done), failed: String(c.failed),
      total: String(c.total), status: st.status } },
    h('div', { class: 'loop-head' },
      h('strong', { text: st.name }), h('span', { class: 'dim', text: ` ${st.loop_mode}` }),
      h('span', { class: 'spacer' }),
      h('span', { class: 'loop-counts', text: `${c.done} done · ${c.failed} failed · ${c.total} total` +
        `${c.in_flight ? ` · ${c.in_flight} in flight` : ''} (${pct}%)` })),
    h('div', { class: 'progress', role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': c.total,
      'aria-valuenow': c.done + c.failed }, done, failed));
  }));
}

// Task errors a policy rule handled in the step's latest run (its record's
// `handled`): the run went on (`continue`, `jump`, `break`) and the step is
// done, but the error is not hidden.
export function handledErrors(step) {
  const hs = step.handled || [];
  if (!hs.length) return null;
  return h('div', { class: 'handled-errors', dataset: { count: String(hs.length) } },
    hs.map((e) => h('div', { class: 'handled-error', dataset: { task: e.task, action: e.action } },
      h('div', { class: 'dim', text: `handled error in task ${e.task}: the policy's \`${e.action}\` went on` +
        `${e.times > 1 ? ` (${e.times} times)` : ''}` }),
      h('pre', { class: 'json handled-text', text: `${e.kind ? `${e.kind}: ` : ''}${e.message}` }))));
}

function resultCell(state, step) {
  const handled = handledErrors(step);
  const result = resultOf(state, step);
  return handled ? h('div', {}, handled, result) : result;
}

function resultOf(state, step) {
  const failure = state.tl.failures.get(step.name);
  if (step.status === 'failed' || (failure && step.status !== 'done')) {
    const f = failure;
    const where = f && f.task ? `task ${f.task}${f.attempt ? `, attempt ${f.attempt}` : ''}` : '';
    const text = f ? `${f.kind ? `${f.kind}: ` : ''}${f.message}` : (step.error || 'failed');
    return h('div', { class: 'step-error', dataset: { task: (f && f.task) || '', attempt: String((f && f.attempt) || '') } },
      where ? h('div', { class: 'dim', text: `failed in ${where}` }) : null,
      h('pre', { class: 'json error-text', text: text }));
  }
  const r = state.tl.results.get(step.name);
  const loaded = state.loaded.get(step.name);
  const button = h('button', { type: 'button', class: 'quiet load-result', dataset: { step: step.name },
    text: loaded ? 'reload result' : 'load result', onclick: () => loadResult(state, step.name) });
  if (loaded) return h('div', {}, loaded, button);
  if (!r) return step.status === 'done' ? button : h('span', { class: 'dim', text: '—' });
  if (isReference(r.result) || isTruncated(r.result)) {
    return h('div', {}, h('span', { class: 'dim', text: isReference(r.result)
      ? 'stored by reference (large) ' : 'only a preview was kept ' }), button);
  }
  return h('div', {}, jsonBlock(r.result, 'json small'), button);
}

async function loadResult(state, step) {
  try {
    const r = await get(`/api/executions/${encodeURIComponent(state.id)}/results/${encodeURIComponent(step)}`);
    const label = r.by_reference ? 'read from the object store' : (r.truncated ? 'preview only' : '');
    state.loaded.set(step, h('div', { class: 'loaded-result', dataset: { step } },
      label ? h('div', { class: 'dim', text: label }) : null, jsonBlock(r.result, 'json small')));
  } catch (e) {
    state.loaded.set(step, note('error', e.message));
  }
  state.loadedVersion = (state.loadedVersion || 0) + 1;
  drawSteps(state);
}

// A key of what the steps table shows: it is drawn again only when it
// changes (a table redrawn under the pointer loses clicks and selections).
function stepsKey(state, steps) {
  const runs = steps.map((st) => {
    const run = st.step_run_id ? state.tl.runs.get(st.step_run_id) : null;
    return run ? [run.status, run.end === null ? Math.floor(Date.now() / 1000) : run.end] : null;
  });
  return JSON.stringify([steps, runs, state.selected, [...state.tl.results.entries()].map(([k, v]) => [k, v.seq]),
    [...state.tl.failures.keys()], [...state.loaded.keys()], state.loadedVersion || 0]);
}

function drawSteps(state) {
  const steps = (state.graph && state.graph.steps) || [];
  const key = stepsKey(state, steps);
  if (key === state.stepsKey) return;
  state.stepsKey = key;
  replace(state.el.steps, steps.map((st) => {
    const run = st.step_run_id ? state.tl.runs.get(st.step_run_id) : null;
    const took = run ? duration((run.end ?? Date.now()) - run.start) : '';
    return h('tr', { class: `step-row${st.name === state.selected ? ' selected' : ''}`,
      dataset: { step: st.name, status: st.status } },
    h('td', {}, h('strong', { text: st.name }), st.desc ? h('div', { class: 'dim', text: st.desc }) : null),
    h('td', {}, h('span', { class: `badge badge-step-${st.status}`, text: st.status.replace('_', ' ') })),
    h('td', { class: 'mono small' }, st.step_run_id ? h('div', { text: st.step_run_id }) : '—',
      took ? h('div', { class: 'dim', text: took }) : null),
    h('td', {}, resultCell(state, st)));
  }));
}

function summary(ev) {
  const p = ev.payload || {};
  if (p.error) return typeof p.error === 'string' ? p.error : (p.error.message || 'error');
  if (p.status) return String(p.status);
  return '';
}

function eventMatches(state, ev) {
  const f = state.el.eventFilter.value.trim().toLowerCase();
  return !f || `${ev.event_type} ${ev.step} ${ev.task}`.toLowerCase().includes(f);
}

function eventRow(ev) {
  const row = h('tr', { class: `event-row${ev.payload && ev.payload.error ? ' has-error' : ''}`,
    dataset: { seq: String(ev.seq), type: ev.event_type }, tabindex: 0 },
  h('td', { class: 'mono', text: ev.seq }),
  h('td', { class: 'mono', title: ev.ts, text: clock(ev.ts) }),
  h('td', { class: 'mono', text: ev.event_type }),
  h('td', { text: ev.step || '' }),
  h('td', { text: ev.task || '' }),
  h('td', { class: 'dim clip', text: summary(ev) }));
  const toggle = () => {
    const next = row.nextElementSibling;
    if (next && next.classList.contains('payload-row')) {
      next.remove();
      row.classList.remove('open');
      return;
    }
    row.classList.add('open');
    row.after(h('tr', { class: 'payload-row' }, h('td', { colspan: 6 },
      h('div', { class: 'dim mono small', text: `event ${ev.event_id} · step-run ${ev.step_run_id || '—'} · ` +
        `task-run ${ev.task_run_id || '—'} · trace ${ev.trace_id || '—'}` }),
      jsonBlock(ev.payload, 'json small'))));
  };
  row.addEventListener('click', toggle);
  row.addEventListener('keydown', (e) => { if (e.key === 'Enter') toggle(); });
  return row;
}

function appendEvent(state, ev) {
  if (!eventMatches(state, ev)) return;
  state.el.events.append(eventRow(ev));
  state.eventRows = (state.eventRows || 0) + 1;
  while (state.eventRows > MAX_EVENT_ROWS) {
    const first = state.el.events.firstElementChild;
    if (!first.classList.contains('payload-row')) state.eventRows -= 1;
    first.remove();
  }
}

function redrawEvents(state) {
  const shown = state.events.filter((ev) => eventMatches(state, ev)).slice(-MAX_EVENT_ROWS);
  replace(state.el.events, shown.map(eventRow));
  state.eventRows = shown.length;
}
