// Times, durations and JSON as the console shows them.

// Milliseconds as `850 ms`, `12.3 s`, `4 min 05 s`, `2 h 03 min`.
export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '';
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(Math.floor(s % 60)).padStart(2, '0')} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, '0')} min`;
}

// An RFC 3339 time as epoch milliseconds (NaN when absent).
export function epoch(ts) {
  return ts ? Date.parse(ts) : NaN;
}

// From `start` to `end` (or to now while it runs).
export function elapsed(start, end) {
  const a = epoch(start);
  if (Number.isNaN(a)) return '';
  const b = end ? epoch(end) : Date.now();
  return duration(b - a);
}

// An RFC 3339 time in the browser's time zone, to the second.
export function when(ts) {
  const t = epoch(ts);
  if (Number.isNaN(t)) return '';
  const d = new Date(t);
  const pad = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// The time of day with milliseconds (event lists).
export function clock(ts) {
  const t = epoch(ts);
  if (Number.isNaN(t)) return '';
  const d = new Date(t);
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// JSON, indented; a text longer than `limit` characters is cut, and says so.
export function json(value, limit = 20000) {
  const text = JSON.stringify(value, null, 2) ?? 'null';
  if (text.length <= limit) return { text, cut: false };
  return { text: text.slice(0, limit), cut: true, size: text.length };
}

// True when a result is stored by reference (the API loads it on demand).
export function isReference(value) {
  return !!value && typeof value === 'object' && typeof value.ref === 'string' &&
    typeof value.key === 'string';
}

// True when only a preview of a result was kept.
export function isTruncated(value) {
  return !!value && typeof value === 'object' && value.truncated === true;
}
