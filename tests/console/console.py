"""Console-test plumbing: a page per test that records console errors and dialogs, signing in,
and waiting for the console's status line to settle."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, Page

from tests.gateway.harness import LiveGateway


@dataclass
class Env:
    gw: LiveGateway
    browser: Browser
    shots: Path


def tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def new_token(gw: LiveGateway, scope: str, access: str) -> str:
    made = await gw.admin("POST", "/admins", {"scope": scope, "access": access})
    token: str = made["token"]
    return token


@dataclass
class Watched:
    page: Page
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def check_clean(self) -> None:
        assert not self.errors, f"console errors: {self.errors}"
        assert not self.dialogs, f"dialogs opened: {self.dialogs}"


# An API refusal the console shows (a 401 after the session ended, a 409 for a duplicate id) is
# logged by Chromium as a failed resource load: not a script error. A 5xx still counts.
EXPECTED = re.compile(r"^Failed to load resource: the server responded with a status of 4\d\d ")


@asynccontextmanager
async def watched_page(
    browser: Browser, width: int = 1280, *, refusals_are_errors: bool = False
) -> AsyncIterator[Watched]:
    """A page whose console errors are recorded: 4xx loads too with ``refusals_are_errors``
    (a flow in which the console should meet no refusal at all)."""
    context = await browser.new_context(viewport={"width": width, "height": 900})
    page = await context.new_page()
    w = Watched(page)

    def on_console(msg: Any) -> None:
        if msg.type == "error" and (refusals_are_errors or not EXPECTED.match(msg.text)):
            w.errors.append(msg.text)

    page.on("console", on_console)
    page.on("pageerror", lambda exc: w.errors.append(str(exc)))

    async def on_dialog(dialog: Any) -> None:
        w.dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", on_dialog)
    try:
        yield w
    finally:
        await context.close()


async def sign_in(page: Page, gw: LiveGateway, token: str) -> None:
    await page.goto(f"{gw.base_url}/admin/ui/")
    await page.get_by_label("Admin token").fill(token)
    await page.get_by_label("Admin token").press("Enter")  # the keyboard alone signs in
    await page.wait_for_selector("#who:not(:empty)")
    await settle(page)


async def settle(page: Page) -> None:
    """Wait until no request of the console is in flight (its aria-busy flag)."""
    await page.wait_for_function("() => !document.body.hasAttribute('aria-busy')")


async def fetch(page: Page, method: str, path: str, body: Any = None, csrf: bool = True) -> Any:
    """A request from the page with its cookie (and its CSRF token unless ``csrf`` is False)."""
    return await page.evaluate(
        """async ([method, path, body, csrf]) => {
          const me = await (await fetch('/admin/v1/session')).json();
          const headers = { 'Content-Type': 'application/json' };
          if (csrf && me.csrf_token) headers['X-CSRF-Token'] = me.csrf_token;
          const r = await fetch('/admin/v1' + path, { method, headers,
            body: body === null ? undefined : JSON.stringify(body) });
          const data = await r.json();
          return [r.status, data.error ? data.error.code : null];
        }""",
        [method, path, body, csrf],
    )
