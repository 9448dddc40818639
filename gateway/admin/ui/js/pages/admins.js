// Admin principals: create (the token shown once), list, revoke (platform admins).
import { api } from '../api.js';
import { badge, clear, field, h, table, when } from '../dom.js';
import { busy, confirmDialog } from '../ui.js';

export async function renderAdmins(view, ctx) {
  const list = await busy('Loading admins', () => api('GET', '/admins'));
  const reload = () => { clear(view); return renderAdmins(view, ctx); };
  view.append(h('h1', {}, 'Admins'));
  if (ctx.editor) view.append(createForm(view, reload));
  if (!list) return;
  view.append(h('section', { class: 'card', 'aria-labelledby': 'al-title' }, h('h2', { id: 'al-title' }, 'Admin tokens'),
    table(['Id', 'Name', 'Scope', 'Access', 'Status', 'Expires', 'Created by', ''], list.data.map((a) => [
      a.id, a.name || '—', a.scope, a.access, badge(a.status), when(a.expires_at), a.created_by,
      ctx.editor && a.status === 'active' ? revoke(a, reload) : '']))));
}

function revoke(a, reload) {
  const btn = h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke admin ${a.id}` }, 'Revoke');
  btn.addEventListener('click', async () => {
    if (!(await confirmDialog(`Revoke admin token ${a.id}? It stops working at once.`, 'Revoke'))) return;
    if (await busy('Revoking', () => api('DELETE', `/admins/${encodeURIComponent(a.id)}`), btn)) await reload();
  });
  return btn;
}

function createForm(view, reload) {
  const scope = h('input', { id: 'admin-scope', value: 'platform', required: true });
  const access = h('select', { id: 'admin-access' }, h('option', { value: 'viewer' }, 'viewer'), h('option', { value: 'editor' }, 'editor'));
  const name = h('input', { id: 'admin-name' });
  const expires = h('input', { id: 'admin-expires', type: 'datetime-local' });
  const form = h('form', {}, h('div', { class: 'row' }, field('Scope', scope, '"platform" or a tenant id')[0],
    field('Access', access)[0], field('Name', name)[0], field('Expires (optional)', expires)[0]),
  h('button', { type: 'submit' }, 'Create admin token'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const body = { scope: scope.value.trim(), access: access.value };
    if (name.value) body.name = name.value;
    if (expires.value) body.expires_at = new Date(expires.value).toISOString();
    const made = await busy('Creating admin', () => api('POST', '/admins', body), event.submitter);
    if (!made) return;
    await reload();
    view.querySelector('#admin-created').append(h('p', {}, `Admin ${made.id} created. Copy the token now: it is not shown again.`),
      h('div', { class: 'secret', id: 'new-admin-token' }, made.token));
  });
  return h('section', { class: 'card', 'aria-labelledby': 'ac-title' }, h('h2', { id: 'ac-title' }, 'Create an admin token'),
    form, h('div', { id: 'admin-created', 'aria-live': 'polite' }));
}
