// The admin API over the session cookie; writes carry the CSRF token (kept in memory only).

let csrf = null;
const listeners = new Set();

export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `request failed (${status})`);
    this.status = status;
    this.code = err.code || null;
    this.param = err.param || null;
  }
}

export function onSignedOut(fn) { listeners.add(fn); }

export function setCsrf(token) { csrf = token; }

export async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && csrf) headers['X-CSRF-Token'] = csrf;
  let resp;
  try {
    resp = await fetch(`/admin/v1${path}`, {
      method, headers, credentials: 'same-origin', cache: 'no-store',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new ApiError(0, { error: { message: 'the gateway cannot be reached' } });
  }
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (resp.status === 401 && path !== '/session') {
    csrf = null;
    for (const fn of listeners) fn();
  }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

export async function signIn(token) {
  const out = await api('POST', '/session', { token });
  csrf = out.csrf_token;
  return out.principal;
}

/** The principal of the console's session, or null before sign-in (asked without a 401:
 * GET /session/status answers ``signed_in: false``, so a first visit logs no error). */
export async function sessionPrincipal() {
  const out = await api('GET', '/session/status');
  csrf = out.csrf_token || null;
  return out.signed_in ? out.principal : null;
}

/** Ends the session; an error (503: the session store is away) means it still holds. */
export async function signOut() {
  try {
    await api('DELETE', '/session');
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) throw err; // 401: already ended
  }
  csrf = null;
}

/** Every page of a paginated list (``{data, next_cursor}``), at most ``max`` rows. */
export async function all(path, max = 1000) {
  const rows = [];
  let cursor = null;
  do {
    const sep = path.includes('?') ? '&' : '?';
    const page = await api('GET', `${path}${sep}limit=200${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
    rows.push(...page.data);
    cursor = page.next_cursor;
  } while (cursor && rows.length < max);
  return rows;
}

export const enc = encodeURIComponent;
