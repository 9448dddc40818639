// Widget settings: look, policy, per-visitor limits; rotating the session secret.
import { api, enc } from '../api.js';
import { clear, field, h } from '../dom.js';
import { busy, confirmDialog, status } from '../ui.js';

export async function renderWidget(el, ctx, tenant) {
  const base = `/tenants/${enc(tenant.id)}/widget`;
  const w = await busy('Loading widget settings', () => api('GET', base));
  if (!w) return;
  const off = !ctx.editor;
  const text = (id, value) => h('input', { id, value: value ?? '', disabled: off });
  const check = (id, value) => h('input', { id, type: 'checkbox', checked: value, disabled: off });
  const num = (id, value, min = '1') => h('input', { id, type: 'number', min, value: value ?? '', disabled: off });
  const f = {
    title: text('w-title', w.title), greeting: text('w-greeting', w.greeting),
    accent: text('w-accent', w.accent), require_session: check('w-session', w.require_session),
    allow_client_system: check('w-client-system', w.allow_client_system),
    history: check('w-history', w.history),
    max_choices: num('w-choices', w.max_choices), rpm: num('w-rpm', w.visitor_limits.rpm),
    tpm: num('w-tpm', w.visitor_limits.tpm), conc: num('w-conc', w.visitor_limits.max_concurrency),
  };
  const form = h('form', {},
    h('div', { class: 'row' }, field('Title', f.title)[0], field('Greeting', f.greeting)[0],
      field('Accent colour', f.accent, '#1f5fbf')[0]),
    h('div', { class: 'row' }, field('Require a session token', f.require_session)[0],
      field('Allow client system messages', f.allow_client_system)[0],
      field('Most choices per request', f.max_choices)[0],
      field('Keep conversations on the server', f.history, 'session-token visitors only')[0]),
    h('div', { class: 'row' }, field('Visitor RPM', f.rpm)[0], field('Visitor TPM', f.tpm)[0],
      field('Visitor concurrency', f.conc)[0]),
    h('p', { class: 'hint' }, `Session secret: ${w.session_secret_set ? 'set' : 'not set'}`));
  const opt = (input) => (input.value === '' ? null : input.value);
  const int = (input) => (input.value === '' ? null : parseInt(input.value, 10));
  const reload = () => { clear(el); return renderWidget(el, ctx, tenant); };
  if (ctx.editor) {
    form.append(h('button', { type: 'submit' }, 'Save widget settings'));
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      const body = { title: opt(f.title), greeting: opt(f.greeting), accent: opt(f.accent),
        require_session: f.require_session.checked, allow_client_system: f.allow_client_system.checked,
        max_choices: int(f.max_choices) || 1, history: f.history.checked,
        visitor_limits: { rpm: int(f.rpm), tpm: int(f.tpm), max_concurrency: int(f.conc) } };
      if (await busy('Saving widget settings', () => api('PUT', base, body), event.submitter)) {
        status('Widget settings saved'); await reload();
      }
    });
    const rotate = h('button', { type: 'button', class: 'danger' }, 'Rotate session secret');
    rotate.addEventListener('click', async () => {
      if (!(await confirmDialog('Rotate the secret? Every session token issued so far stops working.', 'Rotate'))) return;
      if (await busy('Rotating', () => api('POST', `${base}/rotate-secret`), rotate)) { status('Secret rotated'); await reload(); }
    });
    form.append(rotate);
  }
  el.append(h('section', { class: 'card', 'aria-labelledby': 'w-title-h' }, h('h2', { id: 'w-title-h' }, 'Widget'), form));
}
