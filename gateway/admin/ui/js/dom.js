// DOM helpers. Every piece of data becomes a text node (textContent), never markup.

/** h('tag', {attr: value, onclick: fn}, child...) : children are nodes or text. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (name === 'value') el.value = value;
    else if (name === 'checked') el.checked = Boolean(value);
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  for (const child of children) el.append(child instanceof Node ? child : String(child));
  return el;
}

/** A labelled form field: returns [wrapper, input]. */
export function field(label, input, hint) {
  const id = input.id || `f-${Math.random().toString(36).slice(2, 10)}`;
  input.id = id;
  const wrap = h('div', {}, h('label', { for: id }, label), input);
  if (hint) wrap.append(h('div', { class: 'hint' }, hint));
  return [wrap, input];
}

export function table(headers, rows, caption) {
  return h('table', {},
    caption ? h('caption', { class: 'hint' }, caption) : null,
    h('thead', {}, h('tr', {}, headers.map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, rows.map((cells) => h('tr', {}, cells.map((c) => h('td', {}, c))))));
}

export function badge(text) {
  return h('span', { class: `badge ${String(text).replace(/[^a-z_]/g, '')}` }, text);
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : '—';
}
