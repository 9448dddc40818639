// Tenants: list, search, create, suspend / resume / delete (platform admins).
import { all, api, enc } from '../api.js';
import { badge, clear, field, h, table, when } from '../dom.js';
import { busy, confirmDialog, status } from '../ui.js';

export async function renderTenants(view, ctx) {
  const list = h('div', { id: 'tenant-list' });
  const search = h('input', { type: 'search', id: 'tenant-search', placeholder: 'id or name' });
  const statusSel = h('select', { id: 'tenant-status' },
    [['', 'not deleted'], ['active', 'active'], ['suspended', 'suspended'],
      ['deleted', 'deleted'], ['all', 'all']].map(([v, t]) => h('option', { value: v }, t)));
  const [searchField] = field('Search tenants', search);
  const [statusField] = field('Status', statusSel);
  view.append(h('h1', {}, 'Tenants'));
  if (ctx.editor) view.append(createForm(() => load()));
  view.append(h('section', { class: 'card', 'aria-labelledby': 'tl-title' },
    h('h2', { id: 'tl-title' }, 'All tenants'),
    h('div', { class: 'row' }, searchField, statusField), list));
  let rows = [];
  const draw = () => drawList(list, ctx, filter(rows, search.value), () => load());
  async function load() {
    const s = statusSel.value;
    const path = s ? `/tenants?status=${enc(s)}` : '/tenants';
    const got = await busy('Loading tenants', () => all(path));
    if (got) { rows = got; draw(); }
  }
  search.addEventListener('input', draw);
  statusSel.addEventListener('change', load);
  await load();
}

function filter(rows, q) {
  const needle = q.trim().toLowerCase();
  if (!needle) return rows;
  return rows.filter((t) => t.id.includes(needle) || t.name.toLowerCase().includes(needle));
}

function createForm(reload) {
  const id = h('input', { required: true, pattern: '[a-z0-9][a-z0-9\\-]{0,61}[a-z0-9]', id: 'new-tenant-id' });
  const name = h('input', { required: true, maxlength: 200, id: 'new-tenant-name' });
  const prompt = h('textarea', { id: 'new-tenant-prompt', rows: 3 });
  const form = h('form', { 'aria-labelledby': 'ct-title' },
    h('div', { class: 'row' }, field('Tenant id', id, 'lowercase letters, digits, hyphens')[0],
      field('Name', name)[0]),
    field('System prompt (optional)', prompt)[0],
    h('button', { type: 'submit' }, 'Create tenant'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const body = { id: id.value.trim(), name: name.value };
    if (prompt.value) body.system_prompt = prompt.value;
    const out = await busy('Creating tenant', () => api('POST', '/tenants', body), event.submitter);
    if (out) { form.reset(); status(`Tenant ${out.id} created`); await reload(); }
  });
  return h('section', { class: 'card' }, h('h2', { id: 'ct-title' }, 'Create a tenant'), form);
}

function drawList(el, ctx, rows, reload) {
  clear(el);
  if (!rows.length) { el.append(h('p', { class: 'hint' }, 'No tenants.')); return; }
  el.append(table(['Id', 'Name', 'Status', 'Prompt', 'Created', ''], rows.map((t) => [
    h('a', { href: `#/tenants/${enc(t.id)}` }, t.id), t.name, badge(t.status),
    t.prompt_version === null ? '—' : `v${t.prompt_version}`, when(t.created_at),
    ctx.editor ? actions(t, reload) : '',
  ])));
}

function actions(t, reload) {
  const act = (label, fn, cls) => h('button', { type: 'button', class: cls || 'secondary',
    'aria-label': `${label} ${t.id}`, onclick: (e) => fn(e.currentTarget) }, label);
  const patch = (s) => async (btn) => {
    if (await busy('Saving', () => api('PATCH', `/tenants/${enc(t.id)}`, { status: s }), btn)) reload();
  };
  const out = [];
  if (t.status === 'active') out.push(act('Suspend', patch('suspended')));
  else out.push(act('Resume', patch('active')));
  if (t.status !== 'deleted') {
    out.push(act('Delete', async (btn) => {
      if (!(await confirmDialog(`Delete tenant ${t.id}? Its keys stop working.`, 'Delete'))) return;
      if (await busy('Deleting', () => api('DELETE', `/tenants/${enc(t.id)}`), btn)) reload();
    }, 'danger'));
  }
  return h('span', {}, out);
}
