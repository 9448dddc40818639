// Stored conversations: the list (end user, started, turns, tokens, spend), one as a transcript,
// deleting one (editors), and the tenant's switch for this access. Every list and read is in the
// audit log; with access off the API refuses both and the page says so.
import { api, enc } from '../api.js';
import { clear, field, h, table, when } from '../dom.js';
import { busy, confirmDialog, status } from '../ui.js';

const usd = (v) => `$${Number(v).toFixed(4)}`;
const who = (c) => (c.owner_kind === 'user' ? c.end_user : `${c.end_user} (${c.owner_kind})`);

export async function renderTranscripts(el, ctx, tenant, conv) {
  const base = `/tenants/${enc(tenant.id)}`;
  if (ctx.editor) el.append(await accessCard(el, ctx, tenant, base));
  if (conv) await renderOne(el, ctx, tenant, base, conv);
  else await renderList(el, tenant, base);
}

async function accessCard(el, ctx, tenant, base) {
  const now = await busy('Loading transcript access', () => api('GET', `${base}/transcript-access`));
  const box = h('input', { id: 't-access', type: 'checkbox', checked: now ? now.enabled : true });
  const form = h('form', {}, field('Operators may read this tenant\'s transcripts', box)[0],
    h('button', { type: 'submit' }, 'Save transcript access'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const body = { enabled: box.checked };
    if (await busy('Saving transcript access', () => api('PUT', `${base}/transcript-access`, body), event.submitter)) {
      status('Transcript access saved');
      const tab = el; clear(tab);
      await renderTranscripts(tab, ctx, tenant, null);
    }
  });
  return h('section', { class: 'card', 'aria-labelledby': 't-access-h' }, h('h2', { id: 't-access-h' }, 'Transcript access'), form);
}

async function renderList(el, tenant, base) {
  const page = await busy('Loading conversations', () => api('GET', `${base}/transcripts?limit=200`));
  if (!page) return;
  const link = (c) => h('a', { href: `#/tenants/${enc(tenant.id)}/transcripts/${enc(c.id)}`,
    'aria-label': `Read the conversation of ${c.end_user} started ${when(c.started_at)}` }, 'Read');
  el.append(h('section', { class: 'card', 'aria-labelledby': 'tl-title' }, h('h2', { id: 'tl-title' }, 'Conversations'),
    page.data.length ? table(['End user', 'Started', 'Turns', 'Tokens', 'Spend', ''], page.data.map((c) => [
      who(c), when(c.started_at), String(c.turns), String(c.total_tokens), usd(c.spend_usd), link(c)]))
      : h('p', { class: 'hint' }, 'No stored conversations.')));
}

async function renderOne(el, ctx, tenant, base, conv) {
  const out = await busy('Loading transcript', () => api('GET', `${base}/transcripts/${enc(conv)}`));
  if (!out) return;
  const c = out.conversation;
  const back = h('a', { href: `#/tenants/${enc(tenant.id)}/transcripts` }, '← All conversations');
  const facts = h('p', { class: 'hint', id: 'transcript-facts' },
    `${who(c)} · started ${when(c.started_at)} · ${c.turns} turns · ${c.total_tokens} tokens · ${usd(c.spend_usd)}`);
  const log = h('ol', { class: 'transcript', id: 'transcript', 'aria-label': 'Transcript' },
    out.entries.map((e) => h('li', { class: `turn ${e.role.replace(/[^a-z]/g, '')}` },
      h('span', { class: 'who' }, e.type === 'message' ? e.role : `${e.role} · ${e.type}`),
      h('span', { class: 'when hint' }, when(e.created_at)),
      h('div', { class: 'text' }, e.text))));
  const card = h('section', { class: 'card', 'aria-labelledby': 'tr-title' },
    back, h('h2', { id: 'tr-title' }, 'Transcript'), facts,
    out.entries.length ? log : h('p', { class: 'hint' }, 'This conversation has no items.'));
  if (ctx.editor) {
    const del = h('button', { type: 'button', class: 'danger' }, 'Delete conversation');
    del.addEventListener('click', async () => {
      if (!(await confirmDialog(`Delete this conversation of ${who(c)}? It cannot be recovered.`, 'Delete'))) return;
      if (await busy('Deleting conversation', () => api('DELETE', `${base}/transcripts/${enc(conv)}`), del)) {
        status('Conversation deleted');
        location.hash = `#/tenants/${enc(tenant.id)}/transcripts`;
      }
    });
    card.append(del);
  }
  el.append(card);
}
