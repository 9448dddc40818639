// One tenant: a header and tabs (prompt, keys, limits, policies, widget, usage, transcripts,
// audit).
import { api, enc } from '../api.js';
import { badge, h } from '../dom.js';
import { busy } from '../ui.js';
import { renderAudit } from './audit.js';
import { renderKeys } from './keys.js';
import { renderLimits } from './limits.js';
import { renderPolicy } from './policy.js';
import { renderPrompt } from './prompt.js';
import { renderTranscripts } from './transcripts.js';
import { renderUsage } from './usage.js';
import { renderWidget } from './widget.js';

const TABS = [
  ['prompt', 'System prompt', renderPrompt], ['keys', 'Keys', renderKeys],
  ['limits', 'Limits & budget', renderLimits], ['policies', 'Policies', renderPolicy],
  ['widget', 'Widget', renderWidget],
  ['usage', 'Usage', renderUsage], ['transcripts', 'Transcripts', renderTranscripts],
  ['audit', 'Audit log', renderAudit],
];

export async function renderTenant(view, ctx, id, tab, sub) {
  const tenant = await busy('Loading tenant', () => api('GET', `/tenants/${enc(id)}`));
  if (!tenant) return;
  view.append(h('h1', {}, h('span', { id: 'tenant-name' }, tenant.name), ' ',
    h('span', { class: 'hint' }, tenant.id), ' ', badge(tenant.status)));
  view.append(h('nav', { class: 'tabs', 'aria-label': 'Tenant sections' }, TABS.map(([key, label]) =>
    h('a', { href: `#/tenants/${enc(id)}/${key}`, 'aria-current': key === tab ? 'page' : null }, label))));
  const body = h('div', { id: 'tab' });
  view.append(body);
  const found = TABS.find(([key]) => key === tab) || TABS[0];
  await found[2](body, ctx, tenant, sub);
}
