// A tenant's API keys: list, create (the key shown once), revoke.
import { api, enc } from '../api.js';
import { badge, clear, field, h, table, when } from '../dom.js';
import { busy, confirmDialog } from '../ui.js';

export async function renderKeys(el, ctx, tenant) {
  const base = `/tenants/${enc(tenant.id)}/keys`;
  const out = await busy('Loading keys', () => api('GET', base));
  if (!out) return;
  const reload = () => { clear(el); return renderKeys(el, ctx, tenant); };
  if (ctx.editor) el.append(createForm(base, el, reload));
  el.append(h('section', { class: 'card', 'aria-labelledby': 'kl-title' },
    h('h2', { id: 'kl-title' }, 'Keys'),
    out.data.length ? table(['Id', 'Kind', 'Prefix', 'Origins', 'Priority', 'Created', 'Last used', 'Status', ''],
      out.data.map((k) => [k.id, k.kind, k.prefix, k.allowed_origins.join(', ') || '—', k.priority,
        when(k.created_at), when(k.last_used_at), badge(k.revoked_at ? 'revoked' : 'active'),
        ctx.editor && !k.revoked_at ? revokeButton(base, k, reload) : ''])) : h('p', { class: 'hint' }, 'No keys.')));
}

function revokeButton(base, key, reload) {
  const btn = h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke key ${key.id}` }, 'Revoke');
  btn.addEventListener('click', async () => {
    if (!(await confirmDialog(`Revoke key ${key.prefix}…? Requests with it are refused at once.`, 'Revoke'))) return;
    if (await busy('Revoking key', () => api('DELETE', `${base}/${enc(key.id)}`), btn)) await reload();
  });
  return btn;
}

function createForm(base, el, reload) {
  const kind = h('select', { id: 'key-kind' }, h('option', { value: 'server' }, 'server'),
    h('option', { value: 'widget' }, 'widget'));
  const origins = h('input', { id: 'key-origins', placeholder: 'https://shop.example' });
  const shown = h('div', { id: 'key-created', 'aria-live': 'polite' });
  const form = h('form', {},
    h('div', { class: 'row' }, field('Kind', kind)[0],
      field('Allowed origins (widget keys)', origins, 'comma separated')[0]),
    h('button', { type: 'submit' }, 'Create key'), shown);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const list = origins.value.split(',').map((o) => o.trim()).filter(Boolean);
    const body = { kind: kind.value, allowed_origins: list };
    const created = await busy('Creating key', () => api('POST', base, body), event.submitter);
    if (!created) return;
    await reload();
    const box = el.querySelector('#key-created');
    box.append(h('p', {}, `Key ${created.id} created. Copy it now: it is not shown again.`),
      h('div', { class: 'secret', id: 'new-key' }, created.key));
  });
  return h('section', { class: 'card', 'aria-labelledby': 'kc-title' },
    h('h2', { id: 'kc-title' }, 'Create a key'), form);
}
