// Tenant policies (platform editors change them): client system messages, stored conversations
// and their retention, a cache salt per visitor on the vLLM backend. PATCH /tenants/{id}.
import { api, enc } from '../api.js';
import { clear, field, h } from '../dom.js';
import { busy, status } from '../ui.js';

export async function renderPolicy(el, ctx, tenant) {
  const base = `/tenants/${enc(tenant.id)}`;
  const off = !(ctx.editor && ctx.platform);
  const check = (id, value) => h('input', { id, type: 'checkbox', checked: value, disabled: off });
  const f = {
    client: check('p-client-system', tenant.allow_client_system),
    store: check('p-store', tenant.conversation_store),
    days: h('input', { id: 'p-retention', type: 'number', min: '0', max: '36500', step: '1',
      value: tenant.conversation_retention_days ?? '', disabled: off }),
    salt: check('p-visitor-salt', tenant.vllm_visitor_salt),
  };
  const form = h('form', {},
    h('div', { class: 'row' },
      field('Allow client system messages', f.client, 'off: requests that carry them get a 400')[0],
      field('Store conversations', f.store, 'off: every response is served with store off')[0],
      field('Conversation retention (days)', f.days, "empty or 0: the gateway's default")[0]),
    h('div', { class: 'row' },
      field('A cache salt per visitor on vLLM', f.salt,
        'visitors isolated from each other; the tenant prompt is computed again for each')[0]));
  if (off) {
    form.append(h('p', { class: 'hint' }, 'Platform editors change these.'));
  } else {
    form.append(h('button', { type: 'submit' }, 'Save policies'));
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      const body = { allow_client_system: f.client.checked, conversation_store: f.store.checked,
        conversation_retention_days: f.days.value === '' ? 0 : parseInt(f.days.value, 10),
        vllm_visitor_salt: f.salt.checked };
      const saved = await busy('Saving policies', () => api('PATCH', base, body), event.submitter);
      if (saved) { status('Policies saved'); clear(el); await renderPolicy(el, ctx, saved); }
    });
  }
  el.append(h('section', { class: 'card', 'aria-labelledby': 'p-title' },
    h('h2', { id: 'p-title' }, 'Policies'), form));
}
