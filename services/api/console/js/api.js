// The API as the console uses it: JSON requests with the bearer token the
// user entered (kept in this tab's sessionStorage, never in a URL), and
// Server-Sent Events read with fetch (EventSource cannot send a token),
// resumed with Last-Event-ID when the connection drops.

const TOKEN_KEY = 'noetl.console.token';
const unauthorized = new Set();

// The token of this tab, or null.
export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

// Keep `value` as this tab's token (an empty value forgets it).
export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// Call `fn(error)` whenever the API answers 401.
export function onUnauthorized(fn) {
  unauthorized.add(fn);
}

// An error answer: its HTTP status and the API's `error` message.
export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

function headers(extra) {
  const out = { Accept: 'application/json', ...extra };
  const t = token();
  if (t) out.Authorization = `Bearer ${t}`;
  return out;
}

// `method path` with a JSON `body`: the JSON answer, or an ApiError.
// `signal` (an AbortController's) gives the request up: it then rejects
// with the abort's own error, not an ApiError.
export async function call(method, path, body, { signal } = {}) {
  const init = { method, headers: headers(), cache: 'no-store', signal };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    if (signal && signal.aborted) throw e;
    throw new ApiError(0, `the API did not answer (${e.message})`, null);
  }
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch (_) {
    json = null;
  }
  if (!response.ok) {
    const message = (json && json.error) || text || response.statusText;
    const error = new ApiError(response.status, message, json);
    if (response.status === 401) unauthorized.forEach((fn) => fn(error));
    throw error;
  }
  return json;
}

// `GET path` (`opts.signal`: see `call`).
export const get = (path, opts) => call('GET', path, undefined, opts);
// `POST path` with `body`.
export const post = (path, body) => call('POST', path, body ?? {});

// Split a text/event-stream buffer into complete events; the rest stays.
export function parseEvents(buffer) {
  const events = [];
  let rest = buffer.replace(/\r\n?/g, '\n');
  let end;
  while ((end = rest.indexOf('\n\n')) >= 0) {
    const block = rest.slice(0, end);
    rest = rest.slice(end + 2);
    const ev = { id: null, event: 'message', data: '' };
    const data = [];
    for (const line of block.split('\n')) {
      if (!line || line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'id') ev.id = value;
      else if (field === 'event') ev.event = value;
      else if (field === 'data') data.push(value);
    }
    if (data.length || ev.id !== null) {
      ev.data = data.join('\n');
      events.push(ev);
    }
  }
  return { events, rest };
}

// Follow the event stream at `path` (a `?follow=true` URL): `onEvent(data,
// event)` for each event with JSON data; on a dropped connection it
// reconnects after `retryMs` with Last-Event-ID, unless `shouldResume()`
// says no. `onEnd()` once it stops by itself. Returns `{ stop() }`.
export function follow(path, { onEvent, onEnd, onError, shouldResume, retryMs = 1000 }) {
  let stopped = false;
  let lastId = null;
  let controller = null;
  async function once() {
    controller = new AbortController();
    const extra = { Accept: 'text/event-stream' };
    if (lastId !== null) extra['Last-Event-ID'] = lastId;
    const response = await fetch(path, { headers: headers(extra), signal: controller.signal, cache: 'no-store' });
    if (!response.ok) {
      let message = response.statusText;
      try {
        message = (await response.json()).error || message;
      } catch (_) { /* not JSON */ }
      const error = new ApiError(response.status, message, null);
      if (response.status === 401) unauthorized.forEach((fn) => fn(error));
      throw error;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      const parsed = parseEvents(buffer);
      buffer = parsed.rest;
      for (const ev of parsed.events) {
        if (ev.id !== null) lastId = ev.id;
        if (ev.event === 'error') throw new ApiError(0, ev.data, null);
        let data;
        try {
          data = JSON.parse(ev.data);
        } catch (_) {
          continue;
        }
        onEvent(data, ev.event);
      }
    }
  }
  (async () => {
    while (!stopped) {
      try {
        await once();
      } catch (e) {
        if (stopped) return;
        if (onError) onError(e);
        if (e instanceof ApiError && e.status >= 400 && e.status < 500) return;
      }
      if (stopped) return;
      const resume = shouldResume ? await shouldResume() : false;
      if (!resume) {
        if (onEnd) onEnd();
        return;
      }
      await new Promise((r) => setTimeout(r, retryMs));
    }
  })();
  return {
    stop() {
      stopped = true;
      if (controller) controller.abort();
    },
  };
}
