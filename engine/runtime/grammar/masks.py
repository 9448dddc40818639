"""A step's allowed-token masks: filled on the host while the forward runs, applied in one op.

``MaskFiller.start`` hands the fill to its one worker thread before the forward: llguidance
computes the constrained rows' bitmasks on its own thread pool with the GIL released (bit t of
row j: word t >> 5, bit t & 31), then the EOS / stop-token rules are applied to the rows that
need them. ``PendingMask.wait``, called by the sampler just before it reads the logits, joins the
fill; a step pays for masks only what the forward did not hide. A step with no constrained row
never gets here. What the sampler receives depends on the device:

    CUDA   int32 [R * W + R]: the R bitmasks | the R row indices, one pinned host buffer sent
           in ONE host-to-device copy (by ``wait``, on the sampler's thread and stream, so it
           is ordered after the forward); the bits are expanded to [R, V] on the device
    CPU    bool [R, V]: expanded on the worker thread too (numpy ``unpackbits``), so the step
           itself only selects (``torch.where``); no copy at all

Tokens past the tokenizer's vocabulary (a model's padded rows) are never allowed. Buffers are
reused from step to step: the sampler finishes with the step's results on the host (its one
device-to-host copy synchronises the stream), so nothing still reads a buffer when the next step
fills it.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from llguidance import LLExecutor, LLMatcher
from llguidance.numpy import fill_next_token_bitmask_par

from engine.params import SamplingParams

_SHIFTS: dict[torch.device, torch.Tensor] = {}
_NEG_INF = float("-inf")


def _shifts(device: torch.device) -> torch.Tensor:
    if device not in _SHIFTS:
        _SHIFTS[device] = torch.arange(8, dtype=torch.uint8).to(device)
    return _SHIFTS[device]


def allowed_tokens(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, W] int32 bitmask -> [R, vocab] bool (tokens past the bitmask: not allowed). Byte by
    byte (little-endian words: byte k holds bits 8k..8k+7), so the temporaries are one byte per
    token, not four."""
    rows = bits.shape[0]
    octets = bits.contiguous().view(torch.uint8).unsqueeze(-1)
    flags = ((octets >> _shifts(bits.device)) & 1).view(rows, -1).view(torch.bool)
    if flags.shape[1] >= vocab:
        return flags[:, :vocab]
    pad = torch.zeros(rows, vocab - flags.shape[1], dtype=torch.bool, device=bits.device)
    return torch.cat([flags, pad], dim=1)


@dataclass(frozen=True)
class StepMask:
    """The masks of a block of sampled rows: ``rows`` (host, ascending) and ``row_ids`` (the
    same on the logits' device) name them; ``allowed`` [R, V] bool says which tokens each row
    may take (the CPU path), or ``bits`` [R, W] int32 does (expanded when applied)."""

    rows: tuple[int, ...]
    row_ids: torch.Tensor
    allowed: torch.Tensor | None = None
    bits: torch.Tensor | None = None

    def rows_of(self, start: int, stop: int) -> StepMask | None:
        """The masks of rows [start, stop), renumbered from 0; None if none is constrained."""
        lo = next((j for j, r in enumerate(self.rows) if r >= start), len(self.rows))
        hi = next((j for j, r in enumerate(self.rows) if r >= stop), len(self.rows))
        if lo == hi:
            return None
        if start == 0 and hi - lo == len(self.rows):
            return self
        return StepMask(
            tuple(r - start for r in self.rows[lo:hi]),
            self.row_ids[lo:hi] - start,
            None if self.allowed is None else self.allowed[lo:hi],
            None if self.bits is None else self.bits[lo:hi],
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of [N, V] ``logits`` with the masked rows' disallowed tokens at -inf."""
        vocab = logits.shape[-1]
        if self.allowed is not None:
            allowed = self.allowed
        else:
            assert self.bits is not None
            allowed = allowed_tokens(self.bits, vocab)
        if self.rows == tuple(range(logits.shape[0])):
            return torch.where(allowed, logits, _NEG_INF)
        picked = torch.where(allowed, logits.index_select(0, self.row_ids), _NEG_INF)
        return logits.index_put((self.row_ids,), picked)


@dataclass
class MaskStats:
    """Counters of the mask path (what the benchmark and the tests read)."""

    steps: int = 0  # steps that computed masks
    rows: int = 0  # masks computed
    waits: int = 0  # steps whose sampler had to wait for its masks (fill not done at the join)
    wait_seconds: float = 0.0
    copies: int = 0  # host-to-device copies of mask buffers
    fill_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=65536), repr=False)
    # engine-thread seconds per step outside the sampler: matcher sync, hand-off, advance
    host_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=65536), repr=False)


class PendingMask:
    """The masks of one step, being filled; ``wait`` joins the fill and returns them."""

    def __init__(self, job: Future[StepMask | _HostBits], stats: MaskStats) -> None:
        self._job, self._stats = job, stats
        self._mask: StepMask | None = None

    def wait(self) -> StepMask:
        if self._mask is None:
            if not self._job.done():
                start = time.perf_counter()
                self._job.result()
                self._stats.waits += 1
                self._stats.wait_seconds += time.perf_counter() - start
            filled = self._job.result()  # re-raises a failed fill
            if isinstance(filled, _HostBits):
                filled = filled.send(self._stats)  # on the caller's thread and stream
            self._mask = filled
        return self._mask


@dataclass(frozen=True)
class _HostBits:
    """A filled pinned buffer (R bitmasks of W words, then the R row indices) for the device."""

    host: torch.Tensor
    rows: tuple[int, ...]
    words: int
    device: torch.device

    def send(self, stats: MaskStats) -> StepMask:
        n, w = len(self.rows), self.words
        dev = self.host.to(self.device, non_blocking=True)  # the step's one copy
        stats.copies += 1
        return StepMask(self.rows, dev[n * w :].long(), bits=dev[: n * w].view(n, w))


class MaskFiller:
    """Fills a step's masks on a worker thread (llguidance's executor under it)."""

    def __init__(
        self,
        tokenizer_vocab: int,
        logits_vocab: int,
        eos_token_ids: Sequence[int],
        device: torch.device,
        threads: int | None = None,
    ) -> None:
        self.words = (tokenizer_vocab + 31) // 32
        self.vocab = logits_vocab
        self.eos_token_ids = tuple(t for t in eos_token_ids if t < 32 * self.words)
        self.device = device
        self.stats = MaskStats()
        # Masks overlap the forward, whose kernels use every core on the CPU: a few threads.
        cpus = os.cpu_count() or 1
        self._executor = LLExecutor(threads or max(1, min(4, cpus // 2)))
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="kvgate-grammar-mask")
        self._bits = np.zeros((0, self.words), dtype=np.int32)
        self._host = torch.empty(0, dtype=torch.int32)  # CUDA: the pinned copy source
        self._allowed = np.zeros((0, logits_vocab), dtype=np.bool_)  # CPU: expanded masks

    def start(
        self, rows: Sequence[tuple[int, LLMatcher]], params: Sequence[SamplingParams]
    ) -> PendingMask:
        self.stats.steps += 1
        self.stats.rows += len(rows)
        job = self._thread.submit(self._fill, list(rows), params)
        return PendingMask(job, self.stats)

    def _fill(
        self, rows: list[tuple[int, LLMatcher]], params: Sequence[SamplingParams]
    ) -> StepMask | _HostBits:
        start = time.perf_counter()
        n = len(rows)
        if self._bits.shape[0] < n:
            self._bits = np.zeros((max(n, 2 * self._bits.shape[0]), self.words), dtype=np.int32)
        bits = self._bits[:n]
        fill_next_token_bitmask_par(self._executor, [(m, j) for j, (_, m) in enumerate(rows)], bits)
        words = bits.view(np.uint32)
        for j, (i, _) in enumerate(rows):
            p = params[i]
            if p.ignore_eos or p.stop_token_ids:
                self._end_tokens(words[j], p)
        empty = ~words.any(axis=1)
        if empty.any():  # never sample from nothing: an empty mask allows the end of output
            for t in self.eos_token_ids:
                words[empty, t >> 5] |= np.uint32(1 << (t & 31))
        row_ids = [i for i, _ in rows]
        mask = (
            self._for_cpu(bits, row_ids) if self.device.type == "cpu" else self._pack(bits, row_ids)
        )
        self.stats.fill_seconds.append(time.perf_counter() - start)
        return mask

    def _for_cpu(self, bits: np.ndarray, row_ids: list[int]) -> StepMask:
        n = len(row_ids)
        if self._allowed.shape[0] < n:  # columns past the tokenizer's stay False for good
            self._allowed = np.zeros((max(n, 2 * self._allowed.shape[0]), self.vocab), np.bool_)
        width = min(32 * self.words, self.vocab)
        flags = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :width]
        allowed = self._allowed[:n]
        allowed[:, :width] = flags.view(np.bool_)
        rows = torch.tensor(row_ids, dtype=torch.int64)
        return StepMask(tuple(row_ids), rows, allowed=torch.from_numpy(allowed))

    def _pack(self, bits: np.ndarray, row_ids: list[int]) -> _HostBits:
        """One pinned buffer: the bits, then the row indices (sent by ``PendingMask.wait``)."""
        n, w = bits.shape
        if self._host.numel() < n * w + n:
            size = max(n * w + n, 2 * self._host.numel())
            self._host = torch.empty(size, dtype=torch.int32, pin_memory=True)
        host = self._host[: n * w + n]
        flat = host.numpy()
        flat[: n * w] = bits.reshape(-1)
        flat[n * w :] = row_ids
        return _HostBits(host, tuple(row_ids), w, self.device)

    def _end_tokens(self, row: np.ndarray, p: SamplingParams) -> None:
        """Where the grammar lets the output end (an EOS bit is set): the request's stop tokens
        end it too; with ``ignore_eos`` the EOS ids are cleared unless nothing else is allowed."""
        at_end = any(row[t >> 5] >> np.uint32(t & 31) & 1 for t in self.eos_token_ids)
        if not at_end:
            return
        if p.ignore_eos:
            kept = row.copy()
            for t in self.eos_token_ids:
                kept[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
            if kept.any():
                row[:] = kept
        for t in p.stop_token_ids:
            if t < 32 * self.words:
                row[t >> 5] |= np.uint32(1 << (t & 31))

    def close(self) -> None:
        self._thread.shutdown(wait=False)
