// Limits and budgets: the tenant's (set by platform admins), its keys' own (tenant editors).
import { api, enc } from '../api.js';
import { clear, field, h, table } from '../dom.js';
import { busy, status } from '../ui.js';

const TENANT = ['rpm', 'tpm', 'max_concurrency', 'max_output_tokens', 'weight'];
const KEY = ['rpm', 'tpm', 'max_concurrency'];

function numberInputs(names, values, disabled) {
  return names.map((n) => {
    const input = h('input', { type: 'number', min: n === 'weight' ? '0.001' : '1',
      step: n === 'weight' ? 'any' : '1', id: `lim-${n}`, disabled, value: values[n] ?? '' });
    return [n, input];
  });
}

function collect(inputs) {
  const out = {};
  for (const [n, input] of inputs) {
    if (input.value !== '') out[n] = n === 'weight' ? Number(input.value) : parseInt(input.value, 10);
  }
  return out;
}

export async function renderLimits(el, ctx, tenant) {
  const base = `/tenants/${enc(tenant.id)}`;
  const [keys, budget] = await Promise.all([
    busy('Loading limits', () => api('GET', `${base}/keys`)),
    api('GET', `${base}/budget`).catch(() => null),
  ]);
  const reload = async () => { const t = await api('GET', base); clear(el); return renderLimits(el, ctx, t); };
  el.append(tenantLimits(ctx, base, tenant, reload), budgetCard(budget));
  if (keys) el.append(keyLimits(ctx, base, keys.data.filter((k) => !k.revoked_at)));
}

function tenantLimits(ctx, base, tenant, reload) {
  const canEdit = ctx.editor && ctx.platform;
  const inputs = numberInputs(TENANT, tenant.limits, !canEdit);
  const form = h('form', {}, h('div', { class: 'row' }, inputs.map(([n, i]) => field(n, i)[0])));
  if (canEdit) {
    form.append(h('button', { type: 'submit' }, 'Save limits'));
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      if (await busy('Saving limits', () => api('PUT', `${base}/limits`, collect(inputs)), event.submitter)) {
        status('Limits saved'); await reload();
      }
    });
  } else {
    form.append(h('p', { class: 'hint' }, 'Set by the platform admins.'));
  }
  return h('section', { class: 'card', 'aria-labelledby': 'tlim-title' },
    h('h2', { id: 'tlim-title' }, 'Tenant limits'), form);
}

function budgetCard(budget) {
  const card = h('section', { class: 'card', 'aria-labelledby': 'bud-title' }, h('h2', { id: 'bud-title' }, 'Budget'));
  if (!budget) { card.append(h('p', { class: 'hint' }, 'No budget information.')); return card; }
  const row = (name, p) => [name, p ? String(p.max_tokens ?? '—') : '—',
    p ? String(p.max_spend_usd ?? '—') : '—', p ? new Date(p.resets_at).toLocaleString() : '—'];
  card.append(table(['Period', 'Max tokens', 'Max spend (USD)', 'Resets'],
    [row('day', budget.day), row('month', budget.month)]));
  return card;
}

function keyLimits(ctx, base, keys) {
  const card = h('section', { class: 'card', 'aria-labelledby': 'klim-title' },
    h('h2', { id: 'klim-title' }, "Keys' own limits"),
    h('p', { class: 'hint' }, "Applied within the tenant's limits."));
  if (!keys.length) { card.append(h('p', { class: 'hint' }, 'No active keys.')); return card; }
  card.append(table(['Key', ...KEY, ''], keys.map((k) => {
    const inputs = KEY.map((n) => [n, h('input', { type: 'number', min: '1', value: k.limits[n] ?? '',
      disabled: !ctx.editor, 'aria-label': `${n} of key ${k.id}` })]);
    const save = ctx.editor ? h('button', { type: 'button', class: 'secondary', 'aria-label': `Save limits of key ${k.id}` }, 'Save') : '';
    if (save) save.addEventListener('click', () => busy('Saving key limits',
      () => api('PUT', `${base}/keys/${enc(k.id)}/limits`, collect(inputs)), save).then((ok) => ok && status('Key limits saved')));
    return [k.prefix, ...inputs.map(([, i]) => i), save];
  })));
  return card;
}
