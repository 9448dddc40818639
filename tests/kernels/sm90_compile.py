"""Compile the kernels for sm_90 (H100/H200) on the CPU, the way the JIT specializes them.

``python -m tests.kernels.sm90_compile`` prints the resource usage; test_compile_sm90 runs it.

The interpreter runs kernels as numpy code and accepts things the compiler rejects; this compiles
the production tile shapes down to a cubin with the ptxas bundled in the Triton wheel (no GPU
needed) and checks that no registers spill to local memory.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from engine.runtime.kernels.triton import decode, prefill
from engine.runtime.kernels.triton._common import Tiles
from engine.runtime.kernels.triton.norm import _rms_norm_kernel
from engine.runtime.kernels.triton.rope import _rope_kernel
from engine.runtime.kernels.triton.store_kv import _store_kv_kernel

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
INDEX_PTRS = {"bt_ptr", "qsl_ptr", "ctx_ptr", "seq_ptr", "seg_q_ptr", "seg_kv_ptr", "seg_idx_ptr"}
I64_PTRS = {"slot_ptr", "pos_ptr"}
F32_PTRS = {"part_o_ptr", "part_lse_ptr", "lse_ptr", "shared_o_ptr", "shared_lse_ptr"}
NOT_ALIGNED = {
    "num_heads", "num_tokens", "stride_bt", "kv_lo", "kv_hi", "split_size", "hidden",
    "num_shared_parts",
}  # fmt: skip


def _arg_type(name: str, dtype: str) -> str:
    if name in INDEX_PTRS:
        return "*i32"
    if name in I64_PTRS:
        return "*i64"
    if name in F32_PTRS:
        return "*fp32"
    if name.endswith("_ptr"):
        return f"*{dtype}"
    return "fp32" if name in ("scale_log2", "eps") else "i32"


def compile_sm90(kernel: JITFunction, dtype: str, consts: dict, tiles: Tiles) -> dict[str, int]:
    """Compile like the JIT does for 16-byte aligned tensors (runtime integers are
    ``do_not_specialize``); returns the cubin's resource usage (REG, STACK, LOCAL, SHARED,
    DYNAMIC_SHARED). Run in a process that imported triton without the interpreter."""
    fn = kernel
    names = fn.arg_names
    declared = {names[i] for i in fn.constexprs}
    if declared != set(consts):
        raise ValueError(f"{names}: constexprs {sorted(declared)} != given {sorted(consts)}")
    sig = {n: "constexpr" if n in consts else _arg_type(n, dtype) for n in names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if n not in consts
        and n not in NOT_ALIGNED
        and not fn.params[i].do_not_specialize
        and not fn.params[i].do_not_specialize_on_alignment
        and (n.endswith("_ptr") or n.startswith("stride"))
    }
    options = {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
    with triton.knobs.runtime.scope():  # the code generator must not see interpreter mode
        triton.knobs.runtime.interpret = False
        compiled = triton.compile(
            ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
            options=options,
        )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run(
            [str(CUOBJDUMP), "--dump-resource-usage", str(cubin)], capture_output=True, text=True
        ).stdout
    res = {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL|SHARED):(\d+)", usage)}
    res["DYNAMIC_SHARED"] = int(compiled.metadata.shared)
    return res


def _attention_consts(tiles: Tiles, head_dim: int, dtype: str) -> dict:
    return {
        "GROUP": 7, "HEAD_DIM": head_dim, "BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n,
        "BLOCK_SIZE": 16, "PRECISION": "ieee" if dtype == "fp32" else "tf32", "UPCAST": False,
    }  # fmt: skip


def production_configs() -> dict[str, tuple[JITFunction, str, dict, Tiles]]:
    """The GPU launch shapes of every kernel (both head dims, decode and cascade tiles)."""
    out = {}
    extend = ((64, 2048, "fp16", True, False), (128, 2048, "bf16", False, True),
              (128, 64, "fp16", True, False), (128, 1, "bf16", False, False))  # fmt: skip
    for head_dim, query_len, dtype, lse, skip in extend:
        tiles = prefill.gpu_tiles(head_dim, query_len)
        consts = {
            **_attention_consts(tiles, head_dim, dtype), "WRITE_LSE": lse, "SKIP_SINGLE": skip,
        }  # fmt: skip
        out[f"extend_d{head_dim}_m{tiles.block_m}"] = (prefill._extend_kernel, dtype, consts, tiles)
    # decode with partials, decode writing the output directly, cascade's shared pass, and
    # cascade's single-split suffix pass merging the shared partials
    # and the decode rows of a mixed batch (indexed segments, direct output)
    split_kv = (
        ("split_kv_d64_m16", 64, 2, False, False, False),
        ("split_kv_d128_m16_direct", 128, 7, True, False, False),
        ("split_kv_d128_m128", 128, 32 * 7, False, False, False),
        ("split_kv_d128_m16_merge", 128, 7, True, True, False),
        ("split_kv_d128_m16_indexed", 128, 7, True, False, True),
    )
    for name, head_dim, rows, direct, merge, indexed in split_kv:
        tiles = decode.gpu_tiles(head_dim, rows)
        consts = {
            **_attention_consts(tiles, head_dim, "bf16"), "SINGLE_SEGMENT": rows > 16,
            "INDEXED": indexed, "DIRECT": direct, "MERGE_SHARED": merge,
        }  # fmt: skip
        out[name] = (decode._split_kv_kernel, "bf16", consts, tiles)
    merge_consts = {"HEAD_DIM": 128, "BLOCK_P": decode.MERGE_BLOCK_P}
    out["merge"] = (decode._merge_kernel, "fp16", merge_consts, Tiles(1, 1, 2, 1))
    store_consts = {"BLOCK_SIZE": 16, "HEAD_DIM": 64, "BLOCK_H": 2}
    out["store_kv"] = (_store_kv_kernel, "bf16", store_consts, Tiles(1, 1, 4, 1))
    norm_consts = {"BLOCK": 1024, "HAS_RESIDUAL": True}  # hidden 896 (Qwen2.5-0.5B)
    out["rms_norm"] = (_rms_norm_kernel, "bf16", norm_consts, Tiles(1, 1, 4, 1))
    rope_consts = {"HALF": 64, "BLOCK_HQ": 32, "BLOCK_HK": 4, "BLOCK_SIZE": 16, "STORE": True}
    out["rope_store_kv"] = (_rope_kernel, "bf16", rope_consts, Tiles(1, 1, 4, 1))
    return out


def main() -> None:
    """Print the resource usage of every production config as JSON (run without the
    interpreter: Triton decorates its own library functions for one mode at import)."""
    usage = {name: compile_sm90(*cfg) for name, cfg in production_configs().items()}
    print(json.dumps(usage))


if __name__ == "__main__":
    main()
