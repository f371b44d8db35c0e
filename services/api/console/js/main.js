// The console's shell: who the token is, the token form, and the hash
// routes (#/executions, #/executions/<id>, #/catalog, #/credentials).
// Each page is a function that draws into <main> and returns a function
// that stops its polling and streams when the user leaves it.

import { h, replace, note } from './dom.js';
import { get, setToken, token, onUnauthorized } from './api.js';
import { executionsPage } from './executions.js';
import { executionPage } from './execution.js';
import { catalogPage } from './catalog.js';
import { credentialsPage } from './credentials.js';

const main = document.getElementById('main');
const who = document.getElementById('who');
const signOut = document.getElementById('signout');
const RANK = { viewer: 0, operator: 1, admin: 2 };

let leave = null;
let session = null;

// What pages know of the session: who, and whether the role may `role`.
function context() {
  return {
    who: session,
    can: (role) => !!session && RANK[session.role] >= RANK[role],
    go: (hash) => { window.location.hash = hash; },
  };
}

function stopPage() {
  if (leave) {
    try { leave(); } catch (_) { /* the page is gone anyway */ }
  }
  leave = null;
}

function showWho() {
  if (!session) {
    replace(who);
    signOut.hidden = true;
    return;
  }
  replace(who, h('span', { class: 'who-name', text: session.name }), ' ',
    h('span', { class: `role role-${session.role}`, id: 'who-role', text: session.role }));
  signOut.hidden = !token();
}

// The token form, with `message` (why it is shown).
function tokenPage(message) {
  stopPage();
  session = null;
  showWho();
  const input = h('input', {
    type: 'password', id: 'token-input', name: 'token', autocomplete: 'off',
    spellcheck: 'false', required: true, placeholder: 'paste the bearer token',
  });
  const status = h('div', { id: 'token-status' }, message ? note('error', message) : null);
  const form = h('form', { id: 'token-form', class: 'token-form' },
    h('label', { for: 'token-input', text: 'API token' }), input,
    h('button', { type: 'submit', id: 'token-submit', text: 'Use token' }));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    setToken(input.value.trim());
    input.value = '';
    replace(status, note('info', 'Checking the token…'));
    await start();
  });
  replace(main, h('section', { class: 'card narrow', id: 'token-page' },
    h('h1', { text: 'Sign in' }),
    h('p', { text: 'This API needs a bearer token: a viewer token reads, an operator token also ' +
      'starts and cancels executions, an admin token also changes the catalog. It is kept ' +
      'in this browser tab only (sessionStorage) and sent in the Authorization header.' }),
    form, status));
  input.focus();
}

function route() {
  stopPage();
  if (!session) return;
  const hash = window.location.hash || '#/executions';
  const [path, query] = hash.slice(1).split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean);
  for (const a of document.querySelectorAll('[data-nav]')) {
    a.classList.toggle('active', a.dataset.nav === parts[0]);
  }
  const ctx = context();
  if (parts[0] === 'executions' && parts[1]) {
    leave = executionPage(main, decodeURIComponent(parts.slice(1).join('/')), ctx);
  } else if (parts[0] === 'catalog') {
    leave = catalogPage(main, params, ctx);
  } else if (parts[0] === 'credentials') {
    leave = credentialsPage(main, ctx);
  } else {
    leave = executionsPage(main, params, ctx);
  }
}

// Ask who the token is; the token form when it is missing or refused.
async function start() {
  try {
    session = await get('/api/console/whoami');
  } catch (e) {
    session = null;
    if (e.status === 401) {
      const had = !!token();
      setToken(null);
      tokenPage(had ? `The token was refused: ${e.message}` : null);
    } else {
      replace(main, note('error', `The API did not answer: ${e.message}`),
        h('button', { type: 'button', text: 'Try again', onclick: start }));
    }
    return;
  }
  showWho();
  route();
}

onUnauthorized((e) => {
  if (session) {
    setToken(null);
    tokenPage(`The API refused the token: ${e.message}`);
  }
});

signOut.addEventListener('click', () => {
  setToken(null);
  stopPage();
  session = null;
  showWho();
  replace(main, note('info', 'Token forgotten.'));
  start();
});

window.addEventListener('hashchange', route);
start();
