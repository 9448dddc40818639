"""Tile-shape sweep for ``kvgate bench kernels --sweep`` (GPU only).

The kernels' GPU tile shapes (``gpu_tiles`` in engine/runtime/kernels/triton/prefill.py and
decode.py) were chosen without a GPU (compile checks only: no register spills on sm_90). The sweep
times a few alternatives side by side with the defaults, so one GPU run tells which shapes to keep.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from types import ModuleType

from engine.runtime.kernels.triton import decode as decode_mod
from engine.runtime.kernels.triton import prefill as prefill_mod
from engine.runtime.kernels.triton._common import Tiles

PREFILL_CANDIDATES = {
    64: [Tiles(128, 64, 8, 3), Tiles(128, 64, 4, 3), Tiles(128, 128, 8, 3), Tiles(64, 64, 4, 3)],
    128: [Tiles(128, 64, 8, 3), Tiles(128, 32, 8, 3), Tiles(128, 64, 8, 2), Tiles(64, 64, 4, 3)],
}
# decode: block_m follows the GQA group; these vary keys per tile and pipeline depth
DECODE_CANDIDATES = [(32, 3), (64, 3), (64, 4), (128, 3), (32, 5)]
_DEFAULT_DECODE_TILES = decode_mod.gpu_tiles


@contextlib.contextmanager
def _tiles(module: ModuleType, fn: Callable[..., Tiles]) -> Iterator[None]:
    """Temporarily replace ``module.gpu_tiles`` (read at every launch)."""
    original = module.gpu_tiles
    module.gpu_tiles = fn
    try:
        yield
    finally:
        module.gpu_tiles = original


def _try(run: Callable[[], list[float]]) -> dict:
    try:
        return {"us": statistics.median(run())}
    except Exception as exc:  # a shape may not fit (shared memory, registers): record, go on
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def sweep_prefill(head_dim: int, run: Callable[[], list[float]]) -> list[dict]:
    """``run`` times one extend_attention call shape; returns one row per tile candidate."""
    rows = []
    for tiles in PREFILL_CANDIDATES.get(head_dim, []):
        with _tiles(prefill_mod, lambda _d, _q, t=tiles: t):
            rows.append({"tiles": tiles._asdict(), **_try(run)})
    return rows


def sweep_decode(run: Callable[[], list[float]]) -> list[dict]:
    rows = []
    for block_n, stages in DECODE_CANDIDATES:

        def tiles(head_dim: int, n_rows: int, bn: int = block_n, st: int = stages) -> Tiles:
            default = _DEFAULT_DECODE_TILES(head_dim, n_rows)
            return Tiles(default.block_m, bn, default.num_warps, st)

        with _tiles(decode_mod, tiles):
            rows.append({"block_n": block_n, "num_stages": stages, **_try(run)})
    return rows
