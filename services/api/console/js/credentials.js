// #/credentials: the keychain's names and kinds (the API never returns a
// credential's data, and the console never asks for it).

import { h, replace, note } from './dom.js';
import { get } from './api.js';
import { when } from './format.js';

// Draw the page into `main`; returns the function that stops it.
export function credentialsPage(main) {
  let stopped = false;
  const body = h('tbody', { id: 'credentials-body' });
  const message = h('div', { id: 'credentials-message' });
  replace(main, h('section', { class: 'card', id: 'credentials-page' },
    h('div', { class: 'head' }, h('h1', { text: 'Credentials' })),
    h('p', { class: 'dim', text: 'Names and kinds only: a credential\'s data goes in encrypted and never comes out.' }),
    message,
    h('table', { class: 'grid', id: 'credentials-table' },
      h('thead', {}, h('tr', {}, ['Name', 'Kind', 'Last written'].map((t) => h('th', { text: t })))),
      body)));
  (async () => {
    try {
      const r = await get('/api/credentials');
      if (stopped) return;
      const items = r.items || [];
      replace(body, items.map((c) => h('tr', { class: 'credential-row', dataset: { name: c.name } },
        h('td', { class: 'mono', text: c.name }),
        h('td', {}, h('span', { class: 'kind', text: c.type })),
        h('td', { text: when(c.updated_at) }))));
      if (!items.length) replace(body, h('tr', {}, h('td', { colspan: 3, class: 'dim', text: 'No credentials.' })));
    } catch (e) {
      replace(message, note('error', `Could not list credentials: ${e.message}`));
    }
  })();
  return () => { stopped = true; };
}
