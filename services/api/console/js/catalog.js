// #/catalog: the registered playbooks (latest version of each path); one
// selected shows each of its versions' YAML, and a form that runs it with
// a workload (operators and admins).

import { h, replace, note } from './dom.js';
import { post } from './api.js';
import { when } from './format.js';

// The workload a run form starts with: the version's `workload`, as JSON.
export function workloadText(entry) {
  return JSON.stringify((entry && entry.payload) || {}, null, 2);
}

// The workload the user typed: an object, or the reason it is not one.
export function parseWorkload(text) {
  let value;
  try {
    value = JSON.parse(text.trim() || '{}');
  } catch (e) {
    return { error: `The workload is not JSON: ${e.message}` };
  }
  if (!value || typeof value !== 'object' || Array.isArray(value)) {
    return { error: 'The workload must be a JSON object ({"name": value, ...}).' };
  }
  return { value };
}

function listRow(entry, selected, select) {
  const name = (entry.meta && entry.meta.name) || '';
  return h('tr', { class: `catalog-row${entry.path === selected ? ' selected' : ''}`,
    dataset: { path: entry.path, version: String(entry.version) }, tabindex: 0,
    onclick: () => select(entry.path), onkeydown: (e) => { if (e.key === 'Enter') select(entry.path); } },
  h('td', {}, h('div', { class: 'mono', text: entry.path }), name ? h('div', { class: 'dim', text: name }) : null),
  h('td', { text: `v${entry.version}` }),
  h('td', { text: when(entry.created_at) }));
}

// Draw the page into `main`; returns the function that stops it.
export function catalogPage(main, params, ctx) {
  const state = { entries: [], path: params.get('path') || null, version: Number(params.get('version')) || null, stopped: false };
  const list = h('tbody', { id: 'catalog-body' });
  const detail = h('div', { id: 'catalog-detail', class: 'detail' });
  const message = h('div', { id: 'catalog-message' });
  replace(main, h('div', { class: 'split' },
    h('section', { class: 'card', id: 'catalog-page' },
      h('div', { class: 'head' }, h('h1', { text: 'Catalog' })), message,
      h('table', { class: 'grid', id: 'catalog-table' },
        h('thead', {}, h('tr', {}, ['Playbook', 'Latest', 'Registered'].map((t) => h('th', { text: t })))),
        list)),
    h('section', { class: 'card' }, detail)));

  function select(path, version) {
    state.path = path;
    state.version = version || null;
    const q = new URLSearchParams({ path });
    if (version) q.set('version', String(version));
    history.replaceState(null, '', `#/catalog?${q}`);
    replace(list, state.entries.map((e) => listRow(e, state.path, (p) => select(p))));
    const entry = state.entries.find((e) => e.path === path);
    if (entry) showEntry(detail, entry, state.version || entry.version, ctx, (v) => select(path, v));
  }

  (async () => {
    try {
      const r = await post('/api/catalog/list', {});
      if (state.stopped) return;
      state.entries = r.entries || [];
      replace(list, state.entries.map((e) => listRow(e, state.path, (p) => select(p))));
      if (!state.entries.length) {
        replace(list, h('tr', {}, h('td', { colspan: 3, class: 'dim',
          text: 'Nothing registered yet (noetl catalog register, or POST /api/catalog/register).' })));
      }
      const first = state.entries.find((e) => e.path === state.path) || state.entries[0];
      if (first) select(first.path, state.path === first.path ? state.version : null);
      else replace(detail, h('p', { class: 'dim', text: 'No playbook selected.' }));
    } catch (e) {
      replace(message, note('error', `Could not list the catalog: ${e.message}`));
    }
  })();
  return () => { state.stopped = true; };
}

async function showEntry(node, latest, version, ctx, pick) {
  const versions = [];
  for (let v = latest.version; v >= 1; v -= 1) versions.push(v);
  const chooser = h('select', { id: 'catalog-version' },
    versions.map((v) => h('option', { value: String(v), text: `v${v}${v === latest.version ? ' (latest)' : ''}`,
      selected: v === version })));
  chooser.addEventListener('change', () => pick(Number(chooser.value)));
  const body = h('div', { id: 'catalog-version-body' }, note('info', 'Loading…'));
  replace(node, h('div', { class: 'head' }, h('h2', { class: 'mono', id: 'catalog-path', text: latest.path }),
    h('span', { class: 'spacer' }), h('label', {}, 'Version ', chooser)), body);
  let entry;
  try {
    entry = version === latest.version && latest.content ? latest
      : await post('/api/catalog/resource', { path: latest.path, version });
  } catch (e) {
    replace(body, note('error', e.status === 404 ? `Version ${version} is not in the catalog (deleted).` : e.message));
    return;
  }
  replace(body,
    h('p', { class: 'dim' }, h('span', { class: 'mono', text: entry.catalog_id }), ` registered ${when(entry.created_at)}`),
    runForm(entry, ctx),
    h('h3', { text: 'YAML' }),
    h('pre', { class: 'yaml', id: 'catalog-yaml', text: entry.content || '' }));
}

function runForm(entry, ctx) {
  if (!ctx.can('operator')) {
    return note('info', 'Your token is a viewer token: running a playbook needs an operator or admin token.');
  }
  const workload = h('textarea', { id: 'workload-input', rows: 6, spellcheck: 'false', value: workloadText(entry) });
  const status = h('div', { id: 'run-status' });
  const button = h('button', { type: 'submit', id: 'run-button', class: 'primary', text: `Run ${entry.catalog_id}` });
  const form = h('form', { id: 'run-form', class: 'run-form' },
    h('label', { for: 'workload-input', text: 'Workload (JSON object, merged over the playbook\'s workload)' }),
    workload, h('div', { class: 'row' }, button, status));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const parsed = parseWorkload(workload.value);
    if (parsed.error) {
      replace(status, note('error', parsed.error));
      return;
    }
    button.disabled = true;
    replace(status, note('info', 'Starting…'));
    try {
      const r = await post('/api/execute', { path: entry.path, version: entry.version, payload: parsed.value });
      ctx.go(`#/executions/${encodeURIComponent(r.execution_id)}`);
    } catch (err) {
      replace(status, note('error', `Could not start it: ${err.message}`));
      button.disabled = false;
    }
  });
  return form;
}
