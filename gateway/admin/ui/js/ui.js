// Page-wide feedback: the status line (loading), the error box (the API's message), confirm.

const $ = (id) => document.getElementById(id);

export function status(text) { $('status').textContent = text || ''; }

export function showError(err) {
  const box = $('error');
  if (!err) { box.hidden = true; box.textContent = ''; return; }
  box.textContent = err.message || String(err);
  box.hidden = false;
}

/** Run ``fn`` with loading feedback: the button disabled, a status line, errors shown. */
export async function busy(label, fn, button) {
  showError(null);
  status(`${label}…`);
  if (button) button.disabled = true;
  document.body.setAttribute('aria-busy', 'true');
  try {
    const out = await fn();
    status('');
    return out;
  } catch (err) {
    status('');
    showError(err);
    return undefined;
  } finally {
    if (button) button.disabled = false;
    document.body.removeAttribute('aria-busy');
  }
}

/** An accessible confirmation (a modal <dialog>, never window.confirm). */
export function confirmDialog(text, okLabel = 'Confirm') {
  const dialog = $('confirm');
  $('confirm-text').textContent = text;
  $('confirm-ok').textContent = okLabel;
  dialog.returnValue = '';
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.showModal();
    $('confirm-ok').focus();
  });
}
