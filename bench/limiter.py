"""``kvgate bench limiter``: admission + release through the Redis limiter, the two script calls
on every chat request's path.

Each measured tree runs in a process of its own (``gateway`` imported from that tree, so
``--compare DIR`` measures another checkout, e.g. the commit before a change, in the same run).
The processes take turns, one repeat each, so machine noise hits both alike; each times
``--calls`` sequential pairs of ``RedisLimiter.acquire`` + ``release`` (tenant scope, limits
that always admit) against the same Redis, under a key prefix of its own that is deleted at the
end. Reported per tree: the median over repeats of the per-repeat p50 (and min-max), for the
pair, the acquire alone and the release alone, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench limiter", description=__doc__)
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL")
    p.add_argument("--calls", type=int, default=2000, help="acquire + release pairs per repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--compare", type=Path, help="another checkout to measure side by side")
    p.add_argument("--compare-commit", help="its commit, when DIR is not a git checkout")
    p.add_argument("--out", type=Path, default=RESULTS / "limiter.json")
    return p.parse_args(list(argv))


# -- one tree's process ---------------------------------------------------------------------------
async def _child(url: str, calls: int) -> None:
    """Warm up, say ready, then one repeat per ``go`` line on stdin (a JSON line each)."""
    from gateway.ratelimit import Lease, Limits, RedisLimiter, make_client

    prefix = f"kvgate-bench-limiter:{secrets.token_hex(4)}:"
    connect = getattr(RedisLimiter, "connect", None)  # how `kvgate serve` makes it, where known
    lim = connect(url, 2.0, prefix) if connect else RedisLimiter(make_client(url, 2.0), prefix)
    await lim.warm()
    limits = Limits(rpm=10_000_000, tpm=1_000_000_000, max_concurrency=1000)

    async def pair() -> tuple[float, float]:
        lease = Lease.single("bench", limits, 100)
        t0 = time.perf_counter()
        decision = await lim.acquire(lease)
        t1 = time.perf_counter()
        assert decision.allowed
        await lim.release(lease, 50)
        return t1 - t0, time.perf_counter() - t1

    for _ in range(200):
        await pair()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
        timed = [await pair() for _ in range(calls)]
        acquire = [a for a, _ in timed]
        release = [r for _, r in timed]
        print(json.dumps(_p50s(acquire, release)), flush=True)
    keys = [key async for key in lim.client.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await lim.client.delete(*keys)
    await lim.close()


def _p50s(acquire: list[float], release: list[float]) -> dict[str, float]:
    pairs = [a + r for a, r in zip(acquire, release, strict=True)]
    return {
        "pair_p50_ms": statistics.median(pairs) * 1e3,
        "pair_p90_ms": statistics.quantiles(pairs, n=10)[-1] * 1e3,
        "acquire_p50_ms": statistics.median(acquire) * 1e3,
        "release_p50_ms": statistics.median(release) * 1e3,
    }


# -- the parent: takes turns -----------------------------------------------------------------------
class _Tree:
    def __init__(self, name: str, root: Path, url: str, calls: int, commit: str | None) -> None:
        self.name, self.root, self.commit = name, root, commit or _commit(root)
        env = {**os.environ, "PYTHONPATH": str(root)}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", url, str(calls)]
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.repeats: list[dict[str, float]] = []
        line = self._out.readline().strip()
        if line != "ready":
            raise RuntimeError(f"{name}: the bench process did not start ({line!r})")

    @property
    def _out(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def repeat(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.repeats.append(json.loads(self._out.readline()))

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tree": str(self.root), "commit": self.commit}
        for key in self.repeats[0]:
            values = [r[key] for r in self.repeats]
            out[key] = {"median": statistics.median(values), "min": min(values),
                        "max": max(values)}  # fmt: skip
        out["repeats"] = self.repeats
        return out


def _commit(root: Path) -> str | None:
    try:
        cmd = ["git", "-C", str(root), "rev-parse", "--short", "HEAD"]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "--child":
        # Run as a script: bench/ is sys.path[0], where bench/gateway.py would hide the package.
        if Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
            sys.path.pop(0)
        asyncio.run(_child(argv[1], int(argv[2])))
        return 0
    args = _parse(argv)
    config = {
        "benchmark": "limiter",
        "redis": args.redis,
        "calls_per_repeat": args.calls,
        "repeats": args.repeats,
        "measured": "RedisLimiter.acquire + release, tenant scope, sequential",
        "processes": "one per tree, taking turns a repeat each",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(config, indent=2))
    trees = [_Tree("this", ROOT, args.redis, args.calls, None)]
    if args.compare is not None:
        other = args.compare.resolve()
        trees.append(_Tree("compare", other, args.redis, args.calls, args.compare_commit))
    try:
        for i in range(args.repeats):  # ABBA: neither tree always runs first
            for tree in trees if i % 2 == 0 else trees[::-1]:
                tree.repeat()
    finally:
        for tree in trees:
            tree.stop()
    results = {tree.name: tree.summary() for tree in trees}
    for name, r in results.items():
        pair, acq, rel = r["pair_p50_ms"], r["acquire_p50_ms"], r["release_p50_ms"]
        print(
            f"{name} ({r['commit']}): acquire + release p50 {pair['median']:.3f} ms"
            f" ({pair['min']:.3f}-{pair['max']:.3f}), acquire {acq['median']:.3f},"
            f" release {rel['median']:.3f}"
        )
    if "compare" in results:
        delta = (
            results["this"]["pair_p50_ms"]["median"] - results["compare"]["pair_p50_ms"]["median"]
        )
        results["pair_p50_delta_ms"] = delta
        print(f"this - compare: {delta:+.3f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
