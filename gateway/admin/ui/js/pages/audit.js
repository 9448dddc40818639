// A tenant's audit log, newest first (who did what; never secrets).
import { api, enc } from '../api.js';
import { h, table, when } from '../dom.js';
import { busy } from '../ui.js';

export async function renderAudit(el, ctx, tenant) {
  const page = await busy('Loading audit log', () => api('GET', `/tenants/${enc(tenant.id)}/audit?limit=200`));
  if (!page) return;
  el.append(h('section', { class: 'card', 'aria-labelledby': 'a-title' }, h('h2', { id: 'a-title' }, 'Audit log'),
    page.data.length ? table(['When', 'Who', 'Action', 'Details'], page.data.map((a) => [
      when(a.at), a.actor, a.action, h('code', {}, JSON.stringify(a.details))])) : h('p', { class: 'hint' }, 'Nothing yet.')));
}
