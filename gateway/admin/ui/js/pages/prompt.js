// The system prompt: editor (text, tools, tool choice, rounds: a new version is sent whole),
// version history, diff of two versions (text and tools), activation, cache state.
import { api, enc } from '../api.js';
import { badge, clear, field, h, table, when } from '../dom.js';
import { diffLines } from '../diff.js';
import { busy, confirmDialog, showError, status } from '../ui.js';
import {
  choiceLabel, choiceOf, DEFAULT_CHOICE, DEFAULT_ROUNDS, diffTools, parseTools, toolNames, toolSummary,
} from '../tools.js';

export async function renderPrompt(el, ctx, tenant) {
  const base = `/tenants/${enc(tenant.id)}`;
  const [versions, cache] = await Promise.all([
    busy('Loading prompt versions', () => api('GET', `${base}/system-prompts`)),
    api('GET', `${base}/cache`).catch(() => null),
  ]);
  if (!versions) return;
  const rows = versions.data;
  const active = rows.find((v) => v.active);
  const reload = () => { clear(el); return renderPrompt(el, ctx, tenant); };
  el.append(h('div', { class: 'grid2' }, editor(ctx, base, active, reload), cacheCard(cache, active)));
  el.append(history(ctx, base, rows, reload));
  if (rows.length >= 2) el.append(diffCard(rows));
}

function editor(ctx, base, active, reload) {
  const ro = !ctx.editor;
  const text = h('textarea', { id: 'prompt-text', rows: 10, readonly: ro });
  text.value = active ? active.text : '';
  const tools = h('textarea', { id: 'prompt-tools', rows: 8, readonly: ro, spellcheck: 'false' });
  tools.value = JSON.stringify((active && active.tools) || [], null, 2);
  const choice = h('select', { id: 'prompt-choice', disabled: ro });
  const rounds = h('input', { id: 'prompt-rounds', type: 'number', min: '0', max: '16', step: '1',
    readonly: ro, value: active ? active.max_tool_rounds : DEFAULT_ROUNDS });
  const fillChoices = (wanted) => {
    const parsed = parseTools(tools.value);
    const labels = ['auto', 'required', 'none',
      ...(parsed instanceof Error ? [] : toolNames(parsed)).map((n) => `function ${n}`)];
    clear(choice).append(...labels.map((l) => h('option', { value: l }, l)));
    choice.value = labels.includes(wanted) ? wanted : DEFAULT_CHOICE;
  };
  fillChoices(choiceLabel(active && active.tool_choice));
  tools.addEventListener('change', () => fillChoices(choice.value));
  const card = h('section', { class: 'card', 'aria-labelledby': 'pe-title' },
    h('h2', { id: 'pe-title' }, active ? `Active: version ${active.version}` : 'No system prompt'),
    field('System prompt', text)[0],
    field('Tools (JSON)', tools, 'The functions of this version, as PUT .../system-prompt takes them; [] for none.')[0],
    h('div', { class: 'row' }, field('Tool choice', choice)[0], field('Max tool rounds', rounds)[0]));
  if (ctx.editor) {
    const save = h('button', { type: 'button', id: 'prompt-save' }, 'Save as new version');
    save.addEventListener('click', async () => {
      const parsed = parseTools(tools.value);
      if (parsed instanceof Error) { showError(parsed); tools.focus(); return; }
      const had = toolNames(active && active.tools).length;
      if (had && !parsed.length
          && !(await confirmDialog(`Version ${active.version} has ${had} tool(s); the new version will have none. Save without tools?`, 'Save without tools'))) return;
      const body = { text: text.value, tools: parsed, tool_choice: choiceOf(choice.value),
        max_tool_rounds: parseInt(rounds.value, 10) };
      const out = await busy('Saving prompt', () => api('PUT', `${base}/system-prompt`, body), save);
      if (out) { status(`Version ${out.version} is active`); await reload(); }
    });
    card.append(save);
  }
  return card;
}

function cacheCard(cache, active) {
  const card = h('section', { class: 'card', 'aria-labelledby': 'pc-title' },
    h('h2', { id: 'pc-title' }, 'Prompt cache'));
  if (!cache) { card.append(h('p', { class: 'hint' }, 'Cache state is not available.')); return card; }
  const pct = `${Math.round((cache.hit_rate || 0) * 1000) / 10}%`;
  card.append(table(['Measure', 'Value'], [
    ['Prompt tokens', String(cache.prefix_tokens ?? '—')],
    ['Pin state', badge(cache.pin_state)],
    ['Pinned version', cache.prompt_version === null ? '—' : `v${cache.prompt_version}`],
    ['Pinned tokens', String(cache.pinned_tokens ?? 0)],
    ['Requests', String(cache.requests ?? 0)],
    ['Prefix hit rate', pct],
  ]));
  if (active && cache.prompt_version !== null && cache.prompt_version !== active.version) {
    card.append(h('p', { class: 'hint' }, `Version ${active.version} is being pinned.`));
  }
  return card;
}

function history(ctx, base, rows, reload) {
  const activate = (v) => {
    const btn = h('button', { type: 'button', class: 'secondary', 'aria-label': `Activate version ${v.version}` }, 'Activate');
    btn.addEventListener('click', async () => {
      if (!(await confirmDialog(`Make version ${v.version} the active system prompt?`, 'Activate'))) return;
      const out = await busy('Activating', () => api('POST', `${base}/system-prompts/${v.version}/activate`), btn);
      if (out) { status(`Version ${out.version} is active`); await reload(); }
    });
    return btn;
  };
  return h('section', { class: 'card', 'aria-labelledby': 'ph-title' },
    h('h2', { id: 'ph-title' }, 'Version history'),
    table(['Version', 'Created', 'By', 'Characters', 'Tools', 'Text', ''], rows.map((v) => [
      v.active ? h('span', {}, `v${v.version} `, badge('active')) : `v${v.version}`,
      when(v.created_at), v.created_by, String(v.text.length), toolSummary(v),
      h('pre', { class: 'prompt' }, v.text),
      v.active || !ctx.editor ? '' : activate(v),
    ]), 'Newest first'));
}

const SR = { same: '', add: 'added: ', del: 'removed: ', chg: 'changed: ' };

function diffCard(rows) {
  const pick = (id, label, index) => {
    const sel = h('select', { id }, rows.map((v) => h('option', { value: v.version }, `v${v.version}`)));
    sel.selectedIndex = index;
    return [field(label, sel)[0], sel];
  };
  const [fromField, from] = pick('diff-from', 'From version', 1);
  const [toField, to] = pick('diff-to', 'To version', 0);
  const out = h('div', { class: 'diff', id: 'diff-out', 'aria-live': 'polite' });
  const toolsOut = h('ul', { class: 'diff tools', id: 'diff-tools', 'aria-live': 'polite' });
  const line = (op, text, tag) => h(tag, { class: op }, h('span', { class: 'sr-only' }, SR[op]), h('span', { class: 'line' }, text));
  const show = () => {
    const a = rows.find((v) => String(v.version) === from.value);
    const b = rows.find((v) => String(v.version) === to.value);
    clear(out).append(...diffLines(a.text, b.text).map((d) => line(d.op, d.line, 'div')));
    const changes = diffTools(a, b);
    clear(toolsOut).append(...(changes.length ? changes.map((c) => line(c.op, c.text, 'li'))
      : [h('li', { class: 'same' }, 'Tools, tool choice and rounds unchanged')]));
  };
  from.addEventListener('change', show);
  to.addEventListener('change', show);
  show();
  return h('section', { class: 'card', 'aria-labelledby': 'pd-title' },
    h('h2', { id: 'pd-title' }, 'Compare versions'), h('div', { class: 'row' }, fromField, toField),
    h('h3', {}, 'Text'), out, h('h3', {}, 'Tools'), toolsOut);
}
