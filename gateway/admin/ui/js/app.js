// The console: sign-in, the principal's navigation, hash routes to pages.
import { api, onSignedOut, sessionPrincipal, signIn, signOut } from './api.js';
import { clear } from './dom.js';
import { busy, showError, status } from './ui.js';
import { renderAdmins } from './pages/admins.js';
import { renderCluster } from './pages/cluster.js';
import { renderTenant } from './pages/tenant.js';
import { renderTenants } from './pages/tenants.js';

const $ = (id) => document.getElementById(id);
const state = { principal: null };

function showSignIn(message) {
  state.principal = null;
  clear($('view'));
  $('nav').hidden = true;
  $('sign-out').hidden = true;
  $('who').textContent = '';
  $('sign-in').hidden = false;
  showError(message ? { message } : null);
  $('token').focus();
}

function showApp(principal) {
  state.principal = principal;
  $('sign-in').hidden = true;
  $('token').value = '';
  $('sign-out').hidden = false;
  $('nav').hidden = principal.scope !== 'platform';
  $('who').textContent = `${principal.id} · ${principal.scope} · ${principal.access}`;
  document.body.dataset.access = principal.access;
  document.body.dataset.scope = principal.scope === 'platform' ? 'platform' : 'tenant';
  route();
}

async function route() {
  const p = state.principal;
  if (!p) return;
  showError(null);
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const home = p.scope === 'platform' ? ['tenants'] : ['tenants', p.scope];
  const [page, id, tab, sub] = parts[0] ? parts : home;
  for (const a of document.querySelectorAll('nav a')) {
    a.toggleAttribute('aria-current', a.getAttribute('href') === `#/${page}` && !id);
    if (a.hasAttribute('aria-current')) a.setAttribute('aria-current', 'page');
  }
  const view = clear($('view'));
  const ctx = { principal: p, editor: p.access === 'editor', platform: p.scope === 'platform' };
  if (page === 'tenants' && id) await renderTenant(view, ctx, id, tab || 'prompt', sub);
  else if (page === 'cluster' && ctx.platform) await renderCluster(view, ctx);
  else if (page === 'admins' && ctx.platform) await renderAdmins(view, ctx);
  else if (ctx.platform) await renderTenants(view, ctx);
  else location.hash = `#/tenants/${encodeURIComponent(p.scope)}`;
  $('main').focus();
}

async function start() {
  onSignedOut(() => showSignIn('Your session has ended: sign in again.'));
  $('sign-in-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const button = event.submitter || null;
    const principal = await busy('Signing in', () => signIn($('token').value.trim()), button);
    if (principal) showApp(principal);
  });
  $('sign-out').addEventListener('click', async () => {
    // Only a sign-out the gateway confirmed leaves the page: a refused one (503 while the
    // session store is away) keeps the session and says so.
    if (await busy('Signing out', async () => { await signOut(); return true; })) showSignIn();
  });
  window.addEventListener('hashchange', route);
  status('Loading…');
  try {
    const principal = await sessionPrincipal();
    if (principal) showApp(principal);
    else showSignIn();
  } catch (err) {
    showSignIn(err.message);
  } finally {
    status('');
  }
}

export { api, state };
start();
