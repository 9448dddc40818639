"""Admin prompt writes never stall the event loop: with four editors PUTting 200,000-character
system prompts as fast as they are answered, the loop's own work stays under 50 ms a tick (p99).

Rendering and tokenizing a 200k-character prompt costs ~40-200 ms of CPU; on the loop that was
a stall of every tenant's traffic (``/healthz`` p99 in the hundreds of milliseconds). The writes
now tokenize on the tokenize pool's threads (the check against the prompt limit, the pin
manager's build of the new prefix), so what is left on the loop per write is reading and
parsing its JSON, a few database statements and making the ids, a few ms.

The heavy part is off the loop by construction: rendering and encoding run on the tokenize
pool's nice-19 threads with the GIL released while the tokenizer works (``Tokenizer.encoding``:
its ``encode`` held the GIL, and the loop stalled as if it tokenized itself), and the ids are
made on the loop, a few ms, because a nice-19 thread holding the GIL while the scheduler keeps
it off a busy CPU stalls the loop for as long (gateway/prompts/tenant_prefix.py's
``EncodedPrefix``).

What is asserted does not depend on the host's load (this suite runs on shared 2-core hosts):

* the CPU time the loop's own thread spends between two ticks of a 5 ms ticker (its callbacks,
  parsing, garbage collection; other processes cannot inflate it): p99 under 50 ms, never
  100 ms at once. Quiet host: p99 ~20 ms, max 25-47 ms; tokenizing on the loop: p99 60-110 ms;
* ``/healthz`` p99, wall-clock, in the best of three 3-second windows: under 100 ms plus three
  times its unloaded p99. On a quiet 2-core host it is 40-50 ms, the issue's figure; a loaded
  host adds its own waits, which is why the bound is relative. Every window's figures are
  printed (``-s``).

The model is the demo model with a 256k-token context, so the prompts (~113k tokens) fit the
prompt limit (half the context) and each write really makes a version, tokenized once (checked,
then built for its pin from the same encoding; the pin itself is refused at once: the test's KV
pool is small).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.gateway.conftest import long_context_copy
from tests.gateway.harness import ADMIN_TOKEN, LiveGateway, live_gateway, make_settings
from tests.gateway.loadprobe import LoopLag, p99, running
from tests.gateway.prompts.test_loop_stall import WORDS, healthz_times

EDITORS = 4
PROMPT_CHARS = 200_000
WINDOW_S = 3.0
WINDOWS = 3
BOUND_S = 0.050


@pytest.fixture(scope="module")
def admin_long_model(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 256k-token context: the demo tokenizer makes ~113k tokens of 200k characters, and the
    prompt limit is half the context."""
    return long_context_copy(demo_model_dir, tmp_path_factory.mktemp("admin-long"), 1 << 18)


def prompt_body(seed: int) -> tuple[bytes, bytes]:
    """A 200,000-character prompt as the JSON body around an 8-digit edit number: every PUT is
    a new text (as an editor's are; none is answered from memory of an earlier one)."""
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(PROMPT_CHARS // 4))[: PROMPT_CHARS - 9]
    head, tail = json.dumps({"text": f"@ {text}"}).encode().split(b"@", 1)
    return head, tail


async def editor(
    gw: LiveGateway, tenant: str, body: tuple[bytes, bytes], statuses: Counter[str]
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    url = f"{gw.base_url}/admin/v1/tenants/{tenant}/system-prompt"
    head, tail = body
    for edit in range(10**8):
        data = head + b"%08d" % edit + tail
        async with gw.http.put(url, data=data, headers=headers) as r:
            error = (await r.json()).get("error") or {}
            statuses[f"{r.status} {error.get('code')}"] += 1
            if r.status == 429:  # the tokenize pool's share of the tenant is full
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))


@dataclass(frozen=True)
class Window:
    """One measured window: /healthz times, the loop's ticker, and the versions written."""

    health: list[float]
    lag: LoopLag
    versions: int

    def __str__(self) -> str:
        return (
            f"/healthz p99 {p99(self.health) * 1e3:.1f} ms, loop lag max "
            f"{max(self.lag.lags) * 1e3:.1f} ms, loop busy max {max(self.lag.busy) * 1e3:.1f} ms "
            f"(p99 {p99(self.lag.busy) * 1e3:.1f}), {self.versions} versions"
        )


async def measure(gw: LiveGateway) -> tuple[list[float], LoopLag]:
    lag = LoopLag()
    async with running(lag.run()):
        health = await healthz_times(gw, WINDOW_S)
    return health, lag


async def test_four_editors_putting_200k_prompts_leave_the_loop_free(
    gateway_database: str, admin_long_model: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)  # no write throttle: the work measured
    async with live_gateway(settings, admin_long_model) as gw:
        tenants = [(await gw.create_tenant(f"edit{i}")).id for i in range(EDITORS)]
        base_health, base = await measure(gw)
        statuses: Counter[str] = Counter()
        clients = [editor(gw, t, prompt_body(i), statuses) for i, t in enumerate(tenants)]
        windows: list[Window] = []
        async with running(asyncio.gather(*clients)), asyncio.timeout(240):
            while statuses["200 None"] < EDITORS:  # every editor's first version is in
                await asyncio.sleep(0.05)
            for _ in range(WINDOWS):
                before = statuses["200 None"]
                health, lag = await measure(gw)
                windows.append(Window(health, lag, statuses["200 None"] - before))
        versions = await gw.admin("GET", f"/tenants/{tenants[0]}/system-prompts")
        print(  # the figures, with -s
            f"\nadmin answers {dict(statuses)}; unloaded: /healthz p99 "
            f"{p99(base_health) * 1e3:.1f} ms, loop lag max {max(base.lags) * 1e3:.1f} ms; "
            "four editors: " + "; ".join(str(w) for w in windows)
        )
        assert len(versions["data"][0]["text"]) == PROMPT_CHARS  # really written, whole
        assert set(statuses) <= {"200 None", "429 rate_limit_exceeded"}, statuses
        assert sum(w.versions for w in windows) >= 1, "no version was written while measured"
        busy = [b for w in windows for b in w.lag.busy]
        assert p99(busy) < BOUND_S, f"the loop's own work: p99 {p99(busy) * 1e3:.1f} ms a tick"
        assert max(busy) < 2 * BOUND_S, f"the loop computed {max(busy) * 1e3:.1f} ms at once"
        best = min(p99(w.health) for w in windows)
        assert best < 0.100 + 3 * p99(base_health), f"/healthz p99 {best * 1e3:.1f} ms"
        gw.state.prompts.check_integrity()
