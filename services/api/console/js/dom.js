// Building the page without innerHTML: every value the API returns goes
// into the DOM as text, so nothing it holds can become markup or script.

const SVG_NS = 'http://www.w3.org/2000/svg';

// Set attributes, properties and listeners of `node` from `attrs`:
// `class`, `text`, `dataset` (an object), `on<event>` (a function),
// `hidden`, `value`, `disabled`, anything else as an attribute.
function apply(node, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') node.setAttribute('class', value);
    else if (key === 'text') node.textContent = String(value);
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key.startsWith('on') && typeof value === 'function') node.addEventListener(key.slice(2), value);
    else if (key === 'value' || key === 'checked' || key === 'selected') node[key] = value;
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// An HTML element: h('a', {href: '#/x', class: 'link'}, 'text', child...).
export function h(tag, attrs, ...children) {
  return append(apply(document.createElement(tag), attrs), children);
}

// An SVG element, as `h`.
export function s(tag, attrs, ...children) {
  return append(apply(document.createElementNS(SVG_NS, tag), attrs), children);
}

// Replace the children of `node`.
export function replace(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

// A message line: `kind` is `error`, `info` or `ok`.
export function note(kind, text) {
  return h('p', { class: `note note-${kind}`, role: kind === 'error' ? 'alert' : 'status', text });
}
