"""``kvgate bench kernels``: Triton attention kernels vs torch SDPA, side by side in one run.

Geometries: qwen0.5b (14 q heads / 2 kv heads, head_dim 64) and 7b (28 / 4, head_dim 128); paged
KV cache with shuffled block ids. Per geometry:
- prefill: B requests x L new tokens, no cached prefix, causal. kvgate ``extend_attention`` over the
  paged cache vs ``F.scaled_dot_product_attention(is_causal=True)`` (flash backend on CUDA) on
  dense [B, H, L, D] tensors; throughput = causal attention FLOPs / time. Target ratio >= 0.70.
- decode: B requests x C cached tokens, one query each, ``decode_attention``; achieved bandwidth =
  K/V bytes read / time, as a fraction of ``--hbm-gbs`` (H200: 4,800 GB/s). Target >= 0.60.
- cascade: R requests sharing a P-token prefix (+ S own tokens each), one decode token each;
  ``cascade_attention`` vs per-request ``decode_attention``. Target speedup >= 3.
Timing on CUDA: ``--inner`` calls captured in one CUDA graph (launch overhead excluded; L2 warm, as
repeated calls touch the same tensors), ``--repeats`` replays; medians with min-max spread.
``--dry-run``: CPU, Triton interpreter, tiny shapes, fp32: checks the program end to end (numbers
are meaningless and targets are not evaluated).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.runtime.kernels.metadata import AttentionMetadata

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Shape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int


GEOMETRIES = (Shape("qwen0.5b", 14, 2, 64), Shape("7b", 28, 4, 128), Shape("tiny", 4, 2, 32))


@dataclass(frozen=True)
class Workload:
    prefill_batch: int
    prefill_len: int
    decode_batch: int
    decode_context: int
    cascade_requests: int
    cascade_prefix: int
    cascade_suffix: int


GPU_WORKLOAD = Workload(4, 2048, 64, 4096, 32, 2048, 64)
DRY_WORKLOAD = Workload(1, 20, 2, 24, 3, 16, 4)


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench kernels", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="bfloat16")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--inner", type=int, default=10, help="calls per timed CUDA graph replay")
    p.add_argument("--hbm-gbs", type=float, default=4800.0, help="peak HBM bandwidth, GB/s")
    p.add_argument("--geometries", default=None, help="default: qwen0.5b,7b (dry run: tiny)")
    p.add_argument("--sweep", action="store_true", help="also time alternative tile shapes")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(list(argv))
    if args.dry_run:
        args.repeats, args.inner = 2, 1
    if args.geometries is None:
        args.geometries = "tiny" if args.dry_run else "qwen0.5b,7b"
    return args


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _graph_runner(fn: Callable[[], object], inner: int) -> Callable[[], None]:
    """Replay ``inner`` calls of ``fn`` from one CUDA graph (plain calls if capture fails)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)

    def plain() -> None:
        for _ in range(inner):
            fn()

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            plain()
    except Exception as exc:  # any capture failure: fall back to plain launches, say so
        torch.cuda.synchronize()
        print(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); timing plain launches")
        return plain
    return graph.replay


def time_us(
    fn: Callable[[], object], *, device: torch.device, repeats: int, inner: int
) -> list[float]:
    """Microseconds per call of ``fn``, one value per repeat."""
    fn()  # compile / warm up
    if device.type != "cuda":
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            out.append((time.perf_counter() - t0) * 1e6 / inner)
        return out
    run = _graph_runner(fn, inner)
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / inner)
    return out


@dataclass
class Paged:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata


def make_paged(
    shape: Shape, context: Sequence[int], new: Sequence[int], *, shared_tokens: int,
    block_size: int, dtype: torch.dtype, device: torch.device, seed: int = 0,
) -> Paged:  # fmt: skip
    """Random paged batch; the first ``shared_tokens`` (whole blocks) are the same blocks in
    every block table, the rest are distinct shuffled blocks."""
    gen = torch.Generator().manual_seed(seed)
    seq = [c + n for c, n in zip(context, new, strict=True)]
    shared = shared_tokens // block_size
    per = [-(-s // block_size) for s in seq]
    num_blocks = shared + sum(n - shared for n in per)
    ids = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros(len(seq), max(per), dtype=torch.int32)
    pos = shared
    for i, n in enumerate(per):
        table[i, :shared] = ids[:shared]
        table[i, shared:n] = ids[pos : pos + n - shared]
        pos += n - shared
    cache_shape = (num_blocks, block_size, shape.kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, dtype=dtype, device=device)
    v_cache = torch.randn(cache_shape, dtype=dtype, device=device)
    q = torch.randn(sum(new), shape.heads, shape.head_dim, dtype=dtype, device=device)
    qsl = [0]
    for n in new:
        qsl.append(qsl[-1] + n)
    i32 = {"dtype": torch.int32, "device": device}
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(qsl, **i32),
        context_lens=torch.tensor(list(context), **i32),
        seq_lens=torch.tensor(seq, **i32),
        block_tables=table.to(device),
        slot_mapping=torch.zeros(sum(new), dtype=torch.int64, device=device),  # unused here
        max_query_len=max(new),
        max_seq_len=max(seq),
        block_size=block_size,
        num_shared_blocks=shared,
    )
    return Paged(q, k_cache, v_cache, meta)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA; flash backend on CUDA. K/V with fewer heads than q use ``enable_gqa``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = k.shape[1] != q.shape[1]
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def _sdpa_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """K/V as the flash backend takes them: grouped if it supports GQA here, else expanded."""
    try:
        _sdpa(q, k, v)
        return k, v
    except RuntimeError:
        group = q.shape[1] // k.shape[1]
        return k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)


def bench_prefill(
    shape: Shape, w: Workload, args: argparse.Namespace, dev: torch.device, dtype: torch.dtype
) -> dict:
    from engine.runtime.kernels.triton import extend_attention

    b, n = w.prefill_batch, w.prefill_len
    p = make_paged(shape, [0] * b, [n] * b, shared_tokens=0, block_size=args.block_size,
                   dtype=dtype, device=dev)  # fmt: skip
    scale = shape.head_dim**-0.5
    # dense copies of the same K/V for SDPA: [B, H, L, D]
    table = p.meta.block_tables.long()
    pos = torch.arange(n, device=dev)
    k = p.k_cache[table[:, pos // args.block_size], pos % args.block_size].transpose(1, 2)
    v = p.v_cache[table[:, pos // args.block_size], pos % args.block_size].transpose(1, 2)
    q = p.q.view(b, n, shape.heads, shape.head_dim).transpose(1, 2).contiguous()
    k, v = _sdpa_kv(q, k.contiguous(), v.contiguous())
    ours = extend_attention(p.q, p.k_cache, p.v_cache, p.meta, scale)
    ref = _sdpa(q, k, v).transpose(1, 2).reshape_as(ours)
    t_ours = time_us(lambda: extend_attention(p.q, p.k_cache, p.v_cache, p.meta, scale),
                     device=dev, repeats=args.repeats, inner=args.inner)  # fmt: skip
    t_sdpa = time_us(lambda: _sdpa(q, k, v), device=dev, repeats=args.repeats, inner=args.inner)
    flops = 4 * b * shape.heads * shape.head_dim * n * (n + 1) / 2
    extra = {}
    if args.sweep and dev.type == "cuda":
        from bench.kernel_tiles import sweep_prefill

        rows = sweep_prefill(
            shape.head_dim,
            lambda: time_us(lambda: extend_attention(p.q, p.k_cache, p.v_cache, p.meta, scale),
                            device=dev, repeats=3, inner=args.inner),
        )  # fmt: skip
        sdpa = statistics.median(t_sdpa)
        extra["sweep"] = [{**r, "ratio_vs_sdpa": sdpa / r["us"]} if "us" in r else r for r in rows]
    return {
        **extra,
        "batch": b,
        "new_tokens": n,
        "kvgate_us": _stats(t_ours),
        "sdpa_us": _stats(t_sdpa),
        "kvgate_tflops": flops / statistics.median(t_ours) / 1e6,
        "sdpa_tflops": flops / statistics.median(t_sdpa) / 1e6,
        "ratio_vs_sdpa": _stats([s / o for o, s in zip(t_ours, t_sdpa, strict=True)]),
        "max_abs_diff_vs_sdpa": float((ours.float() - ref.float()).abs().max()),
        "sdpa_kv_heads": k.shape[1],
    }


def bench_decode(
    shape: Shape, w: Workload, args: argparse.Namespace, dev: torch.device, dtype: torch.dtype
) -> dict:
    from engine.runtime.kernels.triton import decode_attention

    b, c = w.decode_batch, w.decode_context
    p = make_paged(shape, [c] * b, [1] * b, shared_tokens=0, block_size=args.block_size,
                   dtype=dtype, device=dev)  # fmt: skip
    scale = shape.head_dim**-0.5
    t = time_us(lambda: decode_attention(p.q, p.k_cache, p.v_cache, p.meta, scale),
                device=dev, repeats=args.repeats, inner=args.inner)  # fmt: skip
    elt = torch.finfo(dtype).bits // 8
    kv_bytes = 2 * b * (c + 1) * shape.kv_heads * shape.head_dim * elt
    gbs = [kv_bytes / us / 1e3 for us in t]
    extra = {}
    if args.sweep and dev.type == "cuda":
        from bench.kernel_tiles import sweep_decode

        rows = sweep_decode(
            lambda: time_us(lambda: decode_attention(p.q, p.k_cache, p.v_cache, p.meta, scale),
                            device=dev, repeats=3, inner=args.inner),
        )  # fmt: skip
        extra["sweep"] = [
            {**r, "fraction_of_hbm": kv_bytes / r["us"] / 1e3 / args.hbm_gbs} if "us" in r else r
            for r in rows
        ]
    return {
        **extra,
        "batch": b,
        "context": c,
        "kv_bytes": kv_bytes,
        "kvgate_us": _stats(t),
        "achieved_gbs": _stats(gbs),
        "fraction_of_hbm": statistics.median(gbs) / args.hbm_gbs,
    }


def bench_cascade(
    shape: Shape, w: Workload, args: argparse.Namespace, dev: torch.device, dtype: torch.dtype
) -> dict:
    from engine.runtime.kernels.triton import cascade_attention, decode_attention, use_cascade

    r, pre, suf = w.cascade_requests, w.cascade_prefix, w.cascade_suffix
    p = make_paged(shape, [pre + suf] * r, [1] * r, shared_tokens=pre,
                   block_size=args.block_size, dtype=dtype, device=dev)  # fmt: skip
    scale = shape.head_dim**-0.5
    a = cascade_attention(p.q, p.k_cache, p.v_cache, p.meta, scale)
    d = decode_attention(p.q, p.k_cache, p.v_cache, p.meta, scale)
    kw = {"device": dev, "repeats": args.repeats, "inner": args.inner}
    t_cas = time_us(lambda: cascade_attention(p.q, p.k_cache, p.v_cache, p.meta, scale), **kw)
    t_dec = time_us(lambda: decode_attention(p.q, p.k_cache, p.v_cache, p.meta, scale), **kw)
    m = p.meta
    extra = {}
    if args.sweep and dev.type == "cuda":  # KV splits of both passes, vs the planned default
        extra["sweep_num_splits"] = {
            n: statistics.median(time_us(
                lambda n=n: cascade_attention(p.q, p.k_cache, p.v_cache, m, scale, num_splits=n),
                device=dev, repeats=3, inner=args.inner,
            ))
            for n in (2, 4, 8, 16, 32)
        }  # fmt: skip
    return {
        **extra,
        "requests": r,
        "shared_prefix": pre,
        "own_tokens": suf + 1,
        "use_cascade_rule": use_cascade(m.num_shared_blocks, m.block_size, m.num_seqs, r),
        "cascade_us": _stats(t_cas),
        "per_request_decode_us": _stats(t_dec),
        "speedup": _stats([x / y for x, y in zip(t_dec, t_cas, strict=True)]),
        "max_abs_diff_vs_decode": float((a.float() - d.float()).abs().max()),
    }


def _targets(results: dict) -> dict:
    out = {}
    for name, r in results.items():
        out[name] = {
            "prefill_ratio_ge_0.70": r["prefill"]["ratio_vs_sdpa"]["median"] >= 0.70,
            "decode_hbm_ge_0.60": r["decode"]["fraction_of_hbm"] >= 0.60,
            "cascade_speedup_ge_3": r["cascade"]["speedup"]["median"] >= 3.0,
        }
    return out


def _config(args: argparse.Namespace, dev: torch.device, dtype: torch.dtype, w: Workload) -> dict:
    cfg = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (interpreter)",
        "dtype": str(dtype).removeprefix("torch."),
        "block_size": args.block_size,
        "repeats": args.repeats,
        "inner_calls_per_replay": args.inner,
        "hbm_gbs": args.hbm_gbs,
        "tile_sweep": args.sweep,
        "workload": asdict(w),
        "torch": torch.__version__,
    }
    if dev.type == "cuda":
        from torch.nn.attention import current_flash_attention_impl

        cfg["sdpa_flash_impl"] = str(current_flash_attention_impl() or "default")
    return cfg


def use_interpreter() -> bool:
    """Select Triton's CPU interpreter; possible only before ``triton`` is first imported (it
    fixes the mode at import). False when it was already imported in compiled mode."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
        return True
    import triton

    return bool(triton.knobs.runtime.interpret)


def main(argv: Sequence[str]) -> int:
    args = _args(argv)
    if args.dry_run:
        if not use_interpreter():
            print("kvgate bench kernels --dry-run: triton was already imported in compiled mode; "
                  "run it in a fresh process or with TRITON_INTERPRET=1")  # fmt: skip
            return 2
        return run(args, torch.device("cpu"), torch.float32, DRY_WORKLOAD)
    if not torch.cuda.is_available():
        print("kvgate bench kernels: needs a CUDA device (or --dry-run)")
        return 2
    return run(args, torch.device("cuda"), getattr(torch, args.dtype), GPU_WORKLOAD)


def run(args: argparse.Namespace, dev: torch.device, dtype: torch.dtype, w: Workload) -> int:
    names = args.geometries.split(",")
    shapes = [s for s in GEOMETRIES if s.name in names]
    result: dict = {"config": _config(args, dev, dtype, w), "results": {}}
    print(json.dumps(result["config"], indent=2))
    for shape in shapes:
        row = {"geometry": asdict(shape)}
        for kind, fn in (("prefill", bench_prefill), ("decode", bench_decode),
                         ("cascade", bench_cascade)):  # fmt: skip
            row[kind] = fn(shape, w, args, dev, dtype)
            print(f"{shape.name} {kind}: {json.dumps(row[kind])}")
        result["results"][shape.name] = row
    result["dry_run"] = args.dry_run
    if not args.dry_run:
        result["targets_met"] = _targets(result["results"])
        print(json.dumps(result["targets_met"], indent=2))
    out = args.out or RESULTS / ("kernels_dry_run.json" if args.dry_run else "gpu/kernels.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
