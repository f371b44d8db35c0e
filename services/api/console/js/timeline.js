// What happened when, built from an execution's events: one row per
// step-run (from its first event to its step.done / step.failed), with
// its task attempts inside (task.started to task.done); each failed step
// with the task and attempt that failed it; each step's last result.

import { h, replace } from './dom.js';
import { duration, epoch } from './format.js';

const MAX_ROWS = 300;
// Task attempts kept per step-run (a long loop's oldest are dropped).
const MAX_TASKS = 500;

function taskKey(ev) {
  const attempt = ev.payload && ev.payload.attempt;
  return ev.task_run_id || `${ev.step_run_id}/${ev.task}/${attempt ?? ''}`;
}

// Fold one event into the timeline `tl` (from `newTimeline()`).
export function addEvent(tl, ev) {
  const t = epoch(ev.ts);
  if (Number.isNaN(t)) return;
  tl.start = Math.min(tl.start, t);
  tl.last = Math.max(tl.last, t);
  const p = ev.payload || {};
  if (ev.event_type.startsWith('execution.') && ev.event_type !== 'execution.cancel_requested' &&
      ev.event_type !== 'execution.deadline') {
    tl.end = t;
  }
  if (!ev.step_run_id) return;
  let run = tl.runs.get(ev.step_run_id);
  if (!run) {
    run = { srid: ev.step_run_id, step: ev.step, start: t, end: null, status: 'running', tasks: new Map() };
    tl.runs.set(ev.step_run_id, run);
  }
  run.start = Math.min(run.start, t);
  switch (ev.event_type) {
    case 'step.done': run.end = t; run.status = 'done'; tl.results.set(ev.step, { srid: run.srid, result: p.result, seq: ev.seq }); break;
    case 'step.failed': run.end = t; run.status = 'failed'; tl.failures.set(ev.step, failure(run, ev)); break;
    case 'step.skipped': run.end = t; run.status = 'skipped'; break;
    case 'loop.started': tl.loops.set(ev.step, { srid: run.srid, total: p.total || 0, done: 0, failed: 0, running: true }); break;
    case 'loop.iteration.done':
    case 'loop.iteration.failed': {
      const loop = tl.loops.get(ev.step);
      if (loop && loop.srid === (p.loop_run_id || run.srid)) loop[ev.event_type.endsWith('done') ? 'done' : 'failed'] += 1;
      break;
    }
    case 'loop.done': {
      const c = p.counts || {};
      tl.loops.set(ev.step, { srid: run.srid, total: c.total || 0, done: c.done || 0, failed: c.failed || 0, running: false });
      // The loop step's boundary when it succeeded (else a step.failed follows).
      if (p.boundary) {
        run.end = t;
        run.status = 'done';
        tl.results.set(ev.step, { srid: run.srid, result: p.result, seq: ev.seq });
      }
      break;
    }
    case 'task.started': {
      const task = task_(run, ev, t);
      task.start = t;
      task.kind = p.kind || task.kind;
      break;
    }
    case 'task.done': {
      const task = task_(run, ev, t);
      task.end = t;
      task.status = p.status || 'ok';
      task.ms = p.duration_ms;
      // A quick attempt has no task.started: its start rides in its end.
      if (task.start === null) task.start = p.started ? p.started.at_ms : t - (p.duration_ms || 0);
      if (p.started) task.kind = p.started.kind || task.kind;
      task.error = p.error || null;
      task.action = p.action || '';
      break;
    }
    default:
  }
}

function task_(run, ev, t) {
  const key = taskKey(ev);
  let task = run.tasks.get(key);
  if (!task) {
    task = { name: ev.task, attempt: (ev.payload && ev.payload.attempt) || 1, kind: '', start: null,
      end: null, status: 'running', ms: null, error: null, action: '', first: t };
    run.tasks.set(key, task);
    if (run.tasks.size > MAX_TASKS) {
      run.dropped = (run.dropped || 0) + 1;
      run.tasks.delete(run.tasks.keys().next().value);
    }
  }
  return task;
}

// A failed step: its error, and the last task attempt that failed in it.
function failure(run, ev) {
  const p = ev.payload || {};
  const failed = [...run.tasks.values()].filter((t) => t.status === 'error');
  const last = failed[failed.length - 1] || null;
  const error = p.error;
  const message = typeof error === 'string' ? error
    : (error && (error.message || JSON.stringify(error))) || 'failed';
  return {
    srid: run.srid,
    step: ev.step,
    kind: error && typeof error === 'object' ? error.kind || '' : '',
    message,
    task: last ? last.name : (ev.task || ''),
    attempt: last ? last.attempt : null,
    ts: ev.ts,
  };
}

// An empty timeline.
export function newTimeline() {
  return {
    start: Infinity, last: -Infinity, end: null, runs: new Map(), results: new Map(), failures: new Map(), loops: new Map(),
  };
}

function span(tl, a, b, range) {
  const left = ((a - tl.start) / range) * 100;
  const width = Math.max(((b - a) / range) * 100, 0.4);
  return { left: `${Math.max(0, left)}%`, width: `${Math.min(width, 100 - Math.max(0, left))}%` };
}

function bar(cls, pos, title, dataset) {
  const el = h('div', { class: cls, title, dataset });
  el.style.left = pos.left;
  el.style.width = pos.width;
  return el;
}

// Draw `tl` into `node`; `now` is the time a running run is drawn up to.
export function drawTimeline(node, tl, now) {
  const runs = [...tl.runs.values()].sort((a, b) => a.start - b.start);
  if (!runs.length) {
    replace(node, h('p', { class: 'dim', text: 'No step has run yet.' }));
    return;
  }
  const end = tl.end ?? Math.max(tl.last, now);
  const range = Math.max(end - tl.start, 1);
  const rows = runs.slice(0, MAX_ROWS).map((run) => {
    const runEnd = run.end ?? end;
    const tasks = [...run.tasks.values()].map((t) => bar(`tl-task tl-${t.status}`,
      span(tl, t.start ?? t.first, t.end ?? runEnd, range),
      `${t.name} (${t.kind || 'task'}) attempt ${t.attempt}: ${t.status}` +
        `${t.ms !== null ? `, ${duration(t.ms)}` : ''}${t.action && t.action !== 'continue' ? `, then ${t.action}` : ''}`,
      { task: t.name, attempt: String(t.attempt) }));
    return h('div', { class: 'tl-row', dataset: { step: run.step, stepRun: run.srid, status: run.status } },
      h('div', { class: 'tl-label', title: run.dropped
        ? `${run.srid} (its ${run.dropped} earliest task attempts are not drawn)` : run.srid },
        h('span', { class: 'tl-step', text: run.step }),
        h('span', { class: 'dim', text: ` ${duration(runEnd - run.start)}` })),
      h('div', { class: 'tl-track' },
        bar(`tl-run tl-${run.status}`, span(tl, run.start, runEnd, range),
          `${run.step} (${run.srid}): ${run.status}, ${duration(runEnd - run.start)}`, {}),
        tasks));
  });
  const more = runs.length > MAX_ROWS
    ? h('p', { class: 'dim', text: `${runs.length - MAX_ROWS} later step-runs are not drawn.` }) : null;
  replace(node,
    h('div', { class: 'tl-axis' }, h('span', { text: '0' }), h('span', { text: duration(range) })),
    rows, more);
}
