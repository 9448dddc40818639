"""Every decoder layer of a CPU forward in one call into C (``layers.c``), where the weights are
kept in GGUF blocks (``qgemm.py``): the kernels and their order are the per-op path's
(``engine/runtime/model/decoder.py``), so both give the same bits; what goes is the Python
between them, about ten dispatches a layer, which at decode's one token a step cost as much as
the arithmetic of a small model.

:func:`load` gives None where the C kernels do not run; the decoder then keeps its per-op loop.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.runtime.kernels.cpu import build, gemm, ops, qgemm
from engine.runtime.kernels.metadata import AttentionMetadata

SOURCE = Path(__file__).with_name("layers.c")
_KINDS = {kind: i for i, kind in enumerate(qgemm.KINDS)}  # Kernels.gemm's order
_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class _Linear(ctypes.Structure):
    _fields_ = [
        ("kind", _i64), ("n", _i64), ("k", _i64), ("panels", _i64),
        ("qs", _ptr), ("scales", _ptr), ("bias", _ptr),
    ]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _ptr), ("post_norm", _ptr),
        ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
        ("k_cache", _ptr), ("v_cache", _ptr),
    ]  # fmt: skip


class _Step(ctypes.Structure):
    _fields_ = [
        ("tokens", _i64), ("hidden", _i64), ("hq", _i64), ("hkv", _i64), ("d", _i64),
        ("inter", _i64), ("eps", _f32), ("scale", _f32), ("threads", ctypes.c_int),
        ("positions", _ptr), ("slots", _ptr), ("cos", _ptr), ("sin", _ptr),
        ("tables", _ptr), ("starts", _ptr), ("ctx", _ptr),
        ("table_stride", _i64), ("block_size", _i64), ("max_len", _i64), ("seqs", _i64),
        ("x", _ptr), ("delta", _ptr), ("h", _ptr), ("qkv", _ptr), ("attn", _ptr),
        ("gate_up", _ptr), ("act", _ptr),
    ]  # fmt: skip


class _Kernels(ctypes.Structure):
    _fields_ = [
        ("gemm", _ptr * len(qgemm.KINDS)), ("rms_norm", _ptr), ("rope_store_kv", _ptr),
        ("silu_mul", _ptr), ("attention", _ptr), ("parallel", _ptr),
    ]  # fmt: skip


Blocks = tuple[qgemm.PackedBlocks, torch.Tensor | None]  # a packed weight and its bias
KVPair = tuple[torch.Tensor, torch.Tensor]  # a layer's k and v cache


@dataclass(frozen=True)
class LayerSpec:
    """One layer's weights as the fused loop reads them (float32 norms, packed linears)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Blocks
    o: Blocks
    gate_up: Blocks
    down: Blocks


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: tuple[int, int, int]  # hq, hkv, head dim
    inter: int
    eps: float
    scale: float


def _linear(blocks: Blocks) -> _Linear:
    w, bias = blocks
    return _Linear(
        _KINDS[w.kind], w.n, w.k, w.qs.shape[0], w.qs.data_ptr(), w.scales.data_ptr(),
        None if bias is None else bias.data_ptr(),
    )  # fmt: skip


class FusedLayers:
    """The layers of one decoder; :meth:`run` is one forward's pass through all of them."""

    def __init__(
        self, lib: ctypes.CDLL, kernels: _Kernels, layers: Sequence[LayerSpec], shape: Shape
    ) -> None:
        self._lib, self._kernels, self._specs, self.shape = lib, kernels, tuple(layers), shape
        self._table: ctypes.Array[_Layer] | None = None
        self._caches: tuple[int, ...] = ()  # the cache addresses the table was built for

    def _layers(self, kv_caches: Sequence[KVPair]) -> ctypes.Array[_Layer] | None:
        """The layer table for these caches (rebuilt when they move), or None where a cache is
        not a contiguous float32 CPU tensor."""
        addresses = tuple(t.data_ptr() for pair in kv_caches for t in pair)
        if addresses == self._caches:
            return self._table
        self._table, self._caches = None, addresses
        if all(ops.plain_cpu(t) for pair in kv_caches for t in pair):
            table = (_Layer * len(self._specs))()
            for row, spec, (k, v) in zip(table, self._specs, kv_caches, strict=True):
                row.input_norm = spec.input_norm.data_ptr()
                row.post_norm = spec.post_norm.data_ptr()
                row.qkv, row.o = _linear(spec.qkv), _linear(spec.o)
                row.gate_up, row.down = _linear(spec.gate_up), _linear(spec.down)
                row.k_cache, row.v_cache = k.data_ptr(), v.data_ptr()
            self._table = table
        return self._table

    def run(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: Sequence[KVPair],
    ) -> torch.Tensor | None:
        """All layers over the residual stream ``x`` [T, hidden] (updated in place: the stream
        before the last layer's MLP output), which this returns ([T, hidden]); None, with
        nothing done, where this step's tensors are laid out otherwise (the per-op path then
        takes it)."""
        if not (meta.checked and ops.plain_cpu(x) and x.numel()):
            return None
        if not (positions.dtype == meta.slot_mapping.dtype == torch.int64):
            return None
        if not (positions.is_contiguous() and meta.slot_mapping.is_contiguous()):
            return None
        table = self._layers(kv_caches)
        if table is None:
            return None
        s = self.shape
        hq, hkv, d = s.heads
        t = x.shape[0]
        scratch = {
            "delta": (t, s.hidden), "h": (t, s.hidden), "qkv": (t, (hq + 2 * hkv) * d),
            "attn": (t, hq * d), "gate_up": (t, 2 * s.inter), "act": (t, s.inter),
        }  # fmt: skip
        buffers = {name: x.new_empty(shape) for name, shape in scratch.items()}
        tables = meta.block_tables
        step = _Step(
            t, s.hidden, hq, hkv, d, s.inter, s.eps, s.scale, torch.get_num_threads(),
            positions.data_ptr(), meta.slot_mapping.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            tables.data_ptr(), meta.query_start_loc.data_ptr(), meta.context_lens.data_ptr(),
            tables.stride(0), meta.block_size, meta.max_seq_len, meta.num_seqs, x.data_ptr(),
            *(b.data_ptr() for b in buffers.values()),
        )  # fmt: skip
        status = self._lib.kvgate_decoder_layers(
            table, len(self._specs), ctypes.byref(step), ctypes.byref(self._kernels)
        )
        if status != 0:
            raise MemoryError("decoder layers: a kernel found no memory")
        return buffers["delta"]


@functools.cache
def _kernels(isa: str) -> tuple[ctypes.CDLL, _Kernels] | None:
    lib = build.load_library(SOURCE, isa, ops.ISA_FLAGS[isa])
    c, blocks = ops.load(isa), qgemm.load(isa)
    if lib is None or c is None or blocks is None or c.parallel is None:
        return None
    lib.kvgate_decoder_layers.restype = ctypes.c_int
    lib.kvgate_decoder_layers.argtypes = [ctypes.POINTER(_Layer), _i64, _ptr, _ptr]
    at = build.function_address
    gemms = (_ptr * len(qgemm.KINDS))(*blocks.functions)
    kernels = _Kernels(
        gemms, at(c.lib, "kvgate_rms_norm"), at(c.lib, "kvgate_rope_store_kv"),
        at(c.lib, "kvgate_silu_mul"), at(c.attn, "kvgate_paged_attention"), c.parallel,
    )  # fmt: skip
    return lib, kernels


def load(layers: Sequence[LayerSpec], shape: Shape, isa: str | None = None) -> FusedLayers | None:
    """The fused loop over ``layers``, or None where it cannot run (no C kernels, a head dim the
    C attention does not take, no layers)."""
    isa = isa or gemm.best_isa()
    built = None if isa is None else _kernels(isa)
    c = None if isa is None else ops.load(isa)
    if built is None or c is None or not layers or not c.attends(shape.heads[2]):
        return None
    return FusedLayers(*built, layers, shape)
