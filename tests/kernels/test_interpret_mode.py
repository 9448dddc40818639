from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from engine.runtime.kernels.triton._common import interpreting

ROOT = Path(__file__).resolve().parents[2]
TRITON_DIR = ROOT / "engine" / "runtime" / "kernels" / "triton"


def _run(script: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT), **env_extra)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, cwd=ROOT,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_suite_runs_kernels_in_the_right_mode():
    assert interpreting() is not torch.cuda.is_available()


def test_interpreter_set_before_import_runs_kernels_with_public_reductions():
    # decode uses tl.max / tl.sum through the shared @triton.jit helpers and the merge kernel
    script = """
        import torch
        from engine.runtime.kernels.triton import decode_attention, store_kv
        from tests.kernels.helpers import make_batch, ref_attention
        cache = torch.zeros(2, 4, 1, 16)
        key = torch.arange(16.0).view(1, 1, 16)
        store_kv(key, key + 1, cache, cache.clone(), torch.tensor([5]))
        assert torch.equal(cache[1, 1, 0], key[0, 0])
        b = make_batch((37,), (1,), block_size=4, num_heads=2, num_kv_heads=1, head_dim=16)
        out = decode_attention(b.q, b.k_cache, b.v_cache, b.meta, b.scale, num_splits=3)
        torch.testing.assert_close(out.double(), ref_attention(b), atol=1e-5, rtol=1e-4)
        print("ok")
    """
    proc = _run(script, TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok"]


def test_bench_dry_run_refuses_a_compiled_mode_import():
    script = """
        import triton  # compiled mode: the interpreter can no longer be selected
        from bench.kernels import main
        raise SystemExit(main(["--dry-run", "--out", "/dev/null"]))
    """
    proc = _run(script)
    assert proc.returncode == 2
    assert "fresh process or with TRITON_INTERPRET=1" in proc.stdout


def _private_triton_names(path: Path) -> list[str]:
    """Attribute chains under tl./triton. with a private (underscore) component."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in ("tl", "triton"):
                found.append(f"{path.name}:{node.lineno} {node.attr}")
    return found


def test_kernels_use_no_private_triton_names_and_plain_jit():
    private = [hit for p in sorted(TRITON_DIR.glob("*.py")) for hit in _private_triton_names(p)]
    assert private == []
    kernels = 0
    for path in sorted(TRITON_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef)
                and node.name.endswith("_kernel")
                and node.name[0] == "_"
            ):
                kernels += 1
                deco = ast.unparse(node.decorator_list[0])
                assert deco.startswith("triton.jit"), f"{path.name}:{node.name} {deco}"
    assert kernels == 6


def test_variant_key_follows_triton_specialization():
    from engine.runtime.kernels.triton._common import VariantLog, variant_key

    assert VariantLog().recording is False  # serving pays no key per launch
    from engine.runtime.kernels.triton.prefill import _extend_kernel

    buf = torch.zeros(64)
    names = _extend_kernel.arg_names
    consts = {"GROUP": 1}

    def key(**changed):
        args = {n: (buf if n.endswith("_ptr") else 16) for n in names if n.upper() != n}
        args.update(changed)
        return variant_key(_extend_kernel, list(args.values()), consts, 4, 3)

    base = key()
    assert key(kv_lo=37, stride_bt=1) == base  # do_not_specialize: values never add variants
    assert key(lse_ptr=buf[1:]) == base  # alignment of lse_ptr not specialized
    assert key(q_ptr=buf[1:]) != base  # a misaligned q is a new variant, as in Triton
    assert key(num_heads=1) != key(num_heads=7) != base  # == 1 and % 16 specializations
