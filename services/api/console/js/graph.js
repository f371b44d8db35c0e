// The step graph as SVG, from /api/console/executions/<id>/graph: steps
// in the columns and rows the API laid out (topological layers, left to
// right), arcs as curves (an arc back to an earlier step dashed, below),
// each step coloured by its status, a loop step with its progress bar.

import { s, replace } from './dom.js';

const W = 188;
const H = 62;
const GAP_X = 72;
const GAP_Y = 26;
const PAD = 16;

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

// Where each step's box goes: layers are columns, each centred vertically.
export function positions(graph) {
  const perLayer = new Map();
  for (const st of graph.steps) perLayer.set(st.layer, Math.max(perLayer.get(st.layer) || 0, st.order + 1));
  const rows = Math.max(1, ...perLayer.values());
  const at = new Map();
  for (const st of graph.steps) {
    const shift = ((rows - perLayer.get(st.layer)) * (H + GAP_Y)) / 2;
    at.set(st.name, { x: PAD + st.layer * (W + GAP_X), y: PAD + shift + st.order * (H + GAP_Y) });
  }
  const width = PAD * 2 + Math.max(1, graph.layers) * (W + GAP_X) - GAP_X;
  const height = PAD * 2 + rows * (H + GAP_Y) - GAP_Y;
  return { at, width, height };
}

function arcPath(a, from, to, bottom, k) {
  if (a.from === a.to) {
    const x = from.x + W;
    const y = from.y;
    return `M ${x - 24} ${y} C ${x + 10} ${y - 34}, ${x + 34} ${y + 10}, ${x} ${y + H / 2}`;
  }
  if (a.back) {
    const sx = from.x + W / 2;
    const tx = to.x + W / 2;
    const yb = bottom + 18 + k * 10;
    return `M ${sx} ${from.y + H} C ${sx} ${yb}, ${tx} ${yb}, ${tx} ${to.y + H}`;
  }
  const x1 = from.x + W;
  const y1 = from.y + H / 2;
  const x2 = to.x;
  const y2 = to.y + H / 2;
  const dx = Math.max(28, (x2 - x1) / 2);
  return `M ${x1} ${y1} C ${x1 + dx} ${y1}, ${x2 - dx} ${y2}, ${x2} ${y2}`;
}

function subtitle(st) {
  const p = st.loop_progress;
  if (st.loop_mode) {
    const counts = p ? ` · ${p.done + p.failed}/${p.total}` : '';
    return `loop ${st.loop_mode}${counts}`;
  }
  const kinds = [...new Set(st.tasks.map((t) => t.kind))];
  return clip(kinds.join(' · ') || 'no task', 30);
}

function tooltip(st) {
  const lines = [`${st.name}: ${st.status}`];
  if (st.desc) lines.push(st.desc);
  lines.push(`tasks: ${st.tasks.map((t) => `${t.name} (${t.kind})`).join(', ') || 'none'}`);
  if (st.loop_progress) {
    const p = st.loop_progress;
    lines.push(`loop: ${p.done} done, ${p.failed} failed, ${p.in_flight} in flight, ${p.total} in all`);
  }
  if (st.error) lines.push(`error: ${st.error}`);
  for (const e of st.handled || []) lines.push(`handled error: ${e.task}: ${e.kind ? `${e.kind}: ` : ''}${e.message}`);
  return lines.join('\n');
}

function loopBar(p) {
  const width = W - 24;
  const total = Math.max(p.total, 1);
  const done = (p.done / total) * width;
  const failed = (p.failed / total) * width;
  return s('g', { class: 'loop-bar', transform: `translate(12 ${H - 13})` },
    s('rect', { class: 'loop-bar-bg', width, height: 6, rx: 3 }),
    s('rect', { class: 'loop-bar-done', width: done, height: 6, rx: 3 }),
    s('rect', { class: 'loop-bar-failed', x: done, width: failed, height: 6 }));
}

function stepNode(st, at, selected, onSelect) {
  const g = s('g', {
    class: `node status-${st.status}${st.name === selected ? ' selected' : ''}`,
    transform: `translate(${at.x} ${at.y})`, tabindex: 0, role: 'button',
    dataset: { step: st.name, status: st.status },
  },
  s('title', { text: tooltip(st) }),
  s('rect', { class: 'box', width: W, height: H, rx: 9 }),
  s('text', { class: 'name', x: 12, y: 22, text: clip(st.name, 24) }),
  s('text', { class: 'sub', x: 12, y: 40, text: subtitle(st) }),
  s('text', { class: 'state', x: W - 10, y: 22, 'text-anchor': 'end', text: st.status.replace('_', ' ') }),
  st.loop_progress ? loopBar(st.loop_progress) : null);
  const pick = () => onSelect && onSelect(st.name);
  g.addEventListener('click', pick);
  g.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); pick(); } });
  return g;
}

// Draw `graph` into `node`; `onSelect(step)` when a step is clicked.
export function drawGraph(node, graph, { selected, onSelect } = {}) {
  if (!graph.planned) {
    replace(node, s('svg', { class: 'graph', width: 300, height: 40 },
      s('text', { x: 10, y: 24, class: 'sub', text: 'Waiting for the router to store the plan…' })));
    return;
  }
  const { at, width, height } = positions(graph);
  const backs = graph.arcs.filter((a) => a.back && a.from !== a.to).length;
  const total = height + (backs ? 28 + backs * 10 : 0);
  const status = new Map(graph.steps.map((st) => [st.name, st.status]));
  let k = 0;
  const arcs = graph.arcs.filter((a) => at.has(a.from) && at.has(a.to)).map((a) => {
    const taken = status.get(a.to) !== 'not_run' && status.get(a.from) !== 'not_run';
    const d = arcPath(a, at.get(a.from), at.get(a.to), height - PAD, a.back && a.from !== a.to ? k++ : 0);
    return s('path', { class: `arc${a.back ? ' back' : ''}${taken ? ' taken' : ''}`, d,
      'marker-end': 'url(#arrow)', dataset: { from: a.from, to: a.to } },
    s('title', { text: `${a.from} → ${a.to}${a.when ? ` when ${a.when}` : ''}` }));
  });
  replace(node, s('svg', {
    class: 'graph', id: 'graph-svg', width, height: total, viewBox: `0 0 ${width} ${total}`,
    role: 'img', 'aria-label': 'step graph',
  },
  s('defs', {}, s('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7,
    markerHeight: 7, orient: 'auto-start-reverse' }, s('path', { d: 'M0 0 L10 5 L0 10 z', class: 'arrowhead' }))),
  s('g', { class: 'arcs' }, arcs),
  s('g', { class: 'nodes' }, graph.steps.map((st) => stepNode(st, at.get(st.name), selected, onSelect)))));
}
