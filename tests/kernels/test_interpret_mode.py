from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from engine.kernels.triton._common import LazyKernel, interpreting

ROOT = Path(__file__).resolve().parents[2]


def test_suite_runs_kernels_in_the_right_mode():
    assert interpreting() is not torch.cuda.is_available()


def test_mode_is_read_at_first_launch_not_at_import():
    # the kernels are imported (and the module-level kernels defined) before TRITON_INTERPRET
    # is set; the first launch must still use the interpreter
    script = textwrap.dedent(
        """
        import os
        import torch
        from engine.kernels.triton import store_kv
        from engine.kernels.triton.store_kv import _store_kv_kernel
        assert not _store_kv_kernel._built
        os.environ["TRITON_INTERPRET"] = "1"
        cache = torch.zeros(2, 4, 1, 16)
        key = torch.arange(16.0).view(1, 1, 16)
        store_kv(key, key + 1, cache, cache.clone(), torch.tensor([5]))
        assert torch.equal(cache[1, 1, 0], key[0, 0])
        # reductions too: triton.language was imported in compiled mode, the launch interprets
        from engine.kernels.triton import decode_attention
        from tests.kernels.helpers import make_batch, ref_attention
        b = make_batch((5,), (1,), block_size=4, num_heads=1, num_kv_heads=1, head_dim=16)
        out = decode_attention(b.q, b.k_cache, b.v_cache, b.meta, b.scale)
        torch.testing.assert_close(out.double(), ref_attention(b), atol=1e-5, rtol=1e-4)
        print("ok", list(_store_kv_kernel._built))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok", "[True]"]


def test_lazy_kernel_builds_once_per_mode():
    def fn(x_ptr):  # a kernel body; only decoration is exercised here
        return x_ptr

    kernel = LazyKernel(fn)
    assert kernel._built == {}
    assert callable(kernel[(1,)])
    first = kernel._built[interpreting()]
    kernel[(2,)]
    assert kernel._built == {interpreting(): first}
