"""Retake docs/widget.png: the widget open on the demo page, one exchange in it.

    .venv/bin/python -m tests.widget.screenshot [--out docs/widget.png] [--model DIR]

Runs a gateway in this process on a throw-away SQLite store with the demo page on
(KVGATE_WIDGET_DEMO=true), the demo model (or ``--model``), and Debian's Chromium headless.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from aiohttp import web

from gateway.app import create_app
from gateway.context import STATE
from gateway.settings import Settings
from tenants.migrate import upgrade_to_head
from tests.widget.browser import chromium, wait_state

QUESTION = "Hi! What can you help me with?"


async def take(out: Path, model: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/kvgate.db"
        await upgrade_to_head(url)
        if model is None:
            from engine.runtime.model.demo import write_demo_model

            model = str(write_demo_model(Path(tmp) / "demo-model"))
        env = {
            "KVGATE_DATABASE_URL": url,
            "KVGATE_VAR_DIR": f"{tmp}/var",
            "KVGATE_WIDGET_DEMO": "true",
            "KVGATE_DEVICE": "cpu",
            "KVGATE_KV_CACHE_BYTES": str(32 << 20),
            "KVGATE_DEFAULT_MAX_TOKENS": "40",
            "KVGATE_ADMIN_TOKEN": "screenshot-admin-token",
        }
        if model.endswith(".gguf"):  # the default model: its sampling defaults and name
            from gateway.commands.default_model import MODEL_ID, SAMPLING_DEFAULTS

            env.update(SAMPLING_DEFAULTS, KVGATE_MODEL_NAME=MODEL_ID)
            env["KVGATE_DEFAULT_MAX_TOKENS"] = "80"
        app = create_app(Settings.from_env(env), model_dir=model)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            await app[STATE].pins.ready.wait()
            async with chromium() as browser:
                page = await browser.new_page(viewport={"width": 1180, "height": 700})
                await page.goto(f"http://{host}:{port}/widget/demo")
                await wait_state(page, "ready")
                box = page.get_by_role("textbox", name="Message")
                await box.fill(QUESTION)
                await box.press("Enter")
                await wait_state(page, "ready", timeout=60_000)
                await page.mouse.move(0, 0)
                out.parent.mkdir(parents=True, exist_ok=True)
                await page.screenshot(path=str(out))
        finally:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/widget.png"))
    parser.add_argument(
        "--model", help="HF model directory or .gguf file (default: the random demo model)"
    )
    args = parser.parse_args()
    asyncio.run(take(args.out, args.model))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
