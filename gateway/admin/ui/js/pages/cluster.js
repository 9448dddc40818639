// The cluster: workers, health, load, and where tenants' prompts are pinned.
import { api } from '../api.js';
import { h, table } from '../dom.js';
import { busy } from '../ui.js';

export async function renderCluster(view) {
  const c = await busy('Loading cluster', () => api('GET', '/cluster'));
  view.append(h('h1', {}, 'Cluster'));
  if (!c) return;
  const card = h('section', { class: 'card', 'aria-labelledby': 'c-title' }, h('h2', { id: 'c-title' }, `Mode: ${c.mode}`));
  if (c.mode === 'in_process') card.append(h('p', { class: 'hint' }, 'The engine runs inside this gateway.'));
  if (c.workers.length) {
    card.append(table(['Worker', 'URL', 'Healthy', 'Running', 'Waiting', 'Free blocks', 'Pinned tenants'],
      c.workers.map((w) => [w.worker_id, w.url, w.healthy ? 'yes' : 'no', String(w.running ?? '—'),
        String(w.waiting ?? '—'), `${w.blocks_free ?? '—'} / ${w.blocks_total ?? '—'}`, w.pinned_tenants.join(', ')])));
  }
  const tenants = Object.entries(c.tenants || {});
  if (tenants.length) {
    card.append(h('h2', {}, 'Placement'), table(['Tenant', 'Placed on', 'Pinned on', 'Blocks'],
      tenants.map(([id, t]) => [id, t.placed_on.join(', '), t.pinned_on.join(', '), String(t.blocks)])));
  }
  view.append(card);
}
