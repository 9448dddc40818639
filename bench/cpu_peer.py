"""``kvgate bench model --peer llama.cpp``: the default model on the CPU, kvgate vs llama.cpp.

The same GGUF (the embedded default, SmolLM2-135M-Instruct Q4_1), the same token ids, the same
thread count, each side in a fresh process, the sides alternating in every repeat:

- start-up: loading the model until it can run a step;
- resident memory: the process's RSS after loading, minus its RSS before (libraries excluded);
- TTFT of a new turn on a tenant prompt of ``--tenant-prompt`` tokens: kvgate pins it once
  (``Engine.pin_prefix``), llama.cpp keeps it in its context (llama-cpp-python reuses the longest
  common prefix of consecutive prompts: its warm new turn); one greedy token each time;
- decode of one conversation: greedy tokens/s after the first token, EOS ignored;
- 8 conversations at once: kvgate's aggregate tokens/s (continuous batching); llama-cpp-python's
  API serves one sequence at a time, so its figure is its single stream.

llama-cpp-python is a benchmark-only peer, never a kvgate dependency: ``--peer-python`` names an
interpreter that has it; without one, it is built once from source into its own environment
under ``~/.cache/kvgate/bench/llama-venv-<isa>`` (pip, minutes), for the vector ISA kvgate runs
at (AVX-512, or AVX2 on an AVX2-only host and under ``KVGATE_CPU_ISA=avx2``: both sides then
run what an AVX2-only host runs) without ``-march=native``: kvgate does not use AMX, and ggml's
AMX path crashes on hosts that report AMX without enabling it. Results:
bench/results/cpu_peer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import cpu_isa, cpu_model, result_file, summarize, write_json
from bench.cpu_side import Spec, conversation
from bench.peer_env import peer_python
from engine.runtime import omp_policy

RESULTS = Path(__file__).parent / "results" / "cpu_peer.json"
PEER_SCRIPT = Path(__file__).with_name("llama_side.py")
PEER_PACKAGE = "llama-cpp-python==0.3.36"
PEER_VENVS = Path.home() / ".cache" / "kvgate" / "bench"
METRICS = ("startup_s", "rss_mb", "ttft_s", "decode_tok_s", "aggregate_tok_s")
# kvgate's sides: result key -> (KVGATE_WEIGHTS, the plot's label). kvgate: the default, float32
# activations; the others round the activations per block of 32 (int8 as llama.cpp does)
SIDES = {
    "kvgate": ("auto", "kvgate (float32 activations)"),
    "kvgate_int16": ("blocks-int16", "kvgate blocks-int16"),
    "kvgate_int8": ("blocks-int8", "kvgate blocks-int8"),
}


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench model --peer llama.cpp")
    p.add_argument("--peer", choices=["llama.cpp"], default="llama.cpp")
    p.add_argument("--model", type=Path, default=None, help="a GGUF (default: the embedded one)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tenant-prompt", type=int, default=760, help="tenant prompt tokens")
    p.add_argument("--turns", type=int, default=5, help="new turns timed per repeat")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peer-python", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def _peer_python(given: Path | None) -> Path:
    if given is not None:
        return given
    return peer_python(
        PEER_VENVS / f"llama-venv-{cpu_isa().lower()}",
        "llama_cpp",
        [["install", "-q", PEER_PACKAGE]],
        f"building {PEER_PACKAGE} from source",
        env={**os.environ, "CMAKE_ARGS": " ".join(_ggml_flags())},
    )


def _ggml_flags() -> list[str]:
    flags = [
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
    ]
    if cpu_isa() == "AVX512":
        flags += [f"-DGGML_AVX512{x}=ON" for x in ("", "_VBMI", "_VNNI", "_BF16")]
    return flags


def _model(given: Path | None) -> Path:
    if given is not None:
        return given
    from gateway.commands.default_model import ensure_default_model

    return ensure_default_model(Path.home() / ".cache" / "kvgate" / "models", log=print)


def _side(
    command: list[str], spec: Spec, *extra: str, env: dict[str, str] | None = None
) -> dict[str, float]:
    done = subprocess.run(
        [*command, json.dumps(spec.to_json()), *extra],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if done.returncode != 0:
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        raise RuntimeError(f"{command[-1]} failed ({how}):\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {m: summarize([r[m] for r in runs]) for m in METRICS}


def run(args: argparse.Namespace) -> dict[str, Any]:
    model, peer = _model(args.model), _peer_python(args.peer_python)
    system, turns = conversation(model, args.tenant_prompt, args.turns + args.conversations + 2)
    spec = Spec(
        str(model), args.threads, system, turns, args.turns, args.decode_tokens, args.conversations
    )
    kvgate_cmd = [sys.executable, "-m", "bench.cpu_side"]
    peer_cmd = [str(peer), str(PEER_SCRIPT)]
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in (*SIDES, "llama_cpp")}
    for i in range(args.repeats):
        for side, (weights, _) in SIDES.items():
            runs[side].append(_side(kvgate_cmd, spec, weights))
        runs["llama_cpp"].append(_side(peer_cmd, spec, env=omp_policy.foreign_environ()))
        lines = (f"{side:>12} {r[-1]}" for side, r in runs.items())
        print(f"repeat {i + 1}:\n" + "\n".join(lines), flush=True)
    summary = {side: _summary(r) for side, r in runs.items()}
    p = summary["llama_cpp"]
    return {
        "config": {
            "model": model.name,
            "threads": args.threads,
            "tenant_prompt_tokens": len(system),
            "turn_tokens": len(turns[0]),
            "decode_tokens": args.decode_tokens,
            "conversations": args.conversations,
            "repeats": args.repeats,
            "peer": PEER_PACKAGE,
            "cpu": cpu_model(),
            "isa": cpu_isa(),  # both sides' builds (llama.cpp's CMake flags: _ggml_flags)
            "kvgate_weights": {side: weights for side, (weights, _) in SIDES.items()},
        },
        **summary,
        "runs": runs,
        **{_ratio_key(side): _ratios(summary[side], p, model) for side in SIDES},
    }


def _ratio_key(side: str) -> str:
    """``ratios`` for the default, ``ratios_int8`` for kvgate_int8, ..."""
    return "ratios" + side.removeprefix("kvgate")


def _ratios(
    k: dict[str, dict[str, float]], p: dict[str, dict[str, float]], model: Path
) -> dict[str, float]:
    return {
        "ttft_llama_over_kvgate": p["ttft_s"]["median"] / k["ttft_s"]["median"],
        "decode_kvgate_over_llama": k["decode_tok_s"]["median"] / p["decode_tok_s"]["median"],
        "aggregate_kvgate_over_llama_single": k["aggregate_tok_s"]["median"]
        / p["decode_tok_s"]["median"],
        "rss_over_gguf": k["rss_mb"]["median"] * 2**20 / model.stat().st_size,
    }


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    result = run(args)
    summary = {k: result[k] for k in ("config", *map(_ratio_key, SIDES))}
    print(json.dumps(summary, indent=2))
    for side in (*SIDES, "llama_cpp"):
        row = ", ".join(f"{m} {result[side][m]['median']:.3f}" for m in METRICS)
        print(f"{side:>12}: {row}")
    out = result_file(args.out, RESULTS)
    write_json(out, result)
    _plot(result, out.with_suffix(".png"))
    print(f"results written to {out}")
    return 0


def _plot(result: dict[str, Any], path: Path) -> None:
    """kvgate / llama.cpp per figure (higher is better: TTFT and start-up as llama.cpp / kvgate)."""
    from bench.plots import grouped_bars

    med = {
        side: {m: v["median"] for m, v in result[side].items()} for side in (*SIDES, "llama_cpp")
    }
    p = med["llama_cpp"]
    groups = ["TTFT new turn", "decode, 1 conversation", "8 conversations", "start-up"]

    def ratios(k: dict[str, float]) -> list[float]:
        return [
            p["ttft_s"] / k["ttft_s"],
            k["decode_tok_s"] / p["decode_tok_s"],
            k["aggregate_tok_s"] / p["decode_tok_s"],
            p["startup_s"] / k["startup_s"],
        ]

    series = {label: ratios(med[side]) for side, (_, label) in SIDES.items()}
    grouped_bars(
        path,
        f"kvgate vs llama.cpp, {result['config']['model']}, {result['config']['threads']} threads "
        f"({result['config']['isa']})",
        groups,
        series,
        "x (above 1: kvgate ahead)",
        hline=1.0,
    )
