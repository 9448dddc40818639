"""``GET /`` links what a fresh gateway offers; ``GET /favicon.ico`` answers the icon, cacheable.

Before, both were bare 404s (every page a browser opened asked for the icon again). The page is
also opened in Chromium: its inline style applies under its CSP (the hash is right), nothing is
refused, and its links lead to pages that answer.
"""

from __future__ import annotations

from pathlib import Path

from gateway.home import ICON_PATH, page
from tests.gateway.harness import live_gateway, make_settings
from tests.widget.browser import chromium, require_chromium


def test_the_page_names_the_demo_only_where_it_is_served() -> None:
    assert 'href="/widget/demo"' in page(widget_demo=True)
    off = page(widget_demo=False)
    assert 'href="/widget/demo"' not in off and "KVGATE_WIDGET_DEMO" in off
    for html in (page(True), page(False)):
        assert 'href="/admin/ui/"' in html and 'href="/openapi.json"' in html


async def test_home_and_icon(gateway_database: str, demo_model_dir: Path, tmp_path: Path) -> None:
    settings = make_settings(gateway_database, tmp_path, KVGATE_WIDGET_DEMO="true")
    async with live_gateway(settings, demo_model_dir) as gw:
        async with gw.http.get(f"{gw.base_url}/") as resp:
            assert resp.status == 200 and resp.content_type == "text/html"
            assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
            text = await resp.text()
        for href in ('href="/widget/demo"', 'href="/admin/ui/"', 'href="/openapi.json"'):
            assert href in text
        async with gw.http.get(f"{gw.base_url}/favicon.ico") as resp:
            assert resp.status == 200
            assert resp.content_type == "image/vnd.microsoft.icon"
            assert "max-age=86400" in resp.headers["Cache-Control"]
            icon = await resp.read()
            etag = resp.headers["ETag"]
        assert icon == ICON_PATH.read_bytes() and icon[:4] == b"\0\0\1\0"  # an ICO file
        headers = {"If-None-Match": etag}
        async with gw.http.get(f"{gw.base_url}/favicon.ico", headers=headers) as resp:
            assert resp.status == 304

        require_chromium()
        async with chromium() as browser:
            tab = await browser.new_page()
            said: list[str] = []
            tab.on("console", lambda msg: said.append(msg.text))
            answer = await tab.goto(f"{gw.base_url}/")
            assert answer is not None and answer.status == 200
            width = await tab.evaluate("getComputedStyle(document.body).maxWidth")
            assert width == "640px"  # 40rem: the inline style ran under the CSP
            assert said == []  # no refusal (a CSP violation is reported on the console)
            for name, path in (("Admin console", "/admin/ui/"), ("API reference", "/openapi.json")):
                await tab.goto(f"{gw.base_url}/")
                async with tab.expect_navigation() as nav:
                    await tab.get_by_role("link", name=name).click()
                reached = await nav.value
                assert reached is not None and reached.status == 200
                assert reached.url == f"{gw.base_url}{path}"
